"""DDP: one torch training over k devices as k processes (one per device), gradients all-reduced by
``torch.nn.parallel.DistributedDataParallel`` over gloo (CPU or GPU) or NCCL (GPUs only).

The pack's side (:meth:`DdpStrategy.run`) starts k ``python -m gpupack.runtime.worker`` processes under one
supervisor (:mod:`gpupack.runtime.supervisor`), rank r of k each with its own spec, and follows them as one training:
one rank failing fails the training and the others are killed (they would wait in an all-reduce for it until their
time-out). The training's side (:meth:`DdpStrategy.join`) joins the process group and gives the workload a
:class:`DdpSpread`, which counts what each step all-reduces (bytes, buckets, in-flight time) with a DDP communication
hook, so records say what spreading cost in communication.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Sequence

from gpupack.core.placement import Placement, Spread
from gpupack.errors import ConfigError, nearest
from gpupack.runtime.mps import job_tmp
from gpupack.runtime.supervisor import ChildExit, ChildSpec, Supervisor, Together, fork_server, tail
from gpupack.spread import Strategy

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    from gpupack.core.plan import Training
    from gpupack.core.types import Capacity, TrainingOutcome
    from gpupack.pack import PackContext
    from gpupack.runtime.forkserver import ForkServer
    from gpupack.workload import Workload

KEY = "spread.ddp_backend"
BACKENDS = ("gloo", "nccl")
PREFIX = "ddp-"
# How long a rank waits for the others (rendezvous, one collective) before it gives up. The pack kills the others as
# soon as one rank dies, so this only ends a process group whose ranks all hang.
JOIN_TIMEOUT_S = 600.0
# Finished all-reduce intervals kept before the ones no later all-reduce can overlap are folded into one total.
FOLD_AT = 1024
# A rank's error that only says a peer went away (gloo, NCCL): the failed peer, not this rank, is the cause.
PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|remote worker|remote process|"
                       r"communicator was aborted|Socket Timeout|Timed out waiting", re.IGNORECASE)
# A failing rank closes its connections before its interpreter has ended, so a peer can fail of that first: a rank that
# only lost a peer waits this long for the rank that caused it to end too, before the others are stopped.
PEER_GRACE_S = 5.0


def backends_of(value: Any) -> list[str]:
    """spread.ddp_backend as a list: one name, or a list of names (a plain list or an OmegaConf ListConfig). Pure."""
    names = [value] if isinstance(value, str) else list(value) if value is not None else []
    if not names:
        raise ConfigError(KEY, value, "no DDP backend is given", "use spread.ddp_backend=gloo, or [gloo,nccl] on GPUs")
    for name in names:
        if name not in BACKENDS:
            raise ConfigError(KEY, name, "unknown DDP backend", nearest(str(name), BACKENDS))
    if len(set(names)) != len(names):
        raise ConfigError(KEY, names, "a backend is listed twice", "list each backend once, e.g. [gloo,nccl]")
    return names


@dataclasses.dataclass(frozen=True)
class DdpOptions:
    """ddp's own options, spread.ddp_<field> in the config: spread.ddp_backend, the process group's backend(s)."""

    backend: Any = "gloo"  # gloo or nccl, or a list of them (each measured): spread.ddp_backend

    def check(self) -> None:
        """Refuse a backend that is not gloo or nccl, none, or one listed twice (ConfigError on spread.ddp_backend),
        whether or not this sweep spreads with ddp."""
        backends_of(self.backend)


def backend_of(label: str) -> str:
    """The backend a pack's mode names: ddp-gloo → gloo. Pure."""
    backend = label[len(PREFIX):] if label.startswith(PREFIX) else label
    if backend not in BACKENDS:
        raise ConfigError(KEY, backend, f"the pack mode {label!r} names no DDP backend",
                          nearest(backend, BACKENDS))
    return backend


def check_visible(visible: int, world: int, named: str | None) -> None:
    """Rank r trains on cuda:r, so the job must see at least as many GPUs as the training has ranks (a job given
    fewer than it asked for, or a CUDA_VISIBLE_DEVICES set by hand): say so instead of CUDA's invalid device. Pure."""
    if visible < world:
        raise ConfigError("spread.devices", world, f"one training on {world} GPUs needs {world} GPUs in its job, but "
                          f"it sees {visible} (CUDA_VISIBLE_DEVICES={named!r})",
                          "ask the scheduler for k GPUs on one node (gpupack does, --gpus-per-node=<type>:k), and do "
                          "not narrow CUDA_VISIBLE_DEVICES in the job's setup")


