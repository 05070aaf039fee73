"""Process packing ("no split"): N trainings as N OS processes on the same device.

On a GPU node every process sees the job's CUDA_VISIBLE_DEVICES, so all N share the one GPU; on a CPU
each gets its share of the cores (see :func:`gpupack.pack.threads_for`).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpupack.core.plan import Training
from gpupack.core.records import make_dirs, open_log, read_json_or_none, write_json_atomic
from gpupack.core.types import Capacity, TrainingOutcome
from gpupack.errors import ConfigError, nearest
from gpupack.pack import PackContext, Packer, options_of, worker_env, worker_spec
from gpupack.runtime.forkserver import ForkedProcess, ForkServer, isolate
from gpupack.runtime.mps import mps_daemon
from gpupack.workload import Workload, load_workload

POLL_S = 0.05
ERROR_TAIL_LINES = 20
KILL_GRACE_S = 5.0


def tail(path: Path, lines: int = ERROR_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _child_setup(memory_limit_bytes: int | None, cpus: Sequence[int] | None = None) -> Callable[[], None]:
    """What runs in each fresh training process before it starts (no Python objects of ours cross over): be
    SIGKILLed when the packer dies, even by SIGKILL (scancel, OOM killer), so no training outlives its job and holds
    the GPU; then its address-space limit and its cores. A forked training does the same (gpupack.runtime.forkserver)."""

    def setup() -> None:
        isolate(memory_limit_bytes, cpus)

    return setup


def start_process(argv: Sequence[str], name: str, spec_path: Path, out_path: Path, err_path: Path,
                  env: Mapping[str, str], cwd: str | None, server: ForkServer | None, memory_limit_bytes: int | None,
                  cpus: Sequence[int] | None = None) -> subprocess.Popen[bytes] | ForkedProcess:
    """Start one training's process (a packed training, a DDP rank): forked from the pack's preloaded server, else
    ``argv`` as a program of its own (a list, never a shell) in a session of its own, with its logs, its limits and
    death with the packer. OSError when the program cannot start."""
    if server is not None:  # no interpreter start, no import
        return server.start(name, spec_path, out_path, err_path, env, cwd, memory_limit_bytes, cpus)
    with open_log(out_path) as out, open_log(err_path) as err:
        return subprocess.Popen(list(argv), cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=dict(env),
                                start_new_session=True, preexec_fn=_child_setup(memory_limit_bytes, cpus))


def exit_error(err_path: Path, code: int | None) -> str:
    """Why a process that exited non-zero failed: its stderr's last lines, else its signal or exit code."""
    fallback = (f"killed by signal {-code} ({signal.Signals(-code).name})" if code is not None and code < 0
                else f"exited with code {code}")
    return tail(err_path) or fallback


def cpus_for(cores: Sequence[int], n: int, i: int) -> list[int]:
    """The cores training ``i`` of ``n`` is bound to: its own contiguous share of the job's cores (the first
    ``len(cores) % n`` trainings get one more), or one core each, round-robin, when trainings outnumber cores. Pure."""
    cores = sorted(cores)
    if n >= len(cores):
        return [cores[i % len(cores)]]
    share, extra = divmod(len(cores), n)
    start = i * share + min(i, extra)
    return cores[start:start + share + (1 if i < extra else 0)]


def start_method(preference: str, workloads: Sequence[Workload]) -> str:
    """fork (one preloaded server forks each training) or fresh (an interpreter per training). Pure."""
    if preference == "fresh":
        return "fresh"
    return "fork" if len(workloads) == 1 and workloads[0].forkable else "fresh"


