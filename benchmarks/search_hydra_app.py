"""The Hydra app of benchmarks/search_vs_hydra_optuna.py: one trial of :mod:`search_objective` (the same sleep and
loss as the ``command`` program gpupack's search runs), its loss returned to Hydra's Optuna sweeper."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_objective import trial  # noqa: E402


@dataclass
class Trial:
    x: float = 0.5
    y: float = 0.5


ConfigStore.instance().store(name="trial", node=Trial)


@hydra.main(version_base="1.3", config_path=None, config_name="trial")
def main(cfg: Trial) -> float:
    return trial(cfg.x, cfg.y)


if __name__ == "__main__":
    main()
