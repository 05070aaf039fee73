"""A pack's out-of-memory path in the job: a pack that would not fit skipped and refit at the largest N that fits
(:func:`memory_fit`, :func:`skip_of`), a neighbour's fault's victims marked (:func:`mark_victims`), and an OOM SLURM
tells after the job recorded (:func:`record_job_oom`). :class:`gpupack.job.body.PackAttempt` runs what these decide.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Sequence

from gpupack.core.memory.pack_fit import Fit, Refit, largest_fit, pack_fit
from gpupack.core.memory.victims import victims
from gpupack.core.plan import Pack, Plan, Training, refit_packs, run_at_smaller_n
from gpupack.core.store.journal import RunRecords, append_records, lane_trainings
from gpupack.core.store.records import (
    KILLED,
    RefitNote,
    TrainingRecord,
    read_json,
    read_training,
    write_json_atomic,
)
from gpupack.core.store.rundir import PROBE, RunDir
from gpupack.core.types import PackSettings
from gpupack.job.peaks import PeakBook, budget_of
from gpupack.job.records import as_oom, as_victim, lost_training_record


def memory_fit(book: PeakBook, pack: Pack, todo: Sequence[Training], settings: PackSettings, on_gpu: bool,
               total_mb: float | None, records: RunRecords) -> Fit:
    """Whether ``todo`` fits its device's memory share as ``pack``, by what its settings were measured to need."""
    fit = pack_fit(pack.factor, [book.figure(t, on_gpu, settings.training_memory_mb) for t in todo],
                   budget_of(settings, on_gpu, total_mb)) if settings.admission else Fit(True, "packing.admission=off")
    # an earlier attempt refit it and some ran there: the rest goes on so, never as a pack of N timing no N
    if fit.fits and len(todo) < len(pack.trainings) and records.refits(pack.pack_id):
        return Fit(False, f"{fit.why}; but earlier trainings of this pack ran at a smaller N (skipped for memory "
                   "then): the rest goes on so")
    return fit


@dataclass(frozen=True)
class Skip:
    """A pack skipped for memory (``why``): the N and refit packs its trainings run at instead (none: ``said`` why)."""

    why: str
    refit: Refit | None
    packs: Sequence[Pack]
    said: str

    def runs_in(self) -> dict[str, str]:
        return {t.training_id: r.pack_id for r in self.packs for t in r.trainings}

    def fields(self, todo: Sequence[Training]) -> dict[str, object]:
        said: RefitNote = {"n": self.refit.n if self.refit is not None else None, "why": self.said,
                "packs": [r.pack_id for r in self.packs]}
        return {"skipped_memory": self.why, "refit": said, "skipped_training_ids": [t.training_id for t in todo]}

    def line(self, pack_id: str) -> str:
        return (f"gpupack: pack {pack_id} not started, skipped for memory: {self.why}; "
                + (f"its trainings run at N={self.refit.n} ({len(self.packs)} pack(s))" if self.refit is not None
                   else self.said))


def skip_of(plan: Plan, pack: Pack, todo: Sequence[Training], fit: Fit, book: PeakBook, settings: PackSettings,
            on_gpu: bool, total_mb: float | None) -> Skip:
    """Where the trainings of ``pack``, which does not fit, run: at the largest smaller N that fits, in refit packs."""
    # grid points the plan runs at a smaller N, and a probe step (its climb ends here): refitting adds nothing
    below = run_at_smaller_n(plan, pack)
    left = [] if plan.phase == PROBE else [t for t in todo if t.training_id not in below]
    refit = largest_fit([book.figure(t, on_gpu, settings.training_memory_mb) for t in left],
                        budget_of(settings, on_gpu, total_mb), pack.factor - 1) if left else None
    refits = refit_packs(pack, left, refit.n) if refit is not None else []
    said = refit.why if refit is not None else "a probe step: its climb ends at the skipped N" \
        if plan.phase == PROBE else f"its {len(below)} training(s)' grid points run at a smaller N in this plan"
    return Skip(fit.why, refit, refits, said)


def mark_victims(run: RunDir, pack: Pack, recs: Sequence[TrainingRecord]) -> dict[str, str]:
    """Record the trainings (``recs``) another's fault took down as victims; victim → the one that faulted."""
    taken = victims(recs)
    for rec in recs:
        if (culprit := taken.get(str(rec["training_id"]))) is not None:
            write_json_atomic(run.training_record(pack.pack_id, str(rec["training_id"])), as_victim(rec, culprit))
    return taken


