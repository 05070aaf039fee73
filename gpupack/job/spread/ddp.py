"""DDP: one torch training over k devices as k processes (one per device), gradients all-reduced by
``DistributedDataParallel`` over gloo (CPU or GPU) or NCCL (GPUs only).

The pack's side (:meth:`DdpStrategy.run`) starts k worker processes under one supervisor and follows them as one
training: one rank failing fails it and the others are killed (they would wait for it in an all-reduce). The
training's side is :mod:`gpupack.job.runtime.joins.ddp`.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Any, Iterable, Sequence, cast

from gpupack.core.placement import Placement
from gpupack.core.plan import Training
from gpupack.core.store.records import make_dirs, write_json_atomic
from gpupack.core.types import Capacity, TrainingOutcome
from gpupack.core.workload import Workload
from gpupack.errors import ConfigError, nearest, require_unique
from gpupack.job.pack import PackContext, ended_outcome, read_result, worker_env, worker_spec
from gpupack.job.pack.process import preload, process_options, start_choice
from gpupack.job.runtime.joins.ddp import BACKENDS, KEY, PREFIX, backend_of
from gpupack.job.runtime.supervisor import ChildExit, ChildSpec, FailTogether, Supervisor, tail
from gpupack.job.spread import Strategy
from gpupack.job.workloads import load_workload

# A rank's error that only says a peer went away (gloo, NCCL): the failed peer, not this rank, is the cause.
PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|remote worker|remote process|"
                       r"communicator was aborted|Socket Timeout|Timed out waiting", re.IGNORECASE)
PEER_GRACE_S = 5.0  # a failing rank's peers can fail first, of its closed connections


def backends_of(value: object) -> list[str]:
    """spread.ddp_backend as a list: one name, or a list of names (a plain list or an OmegaConf ListConfig). Pure."""
    names = [value] if isinstance(value, str) else list(cast(Iterable[object], value)) if value is not None else []
    if not names:
        raise ConfigError(KEY, value, "no DDP backend is given", "use spread.ddp_backend=gloo, or [gloo,nccl] on GPUs")
    for name in names:
        if name not in BACKENDS:
            raise ConfigError(KEY, name, "unknown DDP backend", nearest(str(name), BACKENDS))
    require_unique(names, KEY, "a backend", "backend")
    return cast(list[str], names)  # each one of BACKENDS


@dataclasses.dataclass(frozen=True)
class DdpOptions:
    """ddp's own options, spread.ddp_<field> in the config."""

    backend: Any = "gloo"  # gloo or nccl, or a list of them (each measured); Any: OmegaConf's str-or-list

    def check(self) -> None:
        """Refuse a bad spread.ddp_backend, whether or not this sweep spreads with ddp."""
        backends_of(self.backend)


def rank_child(training: "Training", ctx: "PackContext", rank: int, world: int, threads: int,
               started: float) -> ChildSpec:
    """Rank ``rank`` of ``world``: its spec written, the child its supervisor starts."""
    run, pack_id, tid = ctx.run, ctx.pack.pack_id, training.training_id
    name = rank_name(tid, rank)  # rank 0's files are the training's own
    err_path = run.log(pack_id, name, "err")
    result_path = ctx.work(name, "result")
    spec_path = ctx.work(name, "spec")
    make_dirs(err_path.parent)
    result_path.unlink(missing_ok=True)  # a result left by an earlier attempt must not count
    assert ctx.spread is not None  # the job body hands a spread pack its placement (not user input)
    placement = dataclasses.replace(ctx.spread, rank=rank, world=world)
    spec = worker_spec(training, dataclasses.replace(ctx, threads=threads, spread=placement), started)
    spec["result_path"] = str(result_path)
    write_json_atomic(spec_path, spec)
    # On GPUs every rank sees all of the job's devices and takes cuda:<rank> itself (DdpSpread.device).
    argv = [sys.executable, "-m", "gpupack.job.runtime.worker", str(spec_path)]
    return ChildSpec(name, argv, run.log(pack_id, name, "out"), err_path, worker_env(ctx.env, threads), spec_path,
                     memory_limit_bytes=ctx.memory_limit_bytes, started_at=started)


