"""Process packing ("no split"): N trainings as N OS processes on the same device.

On a GPU node every process sees the job's CUDA_VISIBLE_DEVICES, so all N share the one GPU; on a CPU
each gets its share of the cores (see :func:`gpupack.pack.threads_for`).
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import resource
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, Any, Callable, Sequence

from gpupack.errors import ConfigError
from gpupack.mps import mps_daemon
from gpupack.pack import Capacity, Packer, PackContext, TrainingOutcome, worker_env, worker_spec
from gpupack.plan import Training
from gpupack.records import read_json, write_json_atomic
from gpupack.workload import Workload, load_workload

POLL_S = 0.05
ERROR_TAIL_LINES = 20
PR_SET_PDEATHSIG = 1  # linux/prctl.h
KILL_GRACE_S = 5.0


def tail(path: Path, lines: int = ERROR_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _read_result(path: Path) -> dict[str, Any] | None:
    """What the training wrote at its result path; a torn or foreign file counts as nothing written."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def _child_setup(memory_limit_bytes: int | None) -> Callable[[], None]:
    """What runs in each training's process before it starts (no Python objects of ours cross over)."""

    def setup() -> None:
        # Be SIGKILLed when the packer dies, even by SIGKILL (scancel, OOM killer), so no training outlives
        # its job and holds the GPU. Linux only; elsewhere the packer's own cleanup must do.
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        if memory_limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))

    return setup


class _Running:
    def __init__(self, training: Training, ctx: PackContext, workload: Workload) -> None:
        run, pid = ctx.run, ctx.pack.pack_id
        tid = training.training_id
        self.training = training
        self.workload = workload
        self.err_path = run.log(pid, tid, "err")
        self.result_path = run.work(pid, tid, "result")
        spec_path = run.work(pid, tid, "spec")
        self.err_path.parent.mkdir(parents=True, exist_ok=True)
        self.result_path.unlink(missing_ok=True)  # a result left by an earlier attempt must not count
        self.started_at = time.time()
        write_json_atomic(spec_path, worker_spec(training, ctx, self.started_at))
        self._out: IO[bytes] = open(run.log(pid, tid, "out"), "wb")
        self._err: IO[bytes] = open(self.err_path, "wb")
        self.ended_at: float | None = None
        self.timed_out = False
        self._kill_at: float | None = None
        self.start_error: str | None = None
        # A list argv, never a shell: gpupack's worker reads hyperparameters from the spec file; a command
        # workload's argv items are templated one by one.
        launch = workload.launch(training.params, str(spec_path), str(self.result_path))
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                launch.argv, cwd=launch.cwd, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL,
                env={**worker_env(ctx.env, ctx.threads), **launch.env}, start_new_session=True,
                preexec_fn=_child_setup(ctx.memory_limit_bytes),
            )
        except OSError as err:  # the program is gone or not executable on this node: this training fails alone
            self.proc = None
            where = launch.cwd if launch.cwd and not os.path.isdir(launch.cwd) else None
            self.start_error = (f"could not start {launch.argv[0]!r}: its working directory {where!r} does not exist"
                                if where else f"could not start {launch.argv[0]!r}: {err.strerror or err}")
            self._close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _close(self) -> None:
        self.ended_at = time.time()
        self._out.close()
        self._err.close()

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
            self._close()
        return self.ended_at is not None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def outcome(self) -> TrainingOutcome:
        assert self.ended_at is not None  # internal: only called after poll() said it ended
        if self.proc is None:
            return TrainingOutcome(self.training.training_id, self.started_at, self.ended_at, None, None,
                                   self.start_error, None, extra={"timed_out": False})
        code = self.proc.returncode
        sig = -code if code < 0 else None
        result = None
        if code == 0:
            raw = _read_result(self.result_path)
            result = self.workload.result(self.training.params, raw, self.started_at, self.ended_at)
        error = None
        if code != 0:
            error = tail(self.err_path) or (f"killed by signal {sig} ({signal.Signals(sig).name})" if sig else
                                            f"exited with code {code}")
        elif result is None:
            error = "exited 0 but wrote no result"
        if self.timed_out:
            error = "stopped after packing.training_timeout_s; " + (error or "")
        return TrainingOutcome(self.training.training_id, self.started_at, self.ended_at, code, sig, error,
                               result, extra={"timed_out": self.timed_out})


class ProcessPacker(Packer):
    name = "process"

    def check(self, workload: Workload, factor: int, capacity: Capacity, settings: Any) -> None:
        if getattr(settings, "mps", False) and capacity.has_gpu is False:
            raise ConfigError("packing.mps", True, "CUDA MPS needs a GPU and this node has none",
                              "set packing.mps=false, or run on a GPU partition")

    def run(self, trainings: Sequence[Training], ctx: PackContext) -> list[TrainingOutcome]:
        if not getattr(ctx.settings, "mps", False):
            return self._run(trainings, ctx)
        if ctx.gpu_memory_total_mb is None:
            raise ConfigError("packing.mps", True, "CUDA MPS needs a GPU and this job has none",
                              "set packing.mps=false, or run on a GPU partition")
        with mps_daemon(ctx.env) as mps_env:
            return self._run(trainings, dataclasses.replace(ctx, env={**ctx.env, **mps_env}))

    def _run(self, trainings: Sequence[Training], ctx: PackContext) -> list[TrainingOutcome]:
        running: list[_Running] = []
        try:
            workloads = {name: load_workload(name) for name in {t.workload for t in trainings}}
            for t in trainings:
                running.append(_Running(t, ctx, workloads[t.workload]))
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
        return [r.outcome() for r in running]


PACKER = ProcessPacker()
