"""The one supervisor of every process gpupack starts inside a job: process mode's N trainings, the one shared process
of tf_logical and fused, DDP's k ranks (and MirroredStrategy's one process, through process mode).

A :class:`Supervisor` starts each child (:class:`ChildSpec`: a program, never a shell, or a fork of the pack's
:class:`~gpupack.job.runtime.forkserver.ForkServer`) in a session of its own, follows it, stops it past its time limit
(SIGTERM, then SIGKILL :data:`KILL_GRACE_S` later), optionally fails a group together (:class:`FailTogether`), reaps
it and says how it ended (:class:`ChildExit`). Leaving its ``with`` block by an exception kills and reaps every child
still running: no training outlives its pack.
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Callable, Mapping, Sequence

from gpupack.core.store.records import open_log
from gpupack.core.waits import close_fd, pidfd, wait_readable
from gpupack.job.runtime.forkserver import ForkedProcess, ForkRefused, ForkServer, isolate

POLL_S = 0.05  # how often the children are looked at, at the latest: an exit is seen as it happens (Child.wakeup)
HELPER_TIMEOUT_S = 60.0  # a helper program (MPS's control) that takes longer has hung
KILL_GRACE_S = 5.0  # between a SIGTERM and the SIGKILL that follows; also how long a stop waits to reap
ERROR_TAIL_LINES = 20


def tail(path: Path, lines: int = ERROR_TAIL_LINES) -> str:
    """The last lines of a log file ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def child_setup(memory_limit_bytes: int | None, cpus: Sequence[int] | None = None) -> Callable[[], None]:
    """What runs in each fresh child before its program, as in a forked one: die with the packer, then its limits."""
    return functools.partial(isolate, memory_limit_bytes, cpus)


def spawn(argv: Sequence[str], env: Mapping[str, str], *, stdout: IO[bytes] | int, stderr: IO[bytes] | int,
          stdin: int = subprocess.DEVNULL, cwd: str | None = None, memory_limit_bytes: int | None = None,
          cpus: Sequence[int] | None = None) -> subprocess.Popen[bytes]:
    """The one place a program starts inside a job: never a shell, in a session of its own (a signal to its process
    group reaches its helpers too), dying with the packer, under its address-space limit and on its cores."""
    return subprocess.Popen(list(argv), cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, env=dict(env),
                            start_new_session=True, preexec_fn=child_setup(memory_limit_bytes, cpus))


@dataclass(frozen=True)
class ChildSpec:
    """One child to start: ``argv``, or, with a fork server and a ``spec_path``, a fork running the worker on it."""

    name: str  # what it is called (a training id, a rank's, a shared process's): its fork-server id
    argv: Sequence[str]
    out_path: Path
    err_path: Path
    env: Mapping[str, str]
    spec_path: Path | None = None
    cwd: str | None = None
    memory_limit_bytes: int | None = None  # RLIMIT_AS
    cpus: Sequence[int] | None = None  # bound to these cores (sched_setaffinity); None: the job's
    started_at: float | None = None  # where its time limit counts from; None: when it is started
    python_main: Mapping[str, object] | None = None  # forked: this Python program (forkserver.run_main), not the worker


@dataclass(frozen=True)
class ChildExit:
    """How one child ended, as its supervisor saw it."""

    name: str
    pid: int | None
    started_at: float
    ended_at: float
    returncode: int | None  # None: it never started (start_error); < 0: killed by signal -returncode
    err_path: Path
    start_error: OSError | None = None
    timed_out: bool = False
    stopped: bool = False  # signalled by its supervisor (time limit, a failed group member, a stop) while running
    forked: bool = False  # forked from a preloaded server rather than a fresh interpreter
    cpus: list[int] | None = None

    @property
    def signal(self) -> int | None:
        code = self.returncode
        return -code if code is not None and code < 0 else None

    @property
    def failed(self) -> bool:
        """Ended non-zero by its own doing (not a kill its supervisor sent), or never started."""
        return self.start_error is not None or (self.returncode not in (0, None) and not self.stopped)

    def error(self) -> str:
        """Its stderr's last lines, else its signal or exit code (of a child that ended non-zero)."""
        sig = self.signal
        return tail(self.err_path) or (f"killed by signal {sig} ({signal.Signals(sig).name})" if sig is not None
                                       else f"exited with code {self.returncode}")


