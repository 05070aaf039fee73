"""Fast start for process mode: one preloaded server per pack forks each training.

The server pays Python's start-up and the framework import once instead of N times at once: it imports the workload
(:meth:`gpupack.core.workload.Workload.preload`), then forks one child per training, isolated as a fresh process
would be. Preloading imports; it never touches a device, so no CUDA context is forked.

Protocol: JSON lines, each :class:`Request` from the packer on stdin, each :class:`Reply` from the server on stdout.

**Learned preload** (a stream's server): each child tells the server, as it ends, the libraries it imported that the
server had not (:func:`learnable`), which the server imports before the next fork, once each; where that makes forking
unsafe (:func:`fork_unsafe`) it refuses every later training, which starts fresh. The packer's side is
:class:`ForkServer`.
"""
from __future__ import annotations

import time

_SERVER_START = time.time()

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import selectors  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import IO, TYPE_CHECKING, Callable, Mapping, Sequence, TypedDict, cast  # noqa: E402

from gpupack.core.preload import import_libraries, learnable, library_roots  # noqa: E402
from gpupack.core.store.records import open_log  # noqa: E402
from gpupack.job.runtime.memshare import limit_torch  # noqa: E402
from gpupack.job.runtime.worker import exit_at_once  # noqa: E402

if TYPE_CHECKING:
    from gpupack.core.workload import PythonMain

READY_TIMEOUT_S = 600.0  # a framework import on a busy node can be slow; past this the pack fails loudly
LEARN_LIMIT_BYTES = 60_000  # what a child reports fits a usual pipe's buffer (64 KiB)


# ---------------- the messages (one JSON object a line, each way) ----------------

class Preload(TypedDict):
    """The packer's first request: what the server imports before it forks anything."""
    workload: str
    params: list[dict[str, object]]
    learn: bool


class Request(TypedDict, total=False):
    """A request to the server: the first one ``preload``s, each later one ``start``s a training."""
    preload: Preload
    start: str  # the training id
    spec: str
    out: str
    err: str
    env: dict[str, str]
    cwd: str | None
    rlimit_as: int | None
    cpus: list[int] | None
    python_main: dict[str, object] | None  # a PythonMain, as its workload gave it


class Reply(TypedDict, total=False):
    """``ready`` (or ``error``) once, then per training ``started`` (or ``refused``: start it fresh) and ``ended``."""
    ready: float
    error: str
    refused: str
    why: str
    started: str
    pid: int
    ended: str
    returncode: int  # < 0: killed by that signal


# ---------------- the server (its own process) ----------------

def _write(msg: Reply) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def isolate(rlimit_as: int | None, cpus: Sequence[int] | None) -> None:
    """What every training process does first, forked or fresh: die with its parent, then its limits."""
    import ctypes
    import resource

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (linux/prctl.h)
    if rlimit_as:
        resource.setrlimit(resource.RLIMIT_AS, (rlimit_as, rlimit_as))
    if cpus:
        with contextlib.suppress(AttributeError, OSError):  # not Linux, or cores taken away: run where the job runs
            os.sched_setaffinity(0, cpus)


def _report_imports(fd: int, known: set[str]) -> None:
    """In the child, as it ends: the libraries it imported that the server had not, to the server's pipe."""
    try:
        learned, _ = learnable([m for m in list(sys.modules) if m not in known], sys.modules, library_roots())
        os.set_blocking(fd, False)  # a pipe smaller than the report (a user past pipe-user-pages-soft): cut, not hung
        os.write(fd, json.dumps(learned).encode()[:LEARN_LIMIT_BYTES])
    except BaseException:  # nothing learned (a cut report is no JSON): the training's own outcome is what counts
        pass
    finally:
        os.close(fd)


