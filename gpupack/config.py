"""The config schema: dataclasses registered in Hydra's ConfigStore.

YAML under ``conf/`` holds the options and is validated against these types when Hydra composes it;
semantic checks (N >= 1, a known mode, an existing data path) live in :mod:`gpupack.validate`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class SweepConfig:
    """What to train: one workload, a grid of hyperparameters, and the ones held fixed."""

    name: str = MISSING
    workload: str = MISSING
    # Each value is a list of values, a single value, or a Hydra sweep string such as "range(0,4)".
    grid: Dict[str, Any] = field(default_factory=dict)
    # Hyperparameters every training shares (training length, model size, data path, ...).
    fixed: Dict[str, Any] = field(default_factory=dict)
    # Your estimate of one training's wall time on its own (seconds), e.g. from an earlier run's records;
    # time limits shorter than it are refused before anything is submitted. null: not checked.
    training_estimate_s: Optional[float] = None
    # Also run the input pipeline alone (N=1) for each distinct loader setting of the grid: the loader's
    # samples/s is an upper bound on training throughput, and collect flags N that reach it.
    loader_probe: bool = False


@dataclass
class PackingConfig:
    """How trainings share a device."""

    # Packing factors N to measure: N trainings at once on one device. The source study's GPU factors were
    # 1, 3, 5, 8, 13, 21, 34; the default here suits a 2-core machine.
    factors: List[int] = field(default_factory=lambda: [1, 2, 3, 4])
    # Packing modes to compare; each is a module under gpupack/pack/.
    modes: List[str] = field(default_factory=lambda: ["process"])
    # Packs measured per (mode, N) at least, so time per training has a median and a spread.
    repeats: int = 2
    # Threads each training may use; null: max(1, cores // N) (oversubscribing cores cost 2.4-3x here).
    threads_per_training: Optional[int] = None
    # Device the trainings use: auto (a GPU when the job has one, else CPU), cpu, or cuda.
    device: str = "auto"
    # process mode on a GPU node: run the N trainings under CUDA MPS (started and always stopped by the pack).
    mps: bool = False
    # tf_logical mode on a GPU: the GPU memory shared out among the N logical GPUs (MB); null: the GPU's
    # memory less tf_gpu_memory_reserve_mb, kept back for the CUDA context and TensorFlow itself.
    tf_gpu_memory_budget_mb: Optional[int] = None
    tf_gpu_memory_reserve_mb: int = 1024
    # Seconds between two samples of the device (GPU utilization and memory via NVML; CPU % and RSS always).
    sample_interval_s: float = 1.0
    # A training running longer than this is stopped and recorded as timed out; null: no limit.
    training_timeout_s: Optional[float] = None
    # Address-space limit of each training process (RLIMIT_AS), so one cannot take the host's memory from
    # the others; past it the training fails with an out-of-memory error, recorded as oom. null: no limit.
    memory_limit_gb_per_training: Optional[float] = None


@dataclass
class PartitionConfig:
    """One kind of GPU a cluster offers, and how to ask SLURM for one of it."""

    # Model specifier for --gpus-per-node=<gpu>:1 (or --gres=gpu:<gpu>:1); null: no GPU type is asked.
    gpu: Optional[str] = None
    # How to ask: "gpus_per_node" (the Alliance's recommended form) or "gres" (older sites).
    request: str = "gpus_per_node"
    # SLURM partition to submit to, where the site routes GPU types by partition; null: the site's default.
    slurm_partition: Optional[str] = None
    constraint: Optional[str] = None
    # Name in the RGU table (e.g. V100-16gb), for cost comparisons.
    model: Optional[str] = None
    # The most CPUs and host memory one single-GPU job should get here (the site's per-GPU guidance).
    max_cpus: Optional[int] = None
    max_mem_gb: Optional[float] = None
    # Retired hardware, kept so earlier measurements can still be labelled and compared.
    retired: bool = False


@dataclass
class ClusterConfig:
    """Where packs run; ``backend`` names a module under gpupack/submit/."""

    name: str = "local"
    backend: str = "local"
    # Partition label recorded with every pack on the local backend.
    partition: str = "local"
    # GPU types / partitions this cluster offers, by the name used in `partitions=[...]`.
    partitions: Dict[str, PartitionConfig] = field(default_factory=dict)
    # Partitions used when the command line names none.
    default_partitions: List[str] = field(default_factory=list)
    # SLURM account (--account); null: $SLURM_ACCOUNT or $SBATCH_ACCOUNT, as the Alliance documents.
    account: Optional[str] = None
    account_required: bool = False
    # Time limit of one pack job.
    timeout_min: int = 60
    # Resources one pack job asks for, scaled by N: ceil(N * cpus_per_training) CPUs, N * mem_gb_per_training GB.
    cpus_per_training: float = 1.0
    mem_gb_per_training: float = 2.0
    # Local backend: packs run at once; null: one per visible GPU, or one on a CPU-only machine so packs
    # do not disturb each other's timing.
    max_parallel_packs: Optional[int] = None
    # SLURM: array tasks of one (partition, mode, N) group running at once.
    array_parallelism: int = 64
    # SLURM: seconds before the time limit at which the pack is signalled to checkpoint and requeue.
    signal_delay_s: int = 90
    # SLURM: how many times a pack may be requeued after reaching its time limit.
    max_num_timeout: int = 3
    # Shell lines run before each job (e.g. "module load python/3.11", "source ~/venv/bin/activate").
    setup: List[str] = field(default_factory=list)
    # More sbatch options, passed as they are (e.g. {"qos": "high"}).
    additional_parameters: Dict[str, Any] = field(default_factory=dict)
    # Seconds between two looks at the queue while waiting.
    poll_s: float = 5.0


@dataclass
class RguConfig:
    """GPU model → RGU weight (cost of one GPU-hour), as data in conf/rgu/."""

    source: str = ""
    models: Dict[str, float] = field(default_factory=dict)


@dataclass
class GpupackConfig:
    sweep: SweepConfig = field(default_factory=SweepConfig)
    packing: PackingConfig = field(default_factory=PackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    rgu: RguConfig = field(default_factory=RguConfig)
    # Where records go; null: runs/<sweep.name>/<date>_<time>. Re-using a run directory resumes it.
    run_dir: Optional[str] = None
    # Partitions / GPU types to run on (keys of cluster.partitions); empty: the cluster's default_partitions.
    partitions: List[str] = field(default_factory=list)
    # Wait for the jobs and collect; false: submit, print the job ids and return (see `status` and `collect`).
    wait: bool = True
    # Plan and validate only: print the plan and write nothing.
    dry_run: bool = False


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="gpupack_schema", node=GpupackConfig)
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig, package="cluster")
    cs.store(group="rgu", name="rgu_schema", node=RguConfig, package="rgu")
