"""Check a composed config's meaning (Hydra checked its types) before anything starts, and turn it into a typed
:class:`SweepSpec`. Every failure is a ConfigError naming the key, the value and the fix."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, cast

from omegaconf import DictConfig, ListConfig, OmegaConf

from gpupack.core.cost.rgu import check_weights
from gpupack.core.goal import check_goal, check_metric
from gpupack.core.memory.figures import Measured, TrainingMemory, check_memory, estimate, setting_key
from gpupack.core.plan import ORDERS, Plan, expand_grid, grid_values, make_plan
from gpupack.core.store.rundir import check_name
from gpupack.core.types import PackSettings
from gpupack.core.workload import Workload
from gpupack.errors import ConfigError, require_choice, require_counts, require_memory, require_positive, require_unique
from gpupack.job.pack import load_packer, solo_mode
from gpupack.job.workloads import load_workload
from gpupack.search.options import OptunaSearch, read_search
from gpupack.search.plan import search_plan
from gpupack.search.space import Dimension, parse_space, probe_grid
from gpupack.sweep.setup.cluster_facts import ClusterFacts, auto_ladder, bundle_warnings, check_fit, idle_gpu_warnings
from gpupack.sweep.setup.config import DRY_RUN_PACKS
from gpupack.sweep.setup.once import each_reading
from gpupack.sweep.setup.options import check_strategy_options, pack_settings
from gpupack.sweep.setup.spread_check import SpreadSpec, check_spread_config

DEVICES = ("auto", "cpu", "cuda")
STREAMS = ("auto", "on", "off")  # packing.stream
SWITCH = ("on", "off")  # packing.memory_share, packing.admission


@dataclass(frozen=True)
class AutoSpec:
    """packing.factors=auto, checked: the ladder as far as each partition can hold it, and why it ends there."""

    ladder: tuple[int, ...]  # N a job on every partition can hold (CPUs, the mode's limits), in the order tried
    cut: str | None  # why the ladder ends before its last rung, None when it does not
    min_gain: float
    repeats: int
    then: str  # run | stop
    # Where memory would stop the climb by today's figures (a default or stated one until the probe measures):
    # the probe re-checks each next N against what it measured, so this is a forecast, not a cut.
    memory_note: str | None = None
    objective: str = "time"  # packing.auto.objective: time | cost (the RGU billed per training)


@dataclass(frozen=True)
class SweepSpec:
    name: str
    workload: Workload
    workload_ref: str  # how the sweep named it (jobs/ name or dotted module): what workers import
    grid: dict[str, list[object]]  # typed values per key
    fixed: dict[str, object]  # every other hyperparameter: the workload's defaults with sweep.fixed on top
    factors: tuple[int, ...]
    modes: tuple[str, ...]
    partitions: tuple[str, ...]
    repeats: int
    settings: PackSettings
    loader_alone: bool = False
    order: str = "interleaved"
    order_seed: int = 0
    memory: TrainingMemory | None = None  # one training's memory: what capped N and sizes requests
    auto: AutoSpec | None = None  # packing.factors=auto: probe first (gpupack/sweep/flow/auto.py): its ladder
    warnings: tuple[str, ...] = ()  # said before anything runs, e.g. a request that leaves a node's GPUs idle
    notes: tuple[str, ...] = ()  # said before anything runs, nothing amiss: e.g. a preset's grid a search does not use
    spread: SpreadSpec | None = None  # spread.devices: one training over k devices, beside packing
    stream: str = "off"  # packing.stream: auto | on | off
    stream_jobs: int = 1  # K streaming jobs per (partition, mode, N): packing.jobs, else what runs at once
    search: OptunaSearch | None = None  # search=optuna: the study's trials stream through the lanes, not the grid
    # the reference N also measured at this many threads per training (gpupack.core.plan.setup_packs; None: not)
    reference_threads: int | None = None
    plots: bool = True  # collect.plots: a run's end writes the PNG plots and report.html

    def streams(self, production: bool) -> int | None:
        """K when this run streams (on; auto: a production run, never while measuring N), else None."""
        return self.stream_jobs if self.stream == "on" or (self.stream == "auto" and production) else None

    def start_notes(self) -> dict[str, str]:
        """How each mode starts a pack's trainings (fork or fresh, and why fresh), for the run's header."""
        params = [{**self.fixed, **{key: values[0] for key, values in self.grid.items() if values}}]
        return {mode: load_packer(mode).start_note(self.workload, params, self.settings) for mode in self.modes}

    @property
    def filler_seed(self) -> str | None:
        """What fills a pack's extra places: new seeds where the seed reaches the training, else repeats."""
        return self.workload.filler_seed(self.fixed)

    def plan(self) -> Plan:
        if self.search is not None:  # lanes that ask the study (gpupack.search.plan)
            return search_plan(sweep=self.name, workload=self.workload_ref, factor=self.factors[0],
                               partitions=self.partitions, modes=self.modes, jobs=self.stream_jobs,
                               n_trials=self.search.n_trials)
        param = self.workload.loader_param
        alone = (param, self.workload.loader_keys, solo_mode()) if self.loader_alone and param else None
        return make_plan(sweep=self.name, workload=self.workload_ref, grid=self.grid, fixed=self.fixed,
                         factors=self.factors, modes=self.modes, partitions=self.partitions,
                         repeats=self.repeats, seed_key=self.filler_seed, loader_alone=alone,
                         group_keys=group_keys(self.workload, self.modes), order=self.order,
                         order_seed=self.order_seed,
                         spread_layouts=self.spread.layouts if self.spread else (),
                         spread_devices=self.spread.devices if self.spread else (),
                         spread_repeats=self.spread.repeats if self.spread else None,
                         stream_jobs=self.streams(production=False), cost=self.workload.cost,
                         reference_threads=self.reference_threads)