def record_job_oom(run: RunDir, pack_id: str, since: float, why: str, records: RunRecords | None = None) -> list[str]:
    """The pack's job ran out of memory as SLURM tells it afterwards, maybe taking the packer with it: this attempt's
    (since ``since``) SIGKILLed trainings become oom, and one left with no record gets an oom record on the device a
    sibling's names. Returns the trainings it could not record (no sibling), for the caller to report."""
    plan = Plan.from_json(read_json(run.plan))
    pack = plan.pack(pack_id)
    if pack.stream is not None:
        return _record_lane_oom(run, plan, pack, since, why)
    records = records or RunRecords(run)
    lost = _record_pack_oom(run, plan, pack, since, why, records)
    for refit in refits_of(pack, records):  # the packs its trainings ran in, skipped for memory at its N: the job's
        if run.pack_dir(refit.pack_id).is_dir():  # too (one that never began has nothing SLURM could have killed)
            lost += _record_pack_oom(run, plan, refit, since, why, records)
    return lost


def refits_of(pack: Pack, records: RunRecords) -> list[Pack]:
    """The refit packs the job that skipped ``pack`` for memory ran its trainings in, as its records say."""
    said = (records.pack(pack.pack_id) or {}).get("refit")
    runs_in: dict[str, list[Training]] = {}
    for t in pack.trainings:  # each named pack holds the trainings whose record says it runs them, in the pack's order
        where = (records.training(pack.pack_id, t.training_id) or {}).get("runs_in")
        if where:
            runs_in.setdefault(str(where), []).append(t)
    names = (said.get("packs") if said else None) or []
    return [Pack(name, pack.partition, pack.mode, len(held), pack.trainings.index(held[0]), tuple(held),
                 loader_alone=pack.loader_alone) for name in names if (held := runs_in.get(name))]


def _record_pack_oom(run: RunDir, plan: Plan, pack: Pack, since: float, why: str, records: RunRecords) -> list[str]:
    """:func:`record_job_oom` for one whole pack of the plan, or a refit pack of one."""
    pack_id = pack.pack_id
    if not run.pack_dir(pack_id).is_dir() and records.pack(pack_id) is not None:
        return []  # a pack its lane ran to its end and folded before the job was killed: none of its trainings was
    ours: dict[str, TrainingRecord] = {}
    lost: list[Training] = []
    for t in pack.trainings:
        rec = read_training(run.training_record(pack_id, t.training_id))
        if rec is None:
            lost.append(t)
        elif float(rec.get("started_at") or 0) >= since:
            ours[t.training_id] = rec
    for tid, rec in ours.items():
        if rec.get("status") == KILLED and rec.get("signal") == signal.SIGKILL:
            write_json_atomic(run.training_record(pack_id, tid), as_oom(rec, why))
    sibling = next(iter(ours.values()), None)
    if sibling is None:
        return [t.training_id for t in lost]
    for t in lost:
        rec = lost_training_record(t, pack, plan, sibling, why)
        write_json_atomic(run.training_record(pack_id, t.training_id), rec)
    return []


def _record_lane_oom(run: RunDir, plan: Plan, pack: Pack, since: float, why: str) -> list[str]:
    """record_job_oom for a streaming lane: its SIGKILLed trainings' records of this attempt (in a folder, or amended
    in its journal by a later line) become oom. One with no record is left to its claim, run again next time."""
    def ours(rec: TrainingRecord | None) -> bool:
        return (rec is not None and rec.get("pack_id") == pack.pack_id and float(rec.get("started_at") or 0) >= since
                and rec.get("status") == KILLED and rec.get("signal") == signal.SIGKILL)

    for home, t in plan.queue(pack.stream or ""):  # its home's folder, or the lane's own where the lane folds
        for path in dict.fromkeys((run.training_record(home.pack_id, t.training_id),
                                   run.training_record(pack.pack_id, t.training_id))):
            rec = read_training(path)
            if ours(rec):
                write_json_atomic(path, as_oom(rec or {}, why))
    folded = [as_oom(rec, why) for rec in lane_trainings(run, pack.pack_id).values() if ours(rec)]
    if folded:
        append_records(run, pack.pack_id, folded)
    return []