# ---------------- the pack's side ----------------


def rank_child(training: "Training", ctx: "PackContext", rank: int, world: int, threads: int,
               started: float) -> ChildSpec:
    """Rank ``rank`` of ``world``: its spec written, the child its supervisor starts (forked from the pack's preloaded
    server where process mode would fork, else a fresh interpreter, never a shell)."""
    from gpupack.core.records import make_dirs, write_json_atomic
    from gpupack.pack import (  # the pack's side: a rank's process imports this module to join, without it
        worker_env,
        worker_spec,
    )

    run, pack_id, tid = ctx.run, ctx.pack.pack_id, training.training_id
    name = rank_name(tid, rank)  # rank 0's files are the training's own
    err_path = run.log(pack_id, name, "err")
    result_path = run.work(pack_id, name, "result")
    spec_path = run.work(pack_id, name, "spec")
    make_dirs(err_path.parent)
    result_path.unlink(missing_ok=True)  # a result left by an earlier attempt must not count
    assert ctx.spread is not None  # the job body hands a spread pack its placement (not user input)
    placement = dataclasses.replace(ctx.spread, rank=rank, world=world)
    spec = worker_spec(training, dataclasses.replace(ctx, threads=threads, spread=placement), started)
    spec["result_path"] = str(result_path)
    write_json_atomic(spec_path, spec)
    # On GPUs every rank sees all of the job's devices and takes cuda:<rank> itself (DdpSpread.device).
    argv = [sys.executable, "-m", "gpupack.runtime.worker", str(spec_path)]
    return ChildSpec(name, argv, run.log(pack_id, name, "out"), err_path, worker_env(ctx.env, threads), spec_path,
                     memory_limit_bytes=ctx.memory_limit_bytes, started_at=started)


def rank_name(training_id: str, rank: int) -> str:
    return training_id if rank == 0 else f"{training_id}.rank{rank}"


def lost_a_peer(rank: ChildExit) -> bool:
    """A rank whose error (its stderr's last lines: an exit code or signal never says it) only says a peer went away:
    the consequence of another's failure."""
    return bool(PEER_LOST.search(tail(rank.err_path)))


# A failed rank kills the others; one that only lost a peer waits PEER_GRACE_S for the rank that caused it.
RANKS_FAIL_TOGETHER = Together(consequence=lost_a_peer, grace_s=PEER_GRACE_S)


def culprit(failed: Sequence[ChildExit]) -> ChildExit:
    """Of the ranks that failed, the cause: the first whose error is not a lost peer (else the first)."""
    return RANKS_FAIL_TOGETHER.culprit(failed)


def rank_server(training: "Training", ctx: "PackContext") -> "ForkServer | None":
    """The fork server the ranks start from, where process mode would fork the same training (packing.process.start
    auto or fork, a forkable workload), so the two answers pay the same start-up; None: fresh interpreters."""
    from gpupack.pack import options_of, worker_env
    from gpupack.pack.process import start_method
    from gpupack.workload import load_workload

    start = options_of(ctx.settings, "process").start if ctx.settings is not None else "fresh"
    if start_method(start, [load_workload(training.workload)]) != "fork":
        return None
    # None, said in its log, when it cannot start
    return fork_server(training.workload, [training.params], worker_env(ctx.env, ctx.threads),
                       ctx.run.log(ctx.pack.pack_id, "forkserver", "err"))[0]


