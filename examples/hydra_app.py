"""A plain Hydra app: it does not import gpupack. Its multirun is packed N jobs per GPU by choosing the launcher:

    python examples/hydra_app.py -m hydra/launcher=gpupack_local hydra.launcher.pack=2 lr=0.1,0.03,0.01,0.003
    python examples/hydra_app.py -m hydra/launcher=gpupack_slurm hydra.launcher.pack=4 \
        hydra.launcher.partition=v100 hydra.launcher.gres=gpu:v100:1 lr=0.1,0.03,0.01,0.003
    python examples/hydra_app.py -m hydra/sweeper=optuna hydra/launcher=gpupack_local hydra.launcher.pack=2 \
        'lr=interval(0.001,0.3)' hydra.sweeper.n_trials=4 hydra.sweeper.n_jobs=2

It returns the validation loss, so sweepers that minimise a return value (Optuna) work.
"""
from __future__ import annotations

import logging

import hydra
from mnist_mlp import train
from omegaconf import DictConfig

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path="conf", config_name="hydra_app")
def main(cfg: DictConfig) -> float:
    metrics = train(cfg.lr, cfg.batch_size, cfg.epochs, cfg.seed, train_samples=cfg.train_samples,
                    data=cfg.data)
    log.info("lr=%s seed=%s: val_accuracy=%.4f val_loss=%.4f", cfg.lr, cfg.seed, metrics["val_accuracy"],
             metrics["val_loss"])
    return metrics["val_loss"]


if __name__ == "__main__":
    main()
