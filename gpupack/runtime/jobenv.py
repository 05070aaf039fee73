"""The job a pack runs in, as its backend tells it: :class:`JobEnvironment`.

Each backend (gpupack/submit/<backend>.py) builds the environment of its own jobs, from submitit's JobEnvironment and
its scheduler's variables, and hands it to the job body with the pack (as submitit has one JobEnvironment per executor).
The job body records it in the pack record and hands its job id to the pack's trainings (:data:`JOB_ID_ENV`), so that
a training (a Hydra job) names the same job as its pack's record. A pack run outside any backend (the job body called
directly) reads the variables a scheduler may have left: :meth:`JobEnvironment.from_environ`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

# How the job body hands its job id to the pack's trainings (their environment).
JOB_ID_ENV = "GPUPACK_JOB_ID"


@dataclass(frozen=True)
class JobEnvironment:
    """What the pack record says of the job a pack ran in."""

    # The scheduler's name for the job: SLURM's job id (array task included: 1234_5), submitit's local job id, ...
    job_id: str | None = None
    # The GPUs the job sees (CUDA_VISIBLE_DEVICES).
    cuda_visible_devices: str | None = None
    # What SLURM gave the job, to cross-check with sacct's gres/gpu: SLURM_JOB_GPUS, SLURM_JOB_PARTITION.
    slurm_job_gpus: str | None = None
    slurm_partition: str | None = None

    def record_fields(self) -> dict[str, str | None]:
        """The pack record's fields of the job."""
        return {"job_id": self.job_id, "cuda_visible_devices": self.cuda_visible_devices,
                "slurm_job_gpus": self.slurm_job_gpus, "slurm_partition": self.slurm_partition}

    def exported(self) -> dict[str, str]:
        """The variables the pack's trainings inherit, for :func:`job_id` in a training's process."""
        return {JOB_ID_ENV: self.job_id} if self.job_id else {}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> JobEnvironment:
        """A pack run outside any backend: SLURM's job id (array task included), submitit's local job id, else this
        process's id; and the GPUs the environment names."""
        env = os.environ if environ is None else environ
        return cls(job_id=_environ_job_id(env), cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
                   slurm_job_gpus=env.get("SLURM_JOB_GPUS"), slurm_partition=env.get("SLURM_JOB_PARTITION"))


def _environ_job_id(env: Mapping[str, str]) -> str:
    for var in ("SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID"):
        if env.get(var):
            task = env.get("SLURM_ARRAY_TASK_ID")
            return f"{env[var]}_{task}" if task and var == "SLURM_ARRAY_JOB_ID" else env[var]
    return env.get("SUBMITIT_LOCAL_JOB_ID") or str(os.getpid())


def job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The job this process's pack runs in: what the pack's job body handed its trainings (:data:`JOB_ID_ENV`), else
    as :meth:`JobEnvironment.from_environ` reads it."""
    env = os.environ if environ is None else environ
    return env.get(JOB_ID_ENV) or JobEnvironment.from_environ(env).job_id


def job_started_at(environ: Mapping[str, str] | None = None) -> float:
    """When this job started, which its time limit counts from: SLURM's SLURM_JOB_START_TIME (an epoch, Slurm 21.08
    and later), else this process's own start (a job's first process: submitit's, running the job body)."""
    env = os.environ if environ is None else environ
    given = env.get("SLURM_JOB_START_TIME", "")
    if given.isdigit():
        return float(given)
    import psutil  # deferred: only a streaming lane asks

    return float(psutil.Process().create_time())


def job_cpus() -> list[int]:
    """The cores this job may use (what SLURM or taskset gave it)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def job_cores() -> int:
    """How many cores this job may use: its CPU affinity, not the node's count."""
    return len(job_cpus())
