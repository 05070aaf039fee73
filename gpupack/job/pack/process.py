"""Process packing ("no split"): N trainings as N OS processes on the same device (a CPU: each its share of the
cores, :func:`gpupack.job.pack.threads_for`)."""
from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from gpupack.core.jobenv import job_cpus
from gpupack.core.plan import Training
from gpupack.core.store.curves import CurveSpec, PrunedAt
from gpupack.core.store.records import make_dirs, write_json_atomic
from gpupack.core.types import Capacity, PackSettings, TrainingOutcome
from gpupack.core.workload import Workload
from gpupack.errors import ConfigError, nearest
from gpupack.job.pack import (
    PACK_SIZE_ENV,
    WAIT,
    Curve,
    PackContext,
    Packer,
    ended_outcome,
    read_result,
    worker_env,
    worker_spec,
)
from gpupack.job.pack._curve import CurveFollower
from gpupack.job.runtime.forkserver import ForkServer
from gpupack.job.runtime.memshare import SHARE_ENV
from gpupack.job.runtime.mps import MPS_LIMIT_ENV, MPS_PIPE_ENV, mps_daemon
from gpupack.job.runtime.supervisor import KILL_GRACE_S, Child, ChildExit, ChildSpec, Supervisor, fork_server
from gpupack.job.workloads import load_workload


def cpus_for(cores: Sequence[int], n: int, i: int) -> list[int]:
    """The cores training ``i`` of ``n`` is bound to: its own contiguous share of the job's cores (the first
    ``len(cores) % n`` trainings get one more), or one core each, round-robin, when trainings outnumber cores. Pure."""
    cores = sorted(cores)
    if n >= len(cores):
        return [cores[i % len(cores)]]
    share, extra = divmod(len(cores), n)
    start = i * share + min(i, extra)
    return cores[start:start + share + (1 if i < extra else 0)]


def start_choice(preference: str, workloads: Sequence[Workload],
                 params: Sequence[Mapping[str, object]] | None = None) -> tuple[str, str | None]:
    """fork (one preloaded server forks each training) or fresh (an interpreter per training), and why fresh. Pure."""
    if preference == "fresh":
        return "fresh", "packing.process.start=fresh"
    if len(workloads) != 1:
        return "fresh", "the pack mixes workloads, and one server preloads one"
    refusals = sorted({why for p in (params or [{}]) if (why := workloads[0].fork_refusal(p))})
    return ("fresh", "; ".join(refusals)) if refusals else ("fork", None)


