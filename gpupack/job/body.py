"""The job body: what runs inside one submitted job, on whatever backend submitted it.

It skips trainings that already have a completed record (resume), has the pack's mode run the rest at once on the
job's device, and writes one training record per training and one pack record, all atomically. Earlier records are
moved to ``attempts/`` first, never overwritten. One :class:`PackAttempt` holds what every step reads.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence, cast

from gpupack.core.jobenv import JobEnvironment, job_cores
from gpupack.core.memory.figures import MemoryShare, memory_share, memory_shares
from gpupack.core.monitor import DeviceInfo, detect_device, first_visible, visible_devices
from gpupack.core.placement import Placement
from gpupack.core.plan import Pack, Plan, Training
from gpupack.core.store.journal import Folded, RunRecords
from gpupack.core.store.locks import Hold, try_hold
from gpupack.core.store.records import (
    PackRecord,
    TrainingRecord,
    file_mode,
    make_dirs,
    read_json,
    read_training,
    write_json_atomic,
)
from gpupack.core.store.rundir import Holder, RunDir, holder_line
from gpupack.core.types import PackSettings, TrainingOutcome
from gpupack.errors import RunDirError
from gpupack.job.oom import mark_victims, memory_fit, skip_of
from gpupack.job.pack import LaneResources, PackContext, Packer, Stream, load_packer, threads_for, work_prefix
from gpupack.job.peaks import PeakBook, job_device
from gpupack.job.records import (
    OnDevice,
    finished_training_record,
    gpu_model,
    move_aside,
    rebuild_pack_record,
    skipped_training_record,
    write_pack_record,
)
from gpupack.job.runtime.oom import note_oom_kill, oom_kill_count
from gpupack.job.runtime.sampler import Sampler
from gpupack.job.spread import Strategy, load_strategy


def choose_device(preference: str, info: DeviceInfo) -> str:
    if preference == "auto":
        return "cuda" if info.kind == "gpu" else "cpu"
    return preference


@contextlib.contextmanager
def pack_lock(run: RunDir, pack_id: str) -> Iterator[None]:
    """Hold ``packs/<pack_id>/.lock`` (flock) while the pack runs: a second packer of it stops before it moves or
    writes any record. The kernel drops the lock when its holder dies, so a stale lock never blocks a resume."""
    path = run.pack_lock(pack_id)
    make_dirs(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, file_mode())
    try:
        if try_hold(fd, path, "do not run this pack twice at once") is Hold.BUSY:
            holder = Holder.parse(os.pread(fd, 4096, 0).decode(errors="replace"))
            said = holder.said() if holder is not None else f"pid unknown on {socket.gethostname()}"
            raise RunDirError(f"pack {pack_id!r} of run_dir={str(run.root)!r} is already being run by another packer "
                              f"({said} holds {path}); this one stopped and touched "
                              f"none of its records. HINT: let the first finish (python -m gpupack status {run.root}), "
                              "or cancel its job before running the pack again")
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder_line().encode(), 0)
        yield
    finally:
        os.close(fd)


def run_pack(run_root: str, pack_id: str, settings: PackSettings, job: JobEnvironment | None = None,
             plan: Plan | None = None, records: RunRecords | None = None,
             resources: LaneResources | None = None, peaks: PeakBook | None = None) -> PackRecord:
    """Run one pack in this job. ``job``: as its backend tells it (None: this process); ``plan``, ``records``: the
    run's as the caller read them (None: read here); ``resources``: what the lane's packs on this device share (a
    fork server); ``peaks``: what the pack is held against before it starts (a lane's; None: read here)."""
    run = RunDir(Path(run_root))
    with pack_lock(run, pack_id):
        attempt = PackAttempt(run, plan or Plan.from_json(read_json(run.plan)), settings, job or JobEnvironment.here(),
                              records or RunRecords(run, Folded()), resources, peaks)
        return attempt.run_pack(pack_id)


@dataclass
class PackAttempt:
    """One job's attempt at a pack, under its lock: what each step reads (:func:`run_pack`'s; ``book``: ``peaks``)."""

    run: RunDir
    plan: Plan
    settings: PackSettings
    job: JobEnvironment
    records: RunRecords
    resources: LaneResources | None = None
    book: PeakBook | None = None

    def run_pack(self, pack_id: str) -> PackRecord:
        """The pack's trainings that have not run, run, held against its device's memory first; its record."""
        run, pack = self.run, self.plan.pack(pack_id)
        # a training a refit pack of this one completed (it was skipped for memory before) ran: never run again
        todo = [t for t in pack.trainings if not self.records.ran(pack_id, t.training_id)]
        if not todo:  # nothing to run: its record (its folder's, else the journal's), or one rebuilt
            found = self.records.pack(pack_id) or rebuild_pack_record(run, self.plan, pack, self.records)
            if found is None:
                raise FileNotFoundError(f"{run.pack_record(pack_id)}: every training of pack {pack_id} has a record, "
                                        "but neither the pack's record nor one rebuilt from theirs could be read")
            return found
        for t in todo:
            move_aside(run, pack_id, run.training_record(pack_id, t.training_id))
        move_aside(run, pack_id, run.pack_record(pack_id))
        if self.book is None and self.settings.admission and pack.spread is None:
            self.book = PeakBook(run, pack.trainings, device=job_device(self.settings, self.job.device_env()))
        if self.book is not None and pack.spread is None:  # a spread pack is one training: nothing to pack
            self.book.refresh()  # what lanes running beside this one measured since
            skipped = self.skip_for_memory(pack, todo, self.book)
            if skipped is not None:
                return skipped
        return self.run_measured(pack, todo)

    def run_measured(self, pack: Pack, todo: Sequence[Training],
                     extra: Mapping[str, object] | None = None) -> PackRecord:
        """Run ``todo`` as ``pack``, teach the book their peaks, and run another's fault's victims again, once."""
        rec = self.execute(pack, todo, extra=extra, fields=extra)
        # victims only where each training is a process of its own (a shared process's trainings die as one)
        separate = pack.spread is None and load_packer(pack.mode).streams
        recs = [r for tid in rec.get("training_ids", []) if (r := read_training(self.run.training_record(
            pack.pack_id, str(tid)))) is not None] if self.book is not None or separate else []
        if self.book is not None:  # what they peaked at, for the next packs of their settings
            self.book.learn({t.training_id: t for t in pack.trainings}, recs)
        taken = mark_victims(self.run, pack, recs) if separate else {}
        if not taken:
            return rec
        # Run them again, once, in a fresh start of the mode: their records and this pack record kept as an attempt
        for tid in taken:
            move_aside(self.run, pack.pack_id, self.run.training_record(pack.pack_id, tid))
        move_aside(self.run, pack.pack_id, self.run.pack_record(pack.pack_id))
        again = [t for t in pack.trainings if t.training_id in taken]
        return self.execute(pack, again, extra={**(extra or {}), "victims_rerun": taken}, fields=extra)

    def skip_for_memory(self, pack: Pack, todo: Sequence[Training], book: PeakBook) -> PackRecord | None:
        """Hold the pack against its device's memory share (:func:`gpupack.job.oom.memory_fit`); where it does not
        fit, record it and its trainings as skipped for memory, run them at the largest N that fits
        (:meth:`run_refits`), and return its record (None: it fits)."""
        info = detect_device(self.job.device_env())
        device = choose_device(self.settings.device, info)
        fit = memory_fit(book, pack, todo, self.settings, device == "cuda", info.memory_total_mb, self.records)
        if fit.fits:
            return None
        skip = skip_of(self.plan, pack, todo, fit, book, self.settings, device == "cuda", info.memory_total_mb)
        on = OnDevice(info, device, 0, pack.factor, gpu_model(info, self.settings))
        runs_in, now = skip.runs_in(), time.time()
        for t in todo:
            skipped = skipped_training_record(t, pack, self.plan, on, fit.why, runs_in.get(t.training_id), now)
            write_json_atomic(self.run.training_record(pack.pack_id, t.training_id), skipped)
        print(skip.line(pack.pack_id), file=sys.stderr)
        rec = write_pack_record(self.run, pack, [], info, device, job_cores(), 0, on.model, phase=self.plan.phase,
                                job=self.job, extra=skip.fields(todo))
        self.run_refits(pack, skip.packs)
        return rec

    def run_refits(self, pack: Pack, refits: Sequence[Pack]) -> None:
        """Run the refit packs of ``pack`` one after another, each a pack of its own at its N (:meth:`run_measured`).
        A record an earlier refit left of a training is moved aside: the refit that runs it now holds its current."""
        run = self.run
        for refit in refits:
            with pack_lock(run, refit.pack_id):
                for t in refit.trainings:
                    for earlier in self.records.refits(pack.pack_id):
                        if earlier != refit.pack_id:
                            move_aside(run, earlier, run.training_record(earlier, t.training_id))
                    move_aside(run, refit.pack_id, run.training_record(refit.pack_id, t.training_id))
                move_aside(run, refit.pack_id, run.pack_record(refit.pack_id))
                self.run_measured(refit, refit.trainings, extra={"refit_of": pack.pack_id})

    def execute(self, pack: Pack, todo: Sequence[Training], stream: Stream | None = None,
                extra: Mapping[str, object] | None = None, fields: Mapping[str, object] | None = None) -> PackRecord:
        """Run ``todo`` with the pack's mode or strategy (``stream``: a lane's, which refills its slots), writing a
        training record as each ends and the pack record at the end, with ``fields`` and ``extra`` more of theirs."""
        env = self.job.device_env()  # the job's GPUs: one of them, in a job of several GPUs (JobEnvironment.on_gpu)
        info = detect_device(env)
        device = choose_device(self.settings.device, info)
        # its packing mode, or its spread strategy with where its one training runs
        runner: Packer | Strategy = load_packer(pack.mode) if pack.spread is None else load_strategy(pack.spread)
        placement = runner.placement(pack.mode, pack.devices, device) if isinstance(runner, Strategy) else None
        cores = job_cores()
        concurrent = pack.factor if stream is not None else len(todo)  # a lane's slots, else the trainings at once
        threads = threads_for(cores, concurrent, pack.threads or self.settings.threads_per_training)  # a set-up's own
        on = OnDevice(info, device, threads, concurrent, gpu_model(info, self.settings))
        # a rise of the cgroup's OOM kills by a training's end tells an OOM kill from any other SIGKILL
        ends = TrainingEnds(self, pack, on, {t.training_id: t for t in (stream.queue if stream is not None else todo)},
                            {**(fields or {}), "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES")},
                            self.sampler(runner, pack, info, env), stream, oom_kill_count())
        # specs and results in the job's node-local space (the scheduler's), not a file each on /project
        work_dir = tempfile.mkdtemp(prefix=work_prefix(pack.pack_id), dir=self.job.temp_dir())
        ctx = self.context(pack, todo, on, env, placement, ends, work_dir)
        ends.sampler.start()
        mode_started = time.time()  # what a mode does before its first training starts (a fork server's preload)
        try:  # is set-up, recorded as such: the pack's wall counts from that start (write_pack_record)
            if todo:
                runner.run(todo, ctx)
        finally:
            sampled = ends.sampler.stop()
            shutil.rmtree(work_dir, ignore_errors=True)
        billing = {"billing": dict(self.settings.billing)} if self.settings.billing else {}  # what the job asked
        return write_pack_record(self.run, pack, ends.records, info, device, cores, on.threads, on.model, sampled,
                                 mode_started=mode_started, phase=self.plan.phase, job=self.job,
                                 extra={**(extra or {}), **billing})

    def sampler(self, runner: Packer | Strategy, pack: Pack, info: DeviceInfo, env: Mapping[str, str]) -> Sampler:
        """The sampler of the pack's trainings: their memory and the device's, every ``packing.sample_interval_s``."""
        mps = isinstance(runner, Packer) and runner.watches_mps(self.settings)  # the sampler lists MPS clients then
        # A training spread over k GPUs: the job's other k-1 sampled with the first (rank r trains on cuda:r)
        more = visible_devices(env, pack.devices)[1:] if info.kind == "gpu" and pack.devices > 1 else []
        return Sampler(interval_s=self.settings.sample_interval_s, mps=mps, no_gpu_reason=info.note,
                       gpu=(info.uuid or first_visible(env)) if info.kind == "gpu" else None, more_gpus=more,
                       command_pid=self.job.command_pid)

    def context(self, pack: Pack, todo: Sequence[Training], on: OnDevice, env: Mapping[str, str],
                placement: Placement | None, ends: TrainingEnds, work_dir: str) -> PackContext:
        settings, info = self.settings, on.info
        each = memory_share(settings.memory_share, info.memory_total_mb, pack.factor) \
            if on.device == "cuda" and placement is None else None
        own: dict[str, MemoryShare] = {}
        if each is not None and ends.stream is None:  # a lane's slots keep the equal split: who shares them changes
            # each training's by its setting's measured GPU peak (the book's, read here where the pack has none), with
            # settings.memory_margin, else the equal split
            book = self.book if self.book is not None else PeakBook(self.run, todo, device=info.name)
            peaks = [book.figure(t, on_gpu=True, stated_mb=None) for t in todo]
            own = dict(zip([t.training_id for t in todo], memory_shares(
                settings.memory_share, info.memory_total_mb, peaks, settings.memory_margin,
                settings.training_memory_mb) or []))
        return PackContext(run=self.run, pack=pack, device=on.device, threads=on.threads, env=env, memory_share=each,
                           memory_shares=own,
                           settings=settings, gpu_memory_total_mb=info.memory_total_mb,
                           warmup_steps=settings.warmup_steps, on_finished=ends, on_started=ends.sampler.register,
                           training_timeout_s=settings.training_timeout_s,
                           memory_limit_bytes=int(settings.memory_limit_gb_per_training * 2**30)
                           if settings.memory_limit_gb_per_training else None, spread=placement, stream=ends.stream,
                           resources=self.resources, tmp_dir=self.job.temp_dir(), work_dir=work_dir)


