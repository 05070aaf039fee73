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


@dataclass
class ClusterConfig:
    """Where packs run; ``backend`` names a module under gpupack/submit/."""

    name: str = "local"
    backend: str = "local"
    # Partition label recorded with every pack (a SLURM partition; "local" on this machine).
    partition: str = "local"
    # Time limit of one pack job.
    timeout_min: int = 60
    # Local backend: packs run at once; null: one per visible GPU, or one on a CPU-only machine so packs
    # do not disturb each other's timing.
    max_parallel_packs: Optional[int] = None


@dataclass
class GpupackConfig:
    sweep: SweepConfig = field(default_factory=SweepConfig)
    packing: PackingConfig = field(default_factory=PackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # Where records go; null: runs/<sweep.name>/<date>_<time>. Re-using a run directory resumes it.
    run_dir: Optional[str] = None
    # Plan and validate only: print the plan and write nothing.
    dry_run: bool = False


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="gpupack_schema", node=GpupackConfig)
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig, package="cluster")
