"""The job a pack runs in, as its backend tells it: :class:`JobEnvironment`.

Each backend builds its jobs' environment (``Submitter.job_environment``) and hands it to the job body with the pack;
nothing below the backends reads a scheduler's variable. The job body records it in the pack record and hands its job
id to the pack's trainings (:data:`JOB_ID_ENV`). A pack run outside any backend is its own job
(:meth:`JobEnvironment.here`).
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field
from typing import Mapping

# How the job body hands its job id to the pack's trainings (their environment).
JOB_ID_ENV = "GPUPACK_JOB_ID"


@dataclass(frozen=True)
class JobEnvironment:
    """What the pack record says of the job a pack ran in, and when the job started."""

    job_id: str | None = None  # the scheduler's name for the job: SLURM's job id (1234_5), submitit's local one
    cuda_visible_devices: str | None = None
    # When the job started (its time limit counts from it); None: the scheduler does not say (:meth:`start`).
    started_at: float | None = None
    # The job's own temporary space (SLURM's node-local disk), where MPS's pipes and DDP's rendezvous live; None:
    # TMPDIR, else /tmp.
    tmp_dir: str | None = None
    scheduler: Mapping[str, str | None] = field(default_factory=dict)  # kept in the pack record as named there
    # The gpupack command that submitted the job where it runs on the job's host (the local backend): its CPU is the
    # run's own, not load from outside (gpupack.job.runtime.foreign).
    command_pid: int | None = None

    def record_fields(self) -> dict[str, str | None]:
        """The pack record's fields of the job."""
        return {"job_id": self.job_id, "cuda_visible_devices": self.cuda_visible_devices, **self.scheduler}

    def exported(self) -> dict[str, str]:
        """The variables the pack's trainings inherit: the job's id (:func:`job_id`) and its GPUs."""
        gpus = self.cuda_visible_devices
        return {**({JOB_ID_ENV: self.job_id} if self.job_id else {}),
                **({"CUDA_VISIBLE_DEVICES": gpus} if gpus is not None else {})}

    def device_env(self) -> dict[str, str]:
        """The environment as a pack of this job sees its device: the process's, with this job's GPUs."""
        return {**os.environ, **self.exported()}

    def gpus(self, wanted: int) -> list[str]:
        """The ``wanted`` GPUs of this job, as CUDA_VISIBLE_DEVICES names them (unset: indexes 0, 1, ...)."""
        named = self.cuda_visible_devices
        listed = [d for d in named.split(",") if d] if named is not None else [str(i) for i in range(wanted)]
        return listed[:wanted]

    def on_gpu(self, device: str, index: int) -> JobEnvironment:
        """This job as one of its GPUs' packs sees it: that GPU alone, with temporary space of its own (for MPS)."""
        tmp = os.path.join(self.temp_dir(), f"gpu{index}")
        os.makedirs(tmp, exist_ok=True)
        return dataclasses.replace(self, cuda_visible_devices=device, tmp_dir=tmp)

    def temp_dir(self) -> str:
        """Where this job keeps its temporary files: the scheduler's own space, else TMPDIR, else /tmp."""
        return self.tmp_dir or tempfile.gettempdir()

    def start(self) -> float:
        """When this job started: as its scheduler said, else this process's own start."""
        if self.started_at is not None:
            return self.started_at
        import psutil  # deferred: only a streaming lane asks

        return float(psutil.Process().create_time())

    @classmethod
    def here(cls) -> JobEnvironment:
        """A pack run outside any backend: this process is its job, with the GPUs the environment names."""
        return cls(job_id=str(os.getpid()), cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))


def job_id() -> str | None:
    """The job this process's pack runs in (:data:`JOB_ID_ENV`); None: a process started by no pack."""
    return os.environ.get(JOB_ID_ENV)


def job_cpus() -> list[int]:
    """The cores this job may use (what SLURM or taskset gave it)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def job_cores() -> int:
    """How many cores this job may use: its CPU affinity, not the node's count."""
    return len(job_cpus())
