"""A training's share of its device's memory, enforced inside its own process where the platform can.

The packer gives each training of a pack of N ``packing.memory_fraction`` / N of the device, or what earlier records
measured of its setting with ``packing.memory_margin`` (:class:`gpupack.core.memory.figures.MemoryShare`): under MPS as
its client's limit (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, in its environment before it starts:
gpupack.job.pack.process); without MPS, to a torch program gpupack starts (its workloads, and scripts forked from a
server that preloaded torch) as torch's per-process memory fraction, set here before the training's first CUDA
allocation. Past its share a training gets its own out-of-memory error (recorded as oom); its neighbours keep theirs.
TensorFlow's logical splits keep their ``memory_limit`` (``packing.tf_logical``).
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

SHARE_ENV = "GPUPACK_MEMORY_SHARE"  # the fraction of the device this training may fill, e.g. "0.2"


def limit_torch(environ: Mapping[str, str] | None = None, load: bool = False) -> float | None:
    """Set torch's per-process memory fraction of device 0 (the training's GPU: each pack sees its own GPU as 0) to
    the training's share (:data:`SHARE_ENV`) where torch is loaded (``load``: import it) and sees a GPU; the fraction
    set, or None (no share, no torch, no GPU). Before the training's first CUDA allocation: the allocator then refuses
    what would pass it, with torch's own OutOfMemoryError."""
    env = os.environ if environ is None else environ
    value = env.get(SHARE_ENV, "")
    if not value:
        return None
    if "torch" not in sys.modules and not load:
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    fraction = float(value)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return fraction
