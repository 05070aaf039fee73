"""Hyperparameters every gpupack workload shares, as dataclasses workloads extend (a field redeclared in a
subclass changes only its default). The class attributes below are what the workload contract reads."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping, Optional, TypedDict

from gpupack.core.workload import Range, at_least, positive


@dataclass
class TrainingParams:
    lr: float = 0.05
    batch_size: int = 64
    seed: int = 0
    epochs: int = 1
    momentum: float = 0.9
    train_samples: int = 12000  # the first of a seeded shuffle of the training set
    val_samples: int = 10000
    data_dir: Optional[str] = None  # the data set's standard files; null: the copy shipped with gpupack, if any
    amp: bool = False  # mixed precision: float16 (+ GradScaler in torch) on a GPU, bfloat16 on a CPU
    loader_only: bool = False  # only the input pipeline over the same batches (the loader's upper bound)
    # Each numeric hyperparameter's range, refused outside before anything runs (Workload.check_ranges).
    ranges: ClassVar[Mapping[str, Range]] = {
        "lr": positive(), "batch_size": at_least(1), "seed": at_least(0), "epochs": at_least(1),
        "momentum": Range(0, 1, high_open=True), "train_samples": at_least(1), "val_samples": at_least(1)}


@dataclass
class TorchLoaderParams(TrainingParams):
    num_workers: int = 0
    pin_memory: bool = False
    ranges: ClassVar[Mapping[str, Range]] = {**TrainingParams.ranges, "num_workers": at_least(0)}


LOADER_PARAM = "loader_only"
TF_LOADER_KEYS = ("batch_size", "train_samples", "epochs", "data_dir", "seed")
TORCH_LOADER_KEYS = TF_LOADER_KEYS + ("num_workers", "pin_memory")
TF_KNOBS = ("batch_size", "amp")
TORCH_KNOBS = ("batch_size", "amp", "num_workers", "pin_memory")


class Metrics(TypedDict, total=False):
    """What a built-in workload's train() returns (``data``: its data set, which the worker lifts into the record)."""

    train_loss: float
    val_accuracy: float
    peak_gpu_mem_mb: float | None  # torch on a GPU; None on a CPU
    fused_group: int  # trained fused with this many models
    replicas: int  # a Keras training spread over this many replicas
    loader_only: bool  # the data loader alone: the input pipeline, no model
    device: str  # Keras: the TensorFlow device(s) it ran on
    placed_on: str  # Keras: where its first weight lives
    amp_note: str  # why amp was not used as asked
    data: str
