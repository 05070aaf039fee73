"""A lane of whole packs: one job that runs its share of one (partition, mode, N) group's packs, one after another,
one at a time on each of the job's GPUs.

Each pack is still measured as it would be alone in its job (:func:`gpupack.job.body.run_pack`) and keeps its own
records; a completed pack is skipped, so a requeued lane goes on where it stopped. Near its job's time limit the lane
starts no pack it could not finish (by the longest it ran so far). A job of G GPUs (``settings.job_gpus``) runs G
packs at once, each on its GPU alone (:meth:`JobEnvironment.on_gpu`), each taking the lane's next as its last ends.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Sequence, TypedDict

from gpupack.core.jobenv import JobEnvironment
from gpupack.core.plan import Plan, refit_parent
from gpupack.core.store.journal import RunRecords, fold_pack
from gpupack.core.store.records import PackRecord, read_json
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.body import run_pack
from gpupack.job.lanes import LaneKind, queue_lane, run_lane
from gpupack.job.pack import LaneResources
from gpupack.job.peaks import PeakBook, job_device
from gpupack.job.stream import out_of_time


class InTurn(TypedDict):
    in_turn: list[str]
    records: dict[str, PackRecord]
    stopped_claiming: str | None
    unclaimed: int


class Turns:
    """The lane's packs not yet begun, shared by the job's GPUs, and what the lane did."""

    def __init__(self, pack_ids: Sequence[str], settings: PackSettings, started: float,
                 clock: Callable[[], float], kind: LaneKind = queue_lane) -> None:
        self.queue = deque(pack_ids)
        self.kind = kind  # what kind of lane a streaming pack of it is (gpupack.job.lanes.run_lane)
        self.settings, self.started, self.clock = settings, started, clock
        self.records: dict[str, PackRecord] = {}
        self.walls: list[float] = []
        self.stopped: str | None = None
        self.failed: BaseException | None = None
        self._lock = threading.Lock()

    def take(self) -> str | None:
        """The next pack to begin, or None: none left, a GPU's pack failed, or too little time for one more."""
        with self._lock:
            if not self.queue or self.failed is not None or self.stopped is not None:
                return None
            self.stopped = out_of_time(self.settings.claim_until_s, self.clock() - self.started,
                                       max(self.walls, default=None), "a pack")
            return None if self.stopped is not None else self.queue.popleft()

    def ended(self, pack_id: str, record: PackRecord, wall_s: float | None) -> None:
        with self._lock:
            self.records[pack_id] = record
            if wall_s is not None:
                self.walls.append(wall_s)

    def fail(self, err: BaseException) -> None:
        with self._lock:
            self.failed = self.failed or err


def run_in_turn(run_root: str, pack_ids: Sequence[str], settings: PackSettings, job: JobEnvironment | None = None,
                plan: Plan | None = None, clock: Callable[[], float] = time.time,
                kind: LaneKind = queue_lane) -> InTurn:
    """Run ``pack_ids`` in turn in this job, one at a time on each of its ``settings.job_gpus`` GPUs: each pack's
    record, and, where the job's time ran short, why it stopped and how many packs it left. A pack that raises stops
    the lane (the other GPUs end their pack) and is raised. ``kind``: what kind of lane a streaming pack is."""
    job = job or JobEnvironment.here()
    run = RunDir(Path(run_root))
    plan = plan or Plan.from_json(read_json(run.plan))
    turns = Turns(pack_ids, settings, job.start(), clock, kind)
    records = RunRecords(run)  # the lane's journals, read once: a pack an earlier run of the lane folded is complete
    lane = pack_ids[0] if pack_ids else ""
    gpus = job.gpus(settings.job_gpus) if settings.job_gpus > 1 else []
    trainings = [t for pack_id in pack_ids for t in plan.pack(pack_id).trainings]  # what a shared server preloads
    # what each pack is held against before it starts: read once, learnt as the lane's packs end (packing.admission)
    peaks = PeakBook(run, trainings, device=job_device(settings, job.device_env())) if settings.admission else None
    if len(gpus) <= 1:
        with LaneResources(run, lane, trainings) as resources:
            take_turns(run, plan, turns, job, records, lane, resources, peaks)
    else:
        with contextlib.ExitStack() as stack:  # each device's own resources, closed however the lane ends
            per_gpu = [stack.enter_context(LaneResources(run, f"{lane}-gpu{i}", trainings)) for i in range(len(gpus))]
            workers = [threading.Thread(target=take_turns, name=f"gpupack-gpu{i}",
                                        args=(run, plan, turns, job.on_gpu(gpu, i), records, lane, per_gpu[i], peaks))
                       for i, gpu in enumerate(gpus)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
    if settings.fold and any(plan.pack(p).stream is None for p in pack_ids):  # (a streaming lane writes its own)
        from gpupack.core.store.lane_columnar import write_lane_columnar  # pyarrow at its end only

        write_lane_columnar(run, lane)  # what collect reads of the lane's journal (a killed run's: its next)
    if turns.failed is not None:
        raise turns.failed
    return {"in_turn": list(pack_ids), "records": turns.records, "stopped_claiming": turns.stopped,
            "unclaimed": len(turns.queue) if turns.stopped is not None else 0}


def take_turns(run: RunDir, plan: Plan, turns: Turns, job: JobEnvironment, records: RunRecords, lane: str,
               resources: LaneResources | None = None, peaks: PeakBook | None = None) -> None:
    """Run the lane's next pack on ``job``'s device until none is left to begin, folding each where the lane folds."""
    while (pack_id := turns.take()) is not None:
        pack = plan.pack(pack_id)
        ran_before = all(records.ran(pack_id, t.training_id) for t in pack.trainings)
        began = turns.clock()
        try:
            if pack.stream is not None:  # a streaming lane, where a job limit dealt several to one job
                record = run_lane(str(run.root), pack_id, turns.settings, job=job, plan=plan, kind=turns.kind)
            else:
                record = run_pack(str(run.root), pack_id, turns.settings, job=job, plan=plan, records=records,
                                  resources=resources, peaks=peaks)
                if turns.settings.fold:
                    fold_pack(run, pack_id, lane)
                    # its refit packs that still have a folder (this run's, and a killed run's): smaller N's
                    for refit in [os.path.basename(d) for d in run.pack_dirs()]:
                        if refit_parent(refit) == pack_id:
                            fold_pack(run, refit, lane)
        except BaseException as err:  # noqa: BLE001 - raised again by run_in_turn, in the job's own thread
            turns.fail(err)
            return
        # a pack an earlier run of this lane completed takes no time: no estimate of the next
        turns.ended(pack_id, record, None if ran_before else turns.clock() - began)
