"""Report a training's result to gpupack from any program (``from gpupack.result import TrainingResult``).

It lives in :mod:`gpupack.core.result`, the ground every part of gpupack stands on; this module only names it. It
imports the standard library only, so a program loads it in a blink and without torch.
"""
from gpupack.core.result import *  # noqa: F403
from gpupack.core.result import __all__ as __all__
