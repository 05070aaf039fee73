"""Which way a metric is better (collect.goal, `--goal`); the goal a metric's name suggests, for a HINT only; and a
metric named (collect.metric, `--metric`) checked against those reported."""
from __future__ import annotations

import difflib
import re
from typing import Sequence

from gpupack.errors import ConfigError

GOALS = ("max", "min")
# Metrics whose better direction gpupack knows: its own workloads' validation accuracy. Any other needs collect.goal
# (or the Optuna sweeper's direction, which the Hydra launcher records): a direction is never guessed from a name.
KNOWN_GOALS = {"val_accuracy": "max"}

# Words in a metric's name that read as one direction, for a HINT only ("error_reduction" is better higher). Short
# words must be a whole word of the name; longer ones may sit inside one ("valloss", "top1accuracy").
SUGGESTS = {
    "max": ("accuracy", "acc", "f1", "auc", "precision", "recall", "iou", "bleu"),
    "min": ("loss", "error", "err", "perplexity", "mse", "mae", "rmse"),
}
_INSIDE = 4  # a word this long or longer counts inside another word of the name


def check_goal(goal: object, key: str) -> None:
    """A goal is max or min (ConfigError on ``key`` otherwise)."""
    if goal not in GOALS:
        raise ConfigError(key, goal, "a goal is max (higher is better) or min (lower is better)",
                          f"{key}=min for a loss, {key}=max for an accuracy")


def suggested_goal(metric: str) -> str | None:
    """The goal ``metric``'s name reads as (max for an accuracy, min for a loss), or None. Pure; only a suggestion."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", metric)  # its words split at camelCase too (valAcc: val, acc)
    words = [w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w]
    found = {goal for goal, cues in SUGGESTS.items()
             if any(cue in words or (len(cue) >= _INSIDE and any(cue in w for w in words)) for cue in cues)}
    return found.pop() if len(found) == 1 else None


def goal_hint(metric: str, key: str = "collect.goal") -> str:
    """The fix for a missing goal: ``key=<the goal the name suggests>``, else both goals with what each means. Pure."""
    goal = suggested_goal(metric)
    if goal is None:
        return f"{key}=max if higher {metric} is better, {key}=min if lower is"
    other, way = ("min", "higher") if goal == "max" else ("max", "lower")
    return f"{key}={goal} ({metric!r} reads as {way} is better; {key}={other} if not)"


def contradiction(metric: str, goal: str) -> str | None:
    """A line saying ``goal`` goes against ``metric``'s name, with the other goal as its fix; else None. Pure."""
    expected = KNOWN_GOALS.get(metric) or suggested_goal(metric)
    if expected is None or expected == goal:
        return None
    return (f"The goal {goal} ranks {'lowest' if goal == 'min' else 'highest'} {metric} first, though its name "
            f"reads as {'higher' if expected == 'max' else 'lower'} is better. HINT: if so, --goal {expected} "
            f"(collect.goal={expected} in a sweep)")


def check_metric(metric: str, reported: Sequence[str], key: str, whose: str) -> None:
    """``metric`` one of ``reported``, else a ConfigError on ``key`` whose HINT names the nearest one. Pure."""
    if metric in reported or not reported:
        return
    close = difflib.get_close_matches(metric, reported, n=1, cutoff=0.5)
    fix = close[0] if close else "val_accuracy" if "val_accuracy" in reported else reported[0]
    raise ConfigError(key, metric, f"{whose} report no such metric (they report {', '.join(reported)})",
                      f"{key} {fix}" if key.startswith("--") else f"{key}={fix}")
