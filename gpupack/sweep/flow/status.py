"""Where a run stands (its records first, then the backend's queue), and clearing OOMs a user has dealt with."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

from omegaconf import OmegaConf

from gpupack.core.plan import Pack, Plan
from gpupack.core.store.claims import claims
from gpupack.core.store.journal import RunRecords
from gpupack.core.store.records import (
    COMPLETED,
    OOM,
    PRUNED,
    SKIPPED_MEMORY,
    TrainingRecord,
    read_json,
    write_json_atomic,
)
from gpupack.core.store.rundir import HeldLocks, RunDir
from gpupack.core.types import DONE, FAILED, PENDING, RUNNING
from gpupack.errors import RunDirError
from gpupack.search.progress import SearchProgress, read_progress
from gpupack.submit import SubmittedJob, load_submitter

if TYPE_CHECKING:  # the tables (pandas) are imported where the records are read: status needs none of them
    from gpupack.results.analysis.load import ClearedOom


@dataclass
class PackStatus:
    pack_id: str
    partition: str
    state: str  # pending | running | done | failed | stopped | submitted | not submitted | unknown
    done: int  # trainings with a completed record
    trainings: int
    job_id: str | None = None
    skipped: int = 0  # trainings skipped for memory that run nowhere else (their grid points ran at a smaller N)
    why: str | None = None  # why it was skipped for memory (its pack record's reason)
    refit: str | None = None  # where its trainings run instead, in words: at the largest N that fits


# A training's state, as a progress bar counts it; skipped for memory (not started: its pack's measured need passed
# the memory share, gpupack.core.memory.pack_fit) is neither failed nor left to run, and is said only where there is one
T_COMPLETED, T_FAILED, T_RUNNING, T_WAITING = "completed", "failed", "running", "waiting"
TRAINING_STATES = (T_COMPLETED, T_FAILED, T_RUNNING, T_WAITING)
T_SKIPPED = "skipped for memory"
T_PRUNED = "pruned"  # a search's trial its pruner stopped early: ended, neither failed nor left to run
SKIPPED = "skipped for memory"  # a pack's state: its trainings not started, for memory, and run nowhere else


@dataclass
class RunStatus:
    run_dir: Path
    sweep: str
    packs: list[PackStatus]
    queue_answered: bool = True
    trainings: dict[str, Counter[str]] = field(default_factory=dict)  # partition -> training state -> count
    started_at: float | None = None  # the first training's start, from the records
    ended_at: float | None = None  # the last training's end, once none is running or waiting
    last_end_at: float | None = None  # the last training's end so far
    search: SearchProgress | None = None  # search=optuna: its study's trials (its plan has no trainings to count)

    @property
    def stopped(self) -> bool:
        """Trainings (a search's trials) are left, and nothing of the run runs or is queued: it was stopped, and waits
        to be resumed; no rate says when it ends."""
        left = self.ended_at is None if self.search is None else not self.search.ended
        return left and bool(self.packs) and has_ended(self)

    @property
    def trainings_left(self) -> int:
        """Trainings running or waiting, every partition's."""
        return sum(c[T_RUNNING] + c[T_WAITING] for c in self.trainings.values())

    def counts(self) -> dict[str, Counter[str]]:
        out: dict[str, Counter[str]] = {}
        for p in self.packs:
            out.setdefault(p.partition, Counter())[p.state] += 1
        return out

    def elapsed_s(self, now: float) -> float | None:
        return None if self.started_at is None else (self.ended_at or now) - self.started_at

    def left_s(self, now: float) -> float | None:
        """What is left at the rate so far; None before any training ended, or where the run was :attr:`stopped`."""
        if self.stopped:
            return None
        total = sum(self.trainings.values(), Counter[str]())
        ended = total[T_COMPLETED] + total[T_FAILED] + total[T_PRUNED]
        return eta_s(self.elapsed_s(now), ended, total[T_RUNNING] + total[T_WAITING])


def eta_s(elapsed_s: float | None, ended: int, left: int) -> float | None:
    """Time left at the rate so far (elapsed / ended × left). Pure."""
    if left == 0:
        return 0.0
    if elapsed_s is None or ended == 0:
        return None
    return elapsed_s / ended * left


def training_state(record: Mapping[str, object] | None, started: bool, pack_state: str) -> str:
    """One training's state: its record's; without one, running only while its pack runs and its log exists. Pure."""
    if record is not None:
        said = record.get("status")
        return T_COMPLETED if said == COMPLETED else T_SKIPPED if said == SKIPPED_MEMORY else \
            T_PRUNED if said == PRUNED else T_FAILED
    return T_RUNNING if started and pack_state == RUNNING else T_WAITING


STOPPED = "stopped"  # started here and ended with no pack record (stopped or killed mid-run): resume it


def pack_status(pack: Pack, done: int, has_record: bool, job_id: str | None,
                states: Mapping[str, str] | None, started: bool = False, held: bool = False,
                sweep_held: bool = False, skipped: int = 0) -> str:
    """Where one pack stands, from its records first and the queue for the rest. Without job ids (local) the run
    directory tells it: ``started``, its folder exists; ``held``, a live packer holds the pack's lock; ``sweep_held``,
    a live sweep holds the run's. ``skipped``: its trainings skipped for memory that run nowhere else. Done only with
    its own record too: one whose record was lost is stopped once nothing runs it. Pure."""
    if done == len(pack.trainings) and has_record:
        return DONE
    if skipped and done + skipped == len(pack.trainings):
        return SKIPPED
    if job_id is None:
        if has_record:
            return FAILED
        if started:
            return RUNNING if held else STOPPED
        return PENDING if sweep_held else "not submitted"
    if states is None:
        return "unknown"
    queue = states.get(job_id)
    if queue == RUNNING and not started:  # its job runs the packs of a lane in turn, and this one's turn is to come
        return PENDING
    if queue == RUNNING and has_record:  # its lane went on to its next pack: this one ended with failures
        return FAILED
    if queue in (PENDING, RUNNING):
        return queue
    if queue is None:
        return FAILED if has_record else "submitted"  # sacct does not know it yet, or no longer
    if done == len(pack.trainings):  # every training ran, the job ended, and the pack's record is lost: resume it
        return STOPPED
    return FAILED  # the job ended (done or failed) and left trainings without a completed record


def status(run_dir: Path | str) -> RunStatus:
    """Where each pack of a run stands: from its records, and from the backend's queue for the rest."""
    run = RunDir(Path(run_dir))
    if not run.root.is_dir():
        raise RunDirError(f"RUN_DIR={str(run.root)!r}: not a directory. HINT: python -m gpupack status "
                          "runs/<sweep>/<date>_<time>")
    if not run.plan.exists():
        from gpupack.sweep.flow.collect import find_runs

        subs = [p for p in find_runs([run.root]) if p != run.root and RunDir(p).plan.exists()]
        if subs:  # packing.factors=auto (probe/nNN/, run/) or a Hydra multirun (.gpupack/launch_*): each one's packs
            return _merged(run, [status(p) for p in subs])
        raise RunDirError(f"RUN_DIR={str(run.root)!r} has no plan.json. HINT: give the directory a sweep printed")
    plan = Plan.from_json(read_json(run.plan))
    cfg = OmegaConf.load(run.config)
    backend = load_submitter(cfg.cluster.backend, cfg.cluster, run)
    jobs = backend.jobs()
    states = backend.pack_states([j["job_id"] for j in jobs.values()])
    records = RunRecords(run)  # a pack's folder, else its lane's journal
    # each training's record that says where it stands: a refit pack's where its plan pack was skipped for memory
    every = {p.pack_id: {t.training_id: records.current(p.pack_id, t.training_id) for t in p.trainings}
             for p in plan.packs}
    packs = _pack_states(run, plan, records, every, jobs, states)
    trainings, starts, ends = _training_states(run, plan, every, {s.pack_id: s.state for s in packs})
    last_end = max((e for e in ends if e), default=None)
    return RunStatus(run.root, plan.sweep, packs, queue_answered=states is not None, trainings=trainings,
                     started_at=min((s for s in starts if s), default=None),
                     ended_at=last_end if _all_ended(trainings) else None, last_end_at=last_end,
                     search=read_progress(run.study))


def _merged(run: RunDir, parts: list[RunStatus]) -> RunStatus:
    """One status of a folder of runs (an auto run's probe steps and run, a Hydra multirun's launches)."""
    merged: dict[str, Counter[str]] = {}
    for part in parts:
        for partition, c in part.trainings.items():
            merged.setdefault(partition, Counter()).update(c)
    return RunStatus(run.root, parts[0].sweep, [p for part in parts for p in part.packs],
                     queue_answered=all(part.queue_answered for part in parts), trainings=merged,
                     started_at=min((q.started_at for q in parts if q.started_at), default=None),
                     ended_at=max((q.ended_at for q in parts if q.ended_at), default=None)
                     if _all_ended(merged) else None,
                     last_end_at=max((q.last_end_at for q in parts if q.last_end_at), default=None),
                     search=next((q.search for q in parts if q.search is not None), None))


def _pack_states(run: RunDir, plan: Plan, records: RunRecords, every: Mapping[str, Mapping[str, TrainingRecord | None]],
                 jobs: Mapping[str, SubmittedJob], states: Mapping[str, str] | None) -> list[PackStatus]:
    """Each planned pack's state: from its records, its job's queue state, and this host's locks."""
    held = HeldLocks()  # this host's lock table, read once for the run and every pack
    sweep_held = held.holds(run.lock)
    packs = []
    for p in plan.packs:
        said = [(rec.get("status"), bool(rec.get("runs_in"))) for rec in every[p.pack_id].values() if rec]
        done = sum(status == COMPLETED for status, _ in said)
        skipped = said.count((SKIPPED_MEMORY, False))  # skipped for memory, run nowhere else (no refit pack named)
        # skipped for memory, to run in a refit pack that has not recorded it yet: the job that wrote the pack's record
        # (skipped) runs them now, or was cut off before: as a pack with no record yet (running, or to resume)
        to_refit = (SKIPPED_MEMORY, True) in said
        job = jobs.get(p.pack_id, {}).get("job_id")
        pack_rec = records.pack(p.pack_id)
        state = pack_status(p, done, pack_rec is not None and not to_refit, job, states,
                            started=records.started(p.pack_id), held=held.holds(run.pack_lock(p.pack_id)),
                            sweep_held=sweep_held, skipped=skipped)
        why, refit = skipped_words(pack_rec)
        packs.append(PackStatus(p.pack_id, p.partition, state, done, len(p.trainings), job, skipped, why, refit))
    return packs


def _training_states(run: RunDir, plan: Plan, every: Mapping[str, Mapping[str, TrainingRecord | None]],
                     by_pack: Mapping[str, str]) -> tuple[dict[str, Counter[str]], list[float | None],
                                                          list[float | None]]:
    """Each training's state by partition (the lane that claimed it, else its pack, runs it), and the recorded starts
    and ends."""
    trainings: dict[str, Counter[str]] = {}
    starts: list[float | None] = []
    ends: list[float | None] = []
    # a streaming queue's claims, read once: who runs what
    queues = {stream: claims(run.claims(stream))
              for stream in dict.fromkeys(p.stream for p in plan.packs if p.stream is not None)}
    for p in plan.packs:
        held_by = queues.get(p.stream or "", {})
        for tid, rec in every[p.pack_id].items():
            claimed = held_by.get(tid, {})
            runs_in = rec.get("runs_in") if rec is not None and rec.get("status") == SKIPPED_MEMORY else None
            if runs_in:  # skipped for memory, to run in a refit pack that has not recorded it yet
                rec, claimed = None, {"lane": runs_in}
            if rec is not None and float(claimed.get("claimed_at") or 0) > float(rec.get("ended_at") or 0):
                rec = None  # claimed again since that record ended: a lane runs it again
            runner = str(claimed.get("lane") or p.pack_id)  # the lane running it (a claim), which logs
            started = any(run.log(where, tid, "out").exists()             # in its own folder where it folds
                          for where in dict.fromkeys((p.pack_id, runner)))
            state = by_pack.get(runner, by_pack[p.pack_id])
            trainings.setdefault(p.partition, Counter())[training_state(rec, started, state)] += 1
            if rec is not None:
                starts.append(float(rec.get("started_at") or 0) or None)
                ends.append(float(rec.get("ended_at") or 0) or None)
    return trainings, starts, ends


def skipped_words(pack_rec: Mapping[str, object] | None) -> tuple[str | None, str | None]:
    """Why a pack was skipped for memory (None: it was not), and where its trainings run instead (the refit packs its
    latest attempt's record names), in words. Pure."""
    if pack_rec is None or not pack_rec.get("skipped_memory"):
        return None, None
    refit = pack_rec.get("refit")  # {packs, n, why} as the job wrote it, or none
    said: Mapping[str, object] = refit if isinstance(refit, Mapping) else {}
    packs = said.get("packs")
    refits = [str(name) for name in packs] if isinstance(packs, list) else []
    if not refits:
        return str(pack_rec["skipped_memory"]), str(said.get("why")) if said.get("why") else None
    return str(pack_rec["skipped_memory"]), f"its trainings run at N={said.get('n')} in {len(refits)} pack(s) " \
        f"({', '.join(refits)})"


# A pack in one of these states may still run: a run is followed (``watch``) until none of its packs is.
MAY_RUN = (PENDING, RUNNING, "submitted", "unknown")


def has_ended(st: RunStatus) -> bool:
    """Nothing of the run may still run (a queue that did not answer leaves its packs unknown: no end on silence)."""
    return all(p.state not in MAY_RUN for p in st.packs)


def follow(run_dir: Path | str, every_s: float, sleep: Callable[[float], None] = time.sleep,
           look: Callable[[Path | str], RunStatus] | None = None) -> Iterator[RunStatus]:
    """The run's status (``look``: :func:`status`) every ``every_s`` seconds until it has ended, that one last.
    Reads only: nothing is submitted, nothing held open."""
    look = look or status
    while True:
        st = look(run_dir)
        yield st
        if has_ended(st):
            return
        sleep(every_s)


def _all_ended(trainings: Mapping[str, Counter[str]]) -> bool:
    """No training of any partition running or waiting: the run's end is its last training's."""
    return all(c[T_RUNNING] + c[T_WAITING] == 0 for c in trainings.values())


def clear_oom(run_dir: Path | str, *, partition: str | None = None, mode: str | None = None,
              factor: int | None = None) -> int:
    """Let N that ran out of memory count again (the user changed what made them: a smaller batch, another GPU).
    Nothing is deleted: RUN_DIR/cleared_oom.json says what was cleared and when. Returns how many OOM records."""
    run = RunDir(Path(run_dir))
    if not run.plan.exists():
        raise RunDirError(f"RUN_DIR={str(run.root)!r} has no plan.json. HINT: give the directory a sweep printed")
    from gpupack.results.analysis.load import cleared_mask, load_records, read_cleared

    records = load_records([run.root])
    t = records.trainings
    if t.empty:
        return 0
    entry: ClearedOom = {"partition": partition, "mode": mode, "factor": factor, "cleared_at": time.time()}
    # What this entry would clear that no earlier one did: the same rule collect applies (cleared_mask).
    match = (t["status"] == OOM) & ~cleared_mask(t, records.cleared) \
        & cleared_mask(t, [{**entry, "run_dir": str(run.root)}])
    if match.any():
        write_json_atomic(run.cleared_oom, {"cleared": read_cleared(run) + [entry]})
    return int(match.sum())
