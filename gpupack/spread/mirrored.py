"""tf.distribute.MirroredStrategy: one TensorFlow training over k devices, in one process.

The pack's side starts that one process as process mode starts a training (a fresh interpreter: TensorFlow cannot be
forked), with all the job's cores. The training's side, before TensorFlow initialises its devices, makes the k devices
— the job's first k GPUs, or on a CPU job k logical CPU devices split from the one physical CPU, standing in — and the
strategy over them. The workload builds and compiles its model under :meth:`MirroredSpread.scope`; Keras then splits
each global batch over the k replicas and sums their gradients (each replica's loss is scaled by 1/k), so a step at
any k is the same step on the same global batch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ContextManager, Sequence, TypeVar

from gpupack.core.placement import Placement, Spread
from gpupack.errors import ConfigError
from gpupack.spread import Strategy

if TYPE_CHECKING:  # the pack's side only: the training's process imports this module without them
    from gpupack.core.plan import Training
    from gpupack.core.types import TrainingOutcome
    from gpupack.pack import PackContext

T = TypeVar("T")


def first_gpus(physical: Sequence[T], k: int, visible: str | None = None) -> list[T]:
    """The job's first k physical GPUs; refused when the job has fewer (a job asked for fewer GPUs than k, or a
    CUDA_VISIBLE_DEVICES that hides some). Pure."""
    if len(physical) < k:
        seen = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        raise ConfigError("spread.devices", k, f"MirroredStrategy over {k} GPUs needs {k} GPUs in the training's job, "
                          f"but TensorFlow sees {len(physical)}{seen}",
                          f"give each spread job k GPUs (the k of its pack), or use spread.devices with k <= "
                          f"{len(physical)}")
    return list(physical[:k])


def make_devices(tf: Any, device: str, k: int, visible: str | None = None) -> list[str]:
    """k TensorFlow devices for the strategy, made before TensorFlow initialises them (afterwards it refuses:
    "Virtual devices cannot be modified after being initialized")."""
    if device == "cuda":
        gpus = first_gpus(tf.config.list_physical_devices("GPU"), k, visible)
        for gpu in gpus:  # grow, not grab: a GPU's whole memory taken up front says nothing of what training needs
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus, "GPU")
        return [d.name for d in tf.config.list_logical_devices("GPU")]
    # A CPU job: no GPU may take ops the strategy does not place (a CPU run forced on a GPU node).
    tf.config.set_visible_devices([], "GPU")
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(k)])
    return [d.name for d in tf.config.list_logical_devices("CPU")]


class MirroredSpread(Spread):
    """In the training's process: the strategy the workload builds its model under."""

    def __init__(self, placement: Placement, strategy: Any) -> None:
        super().__init__(placement)
        self.strategy = strategy
        # Where the replicas really run, as the strategy resolved the devices it was given.
        self.devices = [str(d) for d in strategy.extended.worker_devices]

    def scope(self) -> ContextManager[Any]:
        return self.strategy.scope()

    def wrap(self, model: Any) -> Any:
        """The model is already mirrored (built under the scope): kept, to say what each step all-reduces."""
        self.model = model
        return model

    def stats(self) -> dict[str, Any]:
        # How replicas' gradients are summed; TF keeps it private, so read it only where it is.
        ops = getattr(self.strategy.extended, "_cross_device_ops", None)
        out: dict[str, Any] = {"replicas": int(self.strategy.num_replicas_in_sync), "replica_devices": self.devices,
               "cross_device_ops": type(ops).__name__ if ops is not None else None}
        model = getattr(self, "model", None)
        if model is not None:  # no hook into TF's all-reduce: computed, as the record says
            out["allreduce_bytes_per_step"] = allreduce_bytes(model.trainable_weights, out["replicas"])
            out["allreduce_bytes_source"] = "computed: every trainable weight's gradient, once per step"
        return out


def allreduce_bytes(weights: Any, replicas: int) -> int:
    """What MirroredStrategy all-reduces each step: one gradient per trainable weight, of its size and dtype (none
    with one replica: nothing to reduce). Pure, given the weights (anything with .shape and .dtype)."""
    import numpy as np

    if replicas < 2:
        return 0
    return int(sum(int(np.prod(w.shape)) * np.dtype(str(w.dtype)).itemsize for w in weights))


class Mirrored(Strategy):
    """tf.distribute.MirroredStrategy over the k devices of one job: one process, k replicas."""

    name = "mirrored"
    framework = "tensorflow"

    def run(self, trainings: Sequence["Training"], ctx: "PackContext") -> list["TrainingOutcome"]:
        from gpupack.pack._host import (
            refuse_rlimit_on_gpu,  # the pack's side: a rank's process imports this module to join, without it
        )
        from gpupack.pack.process import ProcessOptions, run_processes

        if len(trainings) != 1:  # internal: spread_packs makes packs of one training
            raise ValueError(f"a mirrored pack runs one training, not {len(trainings)}")
        if ctx.device == "cuda" and ctx.gpu_memory_total_mb is not None:  # as tf_logical: CUDA fails under RLIMIT_AS
            refuse_rlimit_on_gpu(self.name, ctx.memory_limit_bytes / 2**30 if ctx.memory_limit_bytes else None)
        # Process mode's one training, started, followed, timed out and recorded as it does; always a fresh
        # interpreter, never under MPS or bound to a share of the cores (its threads are all the job's cores).
        return run_processes(trainings, ctx, ProcessOptions(start="fresh"))

    def join(self, placement: Placement) -> Spread:
        import os

        import tensorflow as tf

        devices = make_devices(tf, placement.device, placement.devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
        # The default all-reduce: NCCL over physical GPUs; over CPU devices TensorFlow picks ring collectives itself
        # (CollectiveAllReduce with RING), which works on logical CPUs, so nothing is forced.
        return MirroredSpread(placement, tf.distribute.MirroredStrategy(devices=devices))


STRATEGY = Mirrored()