def _child(req: Request, forked_at: float, report_fd: int | None = None) -> None:
    """In the forked child: become a training process of its own, run the worker, never return."""
    code = 1
    known = set(sys.modules)
    try:
        os.setsid()
        isolate(req.get("rlimit_as"), req.get("cpus"))
        _own_streams(req["out"], req["err"])
        os.environ.clear()
        os.environ.update(req["env"])
        # the native thread pools the server loaded (they read OMP_NUM_THREADS once, at import) set to this child's
        # share: a server shared by packs of several N forks each with its own
        if (threads := req["env"].get("OMP_NUM_THREADS", "")).isdigit() and int(threads) > 0:
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=int(threads))
        if cwd := req.get("cwd"):
            os.chdir(cwd)
        if req.get("python_main"):  # a Python program of the user's, as `python SCRIPT.py ...` would run it
            limit_torch()  # its share of the GPU, where the server preloaded torch: before the program allocates
            code = run_main(cast("PythonMain", req["python_main"]))  # its workload's (command.python_main)
        else:
            from gpupack.job.runtime import worker  # in the forked child: the server itself never trains

            code = worker.main([req["spec"]], process_start=forked_at)
    except BaseException:  # anything before the worker runs: its traceback is the training's stderr
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            if report_fd is not None:
                _report_imports(report_fd, known)
        finally:
            os._exit(code)


def _own_streams(out_path: str, err_path: str) -> None:
    """stdin from /dev/null, stdout and stderr to the training's own logs, as a fresh interpreter's would be."""
    # 0o664 masked by the umask: gpupack's file mode (records.file_mode), never world-writable.
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o664)
    err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o664)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def run_main(entry: PythonMain) -> int:
    """Run a Python program in this (forked) process as ``python SCRIPT.py ARGS`` or ``python -m MODULE ARGS`` would:
    sys.argv, sys.path[0], ``__name__ == "__main__"``, atexit handlers, and its exit status."""
    import atexit
    import runpy
    import traceback

    sys.argv = [str(a) for a in entry["argv"]]
    code: int = 0
    try:
        if entry.get("module"):
            sys.path[0] = os.getcwd()
            runpy.run_module(str(entry["module"]), run_name="__main__", alter_sys=True)
        else:
            script = str(entry["script"])
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:  # what the interpreter exits with for sys.exit(code)
        code = 0 if stop.code is None else stop.code & 0xFF if isinstance(stop.code, int) else 1
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except BaseException as err:  # as the interpreter reports it, without gpupack's and runpy's frames above it
        tb = err.__traceback__
        while tb is not None and (tb.tb_frame.f_code.co_filename == __file__
                                  or "runpy" in os.path.basename(tb.tb_frame.f_code.co_filename)):
            tb = tb.tb_next
        traceback.print_exception(type(err), err, tb)
        code = 1
    try:
        atexit._run_exitfuncs()
    except BaseException:  # an exit handler that fails: the interpreter prints it and keeps the exit status
        traceback.print_exc()
    return code


def _preload(req: Preload) -> None:
    # threadpoolctl here, not in each child: its import sets a variable in os.environ, and a child's is its request's
    import threadpoolctl  # noqa: F401

    from gpupack.job.workloads import load_workload  # the preload is set-up (a pack's setup_s), outside any pack's wall

    workload = load_workload(req["workload"])
    workload.preload([workload.params(p) for p in req.get("params", [])])
    why = fork_unsafe(sys.modules)
    if why:  # the packer starts fresh interpreters instead, and says why
        raise ForkUnsafe(why)


class ForkUnsafe(RuntimeError):
    """What the preload did makes forking unsafe (a CUDA context, a runtime that started its threads)."""


class ForkRefused(RuntimeError):
    """The server forks no more (what it learned made forking unsafe): start this training fresh."""


def fork_unsafe(modules: Mapping[str, object]) -> str | None:
    """Why a process that imported ``modules`` must not fork trainings (a child cannot use an inherited CUDA context,
    nor TensorFlow's or JAX's runtime threads), or None. It imports and initialises nothing itself."""
    torch = modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    with contextlib.suppress(Exception):  # a half-imported torch: leave the decision to the other checks
        if cuda is not None and cuda.is_initialized():
            return "the preload initialised CUDA (torch.cuda.is_initialized() is true): a forked child cannot use it"
    if "tensorflow" in modules:
        return "the preload imported TensorFlow, which starts its threads at import"
    jax_bridge = modules.get("jax._src.xla_bridge")
    if jax_bridge is not None and getattr(jax_bridge, "_backends", None):
        return "the preload initialised a JAX backend"
    return None


