"""The job a pack runs in, as its scheduler names it: SLURM's job id (array task included), submitit's local job id,
else this process's id."""
from __future__ import annotations

import os


def job_id() -> str | None:
    for var in ("SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID"):
        if os.environ.get(var):
            task = os.environ.get("SLURM_ARRAY_TASK_ID")
            return f"{os.environ[var]}_{task}" if task and var == "SLURM_ARRAY_JOB_ID" else os.environ[var]
    return os.environ.get("SUBMITIT_LOCAL_JOB_ID") or str(os.getpid())