@dataclass(frozen=True)
class FailTogether:
    """Children that fail together (DDP's ranks: the others would wait for a failed one in an all-reduce): once one
    fails, all are killed. A failure that may only be the consequence of another's (``consequence``: a rank that lost
    its peer) waits up to ``grace_s`` for its cause to fail too, so the cause, not the consequence, is the culprit."""

    consequence: Callable[[ChildExit], bool] = lambda child: False
    grace_s: float = 0.0

    def culprit(self, failed: Sequence[ChildExit]) -> ChildExit:
        """Of the children that failed, the cause: the first whose failure is no consequence (else the first)."""
        return next((c for c in failed if not self.consequence(c)), failed[0])


class Child:
    """One started (or unstartable) child: its process, its clock, what was done to it."""

    def __init__(self, spec: ChildSpec, proc: subprocess.Popen[bytes] | ForkedProcess | None, started_at: float,
                 forked: bool, start_error: OSError | None = None) -> None:
        self.spec = spec
        self.proc = proc
        self.started_at = started_at
        self.forked = forked
        self.start_error = start_error
        self.ended_at: float | None = None if proc is not None else time.time()
        self.timed_out = False
        self.stopped = False
        self._kill_at: float | None = None
        self._pidfd = pidfd(proc.pid) if isinstance(proc, subprocess.Popen) else None

    def wakeup(self) -> int | None:
        """A descriptor readable once there is news of it (its pidfd, or its fork server's replies); None: none."""
        return self.proc.wakeup() if isinstance(self.proc, ForkedProcess) else self._pidfd

    def close(self) -> None:
        close_fd(self._pidfd)
        self._pidfd = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def poll(self) -> bool:
        """Whether it has ended (reaped); notes when."""
        if self.ended_at is None and self.proc is not None and self.proc.poll() is not None:
            self.ended_at = time.time()
            self.close()
        return self.ended_at is not None

    def signal(self, sig: int) -> None:
        """``sig`` to its process group (it leads its own session: its children go too), if it still runs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.stopped = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def enforce(self, timeout_s: float | None, now: float) -> None:
        """Past its time limit: SIGTERM, then SIGKILL after a grace period."""
        if timeout_s is None or self.ended_at is not None:
            return
        if not self.timed_out and now - self.started_at > timeout_s:
            self.timed_out = True
            self._kill_at = now + KILL_GRACE_S
            self.signal(signal.SIGTERM)
        elif self._kill_at is not None and now > self._kill_at:
            self.signal(signal.SIGKILL)
            self._kill_at = None

    def exit(self) -> ChildExit:
        """How it ended (or stands: ended_at is now while it runs)."""
        return ChildExit(self.spec.name, self.pid, self.started_at, self.ended_at or time.time(),
                         self.proc.returncode if self.proc is not None else None, self.spec.err_path,
                         self.start_error, self.timed_out, self.stopped, self.forked,
                         list(self.spec.cpus) if self.spec.cpus else None)


def fork_server(workload: str, params: Sequence[Mapping[str, object]], env: Mapping[str, str], log: Path,
                learn: bool = False) -> ForkServer | str:
    """A preloaded fork server for ``workload``'s trainings (``params``), or why it did not start (said in ``log``)."""

    def start(argv: Sequence[str], err: IO[bytes]) -> subprocess.Popen[bytes]:
        # torch.cuda.is_available() asked at import through NVML leaves CUDA uninitialised: its children can use it
        return spawn(argv, {**env, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}, stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=err)

    try:
        return ForkServer(workload, params, log, start, learn)
    except (RuntimeError, OSError) as err:
        with open_log(log, append=True) as f:
            f.write(f"gpupack: {err}; starting each training as a fresh interpreter instead\n".encode())
        return str(err)