def group_keys(workload: Workload, modes: Sequence[str]) -> dict[str, Callable[[Mapping[str, object]], object]]:
    """The modes that group trainings into packs (fused: same shapes), each with its key function."""
    packers = {mode: load_packer(mode) for mode in modes}
    return {mode: functools.partial(packer.group_key, workload) for mode, packer in packers.items() if packer.groups}


THEN = ("run", "stop")
OBJECTIVES = ("time", "cost")  # packing.auto.objective


def _check_factors(factors: object) -> tuple[int, ...]:
    if isinstance(factors, str):
        raise ConfigError("packing.factors", factors, "is neither a list of N nor auto",
                          "e.g. packing.factors=[1,2,4] or packing.factors=auto")
    if not isinstance(factors, (list, tuple, ListConfig)):  # a bare N: packing.factors=4
        example = f"[{factors}]" if isinstance(factors, int) and not isinstance(factors, bool) and factors >= 1 \
            else "[1,2,4]"
        raise ConfigError("packing.factors", factors, "must be a list of N (or auto)",
                          f"packing.factors={example}")
    factors = list(factors)
    if not factors:
        raise ConfigError("packing.factors", [], "no packing factor given",
                          "list at least one, e.g. packing.factors=[1,2,4]")
    require_counts(factors, "packing.factors", "a packing factor", "packing.factors=[1,2,4]", each="N")
    return tuple(factors)


def require_sweep(cfg: DictConfig) -> None:
    for key in ("name", "workload"):
        if OmegaConf.is_missing(cfg.sweep, key):
            raise ConfigError(f"sweep.{key}", "???", "no sweep chosen",
                              "choose one with +sweep=NAME, e.g. python -m gpupack +sweep=mnist_pack")


