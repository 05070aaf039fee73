"""The config schema, registered in Hydra's ConfigStore: what each key means and its type (conf/ holds the values;
:mod:`gpupack.sweep.setup.validate` checks their meaning)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Dict, List, Optional, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from gpupack.job.pack import available_modes, load_packer
from gpupack.job.spread import available_strategies, load_strategy
from gpupack.search.options import OptunaSearchConfig
from gpupack.submit import backend_configs  # each backend module owns its config dataclass


@dataclass
class SweepConfig:
    """What to train: one workload, a grid of hyperparameters, and the ones held fixed."""

    name: str = MISSING
    workload: str = MISSING
    # Each value is a list of values, a single value, or a Hydra sweep string such as "range(0,4)".
    grid: Dict[str, Any] = field(default_factory=dict)
    # Hyperparameters every training shares (training length, model size, data path, ...).
    fixed: Dict[str, Any] = field(default_factory=dict)
    # The space search=optuna explores where search.space is not given: hyperparameter -> its range in Hydra's
    # grammar (interval(a,b), tag(log, interval(a,b)), choice(a,b), ...). Checked whether a search runs or not.
    space: Dict[str, str] = field(default_factory=dict)
    # Your estimate of one training's wall time on its own (seconds), e.g. from an earlier run's records;
    # time limits shorter than it are refused before anything is submitted. null: not checked.
    training_estimate_s: Optional[float] = None
    # Memory one training needs (MB), which caps N before anything runs: N x it must fit packing.memory_fraction
    # of the device. Used until earlier records of the same setting measured it; null: a default (1 GB).
    training_memory_mb: Optional[float] = None
    # Also run the input pipeline alone (N=1) for each distinct loader setting of the grid: the loader's
    # samples/s is an upper bound on training throughput, and collect flags N that reach it.
    loader_alone: bool = False


@dataclass
class AutoConfig:
    """packing.factors=auto: probe N along the ladder, stop when it stops paying, run the grid at the best N."""

    # N tried in turn (the source study's ladder), as far as memory allows.
    ladder: List[int] = field(default_factory=lambda: [1, 2, 3, 5, 8, 13, 21, 34])
    # Stop when the next N improves time per training by less than this (0.05: 5 %) or within noise.
    min_gain: float = 0.05
    # Packs per probed N (and of the best N so far and the ladder's first, measured beside it in rounds); null:
    # packing.repeats, at least 3 (with 2 packs a side, a real 5 % gain is rarely beyond noise).
    repeats: Optional[int] = None
    # What the climb weighs: time per training, or cost: the RGU billed per training (time x a pack of N's billed
    # multiple of its GPU's RGU).
    objective: str = "time"


@dataclass
class PackingConfig:
    """How trainings share a device. Each mode's own options are packing.<mode>.* (its module's Options dataclass,
    added by :func:`packing_schema`): packing.process.mps, packing.process.start, packing.tf_logical.*."""

    # Packing factors N to measure: N trainings at once on one device. The source study's GPU factors were
    # 1, 3, 5, 8, 13, 21, 34; the default here suits a 2-core machine. "auto": find the best N by probing
    # packing.auto.ladder on one device per partition, then run the grid at it (packing.then).
    factors: Any = field(default_factory=lambda: [1, 2, 3, 4])
    # With factors=auto: run the rest of the grid at the best N found (run), or only measure (stop).
    then: str = "run"
    auto: AutoConfig = field(default_factory=lambda: AutoConfig())
    # Share of a device's memory N trainings may fill (GPU: NVML's total; CPU: host memory); the source's ~80 %.
    memory_fraction: float = 0.8
    # Each training's share of its GPU, memory_fraction / N (or its setting's measured peak, with memory_margin),
    # enforced where the platform can (an MPS client's limit, torch's per-process memory fraction): past it a training
    # gets its own OOM and its neighbours keep running. on | off.
    memory_share: str = "on"
    # A training whose setting was measured gets that peak x (1 + this) as its share, where the pack's shares fit
    # memory_fraction (the others split the rest). >= 0.
    memory_margin: float = 0.25
    # A streaming lane's freed slot takes its next training only when the memory it is expected to peak at fits the
    # device's free memory and the lane's budget; one that does not fit lets N smaller ones past, never starved.
    # on | off.
    admission: str = "on"
    # The host memory (MB) a streaming lane's trainings may hold together on a CPU, what admission packs against;
    # null: packing.memory_fraction of the host's.
    host_memory_mb: Optional[float] = None
    # Packing modes to compare; each is a module under gpupack/job/pack/.
    modes: List[str] = field(default_factory=lambda: ["process"])
    # Packs measured per (mode, N) at least, so time per training has a median and a spread.
    repeats: int = 2
    # Where no best N can be named, the rounds measured under foreign load are measured again on new seeds, up to this
    # many times; 0: never.
    remeasure: int = 1
    # The order packs run in: interleaved (seeded rounds of at most one pack of every N, so drift cannot line up with
    # N) or by_factor (all N=1 packs, then N=2, ...).
    order: str = "interleaved"
    order_seed: int = 0
    # Streaming: K jobs of N slots drain the trainings, a freed slot taking the next one at once, instead of whole
    # packs that wait for their slowest. auto: on for a production run (factors=auto's at the best N), off while
    # measuring N; on; off.
    stream: str = "auto"
    # Streaming jobs per (partition, mode, N); null: as many as run at once (local: one per device; SLURM:
    # cluster.array_parallelism), never more than the trainings fill at the start.
    jobs: Optional[int] = None
    # Threads each training may use; null: max(1, cores // N) (oversubscribing cores cost 2.4-3x here).
    threads_per_training: Optional[int] = None
    # Device the trainings use: auto (a GPU when the job has one, else CPU), cpu, or cuda.
    device: str = "auto"
    # Seconds between two samples of the device (GPU utilization and memory via NVML; CPU % and RSS always).
    sample_interval_s: float = 1.0
    # A training running longer than this is stopped and recorded as timed out; null: no limit.
    training_timeout_s: Optional[float] = None
    # Address-space limit of each training process (RLIMIT_AS), so one cannot take the host's memory from the others;
    # past it the training is recorded as oom. null: no limit.
    memory_limit_gb_per_training: Optional[float] = None


@dataclass
class SpreadConfig:
    """One training spread over k devices, measured beside packing (N trainings on one device)."""

    # k: the devices one training spreads over, each k its own packs (k <= the GPUs of one node; on a CPU machine,
    # k processes or k logical CPU devices stand in). Empty: no spread, packing only.
    devices: List[int] = field(default_factory=list)
    # The module under gpupack/job/spread/ that spreads it: ddp (torch, one process per device) or mirrored
    # (TensorFlow, one process over k devices). Its own options are spread.<strategy>_<option> (spread_schema), e.g.
    # spread.ddp_backend: gloo or nccl (a list, e.g. [gloo,nccl], measures both).
    strategy: str = "ddp"
    # Trainings measured per (strategy, k); null: packing.repeats.
    repeats: Optional[int] = None


@dataclass
class CollectConfig:
    """How collect ranks the grid's hyperparameters (also `python -m gpupack collect RUN --metric NAME --goal min`)."""

    # The metric to rank by, as the trainings reported it (gpupack.result / $GPUPACK_RESULT, sweep.fixed.metrics, a
    # Hydra task's return value: return_value). null: val_accuracy where reported, else the one metric reported.
    metric: Optional[str] = None
    # max or min: which way the metric is better. null: known only for val_accuracy (max); say it for any other.
    goal: Optional[str] = None
    # The PNG plots and report.html at a run's end; false: the tables and the answer only (a second less, no
    # matplotlib), and `python -m gpupack collect RUN_DIR` writes them later.
    plots: bool = True


