"""A Keras MNIST classifier (small dense net or CNN) on the real MNIST digits, for process and tf_logical packing."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from gpupack.core.frameworks import Framework, Model
from gpupack.core.workload import Range, TrainingContext, at_least
from gpupack.errors import ConfigError
from gpupack.job.workloads import _mnist_data, _tf_common
from gpupack.job.workloads._params import Metrics, TrainingParams

MODELS = ("mlp", "cnn")


@dataclass
class MnistTfParams(TrainingParams):
    model: str = "mlp"
    hidden: int = 128
    ranges: ClassVar[Mapping[str, Range]] = {**TrainingParams.ranges, "hidden": at_least(1)}


class MnistTf(_tf_common.KerasWorkload[MnistTfParams]):
    name = "mnist_tf"
    Params = MnistTfParams
    min_gpu_memory_mb = 512

    def check(self, params: MnistTfParams) -> None:
        if params.model not in MODELS:
            raise ConfigError("model", params.model, "unknown model", f"use one of {', '.join(MODELS)}")
        _mnist_data.find_files(_mnist_data.resolve_dir(params.data_dir))

    def train(self, params: MnistTfParams, ctx: TrainingContext) -> Metrics:
        return _tf_common.run(params, ctx, _mnist_data.load(params.data_dir),
                              lambda keras, dtype: _build(keras, params, dtype))


def _build(keras: Framework, params: MnistTfParams, dtype: str | None) -> Model:
    init = keras.initializers.GlorotUniform(seed=params.seed)
    layers = keras.layers
    if params.model == "cnn":
        body = [layers.Conv2D(16, 3, activation="relu", kernel_initializer=init, dtype=dtype), layers.MaxPooling2D(),
                layers.Conv2D(32, 3, activation="relu", kernel_initializer=init, dtype=dtype), layers.MaxPooling2D(),
                layers.Flatten()]
    else:
        body = [layers.Flatten(), layers.Dense(params.hidden, activation="relu", kernel_initializer=init, dtype=dtype)]
    return keras.Sequential([keras.Input((28, 28, 1)), *body,
                             layers.Dense(10, kernel_initializer=init, dtype="float32")])


WORKLOAD = MnistTf()
