"""spread.*, checked: one training over each k devices, by each layout of the strategy, against the workload and one
node of each partition. Pure, given what the backend answered."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from omegaconf import DictConfig

from gpupack.core.memory.figures import TrainingMemory
from gpupack.core.plan import expand_grid
from gpupack.core.workload import Workload
from gpupack.errors import ConfigError, require_counts, require_positive
from gpupack.job.spread import available_strategies, check_spread, load_strategy, strategy_options
from gpupack.sweep.setup.cluster_facts import ClusterFacts, check_fit


@dataclass(frozen=True)
class SpreadSpec:
    """spread.*, checked: one training over each k devices, by each layout of the strategy (ddp-gloo, mirrored)."""

    strategy: str
    layouts: tuple[tuple[str, str], ...]  # (strategy module, label): the label is the packs' mode
    devices: tuple[int, ...]
    repeats: int


def check_spread_config(cfg: DictConfig, workload: Workload, facts: ClusterFacts, memory: TrainingMemory,
                        fraction: float, grid: Mapping[str, list[object]], fixed: Mapping[str, object],
                        auto: bool) -> SpreadSpec | None:
    """spread.*: the strategy, its layouts and each k against the workload and one node of each partition (each of
    the k processes or replicas holds a whole model). None when spread.devices is empty."""
    spread = cfg.spread
    devices = list(spread.devices)
    check_spread_values(spread)  # every run: a value is checked whether this run spreads or not
    if not devices:
        return None
    if auto:
        raise ConfigError("spread.devices", devices, "packing.factors=auto probes packing alone",
                          "give explicit packing.factors=[...] to measure spread beside packing, or spread.devices=[]")
    strategy = load_strategy(spread.strategy)
    _refuse_other_strategies_options(spread, strategy.name)
    options = strategy_options(strategy, spread)
    labels = strategy.labels(options)
    check_spread(strategy, workload, devices, labels, facts.capacities, options)
    for point in expand_grid(grid):  # the workload's own limits, e.g. a global batch that splits over k devices
        for k in devices:
            try:
                workload.check_spread(workload.params({**fixed, **point}), strategy.name, k)
            except ConfigError as err:
                where = "sweep.grid" if err.key in grid else "sweep.fixed"
                raise ConfigError(f"{where}.{err.key}", err.value, f"{err.why} (spread.devices has {k})",
                                  err.hint) from None
    _check_devices_per_job(devices, facts)
    check_fit(devices, facts, key=lambda i: f"spread.devices[{i}]", noun="processes of one training",
              request_host_mb=memory.host, per_node=True)
    for name, cap in facts.capacities.items():  # each device holds a whole replica: k x one training's host memory
        budget = (cap.node_mem_mb or cap.max_mem_mb or 0) * fraction
        for i, k in enumerate(devices):
            if budget and k * memory.host.mb > budget:
                raise ConfigError(f"spread.devices[{i}]", k, f"{k} replicas x {memory.host.mb:.0f} MB "
                                  f"({memory.host.source}) of host memory is over {name}'s budget of "
                                  f"{budget / 1024:.1f} GB ({fraction:.0%})",
                                  "lower k, or raise packing.memory_fraction")
    return SpreadSpec(strategy=strategy.name, layouts=tuple((strategy.name, label) for label in labels),
                      devices=tuple(devices), repeats=int(spread.repeats or cfg.packing.repeats))


def _check_devices_per_job(devices: list[int], facts: ClusterFacts) -> None:
    """One job of k devices, refused where the site allows fewer (one MIG slice a job), quoting its rule."""
    for name, cap in facts.capacities.items():
        for i, k in enumerate(devices):
            if cap.max_devices_per_job is not None and k > cap.max_devices_per_job:
                raise ConfigError(f"spread.devices[{i}]", k, f"on partition {name}: {cap.devices_rule}",
                                  f"spread.devices=[{cap.max_devices_per_job}], or spread over a full GPU's partition")


def check_spread_values(spread: DictConfig) -> None:
    """spread.* on its own, whether spread.devices is empty or not. Pure."""
    require_counts(list(spread["devices"]), "spread.devices", "a device count", "spread.devices=[1,2]", each="k")
    require_positive(spread["repeats"], "spread.repeats", "spread.repeats=2, or null for packing.repeats", whole=True)
    load_strategy(spread["strategy"])


def _refuse_other_strategies_options(spread: DictConfig, strategy: str) -> None:
    """spread.<name>_* are the options of strategy <name> (spread.ddp_backend: ddp's): one set for another strategy
    would be silently ignored, so it is refused."""
    for owner in available_strategies():
        options = load_strategy(owner).Options
        if owner == strategy or options is None:
            continue
        defaults = options()
        for f in fields(options):
            key = f"{owner}_{f.name}"
            if key in spread and spread[key] != getattr(defaults, f.name):
                raise ConfigError(f"spread.{key}", spread[key],
                                  f"is an option of spread.strategy={owner}, and this sweep spreads with {strategy}",
                                  f"drop spread.{key}, or use spread.strategy={owner}")
