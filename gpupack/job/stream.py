"""A streaming lane: one of K jobs that drain a queue of trainings together, N slots each (packing.stream).

The lane claims trainings from the run directory (:mod:`gpupack.core.claims`) in the queue's order: N at its start,
then one each time a slot frees, until none is left unclaimed; then its job ends. A training whose record says
completed is never claimed. At its start the lane releases the claims an earlier run of itself left (it holds the
lane's lock, so that run is dead: a requeue, a SIGKILL, a node failure, a cancel), and those trainings run again.
Near its job's time limit it claims nothing it could not finish (``PackSettings.claim_until_s``): the slots it
stops filling are left for the lane's requeued run or for the other lanes.

Where its backend folds (``PackSettings.fold``: a cluster's shared filesystem), the lane writes its trainings'
records and logs in its own folder, folds each into its journal as it ends and drops its claim of a completed one
(:mod:`gpupack.core.journal`), and folds its own record and folder at its end: a handful of files per lane, not
per training. A claim won of a training another lane folded as completed is let go at once.
"""
from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Sequence

from gpupack.core.claims import Holder, claim, claim_path, claims, drop, release_stale
from gpupack.core.journal import CompletedTail, RunRecords, fold_pack, fold_trainings
from gpupack.core.lane_columnar import write_lane_columnar
from gpupack.core.plan import Pack, Plan, Training
from gpupack.core.records import COMPLETED, VICTIM, is_completed, read_json, write_json_atomic
from gpupack.core.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.core.victims import culprit_of
from gpupack.job.body import execute, move_aside, pack_lock
from gpupack.runtime.jobenv import JobEnvironment

# A training is claimed only with this much time to spare past its estimate (seconds, or this share of it): a training
# that ends just as the limit's signal comes would be killed and run again.
CLAIM_MARGIN_S, CLAIM_MARGIN = 2.0, 0.1


def out_of_time(limit_s: float | None, elapsed_s: float, estimate_s: float | None, what: str) -> str | None:
    """Why a lane starts no more work (``what``: a training, a pack): one started now, taking up to ``estimate_s``,
    would pass the job's time limit (``limit_s`` after its start, less the requeue signal's delay). None: there is
    time, or no limit, or nothing to estimate by. Pure."""
    if limit_s is None or estimate_s is None:
        return None
    left = limit_s - elapsed_s
    needed = estimate_s + max(CLAIM_MARGIN_S, CLAIM_MARGIN * estimate_s)  # its record written, its process reaped
    if left >= needed:
        return None
    return (f"{left:.0f} s left before the job's time limit, and {what} takes up to {estimate_s:.0f} s: "
            "the rest is left for the requeued job or the other lanes")


