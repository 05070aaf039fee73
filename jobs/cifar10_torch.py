"""A small ResNet-style CNN on CIFAR-10 in plain torch (standard python batches from a data path)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from gpupack.errors import ConfigError
from gpupack.workload import TrainingContext, Workload
from jobs import _cifar10_data


@dataclass
class Cifar10TorchParams:
    lr: float = 0.05
    batch_size: int = 128
    seed: int = 0
    width: int = 16
    blocks: int = 2
    epochs: int = 1
    momentum: float = 0.9
    train_samples: int = 50000
    val_samples: int = 10000
    data_dir: Optional[str] = None
    num_workers: int = 0
    pin_memory: bool = False
    amp: bool = False
    loader_only: bool = False


class Cifar10Torch(Workload):
    name = "cifar10_torch"
    framework = "torch"
    Params = Cifar10TorchParams
    loader_param = "loader_only"
    loader_keys = ("batch_size", "num_workers", "pin_memory", "train_samples", "epochs", "data_dir", "seed")
    knob_keys = ("batch_size", "amp", "num_workers", "pin_memory")

    def check(self, params: Cifar10TorchParams) -> None:
        for key in ("lr", "batch_size", "epochs", "width", "blocks", "train_samples", "val_samples"):
            if not getattr(params, key) > 0:
                raise ConfigError(key, getattr(params, key), "must be > 0", f"set {key} to a positive number")
        _cifar10_data.find_dir(params.data_dir)

    def train(self, params: Cifar10TorchParams, ctx: TrainingContext) -> dict[str, Any]:
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        from jobs.mnist_torch import _amp, _loader_only

        torch.set_num_threads(ctx.threads)
        torch.manual_seed(params.seed)
        device = torch.device(ctx.device)
        data = _cifar10_data.load(params.data_dir)
        gen = torch.Generator().manual_seed(params.seed)
        order = torch.randperm(len(data.y_train), generator=gen)[: params.train_samples]
        to_tensor = lambda x: torch.from_numpy(x).permute(0, 3, 1, 2).float().div_(255.0)  # noqa: E731
        x_train, y_train = to_tensor(data.x_train)[order], torch.from_numpy(data.y_train).long()[order]
        x_val = to_tensor(data.x_test[: params.val_samples])
        y_val = torch.from_numpy(data.y_test[: params.val_samples]).long()
        loader = DataLoader(TensorDataset(x_train, y_train), batch_size=params.batch_size, shuffle=True,
                            generator=gen, num_workers=params.num_workers,
                            pin_memory=params.pin_memory and device.type == "cuda")
        rep = ctx.reporter
        if params.loader_only:
            return _loader_only(params, loader, device, rep, torch, data.source)
        model = small_resnet(torch.nn, params.width, params.blocks).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=params.lr, momentum=params.momentum, weight_decay=5e-4)
        loss_fn = torch.nn.CrossEntropyLoss()
        autocast, scaler = _amp(params.amp, device, torch)
        rep.loop_started()
        running, count = 0.0, 0
        model.train()
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
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(y_val), 1000):
                correct += int((model(x_val[i:i + 1000].to(device)).argmax(1).cpu() == y_val[i:i + 1000]).sum())
        return {"train_loss": running / max(count, 1), "val_accuracy": correct / max(len(y_val), 1),
                "peak_gpu_mem_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
                "data": data.source}


def small_resnet(nn: Any, width: int, blocks: int) -> Any:
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

        def forward(self, x: Any) -> Any:
            return self.act(self.body(x) + self.skip(x))

    layers: list[Any] = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
    cin = width
    for stage, cout in enumerate((width, 2 * width, 4 * width)):
        for b in range(blocks):
            layers.append(Block(cin, cout, 2 if stage > 0 and b == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]
    return nn.Sequential(*layers)


WORKLOAD = Cifar10Torch()
