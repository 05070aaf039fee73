"""A small ResNet-style CNN on CIFAR-10 in plain torch (standard python batches from a data path)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from gpupack.core.frameworks import Framework, Model, Tensor
from gpupack.core.workload import Range, at_least
from gpupack.job.workloads import _cifar10_data
from gpupack.job.workloads import _torch_common as common
from gpupack.job.workloads._images import ImageData
from gpupack.job.workloads._params import TorchLoaderParams


@dataclass
class Cifar10TorchParams(TorchLoaderParams):
    batch_size: int = 128
    train_samples: int = 50000
    width: int = 16
    blocks: int = 2
    ranges: ClassVar[Mapping[str, Range]] = {**TorchLoaderParams.ranges, "width": at_least(1), "blocks": at_least(1)}


class Cifar10Torch(common.TorchImageWorkload[Cifar10TorchParams]):
    name = "cifar10_torch"
    Params = Cifar10TorchParams
    data: ClassVar[ImageData] = _cifar10_data  # the data module (load, source)
    shape_keys = ("width", "blocks")  # BatchNorm's running statistics stay per model when fused
    weight_decay = 5e-4
    eval_batch = 1000

    def check(self, params: Cifar10TorchParams) -> None:
        _cifar10_data.find_dir(params.data_dir)

    def build(self, params: Cifar10TorchParams, nn: Framework) -> Model:
        return small_resnet(nn, params.width, params.blocks)


def small_resnet(nn: Framework, width: int, blocks: int) -> Model:
    """conv stem → `blocks` residual blocks per stage at widths w, 2w, 4w (stride 2 between) → pool → linear."""

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = (nn.Sequential() if stride == 1 and cin == cout else
                         nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))
            self.act = nn.ReLU(inplace=True)

        def forward(self, x: Tensor) -> Tensor:
            return self.act(self.body(x) + self.skip(x))

    layers: list[Model] = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
    cin = width
    for stage, cout in enumerate((width, 2 * width, 4 * width)):
        for b in range(blocks):
            layers.append(Block(cin, cout, 2 if stage > 0 and b == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]
    return nn.Sequential(*layers)


WORKLOAD = Cifar10Torch()
