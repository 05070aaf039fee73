"""ResNet-50 (the source study's medium network) on synthetic images of any resolution, or a staged CIFAR-10.

The architecture is torchvision's ``resnet50``: its own where it imports (optional: its Linux wheel is a CUDA build
that fails beside a CPU torch), else the same network defined below (25,557,032 parameters at 1000 classes).
``data=synthetic`` is seeded random images and labels, the same for every training: it measures images/s, not
accuracy. On a CPU, ``amp`` is ignored with its reason in the record (:data:`AMP_ON_CPU`).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, ClassVar, Mapping, Sequence, cast

import numpy as np

from gpupack.core.frameworks import Framework, Model, Tensor
from gpupack.core.workload import Range, TrainingContext, at_least
from gpupack.errors import ConfigError
from gpupack.job.workloads import _cifar10_data
from gpupack.job.workloads import _torch_common as common
from gpupack.job.workloads._images import ImageData, ImageSet
from gpupack.job.workloads._params import Metrics, TorchLoaderParams

DATA = ("synthetic", "cifar10")
LAYERS = (3, 4, 6, 3)  # bottleneck blocks per stage
AMP_ON_CPU = ("ignored on a CPU: float16 autocast needs CUDA, and bfloat16 convolutions without AMX run slower than "
              "float32; set amp=false on CPU partitions")


@dataclass
class ResNet50Params(TorchLoaderParams):
    batch_size: int = 32
    train_samples: int = 256
    val_samples: int = 64
    lr: float = 0.1
    data: str = "synthetic"  # synthetic | cifar10 (staged: data_dir)
    image_size: int = 32  # synthetic images are image_size x image_size; CIFAR-10 is 32
    num_classes: int = 10
    channels_last: bool = False  # NHWC tensors: faster convolutions on tensor cores with AMP
    # ResNet-50 downsamples 32x: smaller images vanish.
    ranges: ClassVar[Mapping[str, Range]] = {**TorchLoaderParams.ranges, "image_size": at_least(32),
                                             "num_classes": at_least(1)}


@functools.lru_cache(maxsize=4)  # made once per process: a fork server's copy is shared by every forked training
def synthetic(n_train: int, n_test: int, size: int, classes: int) -> ImageSet:
    """Seeded random images and labels (seed 0: the same for every training of a sweep)."""
    rng = np.random.default_rng(0)
    return ImageSet(rng.integers(0, 256, (n_train, size, size, 3), dtype=np.uint8),
                  rng.integers(0, classes, n_train).astype(np.int64),
                  rng.integers(0, 256, (n_test, size, size, 3), dtype=np.uint8),
                  rng.integers(0, classes, n_test).astype(np.int64),
                  f"synthetic ({size}x{size}, {classes} classes, random labels: images/s, not accuracy)")


def images_for(params: ResNet50Params) -> ImageSet:
    if params.data == "cifar10":
        return _cifar10_data.load(params.data_dir)
    return synthetic(params.train_samples, params.val_samples, params.image_size, params.num_classes)


class ResNet50(common.TorchImageWorkload[ResNet50Params]):
    name = "resnet50"
    Params = ResNet50Params
    data: ClassVar[ImageData] = _cifar10_data  # with data=cifar10; synthetic images are made per sweep (images_for)
    shape_keys = ("data", "image_size", "num_classes", "channels_last")
    weight_decay = 1e-4
    eval_batch = 256

    def check(self, params: ResNet50Params) -> None:
        if params.data not in DATA:
            raise ConfigError("data", params.data, "unknown data", f"use one of {', '.join(DATA)}")
        if params.data == "cifar10":
            if params.image_size != 32 or params.num_classes != 10:
                raise ConfigError("image_size" if params.image_size != 32 else "num_classes",
                                  params.image_size if params.image_size != 32 else params.num_classes,
                                  "CIFAR-10 is 32x32 images of 10 classes",
                                  "keep image_size=32 and num_classes=10 with data=cifar10, or use data=synthetic")
            _cifar10_data.find_dir(params.data_dir)

    def device_note(self, params: Mapping[str, object], has_gpu: bool | None) -> str | None:
        return f"amp=true is {AMP_ON_CPU}" if params.get("amp") and has_gpu is False else None

    def cost(self, params: Mapping[str, object]) -> float | None:
        number = common.number
        return number(params, "epochs") * number(params, "train_samples") * number(params, "image_size") ** 2

    def build(self, params: ResNet50Params, nn: Framework) -> Model:
        return resnet50(nn, params.num_classes)

    def preload(self, params: Sequence[ResNet50Params]) -> None:
        common.preload(lambda data_dir: None, [])
        for p in params:
            images_for(p)

    def train(self, params: ResNet50Params, ctx: TrainingContext) -> Metrics:
        run_params, note = on_device(params, ctx.device)
        result = common.run(run_params, ctx, images_for(params), lambda nn: self.build(params, nn),
                            weight_decay=self.weight_decay, eval_batch=self.eval_batch,
                            channels_last=params.channels_last)
        if note:
            result["amp_note"] = note
        return result  # samples/s is images/s

    def train_fused(self, params: Sequence[ResNet50Params],
                    ctxs: Sequence[TrainingContext]) -> list[Metrics | BaseException]:
        from gpupack.job.workloads import _torch_fused

        return _torch_fused.train_fused(params, ctxs, images_for(params[0]), lambda nn, p: self.build(p, nn),
                                        weight_decay=self.weight_decay, eval_batch=self.eval_batch)


def on_device(params: ResNet50Params, device: str) -> tuple[ResNet50Params, str | None]:
    """The hyperparameters the training runs with on ``device``, and why one was changed (amp on a CPU). Pure."""
    if params.amp and device == "cpu":
        return dataclasses.replace(params, amp=False), AMP_ON_CPU
    return params, None


def resnet50(nn: Framework, num_classes: int = 1000) -> Model:
    """torchvision's resnet50 where torchvision imports, else the same network defined here (same module names)."""
    try:
        from torchvision.models import resnet50 as made  # a CUDA wheel beside a CPU torch fails here
    except (ImportError, RuntimeError, OSError, AttributeError):
        return own_resnet50(nn, num_classes)
    return cast(Model, made(num_classes=num_classes))


