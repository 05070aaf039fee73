"""The one runner of a streaming lane (packing.stream), whatever its kind chooses its next training by: a queue's
(:class:`gpupack.job.stream.Lane`) or a search's (:class:`gpupack.search.lane.SearchLane`, given by the job's entry:
the job side knows no study). The lock, admission, what an earlier run left, the attempt and the record are its own.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from gpupack.core.jobenv import JobEnvironment
from gpupack.core.plan import Pack, Plan, Training
from gpupack.core.store.claims import STALE, Claimant, claim_path, drop, release_stale
from gpupack.core.store.journal import Folded, RunRecords, fold_pack, fold_trainings
from gpupack.core.store.records import PackRecord, read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.body import PackAttempt, pack_lock
from gpupack.job.records import move_aside
from gpupack.job.stream import Lane, admission_inputs

# The kind of lane a streaming pack is (gpupack.search.lane.lane_kind: a search's, or a queue's).
LaneKind = Callable[[Pack], type[Lane]]


def queue_lane(pack: Pack) -> type[Lane]:
    """A queue's lane; a search's pack is refused: its kind asks a study, which the job side does not know."""
    if pack.search:
        raise TypeError(f"pack {pack.pack_id} is a search's lane: run it with kind=gpupack.search.lane.lane_kind")
    return Lane


def run_lane(run_root: str, pack_id: str, settings: PackSettings, job: JobEnvironment | None = None,
             plan: Plan | None = None, kind: LaneKind = queue_lane) -> PackRecord:
    """Run one streaming lane in this job until it has nothing left to run; its pack record says what it ran."""
    run = RunDir(Path(run_root))
    job = job or JobEnvironment.here()
    with pack_lock(run, pack_id):
        plan = plan or Plan.from_json(read_json(run.plan))
        pack = plan.pack(pack_id)
        queue = [t for _, t in plan.queue(pack.stream or "")]
        inputs = admission_inputs(run, queue, settings, job.device_env()) if settings.admission else None
        lane = kind(pack)(run, plan, pack, Claimant.here(pack_id, job.job_id), settings, started=job.start(),
                               inputs=inputs)
        if lane.folds:  # what an earlier run of this lane recorded and did not fold before it was killed
            fold_trainings(run, pack_id, [p.stem for p in run.trainings(pack_id).glob("*.json")], pack_id)
        if (done := lane.settled(plan)) is not None:
            return done
        resumed = lane.resume()
        completed, homes = lane.keep()
        released = release_stale(lane.folder, lane.holder, keep=completed, homes=homes)
        torn = {tid: why for tid, why in released.items() if why != STALE}
        for tid, why in torn.items():  # said in the lane's log: a claim file was damaged, and its training runs now
            print(f"gpupack: warning: lane {pack_id}: the claim {claim_path(lane.folder, tid)} could not be read "
                  f"({why}); its training runs again", file=sys.stderr)
        if lane.folds:  # the claims an earlier run of it held of trainings now folded as completed
            drop(lane.folder, completed, pack_id)
        move_aside(run, pack_id, run.pack_record(pack_id))
        first: list[Training] = []
        while len(first) < pack.factor and isinstance(training := lane.next(), Training):
            first.append(training)  # the rest of the slots wait for memory in the mode (gpupack.job.pack.Stream)
        attempt = PackAttempt(run, plan, settings, job, RunRecords(run, Folded()))
        rec = attempt.execute(pack, first, stream=lane,
                              extra={"stream": pack.stream, "lane": pack.index, "released": list(released),
                                     **({"torn_claims": torn} if torn else {}), **resumed})
        rec.update({"claimed": lane.claimed, "stopped_claiming": lane.stopped, "unclaimed": lane.unclaimed(),
                    **lane.summary()})  # type: ignore[typeddict-item]
        if (admitted := lane.admission()) is not None:
            rec["admission"] = admitted
        write_json_atomic(run.pack_record(pack_id), rec)
        if lane.folds:  # the lane's own record and logs; its folder goes; then what collect reads of its journal
            fold_pack(run, pack_id, pack_id)
            from gpupack.core.store.lane_columnar import write_lane_columnar  # pyarrow at its end only

            write_lane_columnar(run, pack_id)
        return rec
