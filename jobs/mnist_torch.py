"""A torch MNIST classifier (a small MLP or CNN) trained on the real MNIST digits.

torch is imported inside :meth:`MnistTorch.train`, so that validating a sweep on the submitting side
stays cheap and the import is counted in the training's start-up time, where it really is paid.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpupack.errors import ConfigError
from gpupack.workload import TrainingContext, Workload, require_positive
from jobs import _mnist_data
from jobs._params import LOADER_PARAM, TORCH_KNOBS, TORCH_LOADER_KEYS, TorchLoaderParams
from jobs import _torch_common as common

MODELS = ("mlp", "cnn")


@dataclass
class MnistTorchParams(TorchLoaderParams):
    model: str = "mlp"
    hidden: int = 128


class MnistTorch(Workload):
    name = "mnist_torch"
    framework = "torch"
    forkable = True  # torch imports without threads or CUDA: trainings fork from a preloaded server
    fusable = True  # N MLPs/CNNs of one shape train as one batched model (jobs/_torch_fused.py)
    Params = MnistTorchParams
    loader_param, loader_keys, knob_keys = LOADER_PARAM, TORCH_LOADER_KEYS, TORCH_KNOBS

    def check(self, params: MnistTorchParams) -> None:
        require_positive(params, "lr", "batch_size", "epochs", "hidden", "train_samples", "val_samples")
        if params.model not in MODELS:
            raise ConfigError("model", params.model, "unknown model", f"use one of {', '.join(MODELS)}")
        if params.num_workers < 0:
            raise ConfigError("num_workers", params.num_workers, "must be >= 0", "use 0 or more")
        _mnist_data.find_files(_mnist_data.resolve_dir(params.data_dir))

    def preload(self, params: Any) -> None:
        common.preload(_mnist_data.load, params)

    def fuse_key(self, params: MnistTorchParams) -> tuple[Any, ...]:
        from jobs import _torch_fused

        return _torch_fused.fuse_key(params, "model", "hidden")

    def train_fused(self, params: Any, ctxs: Any) -> list[Any]:
        from jobs import _torch_fused

        return _torch_fused.train_fused(params, ctxs, _mnist_data.load(params[0].data_dir),
                                        lambda nn, p: _build(p, nn))

    def train(self, params: MnistTorchParams, ctx: TrainingContext) -> dict[str, Any]:
        return common.run(params, ctx, _mnist_data.load(params.data_dir), lambda nn: _build(params, nn))


def _build(params: MnistTorchParams, nn: Any) -> Any:
    if params.model == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 5 * 5, 10),
        )
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, params.hidden), nn.ReLU(),
                         nn.Linear(params.hidden, 10))


WORKLOAD = MnistTorch()