def own_resnet50(nn: Framework, num_classes: int = 1000) -> Model:
    """ResNet-50 v1.5 as torchvision defines and initialises it."""
    return _resnet_class(nn)(num_classes)


def _bottleneck_class(nn: Framework) -> Callable[[int, int, int, Model | None], Model]:
    """ResNet-50's bottleneck block (1x1, 3x3, 1x1 convolutions, 4x wider out), as a class of ``nn``."""

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin: int, width: int, stride: int, downsample: Model | None) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(width * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample
            self.stride = stride

        def forward(self, x: Tensor) -> Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + (self.downsample(x) if self.downsample is not None else x))

    return Bottleneck


@functools.lru_cache(maxsize=None)
def _resnet_class(nn: Framework) -> Callable[[int], Model]:
    """The classes, made once per torch.nn: N models of one class is what fused mode's stacking asks for."""
    Bottleneck = _bottleneck_class(nn)

    class ResNet(nn.Module):
        def __init__(self, num_classes: int) -> None:
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._stage(64, LAYERS[0], 1)
            self.layer2 = self._stage(128, LAYERS[1], 2)
            self.layer3 = self._stage(256, LAYERS[2], 2)
            self.layer4 = self._stage(512, LAYERS[3], 2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512 * 4, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)

        def _stage(self, width: int, blocks: int, stride: int) -> Model:
            downsample = None
            if stride != 1 or self.inplanes != width * 4:
                downsample = nn.Sequential(nn.Conv2d(self.inplanes, width * 4, 1, stride, bias=False),
                                           nn.BatchNorm2d(width * 4))
            layers = [Bottleneck(self.inplanes, width, stride, downsample)]
            self.inplanes = width * 4
            layers += [Bottleneck(self.inplanes, width, 1, None) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x: Tensor) -> Tensor:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet


WORKLOAD = ResNet50()
