"""A training's share of its device's memory, enforced inside its own process where the platform can.

Under MPS it is its client's limit (gpupack.job.pack.process); without MPS, in a torch program, torch's per-process
memory fraction, set here before the training's first CUDA allocation. Past its share a training gets its own
out-of-memory error; its neighbours keep theirs.
"""
from __future__ import annotations

import os
import sys

SHARE_ENV = "GPUPACK_MEMORY_SHARE"  # the fraction of the device this training may fill, e.g. "0.2"


def limit_torch(load: bool = False) -> float | None:
    """Set torch's per-process memory fraction of device 0 (the training's GPU) to its share (:data:`SHARE_ENV`) where
    torch is loaded (``load``: import it) and sees a GPU; the fraction set, or None."""
    value = os.environ.get(SHARE_ENV, "")
    if not value or ("torch" not in sys.modules and not load):
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