def rank_name(training_id: str, rank: int) -> str:
    return training_id if rank == 0 else f"{training_id}.rank{rank}"


# A failed rank kills the others; one whose error only says a peer went away (the consequence of another's failure)
# waits PEER_GRACE_S for the rank that caused it.
RANKS_FAIL_TOGETHER = FailTogether(consequence=lambda rank: bool(PEER_LOST.search(tail(rank.err_path))),
                                   grace_s=PEER_GRACE_S)


class DdpStrategy(Strategy):
    name = "ddp"
    framework = "torch"
    Options = DdpOptions

    def labels(self, options: object) -> list[str]:
        return [PREFIX + b for b in backends_of(options.backend if isinstance(options, DdpOptions) else "gloo")]

    def placement(self, label: str, devices: int, device: str) -> Placement:
        return Placement(strategy=self.name, label=label, devices=devices, device=device, world=devices,
                         backend=backend_of(label))

    def check(self, workload: "Workload", devices: int, label: str, capacity: "Capacity", options: object) -> None:
        if backend_of(label) == "nccl" and capacity.has_gpu is not True:
            raise ConfigError(KEY, "nccl", "NCCL all-reduces between GPUs and this partition/machine has none",
                              "use spread.ddp_backend=gloo (it all-reduces between CPU processes too), or a GPU "
                              "partition")

    def run(self, trainings: Sequence["Training"], ctx: "PackContext") -> list["TrainingOutcome"]:
        # A spread pack holds one training; were there more, each would take all k devices in turn.
        return [self._run_one(t, ctx) for t in trainings]

    def _run_one(self, training: "Training", ctx: "PackContext") -> "TrainingOutcome":
        assert ctx.spread is not None  # internal: the job body sets it for every spread pack
        k = ctx.spread.devices
        threads = max(1, ctx.threads // k)  # the job's cores shared by the k ranks
        rendezvous: str | None = None
        try:
            with Supervisor(ctx.training_timeout_s, together=RANKS_FAIL_TOGETHER) as supervisor:
                # forked where process mode would fork the same training, so the two answers pay the same start-up
                method, _ = start_choice(process_options(ctx.settings).start, [load_workload(training.workload)])
                forked = method == "fork" and preload(supervisor, [training], ctx) is None
                started = time.time()  # after the server's preload (set-up, outside the pack's wall)
                # the ranks meet through a file of the training's own (a TCP port picked here could be taken first)
                rendezvous = tempfile.mkdtemp(prefix="gpupack-ddp-", dir=ctx.tmp_dir)
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
        outcome = _outcome(training, ctx, ranks, supervisor.culprit, started, ended, threads, forked)
        ctx.on_finished(outcome)
        return outcome


def _outcome(training: "Training", ctx: "PackContext", ranks: Sequence[ChildExit], culprit: ChildExit | None,
             started: float, ended: float, threads: int, forked: bool) -> "TrainingOutcome":
    """The training's outcome: the rank that failed first and why, else rank 0's result."""
    k = ctx.spread.devices if ctx.spread is not None else len(ranks)  # ranks: those that started
    timed_out = any(r.timed_out for r in ranks)
    cause = culprit or (next((r for r in ranks if r.returncode != 0), None) if timed_out else None)
    code: int | None = cause.returncode if cause is not None else 0
    result, error = None, None
    rank_of = {rank_name(training.training_id, r): r for r in range(k)}
    if cause is not None and cause.start_error is not None:
        why = cause.start_error.strerror or cause.start_error
        code, error = None, f"rank {rank_of[cause.name]} of {k}: could not start: {why}"
    elif cause is not None:
        error = f"rank {rank_of[cause.name]} of {k}: {cause.error()}"
    else:
        result, error = read_result(load_workload(training.workload), training.params,  # rank 0's
                                    ctx.work(training.training_id, "result"), started, ended)
    return ended_outcome(training.training_id, started, ended, code, error=error, result=result,
                         timed_out=timed_out, extra={"ranks": k, "threads_per_rank": threads,
                                                     "start": "fork" if forked else "fresh"})


STRATEGY = DdpStrategy()
