"""A tiny workload for tests: no torch, trains nothing, fails or sleeps on request."""
from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupack.errors import ConfigError
from gpupack.workload import TrainingContext, Workload


@dataclass
class ProbeParams:
    lr: float = 0.1
    seed: int = 0
    steps: int = 20
    sleep_s: float = 0.01
    fail: bool = False
    tag: str = ""
    # Simulates a training that is slow the first time only (killed, requeued, then finishes): the first
    # attempt creates `marker` and sleeps first_attempt_sleep_s; later attempts find the marker and go on.
    marker: str = ""
    first_attempt_sleep_s: float = 0.0
    # Faults on request: allocate this many GB at once (host OOM under a memory limit), raise a framework's
    # out-of-memory error text, or hang (never return).
    allocate_gb: float = 0.0
    raise_text: str = ""
    hang: bool = False
    # Comma-separated environment variables the training reports back (to see what the packer gave it).
    report_env: str = ""
    # Make the pack's fork server fail while preloading (its trainings must then start fresh).
    preload_fail: bool = False
    preload_sleep_s: float = 0.0
    # A folder: a training that finds another training of this folder running beside it fails once with a CUDA
    # out-of-memory error (the first time only, so a resume of its pack then completes).
    oom_when_shared: str = ""
    # Seconds of pure CPU work (a busy loop): trainings that compete for the cores, so packing them plateaus.
    busy_s: float = 0.0
    # A programmed device: "N:seconds,..." sleeps that long when N trainings share the device ($GPUPACK_N), so a
    # test's time per training is a function of N, whatever the machine's load.
    sleep_by_n: str = ""
    # A barrier, not a clock: "FOLDER:K" waits until K trainings have arrived in FOLDER. Trainings run together meet
    # at once; trainings run one after the other never meet, and fail after meet_timeout_s (a liveness bound).
    meet: str = ""
    # A line printed to stdout at the end, formatted with the params (e.g. "score: {lr}"), after an earlier line with
    # the same words and another number ("epoch 1 score: 0.5"): a metric to read back later, whose last match wins
    say: str = ""
    meet_timeout_s: float = 120.0
    # Modules the training imports itself, comma-separated, as an app that imports its framework inside its task
    # function; its metrics say which were already imported when it began ("warm": forked from a server that had them).
    lazy_import: str = ""
    # The fork server's preload: modules it imports (comma-separated), and a file it appends a line to each time it
    # preloads (how many servers a lane started)
    preload_import: str = ""
    preload_mark: str = ""
    # Report the sizes of the native thread pools loaded in the training's process (threadpoolctl)
    report_threads: bool = False
    # Allocate on the GPU through torch (tests/fake_torch: logged, so a test sees it came after the memory share);
    # cuda_alloc_fraction: this share of the real device's memory at once (the gpu tier: past a training's share)
    cuda_alloc: bool = False
    cuda_alloc_fraction: float = 0.0
    # A fault and its victims: "FILE" — fault: fail with an error of its own once FILE is made (it makes it);
    # die_after: on its first attempt (marker), wait for FILE, then die as a neighbour's fault kills a process
    # (die_as: "signal", SIGABRT; "cuda", an MPS client's CUDA error)
    fault: str = ""
    die_after: str = ""
    die_as: str = "signal"
    # Memory held: allocate hold_mb MB of host memory (every page touched), in 4 steps, and hold it hold_s seconds
    # plus hold_s_per_100mb for each 100 MB (a larger model's training is longer).
    # hold_device "FOLDER:MB": a programmed device of MB shared by the trainings that name FOLDER, as a GPU's memory
    # is: an allocation that would take the memory they hold past MB fails with MemoryError (recorded as oom).
    hold_mb: float = 0.0
    hold_s: float = 0.0
    hold_s_per_100mb: float = 0.0
    hold_device: str = ""
    # A programmed curve (a search's pruning): with curve_slope > 0, each step reports slope × (step + 1) through
    # ctx.report, and the training returns at once when it is pruned; val_accuracy is the curve's last value.
    curve_slope: float = 0.0
    # Once pruned, raise (as Optuna users raise TrialPruned) instead of returning: the process ends failed, yet the
    # study was told pruned, which is how the lane must record it
    raise_when_pruned: bool = False