def _check_params(workload: Workload, grid: Mapping[str, list[object]], fixed: Mapping[str, object],
                  fixed_keys: set[str]) -> None:
    """The workload's checks of every training's hyperparameters: its Params' ranges once per value, its check() once
    per distinct reading of the grid (gpupack.sweep.setup.once), never once per training."""
    try:
        workload.check_ranges(fixed)
        for key, values in grid.items():
            for value in values:
                workload.check_ranges({key: value})
        each_reading(workload.check, grid, fixed, build=workload.params)
    except ConfigError as err:
        base = err.key.split("[")[0].split(".")[0]  # argv[0] → argv, env.NAME → env
        where = "sweep.grid" if base in grid else "sweep.fixed" if base in fixed_keys or base in fixed else "sweep"
        # a hint that is the key's own value (momentum=0.9) is given as the key is: sweep.fixed.momentum=0.9
        hint = f"{where}.{err.hint}" if err.hint.startswith(f"{err.key}=") else err.hint
        raise type(err)(f"{where}.{err.key}", err.value, err.why, hint) from None


def _check_estimate(cfg: DictConfig) -> None:
    """A time limit below one training's stated time can only end in timeouts: refuse it up front."""
    estimate = cfg.sweep.training_estimate_s
    if estimate is None:
        return
    require_positive(estimate, "sweep.training_estimate_s", "sweep.training_estimate_s=120 (seconds), or null")
    limits = {"packing.training_timeout_s": cfg.packing.training_timeout_s,
              "cluster.timeout_min": cfg.cluster.timeout_min * 60.0}
    for key, limit_s in limits.items():
        if limit_s is not None and limit_s < estimate:
            value = cfg.packing.training_timeout_s if key.startswith("packing") else cfg.cluster.timeout_min
            raise ConfigError(key, value, f"is {limit_s:.0f} s, below one training's estimate "
                              f"(sweep.training_estimate_s={estimate:g})",
                              f"raise it above {estimate:g} s (cluster.timeout_min is in minutes)")


def is_auto(cfg: DictConfig) -> bool:
    return isinstance(cfg.packing.factors, str) and cfg.packing.factors == "auto"


def measured_first(cfg: DictConfig) -> DictConfig:
    """The config as it runs (and config.yaml records): a search given several N measures them first, as
    packing.factors=auto with them as its ladder; else ``cfg`` as it is. Pure (a copy)."""
    factors = cfg.packing.factors
    if cfg.get("search") is None or is_auto(cfg) or not isinstance(factors, ListConfig) or len(factors) < 2:
        return cfg
    out = cfg.copy()
    out.packing.factors = "auto"
    out.packing.auto.ladder = list(factors)
    return out


def check_packing(cfg: DictConfig) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """packing.* on its own: factors (or auto's ladder), modes and the numeric options."""
    packing = cfg.packing
    modes = tuple(packing.modes)
    ladder = _check_auto_options(packing)  # every run: a value is checked whether this run uses it or not
    if is_auto(cfg):
        if len(modes) != 1:
            raise ConfigError("packing.modes", list(modes), "packing.factors=auto probes one mode",
                              "choose one, e.g. packing.modes=[process]; compare modes with explicit factors")
        factors = ladder
    else:
        factors = _check_factors(packing.factors)
    if not modes:
        raise ConfigError("packing.modes", [], "no packing mode given", "e.g. packing.modes=[process]")
    for i, mode in enumerate(modes):
        load_packer(mode, key=f"packing.modes[{i}]")
    require_unique(modes, "packing.modes", "a packing mode", "mode")
    if packing.repeats < 1:
        raise ConfigError("packing.repeats", packing.repeats, "must be >= 1 (packs measured per N)",
                          "packing.repeats=2")
    if isinstance(packing.remeasure, bool) or not isinstance(packing.remeasure, int) or packing.remeasure < 0:
        raise ConfigError("packing.remeasure", packing.remeasure, "must be a whole number >= 0 (times the rounds "
                          "measured under load are measured again where no N can be named)",
                          "packing.remeasure=1, or 0 to never measure again")
    require_choice(packing.order, ORDERS, "packing.order", "pack order")
    check_job_options(packing, "packing", {"threads_per_training": "threads_per_training=2, or null to share the "
                                                                   "job's cores out",
                                           "training_timeout_s": "training_timeout_s=3600, or null for no limit"})
    require_memory(packing.memory_limit_gb_per_training, "packing.memory_limit_gb_per_training", "GB",
                   "packing.memory_limit_gb_per_training=4, or null for no limit")
    if packing.stream == "on":
        for i, mode in enumerate(modes):
            if not load_packer(mode).streams:
                raise ConfigError(f"packing.modes[{i}]", mode, "cannot stream: its N trainings share one process, "
                                  "so a slot cannot take a new training while the others run",
                                  "use packing.modes=[process] with packing.stream=on, or packing.stream=off")
    require_choice(packing.memory_share, SWITCH, "packing.memory_share", "memory share choice")
    margin = packing.memory_margin
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin < 0:
        raise ConfigError("packing.memory_margin", margin, "must be a number >= 0 (a measured peak x (1 + it) is a "
                          "training's share)", "e.g. packing.memory_margin=0.25, or 0 for the measured peak itself")
    require_choice(packing.admission, SWITCH, "packing.admission", "admission choice")
    require_memory(packing.host_memory_mb, "packing.host_memory_mb", "MB",
                   "packing.host_memory_mb=8000, or null for packing.memory_fraction of the host's")
    if not 0 < packing.memory_fraction <= 1:
        raise ConfigError("packing.memory_fraction", packing.memory_fraction, "must be in (0, 1]",
                          "e.g. packing.memory_fraction=0.8 (the source's 80 % target)")
    return factors, modes


