"""A torch MNIST classifier (a small MLP or CNN) trained on the real MNIST digits. torch is imported inside training:
validating a sweep stays cheap, and the import counts in the training's start-up, where it is paid."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from gpupack.core.frameworks import Framework, Model
from gpupack.core.workload import Range, at_least
from gpupack.errors import ConfigError
from gpupack.job.workloads import _mnist_data
from gpupack.job.workloads import _torch_common as common
from gpupack.job.workloads._images import ImageData
from gpupack.job.workloads._params import TorchLoaderParams

MODELS = ("mlp", "cnn")


@dataclass
class MnistTorchParams(TorchLoaderParams):
    model: str = "mlp"
    hidden: int = 128
    ranges: ClassVar[Mapping[str, Range]] = {**TorchLoaderParams.ranges, "hidden": at_least(1)}


class MnistTorch(common.TorchImageWorkload[MnistTorchParams]):
    name = "mnist_torch"
    Params = MnistTorchParams
    data: ClassVar[ImageData] = _mnist_data  # the data module (load, source)
    shape_keys = ("model", "hidden")

    def check(self, params: MnistTorchParams) -> None:
        if params.model not in MODELS:
            raise ConfigError("model", params.model, "unknown model", f"use one of {', '.join(MODELS)}")
        _mnist_data.find_files(_mnist_data.resolve_dir(params.data_dir))

    def build(self, params: MnistTorchParams, nn: Framework) -> Model:
        if params.model == "cnn":
            return nn.Sequential(
                nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                nn.Flatten(), nn.Linear(32 * 5 * 5, 10),
            )
        return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, params.hidden), nn.ReLU(),
                             nn.Linear(params.hidden, 10))


WORKLOAD = MnistTorch()