class _Training:
    """One training of the pack: its spec and files, the child the supervisor starts for it, and how it ended."""

    def __init__(self, training: Training, ctx: PackContext, workload: Workload, cpus: Sequence[int] | None,
                 fork_fallback: str | None = None, slot: int = 0) -> None:
        tid = training.training_id
        run, pid = ctx.run, ctx.home(tid)  # a streamed training's files live with its records, whoever runs it
        self.training = training
        self.slot = slot
        self.workload = workload
        self.result_path = ctx.work(tid, "result")
        spec_path = ctx.work(tid, "spec")
        err_path = run.log(pid, tid, "err")
        make_dirs(err_path.parent)
        self.result_path.unlink(missing_ok=True)  # a result left by an earlier attempt must not count
        curve = ctx.stream.curve(tid) if ctx.stream is not None else None  # a search's trial: its lane judges it
        files = curve_files(ctx, tid, curve) if curve is not None else None
        started_at = time.time()
        spec = worker_spec(training, ctx, started_at)
        if files is not None:
            spec["curve"] = files
        write_json_atomic(spec_path, spec)
        self.launch = workload.launch(training.params, str(spec_path), str(self.result_path))
        self.share, share_env = memory_share_env(ctx, tid)
        self.child = ChildSpec(tid, self.launch.argv, run.log(pid, tid, "out"), err_path,
                               {**worker_env(ctx.env, ctx.threads), PACK_SIZE_ENV: str(ctx.pack.factor),
                                **self.launch.env, **share_env}, spec_path, self.launch.cwd,
                               ctx.memory_limit_bytes, list(cpus) if cpus else None, started_at,
                               self.launch.python_main)
        self._outcome: TrainingOutcome | None = None
        self.fork_fallback = fork_fallback  # why it starts fresh although the pack would fork (None: as asked)
        # a search's trial: its curve followed at each look; the prune decision, and when its program was stopped
        self.curve = CurveFollower(curve, files, self.child.out_path) if curve is not None and files else None
        self.pruned: PrunedAt | None = None
        self.stopped_at: float | None = None
        self.running: Child | None = None

    def follow(self) -> None:
        """Give its lane its curve's new points; pruned, a program that prints its curve is stopped as a time limit
        stops one, and one that reports it is answered so."""
        child = self.running
        if self.curve is None or child is None or child.ended_at is not None:
            return
        if self.pruned is None and (hit := self.curve.follow()) is not None:
            self.pruned = hit
            if self.curve.pattern is not None:
                self.stopped_at = time.time()
                child.signal(signal.SIGTERM)
        elif self.stopped_at is not None and time.time() - self.stopped_at > KILL_GRACE_S:
            child.signal(signal.SIGKILL)

    def outcome(self, ended: ChildExit) -> TrainingOutcome:
        if self._outcome is not None:
            return self._outcome
        extra: dict[str, object] = {"start": "fork" if ended.forked else "fresh", "cpus": ended.cpus,
                                    "slot": self.slot,
                                    **({"fork_fallback": self.fork_fallback} if self.fork_fallback else {}),
                                    **({"memory_share": self.share} if self.share else {})}
        code, result, error = ended.returncode, None, None
        if ended.start_error is not None:  # the program is gone or not executable on this node: it fails alone
            cwd = self.launch.cwd
            why = f"its working directory {cwd!r} does not exist" if cwd and not os.path.isdir(cwd) \
                else ended.start_error.strerror or ended.start_error
            code, error = None, f"could not start {self.launch.argv[0]!r}: {why}"
        elif code == 0 or self.pruned is not None:  # stopped for its prune: what it reported so far is its result
            result, error = read_result(self.workload, self.training.params, self.result_path, ended.started_at,
                                        ended.ended_at, self.child.out_path, stopped=self.pruned is not None)
            pruned = self.pruned or (result or {}).get("pruned")  # stopped here, or by its own report()
            if pruned:
                extra["pruned"] = pruned
        else:
            error = ended.error()
            hint = self.workload.failure_hint(self.training.params, error)
            error = f"{error}\n{hint}" if hint else error
        self._outcome = ended_outcome(self.training.training_id, ended.started_at, ended.ended_at, code, error=error,
                                      result=result, timed_out=ended.timed_out, extra=extra)
        return self._outcome


STARTS = ("auto", "fork", "fresh")


@dataclass
class ProcessOptions:
    """packing.process.*: how process mode starts and places its trainings."""

    mps: bool = False  # on a GPU node: the N trainings under CUDA MPS (started and always stopped by the pack)
    # auto: fork each training from one preloaded server per pack where the workload allows it, else a fresh
    # interpreter; fork: require the server; fresh: always a fresh interpreter.
    start: str = "auto"
    cpu_affinity: bool = False  # bind each training to its own share of the job's cores

    def check(self) -> None:
        """Refuse a value out of range, whether or not process mode is used."""
        if self.start not in STARTS:
            raise ConfigError("packing.process.start", self.start, "unknown start method", nearest(self.start, STARTS))