def check_job_options(options: Mapping[str, object], prefix: str, examples: Mapping[str, str],
                      names: Mapping[str, str] | None = None) -> None:
    """What a pack's trainings are given, as packing.* names them or a Hydra launcher does (``names``: the launcher's
    name of each, e.g. threads_per_job); ``examples``: the hint of a key that has its own."""
    names = names or {}
    require_choice(options.get("device", "auto"), DEVICES, f"{prefix}.device", "device")  # one name in both
    require_choice(options.get("stream", "auto"), STREAMS, f"{prefix}.stream", "streaming choice")
    for name, whole, allow_none, example in (("threads_per_training", True, True, "2"),
                                             ("sample_interval_s", False, False, "1"),
                                             ("training_timeout_s", False, True, "3600"),
                                             ("jobs", True, True, "2, or null for as many as run at once")):
        given = names.get(name, name)  # as this front-end names it
        if given in options:
            require_positive(options.get(given), f"{prefix}.{given}",
                             f"{prefix}.{examples.get(name, f'{given}={example}')}", whole=whole, allow_none=allow_none)


def _check_auto_options(packing: DictConfig) -> tuple[int, ...]:
    """packing.auto.* and packing.then, checked on every run (explicit factors too); the ladder."""
    ladder = list(packing.auto.ladder)
    require_counts(ladder, "packing.auto.ladder", "a packing factor", "packing.auto.ladder=[1,2,3,5,8]")
    if len(ladder) < 2 or ladder != sorted(set(ladder)):
        raise ConfigError("packing.auto.ladder", ladder, "needs two or more N, rising, each once",
                          "e.g. packing.auto.ladder=[1,2,3,5,8,13,21,34]")
    if not 0 <= packing.auto.min_gain < 1:
        raise ConfigError("packing.auto.min_gain", packing.auto.min_gain, "must be in [0, 1)",
                          "e.g. packing.auto.min_gain=0.05 (stop below a 5 % gain)")
    if packing.auto.repeats is not None and packing.auto.repeats < 2:
        raise ConfigError("packing.auto.repeats", packing.auto.repeats, "must be >= 2 or null: a probe needs two "
                          "packs per N to tell a gain from noise", "packing.auto.repeats=3")
    require_choice(packing.auto.objective, OBJECTIVES, "packing.auto.objective", "objective")
    require_choice(packing.then, THEN, "packing.then", "choice")
    return tuple(ladder)


def check_modes(workload: Workload, modes: Sequence[str], factors: Sequence[int], facts: ClusterFacts,
                settings: PackSettings) -> None:
    """Each mode refuses, before submission, a workload, N or option it cannot host on each partition."""
    for mode in modes:
        packer = load_packer(mode)
        for name in facts.partitions:
            for n in factors:
                packer.check(workload, n, facts.capacities[name], settings)


