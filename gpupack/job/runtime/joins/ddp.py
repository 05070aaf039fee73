"""DDP, the training's side: in each rank's process, join the process group and give the workload a
:class:`DdpSpread`, whose communication hook counts what each step all-reduces, for the records.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Sequence

from gpupack.core.frameworks import Model, Tensor
from gpupack.core.placement import Placement, Spread
from gpupack.errors import ConfigError, nearest

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

KEY = "spread.ddp_backend"
BACKENDS = ("gloo", "nccl")
PREFIX = "ddp-"
JOIN_TIMEOUT_S = 600.0  # a rank's wait for the others: it ends only a group whose ranks all hang
FOLD_AT = 1024  # finished all-reduce intervals kept before those no later one can overlap are summed
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


def join(placement: Placement) -> "DdpSpread":
    """In rank r's process, before the workload trains: join the process group (on cuda:r where the job has GPUs)."""
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
    """What the communication hook saw (futures complete on the backend's threads, hence the lock)."""

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
                # no later all-reduce starts before the earliest still in flight: what ended by then is summed once
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
    """DDP's own all-reduce (``allreduce_hook``), counted: the bucket's bytes, and its time to completion."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buffer = bucket.buffer()
    token = state.started(buffer.numel() * buffer.element_size(), bucket.is_last())
    # the default (world) process group, the one DDP was built on; torch's hint says ProcessGroup, its code takes None
    world: Any = None
    fut = allreduce_hook(world, bucket)

    def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
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

    def wrap(self, model: Model) -> Model:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        on_gpu = self.placement.device == "cuda"
        ddp = DistributedDataParallel(model, device_ids=[self.rank] if on_gpu else None)
        self._count = _CommCount()
        # DDP checks a hook's annotations as objects; this module's are strings, torch being imported only here
        _counting_hook.__annotations__.update(bucket=dist.GradBucket, state=_CommCount,
                                              **{"return": torch.futures.Future[torch.Tensor]})
        ddp.register_comm_hook(self._count, _counting_hook)
        return ddp

    def shard(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        import torch

        return tuple(torch.tensor_split(t, self.world)[self.rank] for t in tensors)

    def mean(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return float(t.item()) / self.world

    def stats(self) -> dict[str, object]:
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
            # The union of the in-flight intervals (buckets overlap each other and the backward pass): an upper bound
            # on what the network added to a step. Host clock: with NCCL, closer to the launch than to the transfer.
            "allreduce_s_per_step": per_step(count.busy_s()),
        }

    def close(self) -> None:
        with contextlib.suppress(Exception):  # leaving is best effort: the process ends next
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
