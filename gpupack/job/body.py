"""The job body: what runs inside one submitted job, on whatever backend submitted it.

It reads the plan, skips trainings that already have a completed record (resume), asks the pack's mode
to run the rest at once on the job's device, and writes one training record per training and one pack
record, all atomically. Earlier non-completed records are moved to ``attempts/`` first, never overwritten.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from gpupack.core.columnar import write_columnar
from gpupack.core.journal import Folded, RunRecords, append_records, lane_trainings
from gpupack.core.memory import MemoryShare, memory_share, memory_shares
from gpupack.core.pack_fit import Fit
from gpupack.core.placement import Placement
from gpupack.core.plan import Pack, Plan, Training, refit_packs, refit_parent, run_at_smaller_n
from gpupack.core.records import (
    COMPLETED,
    FAILED,
    KILLED,
    OOM,
    SKIPPED_MEMORY,
    TIMEOUT,
    VICTIM,
    file_mode,
    make_dirs,
    pack_record,
    read_json,
    read_json_or_none,
    training_record,
    write_json_atomic,
)
from gpupack.core.rgu import model_from_device_name
from gpupack.core.rundir import PROBE, Holder, RunDir, holder_line
from gpupack.core.types import PackSettings, TrainingOutcome
from gpupack.core.victims import victims
from gpupack.errors import RunDirError
from gpupack.job.fit import PeakBook, check_pack, refit_n
from gpupack.pack import LaneShare, PackContext, Packer, Stream, load_packer, threads_for, work_prefix
from gpupack.runtime.jobenv import JobEnvironment, job_cores
from gpupack.runtime.monitor import DeviceInfo, detect_device, first_visible, visible_devices
from gpupack.runtime.sampler import Sampler
from gpupack.spread import Strategy, load_strategy


def choose_device(preference: str, info: DeviceInfo) -> str:
    if preference == "auto":
        return "cuda" if info.kind == "gpu" else "cpu"
    return preference


# How frameworks say "out of memory" (torch CPU/CUDA, TF, Python, C++), in a training's stderr tail.
OOM_PATTERNS = re.compile(
    r"CUDA out of memory|OutOfMemoryError|out of memory|MemoryError|can't allocate memory|ResourceExhausted"
    r"|OOM when allocating|std::bad_alloc|Cannot allocate memory", re.IGNORECASE)


# ---------------- out of memory, as the kernel or SLURM's cgroup says it ----------------

CGROUP_ROOT = Path("/sys/fs/cgroup")
OOM_KILLED_BY = "oom_killed_by"  # in a training's record: what says a SIGKILL was for memory


def memory_events_path(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> Path | None:
    """The file where this process's cgroup counts OOM kills: cgroup v2 ``memory.events``, else v1
    ``memory.oom_control`` (both have an ``oom_kill N`` line); None where neither is readable. The trainings live in
    their packer's cgroup, so a kill of one by the kernel (host memory) or by SLURM's cgroup (the job's limit) counts
    here. The test seam for OOM detection: tests point it at a file of their own."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    candidates: list[Path] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.strip().lstrip("/")
        if controllers == "":  # v2; on a hybrid host its tree is mounted at unified/
            candidates += [root / rel / "memory.events", root / "unified" / rel / "memory.events"]
        elif "memory" in controllers.split(","):  # v1; in a container without a cgroup namespace, its own
            candidates += [root / "memory" / rel / "memory.oom_control", root / "memory" / "memory.oom_control"]
    return next((c for c in candidates if c.is_file()), None)


def oom_kill_count(path: Path | None = None) -> int | None:
    """The ``oom_kill`` counter of ``path`` (default: :func:`memory_events_path`); None where it cannot be read."""
    path = memory_events_path() if path is None else path
    if path is None:
        return None
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def note_oom_kill(outcome: TrainingOutcome, oom_kills_before: int | None) -> None:
    """A training that died by SIGKILL while its cgroup's oom_kill counter rose (since the pack started) was killed
    for memory, not by a person or a scheduler: mark its outcome so that :func:`status_of` records it as oom and its
    N becomes infeasible. Without a readable counter it stays killed."""
    if outcome.signal != signal.SIGKILL or oom_kills_before is None or outcome.extra.get("timed_out"):
        return
    now = oom_kill_count()
    if now is None or now <= oom_kills_before:
        return
    outcome.extra[OOM_KILLED_BY] = f"cgroup: {now - oom_kills_before} OOM kill(s) counted while the pack ran"
    why = f"killed by the out-of-memory killer ({outcome.extra[OOM_KILLED_BY]})"
    outcome.error = f"{outcome.error}\n{why}" if outcome.error else why


def record_job_oom(run: RunDir, pack_id: str, since: float, why: str, records: RunRecords | None = None) -> list[str]:
    """The pack's job ran out of memory as SLURM tells it afterwards (sacct OUT_OF_MEMORY, slurmstepd's oom-kill line),
    maybe taking the packer with it. Records of this attempt (started since ``since``) of trainings that died by
    SIGKILL become oom; a training left with no record at all (its packer was killed first) gets an oom record on
    the device a sibling's record of this attempt names. The packer writes every other record; here SLURM is the only
    witness left. Returns the trainings it could not record (no sibling to say the device), for the caller to report.
    ``records``: the run's records as the caller holds them (a lane's job asks once for all its packs), else read."""
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
    """The refit packs (:func:`gpupack.core.plan.refit_packs`) in which the job that skipped ``pack`` for memory ran
    its trainings, as its pack record and its trainings' records say (``refit``, ``runs_in``); none where it was not
    skipped, or where its trainings' grid points ran at a smaller N."""
    said = (records.pack(pack.pack_id) or {}).get("refit") or {}
    runs_in: dict[str, list[Training]] = {}
    for t in pack.trainings:  # each named pack holds the trainings whose record says it runs them, in the pack's order
        where = (records.training(pack.pack_id, t.training_id) or {}).get("runs_in")
        if where:
            runs_in.setdefault(str(where), []).append(t)
    return [Pack(name, pack.partition, pack.mode, len(held), pack.trainings.index(held[0]), tuple(held),
                 probe=pack.probe) for name in said.get("packs") or [] if (held := runs_in.get(name))]


def _record_pack_oom(run: RunDir, plan: Plan, pack: Pack, since: float, why: str, records: RunRecords) -> list[str]:
    """:func:`record_job_oom` for one whole pack of the plan, or a refit pack of one."""
    pack_id = pack.pack_id
    if not run.pack_dir(pack_id).is_dir() and records.pack(pack_id) is not None:
        return []  # a pack its lane ran to its end and folded before the job was killed: none of its trainings was
    ours: dict[str, dict[str, Any]] = {}
    lost: list[Training] = []
    for t in pack.trainings:
        rec = read_json_or_none(run.training_record(pack_id, t.training_id))
        if rec is None:
            lost.append(t)
        elif float(rec.get("started_at") or 0) >= since:
            ours[t.training_id] = rec
    for tid, rec in ours.items():
        if rec.get("status") == KILLED and rec.get("signal") == signal.SIGKILL:
            error = f"{rec['error']}\n{why}" if rec.get("error") else why
            write_json_atomic(run.training_record(pack_id, tid), {**rec, "status": OOM, OOM_KILLED_BY: why,
                                                                  "error": error})
    sibling = next(iter(ours.values()), None)
    if sibling is None:
        return [t.training_id for t in lost]
    info = DeviceInfo(kind="cpu" if sibling.get("gpu_type") == "cpu" else "gpu", name=str(sibling.get("device_name")))
    for t in lost:
        outcome = TrainingOutcome(t.training_id, float(sibling["started_at"]), time.time(), None, signal.SIGKILL, why,
                                  extra={OOM_KILLED_BY: why})
        rec = build_training_record(outcome, t, pack, plan.sweep, info, str(sibling.get("device")),
                                    int(sibling.get("threads") or 1), int(sibling.get("concurrent") or pack.factor),
                                    sibling.get("gpu_model"))
        rec["host"] = sibling.get("host")  # where it ran, not this submitting host
        if plan.phase:
            rec["phase"] = plan.phase
        if refit_parent(pack_id) is not None:  # as the refit pack's own records say (run_refits)
            rec["refit_of"] = refit_parent(pack_id)
        write_json_atomic(run.training_record(pack_id, t.training_id), rec)
    return []


def _record_lane_oom(run: RunDir, plan: Plan, pack: Pack, since: float, why: str) -> list[str]:
    """record_job_oom for a streaming lane: the records this lane wrote in this attempt (in a folder, or folded into
    its journal: amended there by a later line) of trainings SIGKILLed become oom. A training it held with no record
    is left to its claim: the lane's next run releases it and runs it again."""
    def ours(rec: Mapping[str, Any] | None) -> bool:
        return (rec is not None and rec.get("pack_id") == pack.pack_id and float(rec.get("started_at") or 0) >= since
                and rec.get("status") == KILLED and rec.get("signal") == signal.SIGKILL)

    def as_oom(rec: Mapping[str, Any]) -> dict[str, Any]:
        error = f"{rec['error']}\n{why}" if rec.get("error") else why
        return {**rec, "status": OOM, OOM_KILLED_BY: why, "error": error}

    for home, t in plan.queue(pack.stream or ""):  # its home's folder, or the lane's own where the lane folds
        for path in dict.fromkeys((run.training_record(home.pack_id, t.training_id),
                                   run.training_record(pack.pack_id, t.training_id))):
            rec = read_json_or_none(path)
            if ours(rec):
                write_json_atomic(path, as_oom(rec or {}))
    folded = [as_oom(rec) for rec in lane_trainings(run, pack.pack_id).values() if ours(rec)]
    if folded:
        append_records(run, pack.pack_id, folded)
    return []


def status_of(outcome: TrainingOutcome) -> str:
    if outcome.extra.get("timed_out"):
        return TIMEOUT
    if outcome.result is None and outcome.error and OOM_PATTERNS.search(outcome.error):
        return OOM
    if outcome.extra.get(OOM_KILLED_BY):  # SIGKILLed by the kernel or SLURM's cgroup (note_oom_kill, record_job_oom)
        return OOM
    if outcome.signal is not None:
        return KILLED
    if outcome.exit_code not in (0, None) or outcome.result is None:
        return FAILED
    return COMPLETED


def move_aside(run: RunDir, pack_id: str, path: Path) -> None:
    """Keep an earlier attempt's record of the pack: move it under attempts/<k>/ instead of overwriting it."""
    if not path.exists():
        return
    k = 1
    while run.attempt_record(pack_id, k, path).exists():
        k += 1
    target = run.attempt_record(pack_id, k, path)
    make_dirs(target.parent)
    os.replace(path, target)


def gpu_model(info: DeviceInfo, settings: PackSettings) -> str | None:
    return model_from_device_name(info.name) if info.kind == "gpu" else settings.gpu_model


def build_training_record(outcome: TrainingOutcome, training: Training, pack: Pack, sweep: str,
                          device: DeviceInfo, ctx_device: str, threads: int, concurrent: int,
                          model: str | None = None) -> dict[str, Any]:
    result = outcome.result or {}
    return training_record(
        sweep=sweep, pack_id=pack.pack_id, training_id=training.training_id, workload=training.workload_label,
        params=dict(training.params), grid_index=training.grid_index, reseed=training.reseed, repeat=training.repeat,
        mode=pack.mode, factor=pack.factor, partition=pack.partition, concurrent=concurrent, probe=pack.probe,
        gpu_type=device.name if device.kind == "gpu" else "cpu", device=ctx_device, device_name=device.name,
        gpu_model=model, threads=threads, status=status_of(outcome), exit_code=outcome.exit_code, signal=outcome.signal,
        error=outcome.error, started_at=outcome.started_at, ended_at=outcome.ended_at,
        wall_s=outcome.ended_at - outcome.started_at,
        timings=result.get("timings"), throughput=result.get("throughput"), metrics=result.get("metrics"),
        memory=result.get("memory"), knobs=result.get("knobs"), loader_setting=result.get("loader_setting"),
        data=result.get("data"), host=socket.gethostname(), **spread_fields(pack, result), **order_fields(pack),
        **outcome.extra,
    )


def order_fields(pack: Pack) -> dict[str, Any]:
    """Where the pack stands in the run's order (gpupack.core.plan.in_rounds): its round, or the pack it repeats at
    the end as a drift check; nothing for a pack without (a lane, a probe, a plan written before rounds)."""
    return {k: v for k, v in (("round", pack.round), ("reference_of", pack.reference_of)) if v is not None}


def spread_fields(pack: Pack, result: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A spread pack's record fields: k devices, the strategy, and what it measured (all-reduce bytes per step, ...).
    Nothing for a packing pack, whose records stay as they were."""
    if pack.spread is None:
        return {}
    return {"devices": pack.devices, "strategy": pack.spread, "spread": (result or {}).get("spread")}


@contextlib.contextmanager
def pack_lock(run: RunDir, pack_id: str) -> Iterator[None]:
    """Hold ``packs/<pack_id>/.lock`` (flock) while the pack runs, so that a second packer of the same pack (a job
    submitted twice, a resume while the first still runs) stops before it moves or writes any record. The kernel
    drops the lock when its holder dies (scancel, OOM), so a stale lock never blocks a resume."""
    path = run.pack_lock(pack_id)
    make_dirs(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, file_mode())
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Holder.parse(os.pread(fd, 4096, 0).decode(errors="replace"))
            said = holder.said() if holder is not None else f"pid unknown on {socket.gethostname()}"
            raise RunDirError(f"pack {pack_id!r} of run_dir={str(run.root)!r} is already being run by another packer "
                              f"({said} holds {path}); this one stopped and touched "
                              f"none of its records. HINT: let the first finish (python -m gpupack status {run.root}), "
                              "or cancel its job before running the pack again") from None
        except OSError as err:  # a file system without flock (Lustre without -o flock): run unlocked, as RunLock does
            print(f"gpupack: warning: cannot lock {path} ({err.strerror}); do not run this pack twice at once",
                  file=sys.stderr)
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder_line().encode(), 0)
        yield
    finally:
        os.close(fd)


def run_pack(run_root: str, pack_id: str, settings: PackSettings, job: JobEnvironment | None = None,
             plan: Plan | None = None, records: RunRecords | None = None,
             share: LaneShare | None = None, peaks: PeakBook | None = None) -> dict[str, Any]:
    """Run one pack in this job. ``job``: the job as its backend tells it (Submitter.job_environment); None (a pack run
    outside any backend): this process (:meth:`JobEnvironment.here`). ``plan``: the run's, as the caller read it
    (None: read here). ``records``: the run's records as a lane read them at its start (its journals: a pack a lane
    folded is complete without a folder); None: the pack's folder alone. ``share``: what the lane's packs on this
    device share (a fork server); None: the pack starts its own. ``peaks``: what the pack is held against before it
    starts (a lane's, learnt as its packs end); None: read here."""
    run = RunDir(Path(run_root))
    with pack_lock(run, pack_id):
        return _run_pack(run, plan or Plan.from_json(read_json(run.plan)), pack_id, settings,
                         job or JobEnvironment.here(), records or RunRecords(run, Folded()), share, peaks)


def _run_pack(run: RunDir, plan: Plan, pack_id: str, settings: PackSettings, job: JobEnvironment,
              records: RunRecords, share: LaneShare | None, peaks: PeakBook | None = None) -> dict[str, Any]:
    pack = plan.pack(pack_id)
    # a training a refit pack of this one completed (it was skipped for memory before) ran: never run again
    todo = [t for t in pack.trainings if not records.ran(pack_id, t.training_id)]
    if not todo:  # nothing to run: its record, or, lost, one rebuilt from its trainings'
        return records.pack(pack_id) or read_json_or_none(run.pack_record(pack_id)) \
            or rebuild_pack_record(run, plan, pack, records) or read_json(run.pack_record(pack_id))
    for t in todo:
        move_aside(run, pack_id, run.training_record(pack_id, t.training_id))
    move_aside(run, pack_id, run.pack_record(pack_id))

    book = peaks if peaks is not None or not settings.admission or pack.spread is not None \
        else PeakBook(run, pack.trainings)
    if book is not None and pack.spread is None:  # a spread pack is one training: nothing to pack
        book.refresh()  # what lanes running beside this one measured since
        skipped = skip_for_memory(run, plan, pack, todo, settings, job, book, records, share)
        if skipped is not None:
            return skipped
    return run_measured(run, plan, pack, todo, settings, job, share, book)


def run_measured(run: RunDir, plan: Plan, pack: Pack, todo: Sequence[Training], settings: PackSettings,
                 job: JobEnvironment, share: LaneShare | None, book: PeakBook | None,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run ``todo`` as ``pack`` (:func:`execute`), teach ``book`` what they peaked at, and run the victims of
    another's fault again, once; the pack record. ``extra``: more fields of the pack's and its trainings' records."""
    rec = execute(run, plan, pack, todo, settings, job, share=share, extra=extra, fields=extra, book=book)
    if book is not None:
        learn(run, pack, rec, book)
    # victims where each training is a process of its own (a mode that can stream): one that dies alone can only
    # take its neighbours down through the device; a host process's trainings die as one, a spread training is one
    separate = pack.spread is None and load_packer(pack.mode).streams
    taken = mark_victims(run, pack, rec) if separate else {}
    if not taken:
        return rec
    # Run them again, once, in a fresh start of the mode (a new MPS daemon): their records and this attempt's pack
    # record (its N trainings' timing) are kept as an earlier attempt
    for tid in taken:
        move_aside(run, pack.pack_id, run.training_record(pack.pack_id, tid))
    move_aside(run, pack.pack_id, run.pack_record(pack.pack_id))
    again = [t for t in pack.trainings if t.training_id in taken]
    return execute(run, plan, pack, again, settings, job, share=share, extra={**(extra or {}), "victims_rerun": taken},
                   fields=extra, book=book)


def skip_for_memory(run: RunDir, plan: Plan, pack: Pack, todo: Sequence[Training], settings: PackSettings,
                    job: JobEnvironment, book: PeakBook, records: RunRecords,
                    share: LaneShare | None) -> dict[str, Any] | None:
    """Hold the pack against its device's memory share by what its settings were measured to need
    (:func:`gpupack.job.fit.check_pack`); where it does not fit, record its trainings and itself as skipped for memory
    with the reason (its N infeasible), run its trainings at the largest N that fits (:func:`run_refits`), and return
    its record (None: it fits, and runs)."""
    info = detect_device(job.device_env())
    device = choose_device(settings.device, info)
    fit = check_pack(book, todo, pack.factor, settings, device == "cuda", info.memory_total_mb)
    # an earlier attempt refit it and some ran there (only then is the todo short of the pack): the rest goes on so,
    # never as a pack of N whose timing is no N's
    if fit.fits and len(todo) < len(pack.trainings) and records.refits(pack.pack_id):
        fit = Fit(False, f"{fit.why}; but earlier trainings of this pack ran at a smaller N (skipped for memory "
                  "then): the rest goes on so")
    if fit.fits:
        return None
    # a measurement sweep that runs these grid points at a smaller N has them measured there, and a probe step's climb
    # ends at the skipped N (its verdict): refitting adds nothing
    below = run_at_smaller_n(plan, pack)
    left = [] if plan.phase == PROBE else [t for t in todo if t.training_id not in below]
    refit = refit_n(book, left, settings, device == "cuda", info.memory_total_mb, pack.factor - 1) if left else None
    refits = refit_packs(pack, left, refit.n) if refit is not None else []
    runs_in = {t.training_id: r.pack_id for r in refits for t in r.trainings}
    now = time.time()
    for t in todo:
        outcome = TrainingOutcome(t.training_id, now, now, None, error=f"skipped for memory: {fit.why}")
        rec = build_training_record(outcome, t, pack, plan.sweep, info, device, 0, pack.factor,
                                    gpu_model(info, settings))
        rec.update(status=SKIPPED_MEMORY, skipped_memory=fit.why)
        rec["runs_in"] = runs_in.get(t.training_id)  # the refit pack that runs it; None: its point ran at a smaller N
        if plan.phase:
            rec["phase"] = plan.phase
        write_json_atomic(run.training_record(pack.pack_id, t.training_id), rec)
    why = refit.why if refit is not None else "a probe step: its climb ends at the skipped N" \
        if plan.phase == PROBE else f"its {len(below)} training(s)' grid points run at a smaller N in this plan"
    said = {"n": refit.n if refit is not None else None, "why": why, "packs": [r.pack_id for r in refits]}
    print(f"gpupack: pack {pack.pack_id} not started, skipped for memory: {fit.why}; "
          + (f"its trainings run at N={refit.n} ({len(refits)} pack(s))" if refit is not None else why),
          file=sys.stderr)
    rec = write_pack_record(run, pack, [], info, device, job_cores(), 0, gpu_model(info, settings), phase=plan.phase,
                            job=job, extra={"skipped_memory": fit.why, "refit": said,
                                            "skipped_training_ids": [t.training_id for t in todo]})
    run_refits(run, plan, pack, refits, settings, job, book, records, share)
    return rec


def run_refits(run: RunDir, plan: Plan, pack: Pack, refits: Sequence[Pack], settings: PackSettings,
               job: JobEnvironment, book: PeakBook, records: RunRecords, share: LaneShare | None) -> None:
    """Run the refit packs of ``pack`` (skipped for memory) one after another, each measured and recorded as a pack
    of its own at its N (:func:`run_measured`), under ``pack``'s lock (held by the caller). A training an earlier
    refit of ``pack`` left unfinished (a killed job, another N) has that record moved aside as an earlier attempt:
    the refit that runs it now holds its current one."""
    for refit in refits:
        with pack_lock(run, refit.pack_id):
            for t in refit.trainings:
                for earlier in records.refits(pack.pack_id):
                    if earlier != refit.pack_id:
                        move_aside(run, earlier, run.training_record(earlier, t.training_id))
                move_aside(run, refit.pack_id, run.training_record(refit.pack_id, t.training_id))
            move_aside(run, refit.pack_id, run.pack_record(refit.pack_id))
            run_measured(run, plan, refit, refit.trainings, settings, job, share, book,
                         extra={"refit_of": pack.pack_id})


def learn(run: RunDir, pack: Pack, pack_rec: Mapping[str, Any], book: PeakBook) -> None:
    """What the pack's trainings peaked at, for the next packs of their settings (read before a lane folds them)."""
    recs = [r for tid in pack_rec.get("training_ids", [])
            if (r := read_json_or_none(run.training_record(pack.pack_id, str(tid)))) is not None]
    book.learn({t.training_id: t for t in pack.trainings}, recs)


def mark_victims(run: RunDir, pack: Pack, pack_rec: Mapping[str, Any]) -> dict[str, str]:
    """Record the trainings of this attempt that another's fault took down (gpupack.core.victims) as ``victim``, with
    ``victim_of`` and ``died_as``; victim → the training that faulted."""
    recs = [r for tid in pack_rec.get("training_ids", [])
            if (r := read_json_or_none(run.training_record(pack.pack_id, str(tid)))) is not None]
    taken = victims(recs)
    for rec in recs:
        culprit = taken.get(str(rec["training_id"]))
        if culprit is not None:
            write_json_atomic(run.training_record(pack.pack_id, str(rec["training_id"])),
                              {**rec, "status": VICTIM, "victim_of": culprit, "died_as": rec.get("status")})
    return taken


def execute(run: RunDir, plan: Plan, pack: Pack, todo: Sequence[Training], settings: PackSettings,
            job: JobEnvironment, stream: Stream | None = None,
            extra: Mapping[str, Any] | None = None, share: LaneShare | None = None,
            fields: Mapping[str, Any] | None = None, book: PeakBook | None = None) -> dict[str, Any]:
    """Run ``todo`` on this job's device with the pack's mode or strategy, write a training record as each ends and
    the pack record at the end. A streaming lane (``stream``) starts ``todo`` in its N slots and refills them from
    the stream (which says where each streamed training's records live); ``extra``: more pack record fields;
    ``fields``: more fields of each training's record (a refit pack's ``refit_of``); ``book``: the peaks each
    training's share of the GPU is sized by (:func:`own_shares`; None: read here where it is needed)."""
    env = job.device_env()  # the job's GPUs: one of them, in a job of several GPUs (JobEnvironment.on_gpu)
    info = detect_device(env)
    device = choose_device(settings.device, info)
    runner, placement = runner_of(pack, device)
    cores = job_cores()
    concurrent = pack.factor if stream is not None else len(todo)  # a lane's slots, else the trainings at once
    threads = threads_for(cores, concurrent, settings.threads_per_training)
    by_id = {t.training_id: t for t in (stream.queue if stream is not None else todo)}
    records: list[dict[str, Any]] = []
    oom_kills_before = oom_kill_count()  # a rise by a training's end tells an OOM kill from any other SIGKILL

    def on_finished(outcome: TrainingOutcome) -> None:
        note_oom_kill(outcome, oom_kills_before)
        rec = build_training_record(outcome, by_id[outcome.training_id], pack, plan.sweep, info, device, threads,
                                    concurrent, gpu_model(info, settings))
        if plan.phase:  # packing.factors=auto: a probe's record, or the run's at the best N
            rec["phase"] = plan.phase
        rec.update(fields or {})
        rec["cuda_visible_devices"] = env.get("CUDA_VISIBLE_DEVICES")  # the GPUs it was given
        fill_memory(rec, sampler.figures(outcome.training_id))
        share_hint(rec)
        tid = outcome.training_id
        if stream is not None:  # which lane, slot and job ran it, and its share of the plan (its home)
            stream.ended(tid, outcome.ended_at - outcome.started_at)
            rec.update(stream=pack.stream, lane=pack.index, job_id=job.job_id, home=stream.home(tid))
            rec = stream.judge(rec)
        write_json_atomic(run.training_record(stream.where(tid) if stream is not None else pack.pack_id, tid), rec)
        records.append(rec)
        if stream is not None:
            stream.recorded(tid)

    # the sampler lists MPS clients then
    mps = isinstance(runner, Packer) and runner.watches_mps(settings)
    # A training spread over k GPUs: the job's other k-1 sampled with the first (rank r trains on cuda:r)
    more = visible_devices(env, pack.devices)[1:] if info.kind == "gpu" and pack.devices > 1 else []
    sampler = Sampler(interval_s=settings.sample_interval_s, mps=mps, no_gpu_reason=info.note,
                      gpu=(info.uuid or first_visible(env)) if info.kind == "gpu" else None, more_gpus=more)
    # specs and results in the job's node-local space (the scheduler's), not a file each on /project
    work_dir = tempfile.mkdtemp(prefix=work_prefix(pack.pack_id), dir=job.temp_dir())
    # the trainings inherit the job's environment, and its id as the backend names it (jobenv.job_id)
    # each training's share of the GPU, enforced in its process where the platform can (packing.memory_share)
    each = memory_share(settings.memory_share, info.memory_total_mb, pack.factor) \
        if device == "cuda" and placement is None else None
    own = own_shares(run, todo, settings, info, book) if each is not None and stream is None else {}
    ctx = PackContext(run=run, pack=pack, device=device, threads=threads, env=env, memory_share=each,
                      memory_shares=own,
                      settings=settings, gpu_memory_total_mb=info.memory_total_mb,
                      warmup_steps=settings.warmup_steps, on_finished=on_finished, on_started=sampler.register,
                      training_timeout_s=settings.training_timeout_s,
                      memory_limit_bytes=int(settings.memory_limit_gb_per_training * 2**30)
                      if settings.memory_limit_gb_per_training else None, spread=placement, stream=stream,
                      share=share, tmp_dir=job.temp_dir(), work_dir=work_dir)
    sampler.start()
    mode_started = time.time()  # what a mode does before its first training starts (a fork server's preload) is
    try:                        # set-up, recorded as such: the pack's wall counts from that start (write_pack_record)
        if todo:
            runner.run(todo, ctx)
    finally:
        sampled = sampler.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    billing = {"billing": dict(settings.billing)} if settings.billing else {}  # what the job asked, its bundle
    return write_pack_record(run, pack, records, info, device, cores, threads, gpu_model(info, settings), sampled,
                             mode_started=mode_started, phase=plan.phase, job=job, extra={**(extra or {}), **billing})


def own_shares(run: RunDir, todo: Sequence[Training], settings: PackSettings, info: DeviceInfo,
               book: PeakBook | None) -> dict[str, MemoryShare]:
    """Each of a whole pack's trainings' share of the GPU (:func:`gpupack.core.memory.memory_shares`): by what earlier
    records measured of its setting (``book``'s GPU peaks: this run's, else earlier runs'; read here where the pack
    has none), with ``settings.memory_margin``, else the equal split. A streaming lane's slots keep the equal split:
    which trainings share the GPU there changes as they are claimed."""
    book = book if book is not None else PeakBook(run, todo)
    peaks = [book.figure(t, on_gpu=True, stated_mb=None) for t in todo]
    shares = memory_shares(settings.memory_share, info.memory_total_mb, peaks, settings.memory_margin,
                           settings.training_memory_mb) or []
    return {t.training_id: s for t, s in zip(todo, shares)}


def share_hint(rec: dict[str, Any]) -> None:
    """A training that ran out of memory with a share of the GPU (packing.memory_share) says what its share was and
    what would give it more: the limit may be what it hit, not the device."""
    share = rec.get("memory_share")
    if rec.get("status") != OOM or not isinstance(share, Mapping):
        return
    source = share.get("source") or "packing.memory_fraction / N"
    rec["error"] = (f"{rec.get('error') or 'out of memory'}\nHINT: its share of the GPU was {share['mb']:.0f} MB "
                    f"({share['fraction']:.3g} of the device, packing.memory_share=on: {source}); "
                    "lower N, raise packing.memory_fraction or packing.memory_margin, "
                    "or set packing.memory_share=off")


def fill_memory(rec: dict[str, Any], sampled: Mapping[str, Any]) -> None:
    """A figure the training did not report itself (a program of the ``command`` workload reports no memory) is the
    sampler's, so the record says what the tables show; ``memory.from_sampler`` names those (sampled every
    ``packing.sample_interval_s``: a shorter peak can be missed)."""
    memory = dict(rec.get("memory") or {})  # None: a training that failed before reporting anything
    filled = [key for key in ("peak_rss_mb", "peak_gpu_mem_mb")
              if memory.get(key) is None and sampled.get(key) is not None]
    if filled:
        rec["memory"] = {"peak_rss_mb": None, "peak_gpu_mem_mb": None, **memory,
                         **{key: sampled[key] for key in filled}, "from_sampler": filled}


def slot_use(records: Sequence[Mapping[str, Any]], slots: int, started: float, ended: float) -> dict[str, Any]:
    """How busy the pack's N slots were: ``slot_occupancy`` = Σ training wall / (N × pack wall), and the idle gaps
    between one training's end and the next one's start in the same slot (a streaming lane's refills). Pure."""
    wall = ended - started
    busy = sum(float(r["ended_at"]) - float(r["started_at"]) for r in records)
    by_slot: dict[int, list[tuple[float, float]]] = {}
    for r in records:  # a mode whose trainings share one host process names no slots: no gaps to tell
        if r.get("slot") is not None:
            by_slot.setdefault(int(r["slot"]), []).append((float(r["started_at"]), float(r["ended_at"])))
    ordered = [sorted(spans) for spans in by_slot.values()]
    gaps = [b[0] - a[1] for spans in ordered for a, b in zip(spans, spans[1:])]
    return {"slots": slots, "busy_s": busy,
            "slot_occupancy": busy / (slots * wall) if wall > 0 and slots else None,
            "slot_gap_mean_s": sum(gaps) / len(gaps) if gaps else None,
            "slot_gap_max_s": max(gaps) if gaps else None}


REBUILT = ("its record was lost (its journal line torn by a writer killed mid-append, or its file never written): "
           "rebuilt from its trainings' records, without the sampler's figures or the set-up time")


def rebuilt_pack_record(pack: Pack, records: Sequence[Mapping[str, Any]], phase: str | None = None) -> dict[str, Any]:
    """The record of a pack whose every training has its record but whose own was lost (:data:`REBUILT`, said in it):
    what :func:`write_pack_record` would have said, from ``records``, those its trainings' current records that ran in
    it. Complete (a timing of N) only where N trainings ran together in one job, as each training's record says.
    Pure."""
    first = records[0] if records else {}
    started = min((float(r["started_at"]) for r in records), default=0.0)
    ended = max((float(r["ended_at"]) for r in records), default=started)
    together = len({(r.get("job_id"), r.get("concurrent")) for r in records}) == 1 \
        and first.get("concurrent") == pack.factor
    rec = pack_record(
        pack_id=pack.pack_id, mode=pack.mode, factor=pack.factor, partition=pack.partition, probe=pack.probe,
        **{k: first.get(k) for k in ("gpu_type", "device", "device_name", "gpu_model", "host", "job_id",
                                     "cuda_visible_devices")},
        concurrent=len(records), complete=len(records) == pack.factor and pack.stream is None and together,
        training_ids=[r["training_id"] for r in records],
        n_completed=sum(r.get("status") == COMPLETED for r in records),
        n_failed=sum(r.get("status") != COMPLETED for r in records),
        n_oom=sum(r.get("status") == OOM for r in records),
        started_at=started, ended_at=ended, wall_s=ended - started, written_at=time.time(),
        threads_per_training=first.get("threads"),
        workload=pack.trainings[0].workload_label if pack.trainings else None, sampler=None, rebuilt=REBUILT,
        **spread_fields(pack), **order_fields(pack), **slot_use(records, pack.factor, started, ended))
    if pack.stream is not None:  # a lane's: its queue, and nothing it left (every training has its record)
        rec.update(stream=pack.stream, lane=pack.index, claimed=rec["training_ids"], unclaimed=0)
    if phase:
        rec["phase"] = phase
    return rec


def rebuild_pack_record(run: RunDir, plan: Plan, pack: Pack, records: RunRecords) -> dict[str, Any] | None:
    """Write the rebuilt record (:func:`rebuilt_pack_record`) of ``pack``, whose trainings all have their record, into
    its folder, as its job would have at its end (a lane that folds folds it next); it says so on stderr. Its
    trainings: those of its queue (a streaming lane's: the ones it ran) or its own, whose current record ran in it;
    None where none did (a lane the others left nothing to: it runs, and writes its own record as ever)."""
    pairs = [(home.pack_id, t.training_id) for home, t in plan.queue(pack.stream)] if pack.stream is not None \
        else [(pack.pack_id, t.training_id) for t in pack.trainings]
    ran = [rec for home, tid in pairs if (rec := records.training(home, tid)) is not None
           and rec.get("pack_id") == pack.pack_id]
    if not ran:
        return None
    rec = rebuilt_pack_record(pack, ran, plan.phase)
    write_json_atomic(run.pack_record(pack.pack_id), rec)
    print(f"gpupack: warning: pack {pack.pack_id}: {REBUILT} ({len(ran)} training(s))", file=sys.stderr)
    return rec


def runner_of(pack: Pack, device: str) -> tuple[Packer | Strategy, Placement | None]:
    """What runs the pack: its packing mode (N trainings on one device), or its spread strategy (one training over
    k devices) with where that training runs."""
    if pack.spread is None:
        return load_packer(pack.mode), None
    strategy = load_strategy(pack.spread)
    return strategy, strategy.placement(pack.mode, pack.devices, device)


def write_pack_record(run: RunDir, pack: Pack, records: Sequence[dict[str, Any]], info: DeviceInfo,
                      device: str, cores: int, threads: int, model: str | None = None,
                      sampled: dict[str, Any] | None = None, mode_started: float | None = None,
                      phase: str | None = None, job: JobEnvironment | None = None,
                      extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write the pack record of this attempt. ``job``: as in :func:`run_pack`; ``extra``: more fields (a lane's).
    Its wall runs from its first training's start (a fresh interpreter's spawn, a fork, a host's spawn: each
    training's own start-up is inside) to its last one's end; what its mode did once before (``mode_started``: a
    fork server's preload, shared by a lane's packs or not) is its ``setup_s``, outside the wall as a job's start is."""
    fields = (job or JobEnvironment.here()).record_fields()
    first = min((float(r["started_at"]) for r in records), default=None)
    started = first if first is not None else (mode_started or time.time())
    ended = max([float(r["ended_at"]) for r in records], default=started)
    setup = {"setup_s": max(0.0, first - mode_started)} if first is not None and mode_started else {}
    slots = slot_use(records, pack.factor, started, ended)
    rec = pack_record(
        pack_id=pack.pack_id, mode=pack.mode, factor=pack.factor, partition=pack.partition, probe=pack.probe,
        gpu_type=info.name if info.kind == "gpu" else "cpu", device=device, device_name=info.name,
        device_note=info.note, gpu_model=model, gpu_memory_total_mb=info.memory_total_mb,
        # Time per training is only meaningful when all N trainings ran together in this attempt (a lane's N slots
        # ran whatever they claimed: it times the production run, not N).
        concurrent=len(records), complete=len(records) == pack.factor and pack.stream is None,
        training_ids=[r["training_id"] for r in records],
        n_completed=sum(r["status"] == COMPLETED for r in records),
        n_failed=sum(r["status"] != COMPLETED for r in records),
        n_oom=sum(r["status"] == OOM for r in records),
        started_at=started, ended_at=ended, wall_s=ended - started, written_at=time.time(),
        cores=cores, threads_per_training=threads, host=socket.gethostname(),
        workload=pack.trainings[0].workload_label if pack.trainings else None,
        # The job (its id, its GPUs), and what the scheduler gave it, to cross-check with sacct's gres/gpu.
        **fields,
        sampler=sampled, **spread_fields(pack), **order_fields(pack), **slots, **setup, **(extra or {}),
    )
    if phase:
        rec["phase"] = phase
    write_json_atomic(run.pack_record(pack.pack_id), rec)
    if pack.stream is not None:  # its trainings' records live in other lanes' folders too: collect reads the JSON
        return rec
    try:  # the pack's trainings in one columnar file: collect reads one file per pack, not one per training
        write_columnar(run, pack.pack_id)
    except Exception as err:  # only a faster copy: without it collect reads the JSON records, the same rows
        print(f"gpupack: warning: no columnar file for pack {pack.pack_id} ({err!r})", file=sys.stderr)
    return rec