class Probe(Workload):
    name = "probe"
    framework = "torch"
    forkable = True  # pure Python: its trainings fork from the pack's server like the torch workloads'

    Params = ProbeParams

    def check(self, params: ProbeParams) -> None:
        if params.steps < 1:
            raise ConfigError("steps", params.steps, "must be >= 1", "use a positive step count")

    def preload(self, params: Any) -> None:
        if any(p.preload_fail for p in params):
            raise RuntimeError("preload failure on purpose")
        time.sleep(max((p.preload_sleep_s for p in params), default=0.0))
        for module in {m for p in params for m in p.preload_import.split(",") if m}:
            importlib.import_module(module)
        for mark in {p.preload_mark for p in params if p.preload_mark}:
            with open(mark, "a") as f:
                f.write(f"{os.getpid()}\n")

    def train(self, params: ProbeParams, ctx: TrainingContext) -> dict[str, Any]:
        lazy = [m for m in params.lazy_import.split(",") if m]
        warm = {m: m in sys.modules for m in lazy}
        for m in lazy:
            importlib.import_module(m)
        if params.fault and (not params.marker or _first(Path(params.marker))):  # with a marker: its first attempt
            Path(params.fault).touch()
            raise RuntimeError("a bug of this training's own (its fault)")
        if params.die_after and params.marker and _first(Path(params.marker)):
            deadline = time.time() + 60
            while not os.path.exists(params.die_after) and time.time() < deadline:
                time.sleep(0.02)
            time.sleep(0.2)  # it dies after the fault, as an MPS server's clients do
            if params.die_as == "signal":  # as a CUDA fatal error aborts the process
                os.kill(os.getpid(), signal.SIGABRT)
            raise RuntimeError("CUDA error: an illegal memory access was encountered (the MPS server failed)")
        if params.cuda_alloc:
            import torch  # tests/fake_torch where a test puts it first

            torch.zeros(1, device="cuda")
        if params.cuda_alloc_fraction:
            import torch

            total = torch.cuda.get_device_properties(0).total_memory
            block = torch.empty(int(params.cuda_alloc_fraction * total), dtype=torch.uint8, device="cuda")
            del block
        if params.meet:
            _meet(params.meet, params.meet_timeout_s)
        if params.marker and not os.path.exists(params.marker):
            open(params.marker, "w").close()
            deadline = time.time() + params.first_attempt_sleep_s
            while time.time() < deadline:
                time.sleep(0.1)
        if params.busy_s:
            _spin(params.busy_s)
        if params.sleep_by_n:
            table = dict(item.split(":") for item in params.sleep_by_n.split(","))
            time.sleep(float(table[os.environ["GPUPACK_N"]]))
        if params.oom_when_shared:
            _oom_when_shared(params.oom_when_shared)
        if params.hold_mb:
            _hold(params.hold_mb, params.hold_s + params.hold_s_per_100mb * params.hold_mb / 100, params.hold_device)
        if params.allocate_gb:
            block = bytearray(int(params.allocate_gb * 2**30))  # MemoryError under RLIMIT_AS
            del block
        if params.raise_text:
            raise RuntimeError(params.raise_text)
        while params.hang:
            time.sleep(0.1)
        ctx.reporter.loop_started()
        value = None
        for step in range(params.steps):
            time.sleep(params.sleep_s)
            ctx.reporter.step(32)
            if params.fail:
                raise RuntimeError(f"probe failure on purpose (tag={params.tag!r})")
            if params.curve_slope > 0:
                value = params.curve_slope * (step + 1)
                if ctx.report(value, step):
                    if params.raise_when_pruned:
                        raise RuntimeError(f"pruned at step {step}: stopping as Optuna's TrialPruned would")
                    break
        ctx.reporter.loop_ended()
        if params.say:
            print(f"epoch 1 {params.say.format(lr=0.5, seed=params.seed)}")
            print(params.say.format(lr=params.lr, seed=params.seed), flush=True)
        # Deterministic "accuracy" so ranking tests know the answer: higher lr scores higher.
        env = {k: os.environ.get(k) for k in params.report_env.split(",") if k}
        accuracy = min(params.lr, 1.0) if value is None else value
        return {"train_loss": 1.0 / (1 + params.lr), "val_accuracy": accuracy, "tag": params.tag,
                "env": env, "data": "probe (no data)", "pid": os.getpid(), "own_session": os.getsid(0) == os.getpid(),
                "cpus": sorted(os.sched_getaffinity(0)), "cwd": os.getcwd(), "warm": warm,
                "thread_pools": _thread_pools() if params.report_threads else None}