class _Running:
    def __init__(self, training: Training, ctx: PackContext, workload: Workload, server: ForkServer | None,
                 cpus: Sequence[int] | None) -> None:
        run, pid = ctx.run, ctx.pack.pack_id
        tid = training.training_id
        self.training = training
        self.workload = workload
        self.err_path = run.log(pid, tid, "err")
        self.result_path = run.work(pid, tid, "result")
        spec_path = run.work(pid, tid, "spec")
        make_dirs(self.err_path.parent)
        self.result_path.unlink(missing_ok=True)  # a result left by an earlier attempt must not count
        self.started_at = time.time()
        write_json_atomic(spec_path, worker_spec(training, ctx, self.started_at))
        self.ended_at: float | None = None
        self.timed_out = False
        self._kill_at: float | None = None
        self.start_error: str | None = None
        self.start = "fork" if server else "fresh"
        self.cpus = list(cpus) if cpus else None
        # A list argv, never a shell: gpupack's worker reads hyperparameters from the spec file; a command
        # workload's argv items are templated one by one.
        launch = workload.launch(training.params, str(spec_path), str(self.result_path))
        env = {**worker_env(ctx.env, ctx.threads), **launch.env}
        self.proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        try:
            self.proc = start_process(launch.argv, tid, spec_path, run.log(pid, tid, "out"), self.err_path, env,
                                      launch.cwd, server, ctx.memory_limit_bytes, self.cpus)
        except OSError as error:  # the program is gone or not executable on this node: it fails alone
            where = launch.cwd if launch.cwd and not os.path.isdir(launch.cwd) else None
            self.start_error = (f"could not start {launch.argv[0]!r}: its working directory {where!r} does "
                                "not exist" if where else f"could not start {launch.argv[0]!r}: "
                                f"{error.strerror or error}")
            self.ended_at = time.time()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def enforce(self, timeout_s: float | None) -> None:
        """Past its time limit: SIGTERM its process group, then SIGKILL after a grace period."""
        if timeout_s is None or self.ended_at is not None:
            return
        now = time.time()
        if not self.timed_out and now - self.started_at > timeout_s:
            self.timed_out = True
            self._kill_at = now + KILL_GRACE_S
            self._signal(signal.SIGTERM)
        elif self._kill_at is not None and now > self._kill_at:
            self._signal(signal.SIGKILL)
            self._kill_at = None

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # the training leads its own session: its children go too
        except ProcessLookupError:
            pass

    def poll(self) -> bool:
        if self.ended_at is None and self.proc is not None and self.proc.poll() is not None:
            self.ended_at = time.time()
        return self.ended_at is not None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def outcome(self) -> TrainingOutcome:
        assert self.ended_at is not None  # internal: only called after poll() said it ended
        if self.proc is None:
            return TrainingOutcome(self.training.training_id, self.started_at, self.ended_at, None, None,
                                   self.start_error, None, extra={"timed_out": False, "start": self.start,
                                                                  "cpus": self.cpus})
        code = self.proc.returncode
        sig = -code if code < 0 else None
        result = None
        if code == 0:
            raw = read_json_or_none(self.result_path)  # torn or foreign: nothing written
            result = self.workload.result(self.training.params, raw, self.started_at, self.ended_at)
        error = None
        if code != 0:
            error = exit_error(self.err_path, code)
        elif result is None:
            error = "exited 0 but wrote no result"
        if self.timed_out:
            error = "stopped after packing.training_timeout_s; " + (error or "")
        return TrainingOutcome(self.training.training_id, self.started_at, self.ended_at, code, sig, error,
                               result, extra={"timed_out": self.timed_out, "start": self.start, "cpus": self.cpus})


STARTS = ("auto", "fork", "fresh")


@dataclass
class ProcessOptions:
    """packing.process.*: how process mode starts and places its trainings."""

    # On a GPU node: run the N trainings under CUDA MPS (started and always stopped by the pack).
    mps: bool = False
    # auto: fork each training from one preloaded server per pack (the framework, the workload and its data imported
    # once) when the workload allows it, else a fresh interpreter; fork: require the server; fresh: always a fresh
    # interpreter (what command and TensorFlow workloads use).
    start: str = "auto"
    # Bind each training to its own share of the job's cores (sched_setaffinity) instead of letting N trainings
    # float over all of them.
    cpu_affinity: bool = False


