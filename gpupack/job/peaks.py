"""A pack held against its device's memory share before it starts (packing.admission,
:mod:`gpupack.core.memory.pack_fit`): the peaks each setting reached, read once where a job begins and learnt as its
packs end.

A lane holds one :class:`PeakBook` for all its packs: earlier runs' peaks and this run's, read at its start, each pack's
trainings added as it ends, and what other lanes fold into their journals read before a pack starts
(:meth:`PeakBook.refresh`), so a lane's N=4 pack is held against the N=1 another lane just measured.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import psutil

from gpupack.core.memory.admission import peak_of
from gpupack.core.memory.figures import (
    Figure,
    Measured,
    candidate_runs,
    device_label,
    measured_by_setting,
    record_device,
    same_device,
    setting_key,
)
from gpupack.core.memory.pack_fit import Budget, pack_budget, training_peak
from gpupack.core.monitor import detect_device
from gpupack.core.plan import Training
from gpupack.core.store.journal import TRAINING, journal_entries
from gpupack.core.store.records import COMPLETED
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.workloads import seed_key

SettingKey = tuple[str, str]  # (workload, setting_key): trainings expected to peak alike

REFRESH_EVERY_S = 30.0  # how often a lane reads what the others folded since (a stat a lane's journal: Lustre's cost)


class PeakBook:
    """The highest host and GPU peaks per setting of completed trainings: this run's (read once, then learnt as packs
    end and lanes' journals grow) and earlier runs' (read once). Thread-safe."""

    def __init__(self, run: RunDir, trainings: Sequence[Training],
                 clock: Callable[[], float] = time.monotonic, *, device: str) -> None:
        # the device this job's trainings run on (:func:`job_device`): peaks on another device model are not this job's
        self.device = device
        self._unloadable: set[str] = set()
        self._learnt: set[str] = set()  # records learnt: a lane's own come again in its journal, and count once
        self._lock = threading.Lock()
        self._run, self._clock = run, clock
        self._read_to = _journal_sizes(run)  # before the read below: a line folded meanwhile is read twice, not missed
        self._refreshed = clock()
        earlier_runs = [r for r in candidate_runs(run.root) if r != run.root]
        self.this_run: dict[SettingKey, Measured] = self._read([run.root], trainings)
        self.earlier: dict[SettingKey, Measured] = self._read(earlier_runs, trainings)

    def setting(self, training: Training) -> SettingKey:
        return training.workload, setting_key(training.params, seed_key(training.workload))

    def _key(self, rec: Mapping[str, object]) -> SettingKey | None:
        """The setting of another lane's record; None where its workload does not load here (not learnt from)."""
        workload, params = str(rec.get("workload")), rec.get("params")
        if workload in self._unloadable:
            return None
        try:
            return workload, setting_key(params if isinstance(params, Mapping) else {}, seed_key(workload))
        except Exception:  # noqa: BLE001 - whatever its import raises
            self._unloadable.add(workload)
            return None

    def refresh(self) -> None:
        """Learn the new lines of the run's lanes' journals, at most every :data:`REFRESH_EVERY_S`."""
        now = self._clock()
        if now - self._refreshed < REFRESH_EVERY_S:
            return
        self._refreshed = now
        for path, size in _journal_sizes(self._run).items():
            start = self._read_to.get(path, 0)
            if size <= start:  # nothing new (a journal is only appended to)
                continue
            entries, self._read_to[path] = journal_entries(path, start)
            done = [e["record"] for e in entries if e.get("kind") == TRAINING]
            self._learn_keyed((key, rec) for rec in done if (key := self._key(rec)) is not None)

    def _read(self, runs: Sequence[Path], trainings: Sequence[Training]) -> dict[SettingKey, Measured]:
        out: dict[SettingKey, Measured] = {}
        if not runs:
            return out
        for name in {t.workload for t in trainings}:
            seen = {self.setting(t)[1] for t in trainings if t.workload == name}
            for setting, m in measured_by_setting(runs, name, seen, seed_key(name), completed_only=True,
                                                  device=self.device).items():
                out[name, setting] = m
        return out

    def learn(self, trainings: Mapping[str, Training], records: Iterable[Mapping[str, object]]) -> None:
        """The peaks a pack's completed training records say (``trainings``: by id), each its setting's if higher. Only
        completed ones: one cut short peaked at no more than it was let, which would size the next share too small."""
        self._learn_keyed((self.setting(t), rec) for rec in records
                          if (t := trainings.get(str(rec.get("training_id")))) is not None)

    def _learn_keyed(self, keyed: Iterable[tuple[SettingKey, Mapping[str, object]]]) -> None:
        """Each completed record's peaks (with its setting), its setting's in this run if higher."""
        with self._lock:
            for key, rec in keyed:
                if rec.get("status") != COMPLETED or (learnt := str(rec.get("training_id"))) in self._learnt \
                        or not same_device(record_device(rec), self.device):  # another lane's, on another device
                    continue
                self._learnt.add(learnt)
                host, gpu = peak_of(rec, on_gpu=False), peak_of(rec, on_gpu=True) if rec.get("gpu_type") != "cpu" \
                    else None
                if host is None and gpu is None:
                    continue
                was = self.this_run.get(key, Measured())
                self.this_run[key] = Measured(host_mb=_higher(was.host_mb, host), gpu_mb=_higher(was.gpu_mb, gpu),
                                              trainings=was.trainings + 1, where="this run",
                                              device=device_label(self.device))

    def figure(self, training: Training, on_gpu: bool, stated_mb: float | None) -> Figure | None:
        """What ``training`` is expected to peak at on a GPU (its GPU memory) or a CPU (its resident memory)."""
        key = self.setting(training)
        with self._lock:
            return training_peak(_figure(self.this_run.get(key), on_gpu, "this run"),
                                 _figure(self.earlier.get(key), on_gpu, None), stated_mb)


def _journal_sizes(run: RunDir) -> dict[Path, int]:
    sizes = {}
    for path in run.lanes.glob("*.jsonl") if run.lanes.is_dir() else []:
        try:
            sizes[path] = path.stat().st_size
        except OSError:  # removed meanwhile
            continue
    return sizes


def _higher(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _figure(m: Measured | None, on_gpu: bool, where: str | None) -> Figure | None:
    mb = None if m is None else m.gpu_mb if on_gpu else m.host_mb
    if m is None or mb is None:
        return None
    on = f" on {m.device}" if m.device else ""
    return Figure(mb, f"the peak of {m.trainings} training(s) of its setting{on} in {where or m.where}", measured=True)


def job_device(settings: PackSettings, env: Mapping[str, str]) -> str:
    """The device this job's trainings run on, as their records name it: "cpu", else NVML's name of its GPU."""
    info = detect_device(env)
    return info.name if info.kind == "gpu" and settings.device != "cpu" else "cpu"


def budget_of(settings: PackSettings, on_gpu: bool, device_total_mb: float | None) -> Budget | None:
    """A pack's memory share on this job's device (I/O: the host's memory on a CPU)."""
    host_total = None if on_gpu else psutil.virtual_memory().total / 2**20
    return pack_budget(on_gpu, settings.memory_fraction, device_total_mb, host_total, settings.host_memory_mb)