class Lane:
    """The claims of one lane: :meth:`next` is what a freed slot takes (a :class:`gpupack.pack.Stream`)."""

    def __init__(self, run: RunDir, plan: Plan, pack: Pack, holder: Holder, settings: PackSettings,
                 clock: Callable[[], float] = time.time, started: float | None = None) -> None:
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
        # what the queue's lanes folded as completed (none where the backend does not fold), by their journals' names
        self.journals = CompletedTail(run, [lane.pack_id for lane in plan.lanes(pack.stream)])
        # how its recent trainings ended (a fault's window), for telling a fault from its victims
        self.ended_recs: deque[dict[str, Any]] = deque(maxlen=4 * pack.factor + 1)
        self.again: deque[Training] = deque()  # victims of a neighbour's fault, to run once more (it holds them)
        self.ran_again: set[str] = set()
        self._by_id = {t.training_id: t for _, t in self.items}
        self._cursor = 0

    @property
    def queue(self) -> Sequence[Training]:
        return [t for _, t in self.items]

    @property
    def folds(self) -> bool:
        return self.settings.fold

    def home(self, training_id: str) -> str:
        return self.homes[training_id]

    def where(self, training_id: str) -> str:
        """The pack whose folder holds the training's record and logs while this lane runs it: its home, or this
        lane's own folder where the lane folds (the lane removes that folder at its end)."""
        return self.pack.pack_id if self.folds else self.homes[training_id]

    def record(self, training_id: str) -> Path:
        return self.run.training_record(self.where(training_id), training_id)

    def is_completed(self, training_id: str, refresh: bool = False) -> bool:
        """The training has a completed record: in a folder, or folded into a journal (``refresh``: read what the
        journals gained since last asked)."""
        if is_completed(self.record(training_id)):
            return True
        done = self.journals.refresh() if refresh else self.journals.done
        return (self.homes[training_id], training_id) in done

    def completed(self) -> set[str]:
        self.journals.refresh()
        return {t.training_id for t in self.queue if self.is_completed(t.training_id)}

    def estimate_s(self) -> float | None:
        """How long the next training may take: the longest this lane has run so far, else the sweep's estimate."""
        return max(self.walls) if self.walls else self.settings.training_estimate_s

    def out_of_time(self) -> str | None:
        """Why the lane claims no more: a training started now would pass the job's time limit (less the requeue
        signal's delay). None: there is time (or no limit, or nothing to estimate by)."""
        return out_of_time(self.settings.claim_until_s, self.clock() - self.started, self.estimate_s(), "a training")

    def next(self) -> Training | None:
        if self.stopped is None:
            self.stopped = self.out_of_time()
        if self.stopped is not None:
            return None
        if self.again:  # a victim, once more: this lane still holds its claim
            training = self.again.popleft()
            move_aside(self.run, self.where(training.training_id), self.record(training.training_id))
            return training
        while self._cursor < len(self.items):
            home, training = self.items[self._cursor]
            self._cursor += 1
            tid = training.training_id
            if self.is_completed(tid) or not claim(self.folder, tid, self.holder):
                continue
            if self.is_completed(tid, refresh=True):  # completed by an earlier run of this lane, whose claim it
                if self.folds:                        # kept, or folded by a lane that then let its claim go
                    claim_path(self.folder, tid).unlink(missing_ok=True)
                continue
            move_aside(self.run, self.where(tid), self.record(tid))  # an earlier attempt's record is kept
            self.claimed.append(tid)
            return training
        return None

    def ended(self, training_id: str, wall_s: float) -> None:
        self.walls.append(wall_s)

    def judge(self, rec: dict[str, Any]) -> dict[str, Any]:
        """A training's record as it ended, before it is written: a victim of a neighbour's fault on this lane's
        device (gpupack.core.victims) is recorded as such and run again once, by this lane."""
        tid = str(rec["training_id"])
        culprit = culprit_of(rec, self.ended_recs) if tid not in self.ran_again else None
        self.ended_recs.append(rec)
        if culprit is None:
            return rec
        self.ran_again.add(tid)
        self.again.append(self._by_id[tid])
        return {**rec, "status": VICTIM, "victim_of": culprit, "died_as": rec.get("status")}

    def recorded(self, training_id: str) -> None:
        """The training's record is written: where the lane folds, it goes into the journal with its logs, and a
        completed training's claim goes (every lane now sees it completed in the journal)."""
        if not self.folds:
            return
        recs = fold_trainings(self.run, self.pack.pack_id, [training_id], self.pack.pack_id)
        if any(rec.get("status") == COMPLETED for rec in recs):
            claim_path(self.folder, training_id).unlink(missing_ok=True)


def run_lane(run_root: str, pack_id: str, settings: PackSettings, job: JobEnvironment | None = None,
             plan: Plan | None = None) -> dict[str, Any]:
    """Run one streaming lane in this job until its queue is drained; its pack record says what it ran. ``plan``:
    the run's, as the caller read it (None: read here)."""
    run = RunDir(Path(run_root))
    job = job or JobEnvironment.here()
    with pack_lock(run, pack_id):
        plan = plan or Plan.from_json(read_json(run.plan))
        pack = plan.pack(pack_id)
        lane = Lane(run, plan, pack, Holder.here(pack_id, job.job_id), settings, started=job.start())
        if lane.folds:  # what an earlier run of this lane recorded and did not fold before it was killed
            fold_trainings(run, pack_id, [p.stem for p in run.trainings(pack_id).glob("*.json")], pack_id)
        completed = lane.completed()
        if len(completed) == len(lane.items) and (done := RunRecords(run).pack(pack_id)) is not None:
            if lane.folds:  # an earlier run killed mid-fold left its folder: fold what is left
                fold_pack(run, pack_id, pack_id)
                write_lane_columnar(run, pack_id)
            return done  # the queue is drained: nothing to run, nothing to move
        released = release_stale(lane.folder, lane.holder, keep=completed)
        if lane.folds:  # the claims an earlier run of it held of trainings now folded as completed
            drop(lane.folder, completed, pack_id)
        move_aside(run, pack_id, run.pack_record(pack_id))
        first: list[Training] = []
        while len(first) < pack.factor and (training := lane.next()) is not None:
            first.append(training)
        rec = execute(run, plan, pack, first, settings, job, stream=lane,
                      extra={"stream": pack.stream, "lane": pack.index, "released": released})
        left = len(lane.items) - len(lane.completed() | set(claims(lane.folder)))
        rec.update(claimed=lane.claimed, stopped_claiming=lane.stopped, unclaimed=left)
        write_json_atomic(run.pack_record(pack_id), rec)
        if lane.folds:  # the lane's own record and logs; its folder goes; then what collect reads of its journal
            fold_pack(run, pack_id, pack_id)
            write_lane_columnar(run, pack_id)
        return rec
