"""A search's streaming lane (``search=optuna``): a stream lane whose freed slot asks the study for its next trial
(:mod:`gpupack.search.study`) instead of claiming a planned training.

The trial's number is unique under the study's lock, so no two lanes race for one; the lane still writes the house's
claim of its training (status and resume see who runs it). The training runs as any streamed one (records, logs,
memory share, victims); when its record is written the lane tells the study its value (the metric from the record),
complete, or failed with why; a trial its own process was told to prune (``TrainingContext.report``) is recorded
pruned. At its start the lane tells failed the trials an earlier run of itself asked and never told (it holds the
lane's lock: that run is dead), so a resume never repeats nor loses one, and takes the trials the command planned for
it (:meth:`gpupack.search.study.Study.plan_first`): it starts those first, while Optuna is imported beside them.
"""
from __future__ import annotations

import sys
from collections import deque
from pathlib import Path
from typing import Mapping

from gpupack.core.plan import Pack, Plan, Training
from gpupack.core.store.claims import Claimant, claim, claims, release_stale
from gpupack.core.store.journal import Folded, RunRecords, fold_pack, fold_trainings
from gpupack.core.store.lane_columnar import write_lane_columnar
from gpupack.core.store.records import COMPLETED, VICTIM, read_json, write_json_atomic
from gpupack.core.store.records import PRUNED as PRUNED_STATUS
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.body import PackAttempt, pack_lock
from gpupack.job.records import move_aside
from gpupack.job.stream import Lane
from gpupack.pack import Wait
from gpupack.runtime.jobenv import JobEnvironment
from gpupack.search.study import (
    COMPLETE,
    FAILED,
    PRUNED,
    Head,
    Outcome,
    State,
    Study,
    TrialRow,
    import_optuna_meanwhile,
    trial_number,
    trial_training,
)

Record = dict[str, object]


class SearchLane(Lane):
    """A lane whose freed slots ask the study (:meth:`next`) and tell it how each trial ended (:meth:`recorded`)."""

    def __init__(self, run: RunDir, plan: Plan, pack: Pack, holder: Claimant, settings: PackSettings,
                 started: float | None = None) -> None:
        super().__init__(run, plan, pack, holder, settings, started=started)
        self.study = Study(run.study)
        self.head = self.study.head()  # the search, the workload and fixed params every trial shares
        self.search_ended: str | None = None  # why the study gave no more trials
        self.planned: deque[TrialRow] = deque()  # the trials the command asked for this lane: run before any ask
        self._ended: dict[str, Mapping[str, object]] = {}

    def next(self) -> Training | Wait | None:
        if self.stopped is None:
            self.stopped = self.out_of_time()
        if self.stopped is not None or self.search_ended is not None:
            return None
        if self.again:  # a victim of a neighbour's fault, once more
            training = self.again.popleft()
            move_aside(self.run, self.where(training.training_id), self.record(training.training_id))
            return self._started(training)
        row = self.planned.popleft() if self.planned else self.study.ask(self.holder)
        if isinstance(row, str):
            self.search_ended = row
            return None
        training = trial_training(self.head, row)
        tid = training.training_id
        self.items.append((self.pack, training))
        self.homes[tid], self._by_id[tid] = self.pack.pack_id, training
        claim(self.folder, tid, self.holder)  # the house's claim: status and resume see who runs it
        self.claimed.append(tid)
        return self._started(training)

    def judge(self, rec: dict[str, object]) -> dict[str, object]:
        """As a stream lane judges it; a trial its study was told pruned is recorded pruned, not failed, however its
        process then ended (the packer records it so where it saw the prune: its result, its stopped program)."""
        rec = super().judge(rec)
        number = trial_number(str(rec["training_id"]))
        # the prune was marked (by the trial's process, or by the packer before it stopped the program) before the
        # process ended; the lane's storage reads only the lines written since its last decision
        journal = self.study.read() if number is not None and rec.get("status") != PRUNED_STATUS else None
        row = journal.trials.get(number) if journal is not None and number is not None else None
        if row is not None and row.state == PRUNED:
            rec.update(status=PRUNED_STATUS, pruned={"step": max(row.intermediate, default=None), "value": row.value})
        self._ended[str(rec["training_id"])] = rec
        return rec

    def recorded(self, training_id: str) -> None:
        """The record is written: the study is told how the trial ended, then the lane folds it as any."""
        rec = self._ended.pop(training_id, {})
        number = trial_number(training_id)
        if number is not None and rec.get("status") != "victim":  # a victim runs again: told after that run
            state, value, why = outcome_of(rec, self.head.search.metric)
            self.study.tell(number, state, value, why, device_s=float(str(rec.get("wall_s") or 0.0)))
        super().recorded(training_id)


