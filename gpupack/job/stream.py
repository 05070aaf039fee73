"""A streaming lane: one of K jobs that drain a queue of trainings together, N slots each (packing.stream).

The lane claims trainings (:mod:`gpupack.core.store.claims`) in the queue's order as its slots free, never one whose
record says completed, nor one it could not finish before its job's time limit; an earlier (dead) run's claims are
released at its start. Where its backend folds, it folds each record into its journal as it ends. Where trainings are
admitted by memory, a freed slot claims only what the rule admits, or waits: it claims nothing it does not start.
"""
from __future__ import annotations

import functools
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence, cast

import psutil

from gpupack.core.memory.admission import (
    Candidate,
    LaneMemory,
    admit,
    expected_peak,
    lane_budget_mb,
    max_passes,
    peak_of,
)
from gpupack.core.memory.figures import Figure, candidate_runs, measured_by_setting, setting_key
from gpupack.core.memory.victims import culprit_of
from gpupack.core.monitor import detect_device, free_memory_mb
from gpupack.core.plan import Pack, Plan, Training
from gpupack.core.store.claims import Claimant, claim, claim_path, claims
from gpupack.core.store.journal import CompletedTail, RunRecords, fold_pack, fold_trainings
from gpupack.core.store.records import (
    COMPLETED,
    Admission,
    PackRecord,
    TrainingRecord,
    is_completed,
)
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.body import choose_device
from gpupack.job.pack import WAIT, Curve, Wait
from gpupack.job.records import as_victim, move_aside, rebuild_pack_record
from gpupack.job.workloads import seed_key

RECHECK_S = 0.5  # a waiting slot looks at the free memory again after this (seconds), or as a training ends
LOOKAHEAD_PER_SLOT = 4  # how many of the queue's next trainings a freed slot looks at, per slot, for one that fits

SettingKey = tuple[str, str]  # (workload, setting_key): trainings expected to peak alike


@dataclass(frozen=True)
class AdmissionInputs:
    """What a lane admits its trainings by (packing.admission): the device's free memory now (MB, the seam tests
    fake), the lane's budget, whether GPU or resident memory counts, and the peaks earlier records reached."""

    free_mb: Callable[[], float | None]
    budget_mb: float | None
    on_gpu: bool
    earlier: Mapping[SettingKey, Figure]


def admission_inputs(run: RunDir, queue: Sequence[Training], settings: PackSettings,
                     env: Mapping[str, str]) -> AdmissionInputs:
    """A lane's inputs on this job's device: its free memory, and earlier records of the queue's settings on it."""
    on_gpu = choose_device(settings.device, info := detect_device(env)) == "cuda"
    host_total = None if on_gpu else psutil.virtual_memory().total / 2**20
    budget = lane_budget_mb(on_gpu, settings.memory_fraction, info.memory_total_mb, host_total,
                            settings.host_memory_mb)
    earlier: dict[SettingKey, Figure] = {}
    for name in {t.workload for t in queue}:
        seed = seed_key(name)
        seen = {setting_key(t.params, seed) for t in queue if t.workload == name}
        for setting, m in measured_by_setting(candidate_runs(run.root), name, seen, seed,
                                              device=info.name if on_gpu else "cpu").items():
            mb = m.gpu_mb if on_gpu else m.host_mb
            if mb is not None:
                earlier[name, setting] = Figure(mb, m.source(), measured=True)
    return AdmissionInputs(functools.partial(free_memory_mb, on_gpu, env), budget, on_gpu, earlier)


CLAIM_MARGIN_S, CLAIM_MARGIN = 2.0, 0.1  # time a claim spares past its estimate (seconds, or this share of it)


