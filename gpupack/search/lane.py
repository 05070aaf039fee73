"""A search's streaming lane (``search=optuna``): a stream lane whose freed slot asks the study for its next trial
instead of claiming a planned training. The training runs as any streamed one, in the one lane runner
(:func:`gpupack.job.lanes.run_lane`, given this kind by :func:`lane_kind`); the lane alone opens the study: it reports
its trials' curves (:class:`TrialCurve`), answers whether the pruner stops one, and tells each trial's end from its
record. At its start it tells what an earlier, dead run of itself never told, and takes the trials planned for it."""
from __future__ import annotations

import sys
import time
from collections import deque
from typing import Callable, Mapping

from gpupack.core.memory.admission import Candidate, LaneMemory, admit, expected_peak
from gpupack.core.plan import Pack, Plan, Training
from gpupack.core.store.claims import Claimant, claim, claims
from gpupack.core.store.journal import RunRecords
from gpupack.core.store.records import COMPLETED, VICTIM
from gpupack.core.store.records import PRUNED as PRUNED_STATUS
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.pack import WAIT, Curve, Wait
from gpupack.job.records import move_aside
from gpupack.job.stream import RECHECK_S, AdmissionInputs, Lane
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
    read_journal,
    search_left,
    trial_number,
    trial_training,
)

Record = dict[str, object]


def lane_kind(pack: Pack) -> type[Lane]:
    """The kind of lane a streaming pack is: a search's (its queue is the study) or a queue's."""
    return SearchLane if pack.search else Lane


class TrialCurve:
    """Trial ``number``'s curve, given to the study by its lane (:class:`gpupack.job.pack.Curve`)."""

    def __init__(self, study: Study, number: int, metric: str, pattern: str | None) -> None:
        self.study, self.number, self.metric, self.pattern = study, number, metric, pattern

    def report(self, step: int, value: float, prune: bool = True) -> bool:
        return self.study.report(self.number, step, value, prune=prune)


class SearchLane(Lane):
    """A lane whose freed slots ask the study (:meth:`next`) and tell it how each trial ended (:meth:`recorded`)."""

    def __init__(self, run: RunDir, plan: Plan, pack: Pack, holder: Claimant, settings: PackSettings,
                 clock: Callable[[], float] = time.time, started: float | None = None,
                 inputs: AdmissionInputs | None = None) -> None:
        super().__init__(run, plan, pack, holder, settings, clock=clock, started=started, inputs=inputs)
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
        if not self.planned and (waits := self._wait_for_memory()) is not None:
            return waits
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

    def _wait_for_memory(self) -> Wait | None:
        """WAIT where admission lets no freed slot start a trial expected to peak as this run's largest; else None."""
        if self.inputs is None:
            return None
        if self._looked is not None and self.clock() - self._looked < RECHECK_S:
            return WAIT  # nothing ended since the last look in vain, and it was a moment ago
        room = LaneMemory(self.inputs.free_mb(), self.inputs.budget_mb, sum(self._holding.values()), len(self._holding))
        if admit([Candidate("the next trial", self.expected_mb(None))], room, 0, 1).take is None:
            self._looked, self.waits = self.clock(), self.waits + 1
            return WAIT
        return None

    def expected_mb(self, training: Training | None) -> float | None:
        """A trial's expected peak (MB): the largest of this run's so far, else sweep.training_memory_mb, else None."""
        if self.inputs is None:
            return None
        peak = max(self._in_run.values(), default=None)
        figure = expected_peak(None, self.settings.training_memory_mb, peak)
        return None if figure is None else figure.mb

    def curve(self, training_id: str) -> Curve | None:
        """Its trial's curve: what its process reports, or what its program prints (search.intermediate)."""
        if (number := trial_number(training_id)) is None:
            return None
        return TrialCurve(self.study, number, self.head.search.metric, self.head.search.intermediate)

    # ---- what a search's lane changes of the one runner (gpupack.job.lanes.run_lane) ----

    def drained(self) -> bool:
        """The study has no trial left to ask or tell."""
        return not search_left(self.run.study)

    def ran_here(self, plan: Plan) -> list[tuple[str, str]]:
        """The trials this lane asked (its trials' records are kept in its own folder, their home)."""
        journal = read_journal(self.run.study)
        rows = journal.trials.values() if journal is not None else []
        return [(self.pack.pack_id, trial_training(self.head, row).training_id) for row in rows
                if row.lane == self.pack.pack_id]

    def resume(self) -> dict[str, object]:
        """Tell the trials an earlier run of this lane never told; take those planned for it unless out of time."""
        told = self.study.fail_dead(self.holder, lambda row: recorded_outcome(self.run, self.pack.pack_id, self.head,
                                                                              row))
        if told:
            print(f"gpupack: lane {self.pack.pack_id}: an earlier run of this lane died before telling trial(s) "
                  f"{', '.join(f'{n} ({s})' for n, s in told)}: told now, from their records where written, else "
                  "failed", file=sys.stderr)
        if self.out_of_time() is None:
            self.planned.extend(self.study.take_planned(self.holder))
        if self.planned:  # they start without Optuna; the lane's next ask needs it
            import_optuna_meanwhile()
        return {"failed_dead": [number for number, state in told if state == FAILED]}

    def keep(self) -> tuple[set[str], Mapping[str, str]]:
        return set(), {}  # its trials' claims name their lane: a dead run's are released

    def unclaimed(self) -> int:
        return len(claims(self.folder)) if self.stopped else 0

    def summary(self) -> dict[str, object]:
        return {"search_ended": self.search_ended}

    def judge(self, rec: dict[str, object]) -> dict[str, object]:
        """As a stream lane judges it; a trial its study was told pruned is recorded pruned, however it then ended."""
        rec = super().judge(rec)
        number = trial_number(str(rec["training_id"]))
        row = self.study.row(number) if number is not None and rec.get("status") != PRUNED_STATUS else None
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
    """How a trial ended by its training's record: complete with its metric's value, pruned, or failed with why."""
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
    """How a trial ended by the record its training wrote (None: none written, or one to run again)."""
    rec = RunRecords(run).training(pack_id, trial_training(head, row).training_id)
    if rec is None or rec.get("status") == VICTIM:
        return None
    return outcome_of(rec, head.search.metric)
