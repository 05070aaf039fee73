"""A stand-in for torch, put first on a training's PYTHONPATH by tests of the memory share on a machine with no GPU:
it says one CUDA device is there and logs each per-process memory fraction set and each allocation on it to
$FAKE_TORCH_LOG (a JSON line each: pid, what, values), so a test sees what a training's process did, in order."""
from __future__ import annotations

import json
import os
from typing import Any


def _log(what: str, **values: Any) -> None:
    with open(os.environ["FAKE_TORCH_LOG"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "what": what, **values}) + "\n")


class _Cuda:
    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        _log("fraction", fraction=fraction, device=device)


cuda = _Cuda()


def zeros(*shape: int, device: Any = None) -> None:
    _log("alloc", device=str(device))
