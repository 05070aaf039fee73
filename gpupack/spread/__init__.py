"""Spread strategies: one training over k devices, the source studies' other answer to a small training's idle GPU
(``spread.devices=[1,2,4]``), measured beside packing (N trainings on one device) in the same records.

Each strategy is one module ``gpupack/spread/<strategy>.py`` exposing ``STRATEGY``, a :class:`Strategy`. It has two
halves:

- the pack's side (:meth:`Strategy.run`, inside the job, like a packing mode's ``run``): start the training's
  process(es) over the job's k devices — DDP one process per device, MirroredStrategy one process for all — follow
  them and say how the training ended;
- the training's side (:meth:`Strategy.join`, in each of those processes, called by :mod:`gpupack.runtime.worker`): set the
  process up (DDP: join the process group; Mirrored: make the strategy over k devices) and hand the workload a
  :class:`Spread`, the few calls a workload makes to spread itself (wrap the model, take its share of a batch, build
  under a scope). The workload never knows which strategy it runs under.

A pack of a spread training is an ordinary :class:`gpupack.core.plan.Pack` of one training whose ``devices`` is k and
whose ``spread`` names the strategy; its mode is the strategy's label (``ddp-gloo``, ``ddp-nccl``, ``mirrored``), so
records, collect and the report keep one word for one layout.
"""
from __future__ import annotations

import contextlib
import importlib
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, ContextManager, Mapping, Sequence

from gpupack.errors import ConfigError, nearest, require_counts

if TYPE_CHECKING:  # the pack's side only: a training's process imports this module without them
    from gpupack.core.plan import Training
    from gpupack.core.types import Capacity, TrainingOutcome
    from gpupack.pack import PackContext
    from gpupack.workload import Workload

KEY = "spread.strategy"


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
    """In a spread training's process: what the workload calls. This base class is the identity (one device, one
    process), so a workload written against it trains the same way alone."""

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

    def wrap(self, model: Any) -> Any:
        """The model as this strategy trains it (DDP: DistributedDataParallel, with its all-reduces counted)."""
        return model

    def shard(self, *tensors: Any) -> tuple[Any, ...]:
        """This process's share of one global batch (DDP: the rank's contiguous slice). The workload keeps loading
        the global batch (``batch_size``), so the global batch is the same at every k."""
        return tensors

    def scope(self) -> ContextManager[Any]:
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


class Strategy(ABC):
    name: ClassVar[str]
    framework: ClassVar[str]  # the workloads it can spread: "torch" or "tensorflow"

    def labels(self, options: Any) -> list[str]:
        """The layouts this strategy measures, as pack modes (ddp: one per spread.ddp_backend)."""
        return [self.name]

    def placement(self, label: str, devices: int, device: str) -> Placement:
        """Where a pack of ``label`` over ``devices`` devices runs, as its job found the device ("cpu"/"cuda")."""
        return Placement(strategy=self.name, label=label, devices=devices, device=device)

    def check(self, workload: "Workload", devices: int, label: str, capacity: "Capacity", options: Any) -> None:
        """Refuse, before anything starts, what this strategy cannot spread (raise ConfigError). The framework and
        device count are checked for every strategy by :func:`check_spread`."""

    @abstractmethod
    def run(self, trainings: Sequence["Training"], ctx: "PackContext") -> list["TrainingOutcome"]:
        """Run the pack's one training over ``ctx.devices`` devices; call ctx.on_started / ctx.on_finished as a
        packing mode does, and say how it ended."""

    @abstractmethod
    def join(self, placement: Placement) -> Spread:
        """In the training's process, before the workload trains: set the process up and return its Spread."""


def available_strategies() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def load_strategy(name: str, key: str = KEY) -> Strategy:
    names = available_strategies()
    if name not in names:
        raise ConfigError(key, name, "no such spread strategy", nearest(name, names))
    return importlib.import_module(f"{__name__}.{name}").STRATEGY


def devices_on(capacity: "Capacity") -> tuple[int | None, str]:
    """How many devices one job on a partition can spread over, and what they are: the node's GPUs where it has
    them (sinfo, or NVML on this machine), else its CPUs standing in (k processes or k logical CPU devices)."""
    if capacity.has_gpu:
        return capacity.node_gpus, "GPUs"
    return capacity.node_cpus or capacity.max_cpus, "CPUs standing in for devices"


def check_spread(strategy: Strategy, workload: "Workload", devices: Sequence[int], labels: Sequence[str],
                 capacities: Mapping[str, "Capacity"], options: Any) -> None:
    """spread.* against the workload and what each partition's node has; one ConfigError line each. Pure."""
    if workload.framework != strategy.framework:
        others = [s for s in available_strategies() if load_strategy(s).framework == workload.framework]
        hint = (f"use spread.strategy={others[0]} for a {workload.framework} workload" if others else
                f"{workload.name} ({workload.framework}) has no spread strategy; leave spread.devices=[]")
        raise ConfigError(KEY, strategy.name, f"spreads {strategy.framework} trainings, but {workload.name} is a "
                          f"{workload.framework} workload", hint)
    if strategy.name not in workload.spreads:
        raise ConfigError(KEY, strategy.name, f"{workload.name} does not say how to spread itself with it "
                          "(Workload.spreads)", "leave spread.devices=[], or make the workload call ctx.spread "
                          "(see jobs/_torch_common.py)")
    require_counts(devices, "spread.devices", "a device count", "spread.devices=[1,2,4]", each="k")
    for name, cap in capacities.items():
        most, what = devices_on(cap)
        for i, k in enumerate(devices):
            if most is not None and k > most:
                raise ConfigError(f"spread.devices[{i}]", k, f"one training on {k} devices needs {k} {what} on one "
                                  f"node, but a {name} node has {most}",
                                  f"use spread.devices with k <= {most}, or a partition whose nodes have more")
            for label in labels:
                strategy.check(workload, k, label, cap, options)