class ProcessPacker(Packer):
    name = "process"
    streams = True
    solo = True
    split_label = "no split (process)"
    line_style = "-"
    Options = ProcessOptions

    def watches_mps(self, settings: PackSettings) -> bool:
        return process_options(settings).mps

    def start_note(self, workload: Workload, params: Sequence[Mapping[str, object]], settings: PackSettings) -> str:
        method, why = start_choice(process_options(settings).start, [workload], params)
        if method == "fork":
            return "fork: each training is forked from one server per pack that imported the workload once"
        return f"fresh: a new interpreter per training ({why})"

    def check(self, workload: Workload, factor: int, capacity: Capacity, settings: PackSettings) -> None:
        opts = process_options(settings)  # its values were checked with every mode's (ProcessOptions.check)
        if opts.start == "fork" and (why := workload.fork_refusal({})):
            raise ConfigError("packing.process.start", "fork", f"{workload.name} cannot be forked from a preloaded "
                              f"server ({why})", "use packing.process.start=auto (it forks where it can) or fresh")
        if opts.mps and capacity.has_gpu is False:
            raise ConfigError("packing.process.mps", True, "CUDA MPS needs a GPU and this node has none",
                              "set packing.process.mps=false, or run on a GPU partition")

    def run(self, trainings: Sequence[Training], ctx: PackContext) -> list[TrainingOutcome]:
        opts = process_options(ctx.settings)  # worked out once for the pack
        if not opts.mps:
            return run_processes(trainings, ctx, opts)
        if ctx.gpu_memory_total_mb is None:
            raise ConfigError("packing.process.mps", True, "CUDA MPS needs a GPU and this job has none",
                              "set packing.process.mps=false, or run on a GPU partition")
        with mps_daemon(ctx.env, ctx.tmp_dir, lambda name, kind: ctx.run.log(ctx.pack.pack_id, name, kind)) as mps_env:
            return run_processes(trainings, dataclasses.replace(ctx, env={**ctx.env, **mps_env}), opts)


def memory_share_env(ctx: PackContext, training_id: str) -> tuple[dict[str, object], dict[str, str]]:
    """A training's share of the GPU (:meth:`PackContext.share_of`), for its record and its environment: under MPS its
    client's limit (whatever the program is), else the fraction its torch sets (gpupack.job.runtime.memshare). Not
    both: an MPS client may see its limit as the device's memory, and a fraction of that is a share of a share."""
    share = ctx.share_of(training_id)
    if share is None:
        return {}, {}
    env = {MPS_LIMIT_ENV: share.mps_limit()} if MPS_PIPE_ENV in ctx.env else {SHARE_ENV: f"{share.fraction:.6f}"}
    return {**share.to_record(), "mps_limit": env.get(MPS_LIMIT_ENV)}, env


def process_options(settings: PackSettings | None) -> ProcessOptions:
    """packing.process.* as a pack's settings carry them (no settings: fresh interpreters)."""
    return settings.options(PACKER.name, ProcessOptions) if settings is not None else ProcessOptions(start="fresh")


def run_processes(trainings: Sequence[Training], ctx: PackContext, opts: ProcessOptions) -> list[TrainingOutcome]:
    """Process mode without MPS: each training a child of one supervisor; streaming, freed slots take the next."""
    stream = ctx.stream
    every = list(stream.queue) if stream is not None else list(trainings)  # what the server preloads for
    workloads = {name: load_workload(name) for name in {t.workload for t in every}}
    method, _ = start_choice(opts.start, list(workloads.values()), [t.params for t in every])
    slots = ctx.pack.factor if stream is not None else len(trainings)
    cores = job_cpus()
    with Supervisor(ctx.training_timeout_s) as supervisor:
        fallback = preload(supervisor, every, ctx) if method == "fork" and every else None
        lane = _Slots(ctx, supervisor, workloads, fallback, method == "fork",
                      [cpus_for(cores, slots, i) if opts.cpu_affinity else None for i in range(slots)])
        # a lane's free slots, in the order they freed: each takes the stream's next training
        lane.free.extend(range(len(trainings), slots))
        for slot, t in enumerate(trainings):
            lane.start(t, slot)
        lane.fill()
        exits = supervisor.follow(on_exit=lane.ended, on_poll=lane.look if stream is not None else None)
    return [p.outcome(child) for p, child in zip(lane.packed, exits)]