def check_packs(workload: Workload, modes: Sequence[str], factors: Sequence[int], facts: ClusterFacts,
                settings: PackSettings, memory: TrainingMemory, fraction: float, key: Callable[[int], str],
                noun: str = "trainings") -> None:
    """Packs of each N against what the backend answered (a sweep's and a Hydra batch's): a job's CPUs and host
    memory, then each mode's own limits (the more specific answer), then the device's memory."""
    check_fit(factors, facts, key=key, noun=noun, request_host_mb=memory.host)
    check_modes(workload, modes, factors, facts, settings)
    check_memory(factors, facts.capacities, memory, fraction, key=key)


def plain(node: DictConfig) -> dict[str, object]:
    """A mapping of the config (its schema says a Dict) as plain values, interpolations resolved."""
    return cast("dict[str, object]", OmegaConf.to_container(node, resolve=True))


def _check_against_the_workload(cfg: DictConfig, workload: Workload, searching: bool, factors: Sequence[int]) -> None:
    """A search streams at one N; the goal and metric are ones the trainings report."""
    if searching and str(cfg.packing.stream) == "off":
        raise ConfigError("packing.stream", "off", "a search streams its trials (each slot asks the study for the next "
                          "as one ends); whole packs would wait for their slowest trial before asking",
                          "leave packing.stream=auto (or on) with search=optuna")
    if searching and not is_auto(cfg) and len(factors) != 1:
        raise ConfigError("packing.factors", list(factors), "a search streams its trials at one N",
                          f"packing.factors=[{max(factors)}] (or packing.factors=auto to measure it first)")
    if cfg.collect.goal is not None:
        check_goal(cfg.collect.goal, "collect.goal")
    if cfg.collect.metric is not None and workload.reported_metrics is not None:  # None: known only once they ran
        check_metric(str(cfg.collect.metric), workload.reported_metrics, "collect.metric",
                     f"{workload.name}'s trainings")


def _auto_spec(cfg: DictConfig, workload: Workload, modes: Sequence[str], factors: Sequence[int],
               facts: ClusterFacts, settings: PackSettings, memory: TrainingMemory, fraction: float) -> AutoSpec:
    """packing.factors=auto: the ladder the device can hold (cut where memory says so) and the probe's settings."""
    ladder, cut, memory_note = auto_ladder(factors, facts, memory, fraction,
                                           lambda n: check_modes(workload, modes, [n], facts, settings))
    return AutoSpec(ladder=ladder, cut=cut, min_gain=float(cfg.packing.auto.min_gain),
                    repeats=int(cfg.packing.auto.repeats or max(3, cfg.packing.repeats)), then=cfg.packing.then,
                    memory_note=memory_note, objective=str(cfg.packing.auto.objective))


def _check_groups(workload: Workload, modes: Sequence[str], grid: Mapping[str, Sequence[object]],
                  fixed: Mapping[str, object]) -> None:
    """Every training fits a group of each mode that packs by group (fused: one shape, no AMP...)."""
    for mode, key in group_keys(workload, modes).items():
        try:
            each_reading(key, grid, fixed)
        except ConfigError as err:
            where = "sweep.grid" if err.key in grid else "sweep.fixed"
            raise ConfigError(f"{where}.{err.key}", err.value, f"{err.why} (packing.modes has {mode})",
                              err.hint) from None


