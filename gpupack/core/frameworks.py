"""The framework objects the built-in workloads handle, named as their hints use them.

torch and TensorFlow are imported only in a training's own process (the packer, the fork server and the CLI import the
workloads without one), so their objects reach the hints untyped: each alias names one such dynamic edge.
"""
from __future__ import annotations

from typing import Any

Framework = Any  # the torch, torch.nn, tensorflow or keras module, imported by the caller in the training's process
Tensor = Any  # a torch.Tensor, a tf.Tensor or a NumPy array: a batch, its labels, a weight, a loss
Model = Any  # a torch.nn.Module or a keras.Model
Device = Any  # a torch.device
Loader = Any  # a torch DataLoader, a tf.data.Dataset, or an iterator of batches
Optimizer = Any  # a torch.optim.Optimizer
GradScaler = Any  # a torch.amp.GradScaler: float16's loss scaling on CUDA
Generator = Any  # a torch.Generator: the seeded source of one training's shuffles