class DdpStrategy(Strategy):
    name = "ddp"
    framework = "torch"
    Options = DdpOptions

    def labels(self, options: Any) -> list[str]:
        return [PREFIX + b for b in backends_of(getattr(options, "ddp_backend", "gloo"))]

    def placement(self, label: str, devices: int, device: str) -> Placement:
        return Placement(strategy=self.name, label=label, devices=devices, device=device, world=devices,
                         backend=backend_of(label))

    def check(self, workload: "Workload", devices: int, label: str, capacity: "Capacity", options: Any) -> None:
        if backend_of(label) == "nccl" and capacity.has_gpu is not True:
            raise ConfigError(KEY, "nccl", "NCCL all-reduces between GPUs and this partition/machine has none",
                              "use spread.ddp_backend=gloo (it all-reduces between CPU processes too), or a GPU "
                              "partition")

    def run(self, trainings: Sequence["Training"], ctx: "PackContext") -> list["TrainingOutcome"]:
        # A spread pack holds one training; were there more, each would take all k devices in turn.
        return [self._run_one(t, ctx) for t in trainings]

    def _run_one(self, training: "Training", ctx: "PackContext") -> "TrainingOutcome":
        from gpupack.core.records import read_json_or_none
        from gpupack.core.types import TrainingOutcome
        from gpupack.workload import load_workload

        assert ctx.spread is not None  # internal: job.runner_of sets it for every spread pack
        k = ctx.spread.devices
        threads = max(1, ctx.threads // k)  # the job's cores shared by the k ranks
        server = rank_server(training, ctx)
        rendezvous: str | None = None
        started = time.time()  # after the server's preload, as process mode's trainings (the pack's wall counts it)
        try:
            with Supervisor(ctx.training_timeout_s, server, RANKS_FAIL_TOGETHER) as supervisor:
                # The ranks meet through a file in the job's node-local temporary space, unique to this training: a
                # TCP port picked here could be taken by another pack's rendezvous before rank 0 binds it.
                rendezvous = tempfile.mkdtemp(prefix="gpupack-ddp-", dir=job_tmp(ctx.env))
                ctx = dataclasses.replace(ctx, spread=dataclasses.replace(
                    ctx.spread, init_method=f"file://{os.path.join(rendezvous, 'store')}"))
                for r in range(k):
                    pid = supervisor.start(rank_child(training, ctx, r, k, threads, started)).pid
                    if pid is None:  # no process for this rank (memory, process limit): the others are killed
                        break
                    ctx.on_started(training.training_id, pid)
                ranks = supervisor.follow()
                # the training's end: before the fork server is closed, as in process mode
                ended = max(r.ended_at for r in ranks)
        finally:
            if rendezvous is not None:
                shutil.rmtree(rendezvous, ignore_errors=True)
        timed_out = any(r.timed_out for r in ranks)
        cause = supervisor.culprit
        if cause is None and timed_out:
            cause = next((r for r in ranks if r.returncode != 0), None)
        code: int | None = cause.returncode if cause is not None else 0
        result, error = None, None
        rank_of = {rank_name(training.training_id, r): r for r in range(k)}
        if cause is not None and cause.start_error is not None:
            why = cause.start_error.strerror or cause.start_error
            code, error = None, f"rank {rank_of[cause.name]} of {k}: could not start: {why}"
        elif cause is not None:
            error = f"rank {rank_of[cause.name]} of {k}: {cause.error()}"
        else:
            raw = read_json_or_none(ctx.run.work(ctx.pack.pack_id, training.training_id, "result"))  # rank 0's
            result = load_workload(training.workload).result(training.params, raw, started, ended)
            if result is None:
                error = "exited 0 but wrote no result"
        if timed_out:
            error = "stopped after packing.training_timeout_s; " + (error or "")
        sig = -code if code is not None and code < 0 else None
        outcome = TrainingOutcome(training.training_id, started, ended, code, sig, error,
                                  result, extra={"timed_out": timed_out, "ranks": k, "threads_per_rank": threads,
                                                 "start": "fork" if server is not None else "fresh"})
        ctx.on_finished(outcome)
        return outcome

    # ---------------- the training's side ----------------

    def join(self, placement: Placement) -> "DdpSpread":
        import torch
        import torch.distributed as dist

        backend = placement.backend or backend_of(placement.label)
        if placement.device == "cuda":
            check_visible(torch.cuda.device_count(), placement.world, os.environ.get("CUDA_VISIBLE_DEVICES"))
            torch.cuda.set_device(placement.rank)  # before NCCL makes its communicator on the current device
        init = placement.init_method or "env://"
        dist.init_process_group(backend, init_method=init,
                                 rank=placement.rank, world_size=placement.world,
                                 timeout=timedelta(seconds=JOIN_TIMEOUT_S))
        return DdpSpread(placement)


class _CommCount:
    """What the communication hook saw: buckets, bytes, backward passes, and when each all-reduce was in flight.
    Futures complete on the backend's threads, hence the lock."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.buckets = 0
        self.bytes = 0
        self.steps = 0  # backward passes: one per optimizer step, counted at each pass's last bucket
        self._inflight: dict[int, float] = {}
        self._next = 0
        self._done: list[tuple[float, float]] = []
        self._folded_s = 0.0

    def started(self, nbytes: int, last: bool) -> int:
        with self.lock:
            self.buckets += 1
            self.bytes += nbytes
            self.steps += int(last)
            token, self._next = self._next, self._next + 1
            self._inflight[token] = self.clock()
            return token

    def finished(self, token: int) -> None:
        end = self.clock()
        with self.lock:
            self._done.append((self._inflight.pop(token), end))
            if len(self._done) >= FOLD_AT:
                # No later all-reduce starts before the earliest one still in flight (or now): what ended by then
                # can be summed once and forgotten.
                self._fold(min(self._inflight.values(), default=end))

    def _fold(self, before: float) -> None:
        kept = []
        for start, end in _merged(self._done):
            if end <= before:
                self._folded_s += end - start
            else:
                kept.append((start, end))
        self._done = kept

    def busy_s(self) -> float:
        """Seconds during which at least one all-reduce was in flight (the union of the intervals)."""
        with self.lock:
            return self._folded_s + sum(end - start for start, end in _merged(self._done))


def _merged(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _counting_hook(state: _CommCount, bucket: "dist.GradBucket") -> "torch.futures.Future[torch.Tensor]":
    """DDP's own all-reduce (``allreduce_hook``: divide by the world, sum), counted on the way: the bucket's bytes as
    sent, and its time from the hook's call to the all-reduce's completion."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buffer = bucket.buffer()
    token = state.started(buffer.numel() * buffer.element_size(), bucket.is_last())
    world: Any = None  # the default (world) process group, the one DDP was built on
    fut = allreduce_hook(world, bucket)

    def done(f: Any) -> Any:
        state.finished(token)
        return f.value()

    return fut.then(done)


class DdpSpread(Spread):
    """One rank of a DDP training: the process group is joined; the workload wraps, shards and averages here."""

    def __init__(self, placement: Placement) -> None:
        super().__init__(placement)
        self._count: _CommCount | None = None

    @property
    def device(self) -> str:
        return f"cuda:{self.rank}" if self.placement.device == "cuda" else "cpu"

    def wrap(self, model: Any) -> Any:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        on_gpu = self.placement.device == "cuda"
        ddp = DistributedDataParallel(model, device_ids=[self.rank] if on_gpu else None)
        self._count = _CommCount()
        # DDP checks a hook's annotations as objects; this module's are strings (postponed), and torch is imported
        # only here, in the training's process.
        _counting_hook.__annotations__.update(bucket=dist.GradBucket, state=_CommCount,
                                              **{"return": torch.futures.Future[torch.Tensor]})
        ddp.register_comm_hook(self._count, _counting_hook)
        return ddp

    def shard(self, *tensors: Any) -> tuple[Any, ...]:
        import torch

        return tuple(torch.tensor_split(t, self.world)[self.rank] for t in tensors)

    def mean(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return float(t.item()) / self.world

    def stats(self) -> dict[str, Any]:
        count = self._count
        if count is None:  # never wrapped (a loader-only training): nothing was all-reduced
            return {}
        steps = count.steps

        def per_step(total: float) -> float | None:
            return total / steps if steps else None

        return {
            "backend": self.placement.backend,
            "comm_steps": steps,
            "allreduce_bytes_per_step": per_step(count.bytes),
            "allreduce_buckets_per_step": per_step(count.buckets),
            # The union of the all-reduces' in-flight intervals, not their sum: buckets overlap one another and the
            # backward pass, so this is the time the network was busy, an upper bound on what it added to a step.
            # Host clock: on CUDA tensors a future's callback may run once the kernel is queued, before it ends, so
            # with NCCL this is closer to the launch time than to the transfer (CUDA events would time the device).
            "allreduce_s_per_step": per_step(count.busy_s()),
        }

    def close(self) -> None:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # leaving is best effort: the process ends next
            pass


STRATEGY = DdpStrategy()
