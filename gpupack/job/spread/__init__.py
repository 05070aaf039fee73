"""Spread strategies: one training over k devices (``spread.devices=[1,2,4]``), measured beside packing in the same
records.

Each strategy is one module ``gpupack/job/spread/<strategy>.py`` exposing ``STRATEGY``, a :class:`Strategy`: the pack's
side (:meth:`Strategy.run`) starts and follows the training's process(es); the training's side (``join`` in
``gpupack/job/runtime/joins/<strategy>.py``, in each process) sets it up and hands the workload a ``Spread``, so the
workload never knows which strategy it runs under. A spread pack is a :class:`gpupack.core.plan.Pack` of one
training whose ``devices`` is k and whose mode is the strategy's label (``ddp-gloo``, ``mirrored``).
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import fields
from typing import TYPE_CHECKING, ClassVar, Mapping, Sequence

from gpupack.core.placement import Placement
from gpupack.core.registry import exported, module_names, require_known
from gpupack.errors import ConfigError, require_counts

if TYPE_CHECKING:  # the pack's side only: a training's process imports this module without them
    from gpupack.core.plan import Training
    from gpupack.core.types import Capacity, Options, TrainingOutcome
    from gpupack.core.workload import Workload
    from gpupack.job.pack import PackContext

KEY = "spread.strategy"


class Strategy(ABC):
    name: ClassVar[str]
    framework: ClassVar[str]  # the workloads it can spread: "torch" or "tensorflow"
    # Its options: a dataclass whose field F is spread.<name>_F, with a ``check()`` (None: it has none).
    Options: ClassVar[type[Options] | None] = None

    def labels(self, options: object) -> list[str]:
        """The layouts this strategy measures, as pack modes (ddp: one per spread.ddp_backend)."""
        return [self.name]

    def placement(self, label: str, devices: int, device: str) -> Placement:
        """Where a pack of ``label`` over ``devices`` devices runs, as its job found the device ("cpu"/"cuda")."""
        return Placement(strategy=self.name, label=label, devices=devices, device=device)

    def check(self, workload: "Workload", devices: int, label: str, capacity: "Capacity", options: object) -> None:
        """Refuse, before anything starts, what this strategy cannot spread (beyond :func:`check_spread`'s checks)."""

    @abstractmethod
    def run(self, trainings: Sequence["Training"], ctx: "PackContext") -> list["TrainingOutcome"]:
        """Run the pack's one training over its devices, as a packing mode's ``run`` does."""


def available_strategies() -> list[str]:
    return module_names(__path__)


def load_strategy(name: str, key: str = KEY) -> Strategy:
    require_known(name, available_strategies(), key, "spread strategy")
    # an abstract class as the kind to check against (python/mypy#4717)
    return exported(importlib.import_module(f"{__name__}.{name}"), "STRATEGY", Strategy)  # type: ignore[type-abstract]


def strategy_options(strategy: Strategy, spread: Mapping[str, object]) -> Options | None:
    """``strategy``'s Options from the spread config's spread.<name>_* keys (None: it has none)."""
    if strategy.Options is None:
        return None
    prefix = f"{strategy.name}_"
    given = {f.name: spread[prefix + f.name] for f in fields(strategy.Options) if prefix + f.name in spread}
    return strategy.Options(**given)


def check_spread(strategy: Strategy, workload: "Workload", devices: Sequence[int], labels: Sequence[str],
                 capacities: Mapping[str, "Capacity"], options: object) -> None:
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
                          "(see gpupack/job/workloads/_torch_common.py)")
    require_counts(devices, "spread.devices", "a device count", "spread.devices=[1,2]", each="k")
    for name, cap in capacities.items():
        # one job spreads over its node's GPUs, else over its CPUs standing in for devices
        most, what = (cap.node_gpus, "GPUs") if cap.has_gpu else (cap.node_cpus or cap.max_cpus,
                                                                  "CPUs standing in for devices")
        for i, k in enumerate(devices):
            if most is not None and k > most:
                raise ConfigError(f"spread.devices[{i}]", k, f"one training on {k} devices needs {k} {what} on one "
                                  f"node, but a {name} node has {most}",
                                  f"use spread.devices with k <= {most}, or a partition whose nodes have more")
            for label in labels:
                strategy.check(workload, k, label, cap, options)