@dataclass
class Supervisor:
    """Start, follow, time out, (fail together,) reap and report the children of one pack or training; start their
    fork server (:meth:`preload`, closed on leaving the ``with`` block) and run helpers to their end (:meth:`call`)."""

    timeout_s: float | None = None  # each child's time limit, from its started_at
    server: ForkServer | None = field(default=None, init=False)  # where children with a spec_path are forked from
    refused: str | None = field(default=None, init=False)  # why the server forks no more (ForkRefused)
    owns_server: bool = field(default=True, init=False)  # False: a server a lane shares (use()), closed by the lane
    together: FailTogether | None = None  # None: each child fails alone
    children: list[Child] = field(default_factory=list)
    culprit: ChildExit | None = None  # the member whose failure failed the group (with ``together``)
    _first_failure: float | None = None

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            if kind is not None:  # the job is being cancelled or broke: take no orphan child with it
                self.stop()
        finally:
            for child in self.children:
                child.close()
            if self.server is not None and self.owns_server:
                self.server.close()

    def start(self, spec: ChildSpec) -> Child:
        """Start one child; one that cannot start ended at once with ``start_error`` (failing a ``together`` group)."""
        started_at = spec.started_at if spec.started_at is not None else time.time()
        try:
            proc = self._spawn(spec)
            child = Child(spec, proc, started_at, isinstance(proc, ForkedProcess))
        except OSError as err:  # a fresh start failed (a fork that fails falls back to one: _spawn)
            child = Child(spec, None, started_at, False, err)
        self.children.append(child)
        if child.start_error is not None and self.together is not None and self.culprit is None:
            self._fail_group(child.exit())
        return child

    def _spawn(self, spec: ChildSpec) -> subprocess.Popen[bytes] | ForkedProcess:
        if self.server is not None and spec.spec_path is not None and self.refused is None:
            try:
                return self.server.start(spec.name, spec.spec_path, spec.out_path, spec.err_path, spec.env, spec.cwd,
                                         spec.memory_limit_bytes, spec.cpus, spec.python_main)
            except ForkRefused as why:  # what it learned made forking unsafe: this and later ones start fresh
                self.refused = str(why)
            except (RuntimeError, OSError) as failure:  # the server died or stopped answering: no training fails
                self.refused = f"the fork server failed ({failure}): starting fresh interpreters"
        with open_log(spec.out_path) as out, open_log(spec.err_path) as err:
            return spawn(spec.argv, spec.env, stdout=out, stderr=err, cwd=spec.cwd,
                         memory_limit_bytes=spec.memory_limit_bytes, cpus=spec.cpus)

    def preload(self, workload: str, params: Sequence[Mapping[str, object]], env: Mapping[str, str],
                log: Path, learn: bool = False) -> str | None:
        """Start the fork server children with a ``spec_path`` are forked from; None, or why it did not start."""
        made = fork_server(workload, params, env, log, learn)
        if isinstance(made, str):
            return made
        self.server = made
        return None

    def use(self, server: ForkServer) -> None:
        """Fork children with a spec_path from ``server``, which the caller keeps (a lane's) and closes."""
        self.server, self.owns_server = server, False

    def call(self, spec: ChildSpec, stdin: bytes | None = None, timeout_s: float = HELPER_TIMEOUT_S) -> ChildExit:
        """Run a helper program (MPS's control) to its end, fed ``stdin``, killed past ``timeout_s``; how it ended."""
        started = time.time()
        try:
            with open_log(spec.out_path) as out, open_log(spec.err_path) as err:
                proc = spawn(spec.argv, spec.env, stdout=out, stderr=err, cwd=spec.cwd,
                             stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL)
        except OSError as error:
            return Child(spec, None, started, False, error).exit()
        helper = Child(spec, proc, started, False)
        try:
            proc.communicate(stdin, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            helper.timed_out = True
            helper.signal(signal.SIGKILL)
            proc.wait()
        helper.poll()
        return helper.exit()

    def follow(self, on_exit: Callable[[ChildExit], None] | None = None,
               on_poll: Callable[[], None] | None = None) -> list[ChildExit]:
        """Follow every child to its end (``on_poll()`` at each look, ``on_exit(child)`` as each ends); their exits."""
        reported: set[int] = set()
        together = self.together
        while True:
            if on_poll is not None:
                on_poll()
            now = time.time()
            for i, child in enumerate(self.children):
                child.enforce(self.timeout_s, now)
                if i not in reported and child.poll():
                    reported.add(i)
                    if on_exit is not None:
                        on_exit(child.exit())
            if together is not None and self.culprit is None and (failed := [
                    e for e in (c.exit() for c in self.children if c.ended_at is not None) if e.failed]):
                self._first_failure = self._first_failure or now  # a consequence waits grace_s for its cause
                if not all(together.consequence(c) for c in failed) or now - self._first_failure > together.grace_s:
                    self._fail_group(together.culprit(failed))
            if len(reported) == len(self.children):
                break
            wait_readable([c.wakeup() for i, c in enumerate(self.children) if i not in reported], POLL_S)
        exits = [child.exit() for child in self.children]
        # failed as the last to end, or in the look that saw all end
        if together is not None and self.culprit is None and (failed := [e for e in exits if e.failed]):
            self.culprit = together.culprit(failed)
        return exits

    def _fail_group(self, culprit: ChildExit) -> None:
        self.culprit = culprit
        for child in self.children:  # the others would wait for it: end them now
            child.signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGKILL every child still running and reap them (waiting at most KILL_GRACE_S)."""
        for child in self.children:
            child.signal(signal.SIGKILL)
        deadline = time.time() + KILL_GRACE_S
        while not all(child.poll() for child in self.children) and time.time() < deadline:
            time.sleep(POLL_S)
