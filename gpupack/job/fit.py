"""A pack held against its device's memory share before it starts (packing.admission, :mod:`gpupack.core.pack_fit`):
the peaks each setting reached, read once where a job begins and learnt as its packs end.

A lane of packs holds one :class:`PeakBook` for all its packs: the earlier runs' peaks and this run's, read at its
start, and each pack's own trainings added as it ends, so the first pack of a setting (the smallest N runs first:
:func:`gpupack.core.plan.measure_first`) measures what the larger ones are held against. Packs that other jobs run at
the same time are seen by the next job that starts.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import psutil

from gpupack.core.admission import peak_of
from gpupack.core.memory import Figure, Measured, candidate_runs, measured_by_setting, setting_key
from gpupack.core.pack_fit import Budget, Fit, Refit, largest_fit, pack_budget, pack_fit, training_peak
from gpupack.core.plan import Training
from gpupack.core.records import COMPLETED
from gpupack.core.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.workloads import load_workload

SettingKey = tuple[str, str]  # (workload, setting_key): trainings expected to peak alike


class PeakBook:
    """The highest host and GPU peaks per setting of trainings that completed: this run's (read once, then learnt as
    packs end) and earlier runs' (read once). Shared by the threads of a job of several GPUs."""

    def __init__(self, run: RunDir, trainings: Sequence[Training]) -> None:
        self._seed_keys: dict[str, str] = {}
        self._lock = threading.Lock()
        earlier_runs = [r for r in candidate_runs(run.root) if r != run.root]
        self.this_run: dict[SettingKey, Measured] = self._read([run.root], trainings)
        self.earlier: dict[SettingKey, Measured] = self._read(earlier_runs, trainings)

    def setting(self, training: Training) -> SettingKey:
        if training.workload not in self._seed_keys:
            self._seed_keys[training.workload] = load_workload(training.workload).seed_key
        return training.workload, setting_key(training.params, self._seed_keys[training.workload])

    def _read(self, runs: Sequence[Path], trainings: Sequence[Training]) -> dict[SettingKey, Measured]:
        out: dict[SettingKey, Measured] = {}
        if not runs:
            return out
        for name in {t.workload for t in trainings}:
            seen = {self.setting(t)[1] for t in trainings if t.workload == name}
            for setting, m in measured_by_setting(runs, name, seen, self._seed_keys[name], completed_only=True).items():
                out[name, setting] = m
        return out

    def learn(self, trainings: Mapping[str, Training], records: Iterable[Mapping[str, object]]) -> None:
        """The peaks a pack's completed training records say (``trainings``: by id), each its setting's in this run
        if higher. A training cut short (its share, a neighbour's fault, a victim about to run again) peaked at no
        more than it was let: a lower bound of its need, which would size the next share too small."""
        with self._lock:
            for rec in records:
                if rec.get("status") != COMPLETED:
                    continue
                t = trainings.get(str(rec.get("training_id")))
                host, gpu = peak_of(rec, on_gpu=False), peak_of(rec, on_gpu=True) if rec.get("gpu_type") != "cpu" \
                    else None
                if t is None or (host is None and gpu is None):
                    continue
                key = self.setting(t)
                was = self.this_run.get(key, Measured())
                self.this_run[key] = Measured(host_mb=_higher(was.host_mb, host), gpu_mb=_higher(was.gpu_mb, gpu),
                                              trainings=was.trainings + 1, where="this run")

    def figure(self, training: Training, on_gpu: bool, stated_mb: float | None) -> Figure | None:
        """What ``training`` is expected to peak at on a GPU (its GPU memory) or a CPU (its resident memory)."""
        key = self.setting(training)
        with self._lock:
            return training_peak(_figure(self.this_run.get(key), on_gpu, "this run"),
                                 _figure(self.earlier.get(key), on_gpu, None), stated_mb)


def _higher(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _figure(m: Measured | None, on_gpu: bool, where: str | None) -> Figure | None:
    mb = None if m is None else m.gpu_mb if on_gpu else m.host_mb
    if m is None or mb is None:
        return None
    return Figure(mb, f"the peak of {m.trainings} training(s) of its setting in {where or m.where}", measured=True)


def budget_of(settings: PackSettings, on_gpu: bool, device_total_mb: float | None) -> Budget | None:
    """A pack's memory share on this job's device (I/O: the host's memory on a CPU)."""
    host_total = None if on_gpu else psutil.virtual_memory().total / 2**20
    return pack_budget(on_gpu, settings.memory_fraction, device_total_mb, host_total, settings.host_memory_mb)


def check_pack(book: PeakBook, todo: Sequence[Training], n: int, settings: PackSettings, on_gpu: bool,
               device_total_mb: float | None) -> Fit:
    """Whether the pack's ``todo`` trainings may start as a pack of ``n`` on this job's device."""
    if not settings.admission:
        return Fit(True, "packing.admission=off")
    return pack_fit(n, [book.figure(t, on_gpu, settings.training_memory_mb) for t in todo],
                    budget_of(settings, on_gpu, device_total_mb))


def refit_n(book: PeakBook, todo: Sequence[Training], settings: PackSettings, on_gpu: bool,
            device_total_mb: float | None, most: int | None = None) -> Refit:
    """The largest N (up to ``most``) at which a skipped pack's ``todo`` trainings fit this job's device, by the rule
    that skipped it (:func:`gpupack.core.pack_fit.largest_fit`)."""
    return largest_fit([book.figure(t, on_gpu, settings.training_memory_mb) for t in todo],
                       budget_of(settings, on_gpu, device_total_mb), most)