class Lines:
    """Whole lines from a raw file descriptor (select() sees the fd, never a Python buffer that hides a line)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer, self.closed = fd, b"", False
        self.sel = selectors.DefaultSelector()
        self.sel.register(fd, selectors.EVENT_READ)

    def read(self, timeout: float | None) -> dict[str, object] | None:
        """The next message; None when the other side closed (``closed``) or said nothing within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer and not self.closed:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.sel.select(left):
                return None
            chunk = os.read(self.fd, 65536)
            self.buffer += chunk
            self.closed = not chunk
        if b"\n" not in self.buffer:
            return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        message: dict[str, object] = json.loads(line)  # each side writes one JSON object per line
        return message


class Learner:
    """What the server learned from its children's imports, and whether it may still fork (``unsafe``: why not)."""

    def __init__(self) -> None:
        self.tried: set[str] = set()
        self.unsafe: str | None = None

    def learn(self, report: bytes, training_id: str) -> None:
        """Import what a child reported (once each), say so, and stop forking should that make it unsafe."""
        try:
            names = [str(n) for n in json.loads(report or b"[]") if str(n) not in self.tried]
        except ValueError:
            return
        if self.unsafe or not names:
            return
        self.tried.update(names)
        import_libraries(names, f"learned from {training_id}")  # said in the server's log
        self.unsafe = fork_unsafe(sys.modules)
        if self.unsafe:
            print(f"gpupack fork server: it forks no more ({self.unsafe}): each later training starts fresh",
                  file=sys.stderr, flush=True)


def serve() -> int:
    """Fork a training per request until the packer closes stdin; report each exit; learn each child's imports."""
    children: dict[int, tuple[str, int]] = {}  # pid -> (training id, the read end of its report pipe)
    requests = Lines(sys.stdin.fileno())
    try:
        first = cast("Request | None", requests.read(None))  # the packer's (ForkServer._send)
        if first is None:
            return 1
        _preload(first["preload"])
    except BaseException as err:  # the packer falls back to fresh interpreters and says why
        _write({"error": str(err) if isinstance(err, ForkUnsafe) else f"{err.__class__.__name__}: {err}"})
        return 1
    _write({"ready": round(time.time() - _SERVER_START, 3)})
    learner = Learner() if first["preload"].get("learn") else None
    while not requests.closed or children:
        req = cast("Request | None", requests.read(0.02) if not requests.closed else None)
        if req is not None and learner is not None and learner.unsafe:
            _write({"refused": req["start"], "why": learner.unsafe})
        elif req is not None:  # its pid, and the read end of its report pipe (-1 without one)
            forked_at = time.time()
            read_end, write_end = os.pipe() if learner is not None else (-1, None)
            pid = os.fork()
            if pid == 0:
                if write_end is not None:
                    os.close(read_end)
                _child(req, forked_at, write_end)
            if write_end is not None:
                os.close(write_end)
            children[pid] = (req["start"], read_end)
            _write({"started": req["start"], "pid": pid})
        elif requests.closed:
            time.sleep(0.02)
        _reap(children, learner if not requests.closed else None)  # more trainings may come: worth learning for
    return 0


