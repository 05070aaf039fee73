"""The launcher's options, registered as hydra/launcher=gpupack_local and hydra/launcher=gpupack_slurm.

They keep hydra-submitit-launcher's names (timeout_min, cpus_per_task, mem_gb, gpus_per_node, partition, gres,
account, array_parallelism, setup, additional_parameters, signal_delay_s, max_num_timeout, ...) so switching is
one override, and add gpupack's: ``pack`` (jobs per GPU) and ``mode``. ``cpus_per_task`` and ``mem_gb`` are what
ONE job needs, as with hydra-submitit-launcher; a pack of N asks SLURM for N times that.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class BaseGpupackConf:
    # Jobs that share one GPU (one array task per pack); 1 is one job per GPU, as hydra-submitit-launcher does.
    pack: int = 1
    # How the jobs of a pack share the GPU: a module under gpupack/job/pack/ that hosts any program (process).
    mode: str = "process"
    # auto/on: each pack job is a streaming lane of `pack` slots, and a slot whose job ends takes the next job of the
    # batch at once (no slot waits for the pack's slowest job); off: whole packs of `pack` jobs, one after another.
    stream: str = "auto"
    # Streaming pack jobs per batch; null: as many as run at once (local: one per device slot; SLURM:
    # array_parallelism), never more than the batch fills.
    jobs: Optional[int] = None
    # Time limit of one pack (minutes).
    timeout_min: int = 60
    # CPUs and host memory (GB) ONE job needs; a pack of N asks N times. null: 1 CPU, 2 GB.
    cpus_per_task: Optional[float] = None
    mem_gb: Optional[float] = None
    # GPUs per pack: 1 (the pack's jobs share it) or 0 (CPU only).
    gpus_per_node: Optional[int] = None
    # Accepted for hydra-submitit-launcher configs; a pack is one task on one node.
    tasks_per_node: int = 1
    nodes: int = 1
    name: str = "${hydra.job.name}"
    # Threads each job may use (OMP_NUM_THREADS, ...); null: the pack's cores shared out.
    threads_per_job: Optional[int] = None
    # A job running longer than this is stopped and returns its failure; null: no limit.
    job_timeout_s: Optional[float] = None
    # Device the jobs see: auto (the pack's GPU, else CPU), cpu, or cuda.
    device: str = "auto"
    # GPU utilization / memory samples per pack (seconds between samples).
    sample_interval_s: float = 1.0
    # Run each pack's jobs under CUDA MPS (process mode on a GPU).
    mps: bool = False
    # How each job's process starts: auto (fork it from one server per pack that preloaded the app: its module and
    # what it imports, e.g. torch; fresh interpreters where that is unsafe, said in one line), fork, or fresh (a new
    # interpreter per job that imports everything again).
    start: str = "auto"
    # Modules the pack's server imports besides the app's (what the app imports inside its task function), e.g.
    # [torch, lightning]; with start=fresh, nothing.
    preload: List[str] = field(default_factory=list)
    # gpupack's records (time per job, per pack): under the multirun directory. `python -m gpupack collect
    # MULTIRUN_DIR` reads them.
    records_dir: str = "${hydra.sweep.dir}/.gpupack"


@dataclass
class GpupackLocalConf(BaseGpupackConf):
    _target_: str = "hydra_plugins.gpupack_launcher.gpupack_launcher.GpupackLocalLauncher"
    # Packs at once; null: one per visible GPU, or one at a time on a machine with no GPU.
    max_parallel_packs: Optional[int] = None


@dataclass
class GpupackSlurmConf(BaseGpupackConf):
    _target_: str = "hydra_plugins.gpupack_launcher.gpupack_launcher.GpupackSlurmLauncher"
    gpus_per_node: Optional[int] = 1
    partition: Optional[str] = None
    qos: Optional[str] = None
    comment: Optional[str] = None
    constraint: Optional[str] = None
    exclude: Optional[str] = None
    # e.g. gpu:v100:1 (one GPU per pack; the type picks the GPU model)
    gres: Optional[str] = None
    account: Optional[str] = None
    signal_delay_s: int = 120
    max_num_timeout: int = 0
    additional_parameters: Dict[str, Any] = field(default_factory=dict)
    array_parallelism: int = 256
    setup: Optional[List[str]] = None
    # The RGU table's name of the partition's GPU (e.g. V100-16gb), for cost when NVML cannot name it.
    gpu_model: Optional[str] = None
    # Seconds between two looks at the queue while waiting.
    poll_s: float = 5.0


ConfigStore.instance().store(group="hydra/launcher", name="gpupack_local", node=GpupackLocalConf(),
                             provider="gpupack")
ConfigStore.instance().store(group="hydra/launcher", name="gpupack_slurm", node=GpupackSlurmConf(),
                             provider="gpupack")
