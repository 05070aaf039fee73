"""Submission backends: the only place that knows about executors and clusters.

Each backend is one module ``gpupack/submit/<backend>.py`` exposing ``SUBMITTER``, a :class:`Submitter`
subclass; a cluster preset (conf/cluster/*.yaml) names its backend. All backends hand a pack to the
same job body, :class:`PackJob` (:func:`gpupack.pack.job.run_pack`, checkpointable for requeues).
"""
from __future__ import annotations

import importlib
import pkgutil
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import submitit

from gpupack.errors import ConfigError, nearest
from gpupack.monitor import detect_device
from gpupack.pack import Capacity
from gpupack.pack.job import PackSettings, run_pack
from gpupack.plan import Pack
from gpupack.records import read_json, write_json_atomic
from gpupack.rundir import RunDir, check_name


@dataclass
class PackResult:
    pack_id: str
    partition: str
    job_id: str | None
    ok: bool  # the job ran to its end (its trainings may still have failed: see the records)
    error: str | None = None
    record: dict[str, Any] | None = None


# Called with (pack, state) as packs move: "pending" → "running" → "done" | "failed".
ProgressFn = Callable[[Pack, str], None]

# Queue states that mean a job may still run (sacct / submitit spellings).
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED",
                 "REQUEUE_HOLD", "REQUEUE_FED")


class PackJob(submitit.helpers.Checkpointable):
    """The job body as submitit runs it. Checkpointable: when SLURM signals the time limit, submitit
    requeues the same call, and run_pack then runs only the trainings that have no completed record."""

    def __call__(self, run_root: str, pack_id: str, settings: PackSettings) -> dict[str, Any]:
        return run_pack(run_root, pack_id, settings)


class Submitter(ABC):
    def __init__(self, cluster: Any, run: RunDir) -> None:
        self.cluster = cluster
        self.run = run

    def resolve_partitions(self, requested: Sequence[str]) -> tuple[str, ...]:
        """The partitions a sweep runs on; the local backend has exactly one."""
        label = check_name("cluster.partition", self.cluster.partition)
        if list(requested) not in ([], [label]):
            raise ConfigError("partitions", list(requested), f"the {self.cluster.name} cluster has one partition, "
                              f"{label!r}", "choose a SLURM cluster (cluster=slurm, cluster=fir, ...) to compare "
                              "partitions")
        return (label,)

    def check(self, factors: Sequence[int], partitions: Sequence[str]) -> None:
        """Cluster-specific checks before anything is submitted (raise ConfigError)."""

    def capacity(self, partition: str) -> Capacity:
        """What this machine's device is (local backend): NVML's answer, or no GPU."""
        info = detect_device()
        return Capacity(has_gpu=info.kind == "gpu", gpu_memory_mb=info.memory_total_mb)

    @abstractmethod
    def run_packs(self, packs: Sequence[Pack], settings: PackSettings, progress: ProgressFn) -> list[PackResult]:
        """Run every pack as one job on one device, wait for all, and say how each job ended."""

    detachable: bool = False  # can submit and return (wait=false): jobs outlive this process

    def require_detachable(self) -> None:
        if not self.detachable:
            raise ConfigError("wait", False, f"the {self.cluster.name} backend runs jobs in this process",
                              "use wait=false with a SLURM cluster (cluster=slurm, cluster=fir, ...)")

    def detach(self, packs: Sequence[Pack], settings: PackSettings) -> dict[str, str]:
        """Submit and return at once: pack id → job id."""
        self.require_detachable()
        return {}

    def job_states(self, job_ids: Sequence[str]) -> dict[str, str]:
        """The queue's state of each job id (e.g. PENDING, RUNNING, COMPLETED); unknown ids are left out."""
        return {}

    # ---- the run directory's record of submitted jobs (jobs.json) ----

    def jobs(self) -> dict[str, dict[str, Any]]:
        return read_json(self.run.jobs) if self.run.jobs.exists() else {}

    def remember(self, submitted: Mapping[str, tuple[str, str]]) -> None:
        """Add pack id → (job id, partition); an earlier job of the same pack stays in its history."""
        jobs = self.jobs()
        for pack_id, (job_id, partition) in submitted.items():
            earlier = jobs.get(pack_id)
            history = (earlier.get("history", []) + [earlier["job_id"]]) if earlier else []
            jobs[pack_id] = {"job_id": job_id, "partition": partition, "backend": self.cluster.backend,
                             "submitted_at": time.time(), "history": history}
        write_json_atomic(self.run.jobs, jobs)

    def active_packs(self) -> dict[str, str]:
        """Packs whose job is still queued or running: pack id → job id."""
        jobs = self.jobs()
        if not jobs:
            return {}
        states = self.job_states([j["job_id"] for j in jobs.values()])
        return {p: j["job_id"] for p, j in jobs.items()
                if states.get(j["job_id"], "").split(" ")[0] in ACTIVE_STATES}


def available_backends() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def load_submitter(backend: str, cluster: Any, run: RunDir, key: str = "cluster.backend") -> Submitter:
    backends = available_backends()
    if backend not in backends:
        raise ConfigError(key, backend, "no such submission backend", nearest(backend, backends))
    cls: type[Submitter] = importlib.import_module(f"{__name__}.{backend}").SUBMITTER
    return cls(cluster, run)


def job_result(pack: Pack, job: submitit.Job) -> PackResult:
    """How a finished submitit job ended: its pack record, or the error submitit re-raises."""
    try:
        record = job.result()
    except Exception as err:
        return PackResult(pack.pack_id, pack.partition, str(job.job_id), ok=False, error=str(err)[-2000:])
    return PackResult(pack.pack_id, pack.partition, str(job.job_id), ok=True, record=record)
