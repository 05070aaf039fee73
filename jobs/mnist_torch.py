"""A torch MNIST classifier (a small MLP or CNN) trained on the real MNIST digits.

torch is imported inside :meth:`MnistTorch.train`, so that validating a sweep on the submitting side
stays cheap and the import is counted in the training's start-up time, where it really is paid.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from gpupack.errors import ConfigError
from gpupack.workload import TrainingContext, Workload
from jobs import _mnist_data

MODELS = ("mlp", "cnn")


@dataclass
class MnistTorchParams:
    lr: float = 0.05
    batch_size: int = 64
    seed: int = 0
    model: str = "mlp"
    hidden: int = 128
    epochs: int = 1
    momentum: float = 0.9
    # Trainings use the first train_samples of a seeded shuffle of the 60,000 training digits.
    train_samples: int = 12000
    val_samples: int = 10000
    # Folder with the MNIST IDX files (or mnist.npz); null: the copy shipped with gpupack.
    data_dir: Optional[str] = None
    num_workers: int = 0
    pin_memory: bool = False
    # Mixed precision: float16 autocast + GradScaler on CUDA, bfloat16 autocast on CPU.
    amp: bool = False
    # Run only the input pipeline over the same batches (the loader's upper bound on throughput).
    loader_only: bool = False


class MnistTorch(Workload):
    name = "mnist_torch"
    framework = "torch"
    Params = MnistTorchParams
    loader_param = "loader_only"
    loader_keys = ("batch_size", "num_workers", "pin_memory", "train_samples", "epochs", "data_dir", "seed")
    knob_keys = ("batch_size", "amp", "num_workers", "pin_memory")

    def check(self, params: MnistTorchParams) -> None:
        positive = {"lr": params.lr, "batch_size": params.batch_size, "epochs": params.epochs,
                    "hidden": params.hidden, "train_samples": params.train_samples,
                    "val_samples": params.val_samples}
        for key, value in positive.items():
            if not value > 0:
                raise ConfigError(key, value, "must be > 0", f"set {key} to a positive number")
        if params.model not in MODELS:
            raise ConfigError("model", params.model, "unknown model", f"use one of {', '.join(MODELS)}")
        if params.num_workers < 0:
            raise ConfigError("num_workers", params.num_workers, "must be >= 0", "use 0 or more")
        _mnist_data.find_files(_mnist_data.resolve_dir(params.data_dir))

    def train(self, params: MnistTorchParams, ctx: TrainingContext) -> dict[str, Any]:
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        torch.set_num_threads(ctx.threads)
        torch.manual_seed(params.seed)
        device = torch.device(ctx.device)
        data = _mnist_data.load(params.data_dir)

        gen = torch.Generator().manual_seed(params.seed)
        order = torch.randperm(len(data.y_train), generator=gen)[: params.train_samples]
        x_train = torch.from_numpy(data.x_train).float().div_(255.0).unsqueeze(1)[order]
        y_train = torch.from_numpy(data.y_train).long()[order]
        x_val = torch.from_numpy(data.x_test[: params.val_samples]).float().div_(255.0).unsqueeze(1)
        y_val = torch.from_numpy(data.y_test[: params.val_samples]).long()
        loader = DataLoader(TensorDataset(x_train, y_train), batch_size=params.batch_size, shuffle=True,
                            generator=gen, num_workers=params.num_workers,
                            pin_memory=params.pin_memory and device.type == "cuda")

        rep = ctx.reporter
        if params.loader_only:
            return _loader_only(params, loader, device, rep, torch, data.source)
        model = _build(params, nn).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=params.lr, momentum=params.momentum)
        loss_fn = nn.CrossEntropyLoss()
        autocast, scaler = _amp(params.amp, device, torch)
        rep.loop_started()
        running, count = 0.0, 0
        for _ in range(params.epochs):
            for xb, yb in loader:
                xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
                opt.zero_grad(set_to_none=True)
                with autocast():
                    loss = loss_fn(model(xb), yb)
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    opt.step()
                running += loss.item() * len(yb)
                count += len(yb)
                rep.step(len(yb))
        if device.type == "cuda":
            torch.cuda.synchronize()
        rep.loop_ended()
        return {
            "train_loss": running / max(count, 1),
            "val_accuracy": _accuracy(model, x_val, y_val, device, torch),
            "peak_gpu_mem_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
            "data": data.source,
        }


def _amp(enabled: bool, device: Any, torch: Any) -> tuple[Any, Any]:
    """The autocast context and, on CUDA, the GradScaler that float16 needs."""
    import contextlib

    if not enabled:
        return contextlib.nullcontext, None
    if device.type == "cuda":
        return (lambda: torch.autocast("cuda", dtype=torch.float16)), torch.amp.GradScaler("cuda")
    return (lambda: torch.autocast("cpu", dtype=torch.bfloat16)), None


def _loader_only(params: MnistTorchParams, loader: Any, device: Any, rep: Any, torch: Any,
                 source: str) -> dict[str, Any]:
    """The same batches, onto the device, and nothing else: what the input pipeline alone can deliver."""
    rep.loop_started()
    for _ in range(params.epochs):
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            rep.step(len(yb))
    if device.type == "cuda":
        torch.cuda.synchronize()
    rep.loop_ended()
    return {"loader_only": True, "data": source}


def _build(params: MnistTorchParams, nn: Any) -> Any:
    if params.model == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 5 * 5, 10),
        )
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, params.hidden), nn.ReLU(),
                         nn.Linear(params.hidden, 10))


def _accuracy(model: Any, x: Any, y: Any, device: Any, torch: Any) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), 2000):
            pred = model(x[i:i + 2000].to(device)).argmax(1).cpu()
            correct += int((pred == y[i:i + 2000]).sum())
    return correct / len(y)


WORKLOAD = MnistTorch()
