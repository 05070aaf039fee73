"""tf.distribute.MirroredStrategy: one TensorFlow training over k devices, in one process.

The pack's side (here) starts it as process mode starts a fresh training, with all the job's cores; the training's
side, :mod:`gpupack.job.runtime.joins.mirrored`, makes the k devices and the strategy, over which Keras splits each
global batch, so a step at any k is the same step on the same global batch.
"""
from __future__ import annotations

from typing import Sequence

from gpupack.core.plan import Training
from gpupack.core.types import TrainingOutcome
from gpupack.job.pack import PackContext
from gpupack.job.pack._shared import refuse_rlimit_on_gpu
from gpupack.job.pack.process import ProcessOptions, run_processes
from gpupack.job.spread import Strategy


class Mirrored(Strategy):
    name = "mirrored"
    framework = "tensorflow"

    def run(self, trainings: Sequence["Training"], ctx: "PackContext") -> list["TrainingOutcome"]:
        if len(trainings) != 1:  # internal: spread_packs makes packs of one training
            raise ValueError(f"a mirrored pack runs one training, not {len(trainings)}")
        if ctx.device == "cuda" and ctx.gpu_memory_total_mb is not None:  # as tf_logical: CUDA fails under RLIMIT_AS
            refuse_rlimit_on_gpu(self.name, ctx.memory_limit_bytes / 2**30 if ctx.memory_limit_bytes else None)
        # process mode's, always fresh (TensorFlow cannot be forked), never under MPS or bound to a share of the cores
        return run_processes(trainings, ctx, ProcessOptions(start="fresh"))


STRATEGY = Mirrored()
