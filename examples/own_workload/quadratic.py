"""A workload outside jobs/: least squares by gradient descent in numpy, packed like any other.

    PYTHONPATH=examples .venv/bin/python -m gpupack \
        'hydra.searchpath=[file://examples/own_workload/conf]' +sweep=quadratic_pack
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpupack.errors import ConfigError
from gpupack.workload import TrainingContext, Workload


@dataclass
class QuadraticParams:
    lr: float = 0.1
    seed: int = 0
    dim: int = 256
    samples: int = 4096
    steps: int = 400


class Quadratic(Workload):
    name = "quadratic"
    framework = "numpy"
    Params = QuadraticParams

    def check(self, params: QuadraticParams) -> None:
        if not 0 < params.lr < 1:
            raise ConfigError("lr", params.lr, "must be in (0, 1) for this problem", "try lr=0.1")

    def train(self, params: QuadraticParams, ctx: TrainingContext) -> dict[str, Any]:
        rng = np.random.default_rng(params.seed)
        x = rng.standard_normal((params.samples, params.dim)) / np.sqrt(params.dim)
        w_true = rng.standard_normal(params.dim)
        y = x @ w_true
        w = np.zeros(params.dim)
        ctx.reporter.loop_started()
        for _ in range(params.steps):
            w -= params.lr * x.T @ (x @ w - y) / params.samples * params.dim
            ctx.reporter.step(params.samples)
        ctx.reporter.loop_ended()
        loss = float(np.mean((x @ w - y) ** 2))
        return {"train_loss": loss, "val_accuracy": 1.0 / (1.0 + loss), "data": "synthetic least squares"}


WORKLOAD = Quadratic()
