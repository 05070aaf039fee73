"""A small Keras CNN on CIFAR-10 (standard python batches from a data path), for process and tf_logical packing."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from gpupack.core.frameworks import Framework, Model
from gpupack.core.workload import Range, TrainingContext, at_least
from gpupack.job.workloads import _cifar10_data, _tf_common
from gpupack.job.workloads._params import Metrics, TrainingParams


@dataclass
class Cifar10TfParams(TrainingParams):
    batch_size: int = 128
    train_samples: int = 50000
    width: int = 32
    ranges: ClassVar[Mapping[str, Range]] = {**TrainingParams.ranges, "width": at_least(1)}


class Cifar10Tf(_tf_common.KerasWorkload[Cifar10TfParams]):
    name = "cifar10_tf"
    Params = Cifar10TfParams
    min_gpu_memory_mb = 1024

    def check(self, params: Cifar10TfParams) -> None:
        _cifar10_data.find_dir(params.data_dir)

    def train(self, params: Cifar10TfParams, ctx: TrainingContext) -> Metrics:
        return _tf_common.run(params, ctx, _cifar10_data.load(params.data_dir),
                              lambda keras, dtype: _build(keras, params, dtype))


def _build(keras: Framework, params: Cifar10TfParams, dtype: str | None) -> Model:
    init = keras.initializers.HeNormal(seed=params.seed)
    w, layers = params.width, keras.layers
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        layers.Conv2D(w, 3, padding="same", activation="relu", kernel_initializer=init, dtype=dtype),
        layers.MaxPooling2D(),
        layers.Conv2D(2 * w, 3, padding="same", activation="relu", kernel_initializer=init, dtype=dtype),
        layers.MaxPooling2D(),
        layers.Conv2D(4 * w, 3, padding="same", activation="relu", kernel_initializer=init, dtype=dtype),
        layers.GlobalAveragePooling2D(),
        layers.Dense(10, kernel_initializer=init, dtype="float32"),
    ])


WORKLOAD = Cifar10Tf()
