"""tf.distribute.MirroredStrategy, the training's side: before TensorFlow initialises its devices, make the k devices
(the job's first k GPUs, or k logical CPUs) and the strategy over them, under which the workload builds its model.
"""
from __future__ import annotations

from typing import Any, ContextManager, Sequence, TypeVar, cast

from gpupack.core.frameworks import Framework, Model, Tensor
from gpupack.core.placement import Placement, Spread
from gpupack.errors import ConfigError

T = TypeVar("T")


def first_gpus(physical: Sequence[T], k: int, visible: str | None = None) -> list[T]:
    """The job's first k physical GPUs; refused when it has fewer. Pure."""
    if len(physical) < k:
        seen = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        raise ConfigError("spread.devices", k, f"MirroredStrategy over {k} GPUs needs {k} GPUs in the training's job, "
                          f"but TensorFlow sees {len(physical)}{seen}",
                          f"give each spread job k GPUs (the k of its pack), or use spread.devices with k <= "
                          f"{len(physical)}")
    return list(physical[:k])


def make_devices(tf: Framework, device: str, k: int, visible: str | None = None) -> list[str]:
    """k TensorFlow devices for the strategy, made before TensorFlow initialises them (it refuses afterwards)."""
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

    def scope(self) -> ContextManager[object]:
        return cast(ContextManager[object], self.strategy.scope())  # TensorFlow's, untyped

    def wrap(self, model: Model) -> Model:
        """The model is already mirrored (built under the scope): kept, to say what each step all-reduces."""
        self.model = model
        return model

    def stats(self) -> dict[str, object]:
        # How replicas' gradients are summed; TF keeps it private, so read it only where it is.
        ops = getattr(self.strategy.extended, "_cross_device_ops", None)
        replicas = int(self.strategy.num_replicas_in_sync)
        out: dict[str, object] = {"replicas": replicas, "replica_devices": self.devices,
                                  "cross_device_ops": type(ops).__name__ if ops is not None else None}
        model = getattr(self, "model", None)
        if model is not None:  # no hook into TF's all-reduce: computed, as the record says
            out["allreduce_bytes_per_step"] = allreduce_bytes(model.trainable_weights, replicas)
            out["allreduce_bytes_source"] = "computed: every trainable weight's gradient, once per step"
        return out


def allreduce_bytes(weights: Sequence[Tensor], replicas: int) -> int:
    """What MirroredStrategy all-reduces each step: one gradient per trainable weight (none with one replica). Pure."""
    import numpy as np

    if replicas < 2:
        return 0
    return int(sum(int(np.prod(w.shape)) * np.dtype(str(w.dtype)).itemsize for w in weights))


def join(placement: Placement) -> Spread:
    """In the training's process, before TensorFlow initialises its devices: the k devices and the strategy."""
    import os

    import tensorflow as tf

    devices = make_devices(tf, placement.device, placement.devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
    # The default all-reduce: NCCL over GPUs, ring collectives over logical CPUs: nothing is forced.
    return MirroredSpread(placement, tf.distribute.MirroredStrategy(devices=devices))