class _Slots:
    """A pack's slots: streaming, each takes the stream's next training as its own ends, or waits while none fits."""

    def __init__(self, ctx: PackContext, supervisor: Supervisor, workloads: Mapping[str, Workload],
                 fallback: str | None, fork: bool, cpus: Sequence[list[int] | None]) -> None:
        self.ctx, self.supervisor, self.workloads = ctx, supervisor, workloads
        self.fallback, self.fork, self.cpus = fallback, fork, cpus
        self.packed: list[_Training] = []
        self.by_name: dict[str, _Training] = {}
        self.free: deque[int] = deque()

    def start(self, t: Training, slot: int) -> None:
        p = _Training(t, self.ctx, self.workloads[t.workload], self.cpus[slot], self.fallback, slot)
        self.packed.append(p)
        self.by_name[t.training_id] = p
        child = p.running = self.supervisor.start(p.child)
        if self.fork and not child.forked and self.supervisor.refused:  # the server refused it or died: why
            p.fork_fallback = self.supervisor.refused
        if child.pid is not None:
            self.ctx.on_started(t.training_id, child.pid)

    def fill(self) -> None:
        stream = self.ctx.stream
        while stream is not None and self.free:
            following = stream.next()
            if following is WAIT:
                return
            if not isinstance(following, Training):  # drained: no slot takes anything more
                self.free.clear()
                return
            self.start(following, self.free.popleft())

    def ended(self, child: ChildExit) -> None:
        done = self.by_name[child.name]
        if done.curve is not None and done.pruned is None:  # what it printed since the last look, not to be pruned
            done.curve.follow(prune=False)
        self.ctx.on_finished(done.outcome(child))
        self.free.append(done.slot)
        self.fill()  # the freed slot takes the next training at once, where it fits

    def look(self) -> None:
        for p in self.packed:  # a trial whose printed curve its pruner stops: its slot frees as its program ends
            p.follow()
        self.fill()


def curve_files(ctx: PackContext, training_id: str, curve: Curve) -> CurveSpec:
    """Where a trial's process reports its curve and is answered, none left by an earlier attempt."""
    files: CurveSpec = {"points": str(ctx.work(training_id, "curve")), "verdict": str(ctx.work(training_id, "verdict")),
                        "metric": curve.metric}
    for path in (files["points"], files["verdict"]):
        Path(path).unlink(missing_ok=True)
    return files


def preload(supervisor: Supervisor, trainings: Sequence[Training], ctx: PackContext) -> str | None:
    """Start ``supervisor``'s fork server for ``trainings`` (a stream's whole queue), or use the one the lane's packs
    share (``ctx.resources``); None, or why it did not start (each record's ``fork_fallback``). Only a stream's server
    learns its trainings' imports: in a whole pack, an import between their ends would sit inside the pack's wall."""
    workload, env = trainings[0].workload, worker_env(ctx.env, ctx.threads)
    if ctx.resources is None or ctx.stream is not None:
        return supervisor.preload(workload, [t.params for t in trainings], env,
                                  ctx.run.log(ctx.pack.pack_id, "forkserver", "err"), learn=ctx.stream is not None)
    lane = ctx.resources
    every = [t.params for t in lane.trainings if t.workload == workload] or [t.params for t in trainings]
    made = lane.get(("forkserver", workload), lambda: fork_server(workload, every, env, lane.log("forkserver")),
                    close=lambda server: server.close() if isinstance(server, ForkServer) else None,
                    alive=lambda server: not isinstance(server, ForkServer) or server.proc.poll() is None)
    if isinstance(made, str):
        return made
    supervisor.use(made)  # its children's thread pools are set to each pack's share as they are forked
    return None


PACKER = ProcessPacker()
