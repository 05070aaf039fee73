"""This machine, no cluster: submitit's LocalExecutor runs each pack as a job here.

Packs run one per device at a time — one per visible GPU, or one at a time on a CPU-only machine — so
that packs never disturb each other's timing.
"""
from __future__ import annotations

import resource
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Optional, Sequence

import psutil
import submitit

from gpupack.config import ClusterConfig
from gpupack.errors import ConfigError
from gpupack.monitor import detect_device, gpu_count
from gpupack.pack import Capacity
from gpupack.pack.job import PackSettings, job_cores
from gpupack.plan import Pack
from gpupack.rundir import check_name
from gpupack.submit import PackJob, PackResult, ProgressFn, Submitter, job_result, progress_state

POLL_S = 0.2


@dataclass
class LocalConfig(ClusterConfig):
    """The local backend's options (conf/cluster/local.yaml)."""

    # Partition label recorded with every pack.
    partition: str = "local"
    # Packs run at once; null: one per visible GPU, or one on a CPU-only machine so packs do not disturb
    # each other's timing.
    max_parallel_packs: Optional[int] = None


def process_room() -> int | None:
    """Processes this user may still start here: the soft ulimit -u (which counts threads too) and the kernel's pid
    space, less what runs now. None when neither is known."""
    running = len(psutil.pids())
    room = []
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY:
        room.append(soft - running)
    try:
        room.append(int(Path("/proc/sys/kernel/pid_max").read_text()) - running)
    except (OSError, ValueError):
        pass
    return max(0, min(room)) if room else None


class LocalSubmitter(Submitter):
    Config = LocalConfig

    def resolve_partitions(self, requested: Sequence[str]) -> tuple[str, ...]:
        label = check_name(self.key("partition"), self.cluster.partition)
        if list(requested) not in ([], [label]):
            raise ConfigError("partitions", list(requested), f"the {self.cluster.name} cluster has one partition, "
                              f"{label!r}", "choose a SLURM cluster (cluster=slurm, cluster=fir, ...) to compare "
                              "partitions")
        return (label,)

    def check(self, partitions: Sequence[str]) -> None:
        slots = self.cluster.max_parallel_packs
        if slots is not None and slots < 1:
            raise ConfigError(self.key("max_parallel_packs"), slots, "must be >= 1 or null",
                              "leave it null for one pack per device")
        if self.cluster.timeout_min < 1:
            raise ConfigError(self.key("timeout_min"), self.cluster.timeout_min, "must be >= 1",
                              "give each pack job at least a minute")

    def capacities(self, partitions: Sequence[str]) -> dict[str, Capacity]:
        """This machine: NVML's device (or none), the cores this process may use, its memory."""
        info = detect_device()
        cap = Capacity(has_gpu=info.kind == "gpu", gpu_memory_mb=info.memory_total_mb, max_cpus=job_cores(),
                       max_mem_mb=psutil.virtual_memory().total / 2**20, max_processes=process_room())
        return {name: cap for name in partitions}

    def slots(self) -> list[list[int]]:
        """The devices packs may use at once: one GPU each, or one CPU-wide slot."""
        gpus = gpu_count()
        n = self.cluster.max_parallel_packs or max(gpus, 1)
        return [[i % gpus] for i in range(n)] if gpus else [[] for _ in range(n)]

    def run_packs(self, packs: Sequence[Pack], settings: PackSettings, progress: ProgressFn) -> list[PackResult]:
        executor = submitit.LocalExecutor(folder=str(self.run.submitit / "%j"))
        free = self.slots()
        queue = list(packs)
        running: list[tuple[Pack, list[int], submitit.Job]] = []
        results: list[PackResult] = []
        for p in queue:
            progress(p, "pending")
        while queue or running:
            while queue and free:
                pack, gpus = queue.pop(0), free.pop(0)
                executor.update_parameters(timeout_min=self.cluster.timeout_min, gpus_per_node=len(gpus),
                                           visible_gpus=gpus, name=pack.pack_id)
                job = executor.submit(PackJob(), str(self.run.root), pack.pack_id, settings)
                running.append((pack, gpus, job))
                progress(pack, "running")
            time.sleep(POLL_S)
            for item in [r for r in running if r[2].done()]:
                running.remove(item)
                pack, gpus, job = item
                free.append(gpus)
                results.append(job_result(pack, job))
                progress(pack, progress_state(results[-1]))
        return results


SUBMITTER = LocalSubmitter
