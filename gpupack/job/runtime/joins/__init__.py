"""The training's side of each spread strategy: one module per strategy, named as its pack's side in
:mod:`gpupack.job.spread`, whose ``join(placement)`` sets the training's process up and returns its ``Spread``.
"""
from __future__ import annotations

import importlib

from gpupack.core.placement import Placement, Spread


def join(placement: Placement) -> Spread:
    spread = importlib.import_module(f"{__name__}.{placement.strategy}").join(placement)
    if not isinstance(spread, Spread):
        raise TypeError(f"gpupack/job/runtime/joins/{placement.strategy}.py's join returned no Spread")
    return spread
