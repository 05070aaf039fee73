"""A search's trial and its lane, which alone opens the study: the trial appends each intermediate value to
``<tid>.curve.json`` and waits for the lane's :class:`Verdict` on it in ``<tid>.verdict.json``. So a trial neither
imports Optuna nor takes the study's lock, and a Python trial's curve and a program's printed one are judged alike.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, TypedDict

from gpupack.core.store.records import read_json_or_none, write_json_atomic

# How long a trial waits for its lane's verdict on a step before it goes on unjudged (its lane busy, or gone): the
# lane looks every few hundredths of a second, so only a lane that no longer runs leaves it this long.
VERDICT_WAIT_S = 60.0
_LOOK_S = 0.01


class CurveSpec(TypedDict):
    """What a trial's worker is told of its curve: its two files, and the metric its study ranks trials by."""

    points: str
    verdict: str
    metric: str


class PrunedAt(TypedDict):
    """Where a search's pruner stopped a trial: the step and the value it reported."""

    step: int
    value: float


class Verdict(TypedDict):
    """The lane's answer to a trial's curve: the last step it judged, and where it pruned the trial (None: not)."""

    step: int
    pruned: PrunedAt | None


def append_point(path: Path, step: int, value: float) -> None:
    """The trial's side: one more point of its curve, whole in one write (the lane reads whole lines only)."""
    line = json.dumps({"step": int(step), "value": float(value)}) + "\n"
    with path.open("a") as f:
        f.write(line)


def await_verdict(path: Path, step: int, wait_s: float = VERDICT_WAIT_S,
                  clock: Callable[[], float] = time.monotonic) -> Verdict | None:
    """The trial's side: the lane's verdict on ``step``; None after ``wait_s`` (said; the trial goes on, not pruned)."""
    deadline = clock() + wait_s
    while True:
        verdict = read_verdict(path)
        if verdict is not None and (verdict["step"] >= step or verdict["pruned"] is not None):
            return verdict
        if clock() >= deadline:
            print(f"gpupack: no verdict on step {step} of this trial's curve from its lane in {wait_s:.0f} s: it goes "
                  "on, not pruned", file=sys.stderr)
            return None
        time.sleep(_LOOK_S)


def read_verdict(path: Path) -> Verdict | None:
    data = read_json_or_none(path)
    if not isinstance(data, dict) or not isinstance(data.get("step"), int):
        return None
    pruned = data.get("pruned")
    at: PrunedAt | None = None
    if isinstance(pruned, dict) and isinstance(pruned.get("step"), int) and \
            isinstance(pruned.get("value"), (int, float)):
        at = {"step": pruned["step"], "value": float(pruned["value"])}
    return {"step": data["step"], "pruned": at}


def write_verdict(path: Path, verdict: Verdict) -> None:
    """The lane's side: written atomically, so the trial never reads half of it."""
    write_json_atomic(path, verdict)


class NewLines:
    """The whole lines written to a file since the last look; ``ended``: its last line too, newline or not."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self, ended: bool = False) -> list[bytes]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:  # not created yet
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        if ended:
            lines, self._partial = [*lines, self._partial], b""
        return lines


def points(lines: list[bytes]) -> list[tuple[int, float]]:
    """The (step, value) points of a curve file's lines (a line that is no point is no step). Pure."""
    found = []
    for line in lines:
        try:
            point = json.loads(line)
            found.append((int(point["step"]), float(point["value"])))
        except (ValueError, KeyError, TypeError):
            continue
    return found