def validate(cfg: DictConfig, facts: ClusterFacts,
             measure: Callable[[str, set[str], str], Measured] | None = None) -> SweepSpec:
    """Check everything against the backend's answers (``facts``) and, through ``measure``, what earlier records
    say one training's memory is (None: nothing measured). Pure, given those. A sweep was chosen (require_sweep)."""
    check_weights(plain(cfg.rgu.models))
    require_choice(cfg.dry_run_packs, DRY_RUN_PACKS, "dry_run_packs", "pack listing")
    sweep = cfg.sweep
    check_name("sweep.name", sweep.name)
    workload = load_workload(sweep.workload)
    # a search's default: checked whether one runs or not
    check_space(parse_space(plain(sweep.space), "sweep.space") if sweep.space else {}, workload, "sweep.space")
    search = check_search(cfg, workload) if cfg.get("search") is not None else None
    # a search's grid is the one point of its space a probe for N trains (the space's midpoints), so memory and every
    # check see a trial's setting; the user's grid is not used (a name both fixed and searched was refused)
    grid, fixed = typed_grid(workload, probe_grid(search.space) if search else plain(sweep.grid), plain(sweep.fixed))
    if sweep.loader_alone and not workload.loader_param:
        raise ConfigError("sweep.loader_alone", True, f"{workload.name} cannot run its data loader alone",
                          "set sweep.loader_alone=false, or give the workload a loader_param")
    factors, modes = check_packing(cfg)
    _check_against_the_workload(cfg, workload, search is not None, factors)
    # Every mode's and strategy's own options, used by this sweep or not: a value out of range is refused, not ignored.
    settings = pack_settings(cfg.packing, cfg.sweep.training_estimate_s, cfg.sweep.training_memory_mb)
    check_strategy_options(cfg.spread)
    _check_estimate(cfg)
    stated = sweep.training_memory_mb
    require_memory(stated, "sweep.training_memory_mb", "MB", "sweep.training_memory_mb=800, or null")
    settings_seen = {setting_key({**fixed, **p}, workload.seed_key) for p in expand_grid(grid)}
    measured = measure(sweep.workload, settings_seen, workload.seed_key) if measure else Measured()
    memory = estimate(stated, measured)
    fraction = float(cfg.packing.memory_fraction)
    auto = None
    if is_auto(cfg):
        auto = _auto_spec(cfg, workload, modes, factors, facts, settings, memory, fraction)
        factors = auto.ladder
    else:
        check_packs(workload, modes, factors, facts, settings, memory, fraction, lambda i: f"packing.factors[{i}]")
    spread = check_spread_config(cfg, workload, facts, memory, fraction, grid, fixed, auto=is_auto(cfg))
    _check_groups(workload, modes, grid, fixed)
    return SweepSpec(name=sweep.name, workload=workload, workload_ref=sweep.workload, grid=grid, fixed=fixed,
                     factors=factors, modes=modes, partitions=facts.partitions, repeats=cfg.packing.repeats,
                     loader_alone=bool(sweep.loader_alone), settings=settings, order=cfg.packing.order,
                     order_seed=int(cfg.packing.order_seed), memory=memory, auto=auto,
                     warnings=tuple(idle_gpu_warnings(factors, facts, memory.host))
                     + tuple(bundle_warnings(factors, facts, memory.host))
                     + device_notes(workload, grid, fixed, facts, settings.device),
                     notes=grid_unused(search, plain(sweep.grid)), spread=spread,
                     stream=str(cfg.packing.stream),
                     stream_jobs=int(cfg.packing.jobs or min(facts.stream_jobs(p) for p in facts.partitions)),
                     search=search, reference_threads=reference_threads(factors, facts, settings),
                     plots=bool(cfg.collect.plots))


def reference_threads(factors: Sequence[int], facts: ClusterFacts, settings: PackSettings) -> int | None:
    """1 where the reference N (the smallest) would get more than one thread per training on a CPU: a training given
    threads it cannot use is the one its neighbours slow most, so the reference is measured at 1 thread as well. None
    where the threads are the user's, on a GPU, where the cores are not known, or with one N. Pure."""
    if settings.threads_per_training is not None or len(set(factors)) < 2:
        return None
    caps = [facts.capacities.get(p) for p in facts.partitions]
    on_cpu = settings.device == "cpu" or all(c is not None and c.has_gpu is False for c in caps)
    cores = [c.max_cpus for c in caps if c is not None and c.max_cpus]
    if not on_cpu or not cores or len(cores) != len(caps):
        return None
    return 1 if min(cores) // min(factors) > 1 else None


def check_space(space: Mapping[str, Dimension], workload: Workload, key: str) -> None:
    """A search space's names and types, the workload's."""
    for name, dim in space.items():
        sample = dim.choices[0] if dim.choices else int(dim.low) if dim.kind == "int" else dim.low
        workload.typed(name, sample, key)


