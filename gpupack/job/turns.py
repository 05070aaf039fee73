"""A lane of whole packs: one job that runs its share of one (partition, mode, N) group's packs, one after another.

A sweep of thousands of packs runs as a few such jobs per group (the backend deals the packs out, within the site's
job limits) instead of one job per pack. Each pack is still measured as it would be alone in its job
(:func:`gpupack.job.body.run_pack`: the pack's wall from its mode's start, no job start inside it; wall / N per
training), keeps its own folder and records, and a completed pack is skipped, so a requeued lane goes on where it
stopped. Near its job's time limit the lane starts no pack it could not finish (by the longest pack it ran so far)
and says what it left, and its backend requeues it (:class:`gpupack.submit.PackJob`).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

from gpupack.core.plan import Plan
from gpupack.core.records import is_completed, read_json
from gpupack.core.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.body import run_pack
from gpupack.job.stream import out_of_time, run_lane
from gpupack.runtime.jobenv import JobEnvironment


def run_in_turn(run_root: str, pack_ids: Sequence[str], settings: PackSettings, job: JobEnvironment | None = None,
                plan: Plan | None = None, clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Run ``pack_ids`` in turn in this job; what each pack's record says (``records``), and, where the job's time ran
    short, why it stopped (``stopped_claiming``) and how many packs it left (``unclaimed``)."""
    job = job or JobEnvironment.here()
    run = RunDir(Path(run_root))
    plan = plan or Plan.from_json(read_json(run.plan))
    started = job.start()
    records: dict[str, dict[str, Any]] = {}
    walls: list[float] = []
    for i, pack_id in enumerate(pack_ids):
        stopped = out_of_time(settings.claim_until_s, clock() - started, max(walls, default=None), "a pack")
        if stopped is not None:
            return {"in_turn": list(pack_ids), "records": records, "stopped_claiming": stopped,
                    "unclaimed": len(pack_ids) - i}
        pack = plan.pack(pack_id)
        ran_before = all(is_completed(run.training_record(pack_id, t.training_id)) for t in pack.trainings)
        began = clock()
        # a streaming lane's pack too, where the user's job limit dealt several to one job: it drains its queue
        run_one = run_lane if pack.stream is not None else run_pack
        records[pack_id] = run_one(run_root, pack_id, settings, job=job, plan=plan)
        if not ran_before:  # a pack an earlier run of this lane completed takes no time: no estimate of the next
            walls.append(clock() - began)
    return {"in_turn": list(pack_ids), "records": records, "stopped_claiming": None, "unclaimed": 0}
