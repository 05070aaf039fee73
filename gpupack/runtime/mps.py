"""CUDA MPS for process packing: N processes share one GPU through one MPS server instead of time-slicing.

The pack starts its own control daemon with its pipe and log directories inside the job's temporary space
(so packs on one node never share a daemon), gives the trainings those directories, and always shuts the
daemon down, on success and on failure.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Mapping

from gpupack.errors import ConfigError

CONTROL = "nvidia-cuda-mps-control"


def job_tmp(env: Mapping[str, str]) -> str:
    """The job's own temporary space: SLURM_TMPDIR (the Alliance's node-local disk), TMPDIR, else /tmp."""
    return env.get("SLURM_TMPDIR") or env.get("TMPDIR") or tempfile.gettempdir()


@contextlib.contextmanager
def mps_daemon(env: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """Start an MPS control daemon for this pack; yield the environment the trainings need; always quit it."""
    control = shutil.which(CONTROL, path=env.get("PATH"))
    if control is None:
        raise ConfigError("packing.process.mps", True, f"{CONTROL} is not on this node's PATH",
                          "load the CUDA module that provides it (e.g. module load cuda), "
                          "or set packing.process.mps=false")
    root = Path(tempfile.mkdtemp(prefix="gpupack-mps-", dir=job_tmp(env)))
    mps_env = {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
    for path in mps_env.values():
        os.makedirs(path, exist_ok=True)
    daemon_env = {**env, **mps_env}
    subprocess.run([control, "-d"], env=daemon_env, check=True, capture_output=True, timeout=60)
    try:
        yield mps_env
    finally:
        # `echo quit | nvidia-cuda-mps-control`, without a shell
        subprocess.run([control], input=b"quit\n", env=daemon_env, capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)
