"""CUDA MPS for process packing: N processes share one GPU through one MPS server instead of time-slicing.

The pack starts its own control daemon in the job's temporary space (packs on one node never share one), gives the
trainings its directories, and always shuts it down. The control program runs under :meth:`Supervisor.call`.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Mapping

from gpupack.errors import ConfigError
from gpupack.job.runtime.supervisor import ChildSpec, Supervisor

CONTROL = "nvidia-cuda-mps-control"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"  # a client's way to its daemon: set, the process is an MPS client
MPS_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"  # a client's device memory limit, e.g. "0=4096M" (Volta onwards)


@contextlib.contextmanager
def mps_daemon(env: Mapping[str, str], tmp_dir: str,
               log: Callable[[str, str], Path]) -> Iterator[dict[str, str]]:
    """Start an MPS daemon for this pack in ``tmp_dir``, yield its clients' environment, always quit it (``log``)."""
    control = shutil.which(CONTROL, path=env.get("PATH"))
    if control is None:
        raise ConfigError("packing.process.mps", True, f"{CONTROL} is not on this node's PATH",
                          "load the CUDA module that provides it (e.g. module load cuda), "
                          "or set packing.process.mps=false")
    root = Path(tempfile.mkdtemp(prefix="gpupack-mps-", dir=tmp_dir))
    try:
        mps_env = {MPS_PIPE_ENV: str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
        for path in mps_env.values():
            os.makedirs(path, exist_ok=True)
        daemon_env = {**env, **mps_env}
        helpers = Supervisor()
        started = helpers.call(ChildSpec("mps-start", [control, "-d"], log("mps-start", "out"),
                                         log("mps-start", "err"), daemon_env))
        if started.failed or started.timed_out:
            why = "timed out" if started.timed_out else started.error()
            raise RuntimeError(f"{CONTROL} -d did not start the MPS daemon: {why}")
        try:
            yield mps_env
        finally:  # `echo quit | nvidia-cuda-mps-control`, without a shell
            helpers.call(ChildSpec("mps-quit", [control], log("mps-quit", "out"), log("mps-quit", "err"),
                                   daemon_env), stdin=b"quit\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)