def _thread_pools() -> dict[str, int]:
    """Each loaded native thread pool's size (OpenMP, BLAS), by its library's name."""
    from threadpoolctl import threadpool_info

    return {f"{info['internal_api']}:{os.path.basename(info['filepath'])}": info["num_threads"]
            for info in threadpool_info()}


def _spin(cpu_s: float) -> None:
    """Burn ``cpu_s`` seconds of this process's CPU time (not wall time: sharing a core makes it take longer)."""
    end = time.process_time() + cpu_s
    x = 0
    while time.process_time() < end:
        x += 1


def _meet(spec: str, timeout_s: float) -> None:
    folder, _, k = spec.rpartition(":")
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    (root / f"arrived-{os.getpid()}").touch()
    deadline = time.time() + timeout_s
    while len(list(root.glob("arrived-*"))) < int(k):
        if time.time() > deadline:
            raise RuntimeError(f"only {len(list(root.glob('arrived-*')))} of {k} trainings ever met in {folder}")
        time.sleep(0.02)


def _first(marker: Path) -> bool:
    """True for the one caller that creates ``marker`` (atomic: O_EXCL)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _oom_when_shared(folder: str) -> None:
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    me = root / f"running-{os.getpid()}"
    me.touch()
    try:
        time.sleep(0.5)  # long enough for trainings started together to see each other
        shared = len(list(root.glob("running-*"))) > 1
        if shared and _first(root / "oomed"):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (fake: another training shares the GPU)")
    finally:
        time.sleep(0.5)  # still running while a later-starting neighbour looks
        me.unlink()


def _hold(mb: float, seconds: float, device: str) -> None:
    """Allocate ``mb`` MB in 4 steps (pages touched: resident, not only reserved) and hold them ``seconds``; on a
    programmed ``device`` ("FOLDER:MB") each step first books its MB there, under a lock, and fails with MemoryError
    where the trainings alive holding memory on it would pass its MB."""
    import fcntl

    folder, _, capacity = device.rpartition(":")
    root = Path(folder) if device else None
    held: list[bytearray] = []
    mine = root / f"held-{os.getpid()}" if root else None
    try:
        for _ in range(4):
            step = int(mb * 2**20 / 4)
            if root is not None and mine is not None:
                root.mkdir(parents=True, exist_ok=True)
                with open(root / "lock", "w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    others = sum(float(p.read_text() or 0) for p in root.glob("held-*")
                                 if p != mine and _alive(int(p.name[5:])))
                    booked = sum(len(b) for b in held) / 2**20
                    if others + booked + step / 2**20 > float(capacity):
                        raise MemoryError(f"out of memory on the programmed device {device}: {booked:.0f} MB held, "
                                          f"{step / 2**20:.0f} MB more asked, {others:.0f} MB held by others")
                    mine.write_text(f"{booked + step / 2**20:.1f}")
            block = bytearray(step)
            block[::4096] = b"\x01" * len(range(0, step, 4096))  # touch every page: resident memory
            held.append(block)
            time.sleep(0.05)
        time.sleep(seconds)
    finally:
        if mine is not None:
            mine.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


WORKLOAD = Probe()
