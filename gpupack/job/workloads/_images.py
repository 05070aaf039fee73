"""Images as torch tensors, for the torch workloads and their fused training alike; and what an image data set is."""
from __future__ import annotations

from typing import Protocol

import numpy as np

from gpupack.core.frameworks import Framework, Tensor


class ImageSet(Protocol):
    """A data set of uint8 images and their labels, split into train and test (_mnist_data.Mnist,
    _cifar10_data.Cifar10, resnet50's synthetic Images), and where it came from (for the record)."""

    @property
    def x_train(self) -> np.ndarray: ...
    @property
    def y_train(self) -> np.ndarray: ...
    @property
    def x_test(self) -> np.ndarray: ...
    @property
    def y_test(self) -> np.ndarray: ...
    @property
    def source(self) -> str: ...


class ImageData(Protocol):
    """A data module (_mnist_data, _cifar10_data): ``load(data_dir)`` reads its image set (None: the shipped copy)."""

    def load(self, data_dir: str | None) -> ImageSet: ...


def images(torch: Framework, x: np.ndarray) -> Tensor:
    """uint8 images (n, H, W) or (n, H, W, C) as float NCHW tensors in [0, 1]."""
    t = torch.from_numpy(x).float().div_(255.0)
    return t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2)