class ProcessPacker(Packer):
    name = "process"
    Options = ProcessOptions

    def check(self, workload: Workload, factor: int, capacity: Capacity, settings: Any) -> None:
        opts = options_of(settings, self.name)
        if opts.start not in STARTS:
            raise ConfigError("packing.process.start", opts.start, "unknown start method", nearest(opts.start, STARTS))
        if opts.start == "fork" and not workload.forkable:
            why = ("a program of its own" if workload.framework in ("command", "hydra")
                   else "its framework starts threads at import")
            raise ConfigError("packing.process.start", "fork", f"{workload.name} cannot be forked from a preloaded "
                              f"server ({why})", "use packing.process.start=auto (it forks where it can) or fresh")
        if opts.mps and capacity.has_gpu is False:
            raise ConfigError("packing.process.mps", True, "CUDA MPS needs a GPU and this node has none",
                              "set packing.process.mps=false, or run on a GPU partition")

    def run(self, trainings: Sequence[Training], ctx: PackContext) -> list[TrainingOutcome]:
        if not options_of(ctx.settings, self.name).mps:
            return self._run(trainings, ctx)
        if ctx.gpu_memory_total_mb is None:
            raise ConfigError("packing.process.mps", True, "CUDA MPS needs a GPU and this job has none",
                              "set packing.process.mps=false, or run on a GPU partition")
        with mps_daemon(ctx.env) as mps_env:
            return self._run(trainings, dataclasses.replace(ctx, env={**ctx.env, **mps_env}))

    def _run(self, trainings: Sequence[Training], ctx: PackContext,
             opts: ProcessOptions | None = None) -> list[TrainingOutcome]:
        running: list[_Running] = []
        workloads = {name: load_workload(name) for name in {t.workload for t in trainings}}
        if opts is None:
            opts = options_of(ctx.settings, self.name) if ctx.settings is not None else ProcessOptions(start="fresh")
        method = start_method(opts.start, list(workloads.values()))
        cores = job_cpus()
        cpus = [cpus_for(cores, len(trainings), i) if opts.cpu_affinity else None for i in range(len(trainings))]
        server = None
        try:
            if method == "fork":
                server = self.preloaded_server(trainings, ctx)
            for t, bound in zip(trainings, cpus):
                running.append(_Running(t, ctx, workloads[t.workload], server, bound))
                if running[-1].pid is not None:
                    ctx.on_started(t.training_id, running[-1].pid)
            reported: set[str] = set()
            while len(reported) < len(running):
                for r in running:
                    r.enforce(ctx.training_timeout_s)
                    if r.training.training_id not in reported and r.poll():
                        reported.add(r.training.training_id)
                        ctx.on_finished(r.outcome())
                time.sleep(POLL_S)
        except BaseException:  # the job is being cancelled or broke: take no orphan trainings with it
            for r in running:
                r.kill()
            raise
        finally:
            if server is not None:
                server.close()
        return [r.outcome() for r in running]

    def run_as_processes(self, trainings: Sequence[Training], ctx: PackContext,
                         opts: ProcessOptions) -> list[TrainingOutcome]:
        """Process mode's machinery with options of the caller's (a spread strategy's one training, one process):
        start, follow, time out and record each training as process mode does, without MPS."""
        return self._run(trainings, ctx, opts)

    @staticmethod
    def preloaded_server(trainings: Sequence[Training], ctx: PackContext) -> ForkServer | None:
        """The pack's preloaded fork server; None (fresh interpreters, said in the server's log) if it cannot start."""
        log = ctx.run.pack_dir(ctx.pack.pack_id) / "logs" / "forkserver.err"
        try:
            return ForkServer(trainings[0].workload, [t.params for t in trainings], worker_env(ctx.env, ctx.threads),
                              log, setup=_child_setup(None))
        except (RuntimeError, OSError) as err:
            with open_log(log, append=True) as f:
                f.write(f"gpupack: {err}; starting each training as a fresh interpreter instead\n".encode())
            return None


def job_cpus() -> list[int]:
    """The cores this job may use (what SLURM or taskset gave it)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


PACKER = ProcessPacker()
