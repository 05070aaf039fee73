"""Images as torch tensors, for the torch workloads and their fused training alike; and what an image data set is."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gpupack.core.frameworks import Framework, Tensor


@dataclass(frozen=True)
class ImageSet:
    """A data set of uint8 images (n, H, W[, C]) and labels, split into train and test, and where it came from."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str


class ImageData(Protocol):
    """A data module (_mnist_data, _cifar10_data): ``load(data_dir)`` reads its image set (None: the shipped copy)."""

    def load(self, data_dir: str | None) -> ImageSet: ...


def images(torch: Framework, x: np.ndarray) -> Tensor:
    """uint8 images (n, H, W) or (n, H, W, C) as float NCHW tensors in [0, 1]."""
    t = torch.from_numpy(x).float().div_(255.0)
    return t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2)