def outcome_of(rec: Mapping[str, object], metric: str) -> tuple[State, float | None, str | None]:
    """How a trial ended by its training's record: complete with the metric's value, pruned, or failed with why (a
    completed training that reported no such metric fails: the study cannot rank it). Pure."""
    if rec.get("status") == PRUNED_STATUS:
        return PRUNED, None, None
    if rec.get("status") != COMPLETED:
        return FAILED, None, str(rec.get("error") or rec.get("status") or "no record")
    metrics = rec.get("metrics")
    value = metrics.get(metric) if isinstance(metrics, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return COMPLETE, float(value), None
    said = sorted(metrics) if isinstance(metrics, dict) else "none"
    return FAILED, None, f"its record holds no {metric} (it reported {said})"


def recorded_outcome(run: RunDir, pack_id: str, head: Head, row: TrialRow) -> Outcome | None:
    """How a trial ended by the record its training wrote (None: none written, or one to run again): what a lane that
    died between the record and its tell would have told."""
    rec = RunRecords(run).training(pack_id, trial_training(head, row).training_id)
    if rec is None or rec.get("status") == VICTIM:
        return None
    return outcome_of(rec, head.search.metric)


def run_search_lane(run_root: str, pack_id: str, settings: PackSettings, job: JobEnvironment | None = None,
                    plan: Plan | None = None) -> dict[str, object]:
    """Run one search lane until the study gives it no more trials; its pack record says what it ran."""
    run = RunDir(Path(run_root))
    job = job or JobEnvironment.here()
    with pack_lock(run, pack_id):
        plan = plan or Plan.from_json(read_json(run.plan))
        pack = plan.pack(pack_id)
        lane = SearchLane(run, plan, pack, Claimant.here(pack_id, job.job_id), settings, started=job.start())
        if lane.folds:  # what an earlier run of this lane recorded and did not fold before it was killed
            fold_trainings(run, pack_id, [p.stem for p in run.trainings(pack_id).glob("*.json")], pack_id)
        told = lane.study.fail_dead(lane.holder, lambda row: recorded_outcome(run, pack_id, lane.head, row))
        dead = [number for number, state in told if state == FAILED]
        if told:
            print(f"gpupack: lane {pack_id}: an earlier run of this lane died before telling trial(s) "
                  f"{', '.join(f'{n} ({s})' for n, s in told)}: told now, from their records where written, else "
                  "failed", file=sys.stderr)
        if lane.out_of_time() is None:  # else they wait for the requeued run, not taken by one that starts none
            lane.planned.extend(lane.study.take_planned(lane.holder))
        if lane.planned:  # they start without Optuna; the lane's next ask needs it
            import_optuna_meanwhile()
        released = release_stale(lane.folder, lane.holder)
        move_aside(run, pack_id, run.pack_record(pack_id))
        first: list[Training] = []
        while len(first) < pack.factor and isinstance(training := lane.next(), Training):
            first.append(training)
        attempt = PackAttempt(run, plan, settings, job, RunRecords(run, Folded()))
        rec = attempt.execute(pack, first, stream=lane,
                              extra={"stream": pack.stream, "lane": pack.index, "released": list(released),
                                     "failed_dead": dead})
        rec.update({"claimed": lane.claimed, "stopped_claiming": lane.stopped, "search_ended": lane.search_ended,
                    "unclaimed": len(claims(lane.folder)) if lane.stopped else 0})
        write_json_atomic(run.pack_record(pack_id), rec)
        if lane.folds:
            fold_pack(run, pack_id, pack_id)
            write_lane_columnar(run, pack_id)
        return dict(rec)
