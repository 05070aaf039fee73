"""One training spread over k devices, as its processes see it: where each process stands (:class:`Placement`) and
the calls the workload makes (:class:`Spread`, ``ctx.spread``); the strategies are :mod:`gpupack.job.spread`'s."""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any, ContextManager, Mapping

from gpupack.core.frameworks import Model, Tensor


@dataclass(frozen=True)
class Placement:
    """Where one process of a spread training stands; written into its worker spec (``spec["spread"]``)."""

    strategy: str  # module name: ddp | mirrored
    label: str  # the pack's mode: ddp-gloo | ddp-nccl | mirrored
    devices: int  # k: the devices the training spreads over
    device: str  # "cpu" or "cuda": what the job found (k CPU stand-ins, or k of the job's GPUs)
    rank: int = 0  # this process among the training's processes
    world: int = 1  # the training's processes: k for DDP, 1 for MirroredStrategy
    backend: str | None = None  # ddp: gloo | nccl
    # ddp: where the ranks meet, file:///<job tmp>/store (a file of this training alone: no port to race for);
    # None: torch's env:// (MASTER_ADDR, MASTER_PORT), for a process group set up by hand
    init_method: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "Placement":
        return Placement(**dict(data))


class Spread:
    """What the workload calls in a spread training's process; this base is the identity (one device, one process)."""

    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    @property
    def rank(self) -> int:
        return self.placement.rank

    @property
    def world(self) -> int:
        return self.placement.world

    @property
    def is_main(self) -> bool:
        """The process whose result is the training's (rank 0)."""
        return self.placement.rank == 0

    @property
    def device(self) -> str:
        """The device this process trains on (DDP over GPUs: cuda:<rank>; otherwise the job's device)."""
        return self.placement.device

    def wrap(self, model: Model) -> Model:
        """The model as this strategy trains it (DDP: DistributedDataParallel, with its all-reduces counted)."""
        return model

    def shard(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        """This process's share of one global batch (DDP: the rank's slice): the global batch is the same at every k."""
        return tensors

    def scope(self) -> ContextManager[object]:
        """Where the model, its optimizer and compile must be built (MirroredStrategy's scope)."""
        return contextlib.nullcontext()

    def mean(self, value: float) -> float:
        """``value`` averaged over the training's processes (a loss each rank measured on its share)."""
        return value

    def stats(self) -> dict[str, Any]:
        """What the strategy measured, into the training's result (DDP: all-reduce bytes and time per step)."""
        return {}

    def close(self) -> None:
        """Leave (DDP: destroy the process group)."""