@dataclass
class RguConfig:
    """GPU model → RGU weight (cost of one GPU-hour), as data in conf/rgu/."""

    source: str = ""
    models: Dict[str, float] = field(default_factory=dict)


@dataclass
class GpupackConfig:
    sweep: SweepConfig = field(default_factory=SweepConfig)
    packing: PackingConfig = field(default_factory=PackingConfig)
    spread: SpreadConfig = field(default_factory=SpreadConfig)
    # A backend's own config (gpupack.submit.local.LocalConfig, gpupack.submit.slurm.SlurmConfig), chosen by
    # cluster=NAME (conf/cluster/NAME.yaml names its schema in its defaults list).
    cluster: Any = MISSING
    rgu: RguConfig = field(default_factory=RguConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    # search=optuna (conf/search/optuna.yaml): an Optuna study's trials stream through the lanes instead of the grid
    search: Optional[OptunaSearchConfig] = None
    # Where records go; null: runs/<sweep.name>/<date>_<time>. Re-using a run directory resumes it.
    run_dir: Optional[str] = None
    # Partitions / GPU types to run on (keys of cluster.partitions); null: the cluster's default_partitions. An
    # empty list chooses none and is refused, as an empty grid is.
    partitions: Optional[List[str]] = None
    # Wait for the jobs and collect; false: submit, print the job ids and return (see `status` and `collect`).
    wait: bool = True
    # Plan and validate only: print the plan and write nothing.
    dry_run: bool = False
    # How many of its packs a dry run lists: "few" (the first ones, and a count of the rest) or "all".
    dry_run_packs: str = "few"


DRY_RUN_PACKS = ("few", "all")  # the values of dry_run_packs


def packing_schema() -> type:
    """PackingConfig with one section per packing mode that has options, typed by the mode's own dataclass: the
    modes own their options, and no mode is named here."""
    sections = [(mode, packer.Options, field(default_factory=packer.Options))
                for mode, packer in ((m, load_packer(m)) for m in available_modes()) if packer.Options]
    return make_dataclass("PackingConfig", sections, bases=(PackingConfig,))


def spread_schema() -> type:
    """SpreadConfig with each spread strategy's own options as spread.<strategy>_<option>, typed and defaulted by the
    strategy's Options dataclass (ddp's backend: spread.ddp_backend): no strategy is named here."""
    options = [(f"{name}_{f.name}", get_type_hints(strategy.Options)[f.name], field(default=f.default))
               for name, strategy in ((s, load_strategy(s)) for s in available_strategies()) if strategy.Options
               for f in fields(strategy.Options)]
    return make_dataclass("SpreadConfig", options, bases=(SpreadConfig,))


def schema() -> GpupackConfig:
    """The whole schema: GpupackConfig with every mode's and strategy's own options in their sections."""
    return GpupackConfig(packing=packing_schema()(), spread=spread_schema()())


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="gpupack_schema", node=schema())
    for backend, node in backend_configs().items():
        cs.store(group="cluster", name=f"{backend}_schema", node=node, package="cluster")
    cs.store(group="rgu", name="rgu_schema", node=RguConfig, package="rgu")