def _reap(children: dict[int, tuple[str, int]], learner: Learner | None) -> None:
    """Report each child that ended, and, with ``learner``, learn what it imported."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        training_id, read_end = children.pop(pid)
        _write({"ended": training_id, "returncode": os.waitstatus_to_exitcode(status)})
        if read_end == -1:
            continue
        # what it wrote to its report pipe (nothing, if it died before it could), up to its end or what a process
        # it left holding the pipe has not written: FileIO.readall() stops there instead of blocking
        with open(read_end, "rb", buffering=0) as pipe:
            os.set_blocking(read_end, False)
            report = pipe.read() or b""
        if learner is not None:
            learner.learn(report, training_id)


# ---------------- the packer's side ----------------

class ForkedProcess:
    """A training forked by the server, read like ``subprocess.Popen``."""

    def __init__(self, server: "ForkServer", training_id: str, pid: int) -> None:
        self._server, self.training_id, self.pid = server, training_id, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._server.pump()
        return self.returncode

    def wakeup(self) -> int | None:
        """Readable when its server has something to say (an exit among it); None once it has ended."""
        return self._server._lines.fd if self.returncode is None else None

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)  # its own session: its children go too


class ForkServer:
    """The pack's preloaded server: start it, :meth:`start` trainings, :meth:`close` when all have ended."""

    def __init__(self, workload: str, params: Sequence[Mapping[str, object]], log: Path,
                 start: Callable[[Sequence[str], IO[bytes]], subprocess.Popen[bytes]], learn: bool = False) -> None:
        """``start(argv, stderr)``: the server's process, piped (the supervisor's); ``learn``: see :class:`Learner`."""
        self._log = open_log(log)
        try:
            self.proc = start([sys.executable, "-m", "gpupack.job.runtime.forkserver"], self._log)
        except OSError:
            self._log.close()
            raise
        assert self.proc.stdout is not None  # internal: start() gives it a pipe
        self._lines = Lines(self.proc.stdout.fileno())
        self._processes: dict[str, ForkedProcess] = {}
        self._send({"preload": {"workload": workload, "params": [dict(p) for p in params], "learn": learn}})
        reply = self._read(READY_TIMEOUT_S)
        if reply is None or "ready" not in reply:
            why = (reply or {}).get("error") or f"no answer (see {log})"
            self.close()
            raise RuntimeError(f"the fork server did not start: {why}")

    def _send(self, msg: Request) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def _read(self, timeout: float | None) -> Reply | None:
        """The server's next message; None when it is gone or (with a timeout) silent that long."""
        return cast("Reply | None", self._lines.read(timeout))  # the server's (_write)

    def _handle(self, msg: Reply) -> None:
        # none unknown but one start() gave up waiting for (the server says a child's started before its ended)
        if "ended" in msg and (proc := self._processes.get(msg["ended"])) is not None:
            proc.returncode = int(msg["returncode"])

    def pump(self) -> None:
        """Take in whatever the server has said (exits), without waiting."""
        while (msg := self._read(0)) is not None:
            self._handle(msg)
        if self.proc.poll() is not None:  # the server died: its children died with it
            for p in self._processes.values():
                if p.returncode is None:
                    p.returncode = -signal.SIGKILL

    def start(self, training_id: str, spec: Path, out: Path, err: Path, env: Mapping[str, str],
              cwd: str | None = None, rlimit_as: int | None = None, cpus: Sequence[int] | None = None,
              python_main: Mapping[str, object] | None = None) -> ForkedProcess:
        self._send({"start": training_id, "spec": str(spec), "out": str(out), "err": str(err), "env": dict(env),
                    "cwd": cwd, "rlimit_as": rlimit_as, "cpus": list(cpus) if cpus else None,
                    "python_main": dict(python_main) if python_main else None})
        while True:
            msg = self._read(READY_TIMEOUT_S)
            if msg is None:
                raise RuntimeError("the fork server stopped answering")
            if msg.get("refused") == training_id:
                raise ForkRefused(str(msg.get("why")))
            if msg.get("started") == training_id:
                proc = self._processes[training_id] = ForkedProcess(self, training_id, int(msg["pid"]))
                return proc
            self._handle(msg)

    def close(self) -> None:
        """No more trainings: the server exits once its children have (it is killed if it lingers)."""
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            self._log.close()


if __name__ == "__main__":
    exit_at_once(serve())  # it has told the packer everything; its trainings ran their own exit handlers (_child)
