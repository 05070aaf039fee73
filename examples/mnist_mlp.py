"""A small torch MLP on MNIST: what both example programs (train.py, hydra_app.py) train. Knows nothing of gpupack.

The digits are read from the IDX files in gpupack's repository (gpupack/job/workloads/data/mnist), or from --data /
data_dir.
"""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import Callable

import numpy as np

DEFAULT_DATA = Path(__file__).resolve().parent.parent / "gpupack" / "job" / "workloads" / "data" / "mnist"


def _idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data: str | Path | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    folder = Path(data) if data else DEFAULT_DATA
    return (_idx(folder / "train-images-idx3-ubyte.gz"), _idx(folder / "train-labels-idx1-ubyte.gz"),
            _idx(folder / "t10k-images-idx3-ubyte.gz"), _idx(folder / "t10k-labels-idx1-ubyte.gz"))


def train(lr: float, batch_size: int = 128, epochs: int = 1, seed: int = 0, hidden: int = 128,
          train_samples: int = 6000, val_samples: int = 2000, data: str | Path | None = None,
          on_first_step: Callable[[], None] = lambda: None,
          on_step: Callable[[int], None] = lambda samples: None) -> dict[str, float]:
    """SGD on the first ``train_samples`` of a seeded shuffle; returns validation accuracy and loss."""
    import torch

    torch.manual_seed(seed)
    x_train, y_train, x_test, y_test = load(data)
    order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(seed))[:train_samples]
    x = torch.from_numpy(x_train.copy()).float().div_(255)[order].flatten(1)
    y = torch.from_numpy(y_train.copy()).long()[order]
    xv = torch.from_numpy(x_test[:val_samples].copy()).float().div_(255).flatten(1)
    yv = torch.from_numpy(y_test[:val_samples].copy()).long()
    model = torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    on_first_step()
    for _ in range(epochs):
        for i in range(0, len(y), batch_size):
            opt.zero_grad()
            loss = loss_fn(model(x[i:i + batch_size]), y[i:i + batch_size])
            loss.backward()
            opt.step()
            on_step(len(y[i:i + batch_size]))
    with torch.no_grad():
        logits = model(xv)
        return {"val_accuracy": float((logits.argmax(1) == yv).float().mean()),
                "val_loss": float(loss_fn(logits, yv)), "train_loss": float(loss)}
