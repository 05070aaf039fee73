"""The training's side of each spread strategy, in the training's own process (:mod:`gpupack.job.runtime.worker`): one
module per strategy, named as its pack's side in :mod:`gpupack.job.spread`, with ``join(placement) -> Spread``: set the
process up (DDP: join the process group; Mirrored: make the strategy over k devices) and hand the workload its
:class:`gpupack.core.placement.Spread`. It sits below the job and the pack's side, so the worker imports it downward.
"""
from __future__ import annotations

import importlib

from gpupack.core.placement import Placement, Spread


def join(placement: Placement) -> Spread:
    """The strategy's training side sets this process up and returns the Spread the workload calls."""
    spread = importlib.import_module(f"{__name__}.{placement.strategy}").join(placement)
    if not isinstance(spread, Spread):
        raise TypeError(f"gpupack/job/runtime/joins/{placement.strategy}.py's join returned no Spread")
    return spread