@dataclass
class TrainingEnds:
    """The mode's ``on_finished``: each training's record built, written where it lives, and kept for the pack's."""

    attempt: PackAttempt
    pack: Pack
    on: OnDevice
    by_id: Mapping[str, Training]
    fields: Mapping[str, object]
    sampler: Sampler
    stream: Stream | None
    oom_kills_before: int | None
    records: list[TrainingRecord] = field(default_factory=list)

    def __call__(self, outcome: TrainingOutcome) -> None:
        note_oom_kill(outcome, self.oom_kills_before)
        tid, pack, stream = outcome.training_id, self.pack, self.stream
        by_id = self.by_id if tid in self.by_id or stream is None else {t.training_id: t for t in stream.queue}
        rec = finished_training_record(outcome, by_id[tid], pack, self.attempt.plan, self.on, self.fields,
                                       self.sampler.figures(tid))
        if stream is not None:  # which lane, slot and job ran it, and its share of the plan (its home)
            stream.ended(tid, outcome.ended_at - outcome.started_at)
            rec.update({"stream": pack.stream, "lane": pack.index, "job_id": self.attempt.job.job_id,
                        "home": stream.home(tid)})
            rec = cast(TrainingRecord, stream.judge(dict(rec)))  # the Stream protocol's plain dict
        write_json_atomic(self.attempt.run.training_record(stream.where(tid) if stream is not None else pack.pack_id,
                                                           tid), rec)
        self.records.append(rec)
        if stream is not None:
            stream.recorded(tid)
