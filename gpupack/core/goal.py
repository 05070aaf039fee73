"""Which way a metric is better: the goal collect ranks hyperparameters towards (collect.goal, `--goal`), shared by
the config's checks and the ranking."""
from __future__ import annotations

from gpupack.errors import ConfigError

GOALS = ("max", "min")
# Metrics whose better direction gpupack knows: its own workloads' validation accuracy. Any other needs collect.goal
# (or the Optuna sweeper's direction, which the Hydra launcher records): a direction is never guessed from a name.
KNOWN_GOALS = {"val_accuracy": "max"}


def check_goal(goal: object, key: str) -> None:
    """A goal is max or min (ConfigError on ``key`` otherwise)."""
    if goal not in GOALS:
        raise ConfigError(key, goal, "a goal is max (higher is better) or min (lower is better)",
                          f"{key}=min for a loss, {key}=max for an accuracy")
