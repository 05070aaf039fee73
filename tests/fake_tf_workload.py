"""A tiny TensorFlow workload for tests: a few matmuls on its device, placement reported, fails on request."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from gpupack.job.workloads._tf_common import tf_device
from gpupack.workload import TrainingContext, Workload


@dataclass
class TfProbeParams:
    seed: int = 0
    steps: int = 20
    fail: bool = False
    tag: str = ""
    # Seconds after which this training ends its whole shared process with exit code 3 (os._exit: no result, no
    # finally), as a segfault or a kill would: the trainings that landed before keep theirs
    exit_after_s: float = 0.0


class TfProbe(Workload):
    name = "tf_probe"
    framework = "tensorflow"
    Params = TfProbeParams
    min_gpu_memory_mb = 300

    def train(self, params: TfProbeParams, ctx: TrainingContext) -> dict[str, Any]:
        import tensorflow as tf

        if params.exit_after_s:
            time.sleep(params.exit_after_s)
            os._exit(3)
        device = tf_device(ctx.device)
        with tf.device(device):
            w = tf.Variable(tf.random.stateless_normal((64, 64), seed=(params.seed, 0)))
            ctx.reporter.loop_started()
            for _ in range(params.steps):
                w.assign(tf.tanh(tf.matmul(w, w)) * 0.5)
                ctx.reporter.step(64)
                if params.fail:
                    raise RuntimeError(f"tf probe failure on purpose (tag={params.tag!r})")
            ctx.reporter.loop_ended()
        return {"val_accuracy": 0.5, "placed_on": w.device, "tag": params.tag, "data": "tf probe (no data)"}


WORKLOAD = TfProbe()