def check_search(cfg: DictConfig, workload: Workload) -> OptunaSearch:
    """search.*, checked (gpupack.search.options), its space's names and types against the workload's."""
    section = plain(cfg.search)
    where = "search.space"
    if not section.get("space") and cfg.sweep.space:  # the sweep's own space, where the command gives none
        section["space"], where = plain(cfg.sweep.space), "sweep.space"
    search = read_search(section, cfg.collect.metric, cfg.collect.goal, workload.reported_metrics, workload.name,
                         workload.curve_in_output)
    check_space(search.space, workload, where)
    fixed = plain(cfg.sweep.fixed)
    for name in search.space:
        if name in fixed:  # the space would replace it in every trial: said, not dropped
            raise ConfigError(f"sweep.fixed.{name}", fixed[name], f"is also searched ({where}.{name}): each "
                              "trial takes the space's value, never this one",
                              f"drop one: ~sweep.fixed.{name}, or leave {name} out of {where}")
    return search


def grid_unused(search: OptunaSearch | None, raw_grid: Mapping[str, object]) -> tuple[str, ...]:
    """A search given a grid: the note that it is not used (a preset sweep brings its grid, so not refused). Pure."""
    if search is None or not raw_grid:
        return ()
    return (f"sweep.grid ({', '.join(map(str, raw_grid))}) is not used by search=optuna: the space "
            f"({', '.join(search.space)}) chooses each trial's values, and an axis outside it keeps sweep.fixed's or "
            "the workload's default",)


def device_notes(workload: Workload, grid: Mapping[str, list[object]], fixed: Mapping[str, object], facts: ClusterFacts,
                 device: str) -> tuple[str, ...]:
    """What the workload will do otherwise than asked on each partition (its device_note), each said once. Pure."""
    notes: list[str] = []
    for partition in facts.partitions:
        has_gpu = facts.capacities[partition].has_gpu if device != "cpu" else False
        readings = each_reading(lambda values: workload.device_note(values, has_gpu), grid, fixed)
        notes += [f"{partition}: {note}" for _, note in readings if note]
    return tuple(dict.fromkeys(notes))


def requested_partitions(partitions: Sequence[str] | None) -> list[str]:
    """``partitions`` as the backend is asked for them: null (none asked) leaves it the cluster's default ones."""
    if partitions is None:
        return []
    if not partitions:
        raise ConfigError("partitions", [], "an empty list chooses no partition to run on",
                          "partitions=null (or leave it out) runs on the cluster's default ones; or name those to "
                          "run on (--cfg job -p cluster lists them)")
    return list(partitions)


def typed_grid(workload: Workload, raw_grid: Mapping[str, object], raw_fixed: Mapping[str, object]
               ) -> tuple[dict[str, list[object]], dict[str, object]]:
    """The grid's values and the fixed hyperparameters, typed by the workload and checked by it."""
    if not raw_grid:
        raise ConfigError("sweep.grid", raw_grid, "the grid is empty",
                          "give at least one axis, e.g. +sweep.grid.lr=[0.1,0.01]")
    # Typed first: a key that may not be a grid axis at all (command's argv) is refused for what it is.
    grid = {k: workload.typed_values(k, grid_values(k, raw), "sweep.grid") for k, raw in raw_grid.items()}
    for k, values in grid.items():  # an axis is a set: a value twice would be planned twice, reseeded unasked
        require_unique(values, f"sweep.grid.{k}", "a grid value", "value")
    if both := sorted(set(raw_grid) & set(raw_fixed)):
        key = both[0]
        raise ConfigError(f"sweep.fixed.{key}", raw_fixed[key], "is also a grid axis",
                          f"keep {key} in sweep.grid or in sweep.fixed, not both")
    fixed = {**workload.defaults(), **{k: workload.typed(k, v, "sweep.fixed") for k, v in raw_fixed.items()}}
    for k in grid:
        fixed.pop(k, None)
    _check_params(workload, grid, fixed, set(raw_fixed))
    return grid, fixed