def out_of_time(limit_s: float | None, elapsed_s: float, estimate_s: float | None, what: str) -> str | None:
    """Why a lane starts no more work (``what``: a training, a pack): one started now, taking up to ``estimate_s``,
    would pass the job's time limit (``limit_s`` after its start). None: there is time, or no limit or estimate.
    Pure."""
    if limit_s is None or estimate_s is None:
        return None
    left = limit_s - elapsed_s
    needed = estimate_s + max(CLAIM_MARGIN_S, CLAIM_MARGIN * estimate_s)  # its record written, its process reaped
    if left >= needed:
        return None
    return (f"{left:.0f} s left before the job's time limit, and {what} takes up to {estimate_s:.0f} s: "
            "the rest is left for the requeued job or the other lanes")


class Lane:
    """The claims of one lane: :meth:`next` is what a freed slot takes (a :class:`gpupack.job.pack.Stream`)."""

    def __init__(self, run: RunDir, plan: Plan, pack: Pack, holder: Claimant, settings: PackSettings,
                 clock: Callable[[], float] = time.time, started: float | None = None,
                 inputs: AdmissionInputs | None = None) -> None:
        if pack.stream is None:
            raise ValueError(f"pack {pack.pack_id} is not a streaming lane")
        self.run, self.pack, self.holder, self.settings, self.clock = run, pack, holder, settings, clock
        self.items = plan.queue(pack.stream)
        self.folder = run.claims(pack.stream)
        self.homes = {t.training_id: home.pack_id for home, t in self.items}
        self.started = clock() if started is None else started  # the job's start: its time limit counts from there
        self.claimed: list[str] = []
        self.walls: list[float] = []  # of the trainings this lane ran to their end
        self.stopped: str | None = None  # why it stopped claiming before the queue was drained
        self.journals = CompletedTail(run, [lane.pack_id for lane in plan.lanes(pack.stream)])  # folded as completed
        self.ended_recs: deque[TrainingRecord] = deque(maxlen=4 * pack.factor + 1)  # a fault's window: its victims
        self.again: deque[Training] = deque()  # victims of a neighbour's fault, to run once more (it holds them)
        self.ran_again: set[str] = set()
        self._by_id = {t.training_id: t for _, t in self.items}
        self._cursor = 0  # every item before it is gone: claimed (by any lane) or completed
        self._gone: set[int] = set()  # items past the cursor gone too (a head passed over keeps the cursor)
        # admission (None: off): what each running training holds, the head passed over, this run's peaks, the last look
        self.inputs = inputs
        self._holding: dict[str, float] = {}
        self._head: str | None = None
        self._head_passes = 0
        self._in_run: dict[SettingKey, float] = {}
        self._looked: float | None = None
        self.passed_over = 0  # trainings started past a head that did not fit
        self.waits = 0  # looks that found nothing fitting

    @property
    def queue(self) -> Sequence[Training]:
        return [t for _, t in self.items]

    @property
    def folds(self) -> bool:
        return self.settings.fold

    def home(self, training_id: str) -> str:
        return self.homes[training_id]

    def where(self, training_id: str) -> str:
        """The pack whose folder holds the training's record and logs: its home, or this lane's where it folds."""
        return self.pack.pack_id if self.folds else self.homes[training_id]

    def curve(self, training_id: str) -> Curve | None:
        """A queue's training reports no curve (a search's lane's trials do: gpupack.search.lane)."""
        return None

    def record(self, training_id: str) -> Path:
        return self.run.training_record(self.where(training_id), training_id)

    def is_completed(self, training_id: str, refresh: bool = False) -> bool:
        """The training has a completed record, in a folder or a journal (``refresh``: read the journals again)."""
        if is_completed(self.record(training_id)):
            return True
        done = self.journals.refresh() if refresh else self.journals.done
        return (self.homes[training_id], training_id) in done

    def completed(self) -> set[str]:
        self.journals.refresh()
        return {t.training_id for t in self.queue if self.is_completed(t.training_id)}

    def out_of_time(self) -> str | None:
        """Why the lane claims no more (:func:`out_of_time`, by the longest training it ran); None: there is time."""
        estimate = max(self.walls) if self.walls else self.settings.training_estimate_s
        return out_of_time(self.settings.claim_until_s, self.clock() - self.started, estimate, "a training")

    def next(self) -> Training | Wait | None:
        if self.stopped is None:
            self.stopped = self.out_of_time()
        if self.stopped is not None:
            return None
        if self.again:  # a victim, once more: this lane still holds its claim
            training = self.again.popleft()
            move_aside(self.run, self.where(training.training_id), self.record(training.training_id))
            return self._started(training)
        if self.inputs is not None:
            return self._admitted(self.inputs)
        while self._cursor < len(self.items):
            if (claimed := self._claim(self._cursor)) is not None:
                return self._started(claimed)
        return None

    def _claim(self, i: int) -> Training | None:
        """Claim the queue's item ``i`` (gone from later looks either way); None: another's, or completed."""
        training = self.items[i][1]
        tid = training.training_id
        self._gone.add(i)
        while self._cursor in self._gone:
            self._cursor += 1
        if self.is_completed(tid) or not claim(self.folder, tid, self.holder):
            return None
        if self.is_completed(tid, refresh=True):  # completed by an earlier run of this lane, whose claim it
            if self.folds:                        # kept, or folded by a lane that then let its claim go
                claim_path(self.folder, tid).unlink(missing_ok=True)
            return None
        move_aside(self.run, self.where(tid), self.record(tid))  # an earlier attempt's record is kept
        self.claimed.append(tid)
        return training

    def _started(self, training: Training) -> Training:
        if self.inputs is not None:  # what it is expected to hold until it ends (nothing known: nothing counted)
            self._holding[training.training_id] = self.expected_mb(training) or 0.0
        return training

    def _admitted(self, inputs: AdmissionInputs) -> Training | Wait | None:
        """The training the admission rule lets a freed slot start, claimed; WAIT: none fits now; None: none left."""
        if self._looked is not None and self.clock() - self._looked < RECHECK_S:
            return WAIT  # nothing ended since the last look in vain, and it was a moment ago
        while True:
            window: list[tuple[int, Training]] = []  # the queue's next trainings neither claimed nor completed
            for i in range(self._cursor, len(self.items)):
                if len(window) == LOOKAHEAD_PER_SLOT * self.pack.factor:
                    break
                if i in self._gone:
                    continue
                if claim_path(self.folder, (tid := self.items[i][1].training_id)).exists() or self.is_completed(tid):
                    self._gone.add(i)  # gone from later looks too (a look claims nothing)
                    continue
                window.append((i, self.items[i][1]))
            if not window:
                return None
            if window[0][1].training_id != self._head:
                self._head, self._head_passes = window[0][1].training_id, 0
            candidates = [Candidate(t.training_id, self.expected_mb(t)) for _, t in window]
            room = LaneMemory(inputs.free_mb(), inputs.budget_mb, sum(self._holding.values()), len(self._holding))
            verdict = admit(candidates, room, self._head_passes, max_passes(self.pack.factor))
            if verdict.take is None:
                self._looked, self.waits = self.clock(), self.waits + 1
                return WAIT
            training = self._claim(window[verdict.take][0])
            if training is None:  # another lane took it, or it completed: look again
                continue
            self._head_passes += verdict.passes_head
            self.passed_over += verdict.passes_head
            return self._started(training)

    def _setting(self, training: Training) -> SettingKey:
        return training.workload, setting_key(training.params, seed_key(training.workload))

    def expected_mb(self, training: Training) -> float | None:
        """The memory ``training`` is expected to peak at on the lane's device (MB); None: not known."""
        if self.inputs is None:
            return None
        key = self._setting(training)
        figure = expected_peak(self.inputs.earlier.get(key), self.settings.training_memory_mb, self._in_run.get(key))
        return None if figure is None else figure.mb

    def admission(self) -> Admission | None:
        """What admission did, for the lane's record (None: off)."""
        if self.inputs is None:
            return None
        return {"budget_mb": self.inputs.budget_mb, "passed_over": self.passed_over, "waits": self.waits}

    def ended(self, training_id: str, wall_s: float) -> None:
        self.walls.append(wall_s)
        if self._holding.pop(training_id, None) is not None:
            self._looked = None  # its memory frees: the next look measures again at once

    def judge(self, rec: dict[str, object]) -> dict[str, object]:
        """A training's record as it ended, before it is written: a victim of a neighbour's fault
        (gpupack.core.memory.victims) is recorded as such and run again once, by this lane."""
        training = cast(TrainingRecord, rec)
        tid = str(training["training_id"])
        culprit = culprit_of(training, self.ended_recs) if tid not in self.ran_again else None
        self.ended_recs.append(training)
        # a completed training's peak: its setting's figure in this run, where nothing earlier says one
        peak = peak_of(training, self.inputs.on_gpu) if self.inputs and training.get("status") == COMPLETED else None
        if peak is not None:
            key = self._setting(self._by_id[tid])
            self._in_run[key] = max(peak, self._in_run.get(key, 0.0))
        if culprit is None:
            return rec
        self.ran_again.add(tid)
        self.again.append(self._by_id[tid])
        return dict(as_victim(training, culprit))

    def recorded(self, training_id: str) -> None:
        """Where the lane folds, the written record goes into the journal, and a completed training's claim goes."""
        if not self.folds:
            return
        recs = fold_trainings(self.run, self.pack.pack_id, [training_id], self.pack.pack_id)
        if any(rec.get("status") == COMPLETED for rec in recs):
            claim_path(self.folder, training_id).unlink(missing_ok=True)

    # ---- what a kind of lane changes of the one runner (:func:`gpupack.job.lanes.run_lane`) ----

    def settled(self, plan: Plan) -> PackRecord | None:
        """The lane's record where its queue is drained (an earlier run's, or rebuilt); None: it has work left."""
        if not self.drained():
            return None
        records = RunRecords(self.run)
        done = records.pack(self.pack.pack_id) or rebuild_pack_record(self.run, plan, self.pack, records,
                                                                      self.ran_here(plan))
        if not done:
            return None
        if self.folds:  # an earlier run killed mid-fold left its folder (or the rebuilt record): fold what is left
            fold_pack(self.run, self.pack.pack_id, self.pack.pack_id)
            from gpupack.core.store.lane_columnar import write_lane_columnar  # pyarrow at its end only

            write_lane_columnar(self.run, self.pack.pack_id)
        # drained: the last record may say trainings were left (its run stopped claiming): none is now, or the job
        # would requeue itself for ever
        return cast(PackRecord, {**done, "unclaimed": 0})

    def drained(self) -> bool:
        """Nothing is left for any lane of its queue to run: every training of it completed."""
        return len(self.completed()) == len(self.items)

    def ran_here(self, plan: Plan) -> list[tuple[str, str]]:
        """The (home, training id) of each training this lane may have run (a lost record is rebuilt from them)."""
        return [(home.pack_id, t.training_id) for home, t in plan.queue(self.pack.stream or "")]

    def resume(self) -> dict[str, object]:
        """Settle what an earlier (dead) run left before this one claims; what the record keeps (a queue's: none)."""
        return {}

    def keep(self) -> tuple[set[str], Mapping[str, str]]:
        """The claims a dead run's release keeps (completed trainings), and each training's home lane."""
        return self.completed(), self.homes

    def unclaimed(self) -> int:
        """Trainings of the queue no lane claimed nor completed, at the lane's end."""
        return len(self.items) - len(self.completed() | set(claims(self.folder)))

    def summary(self) -> dict[str, object]:
        """What the lane's record says of it at its end, beyond the claims."""
        return {}
