"""Report a training's result to gpupack from any program: it imports only the standard library (and gpupack's
record writer), so it loads in a blink and without torch.

A program packed by the ``command`` workload finds the path gpupack wants its result at in ``$GPUPACK_RESULT``.
Outside gpupack (the variable unset) every call here does nothing, so the same script still runs on its own::

    from gpupack.core.result import TrainingResult

    result = TrainingResult()
    result.first_step()                  # start-up ends here: gpupack splits start-up from the loop
    for xb, yb in loader:
        ...
        result.step(len(yb))             # samples seen (throughput); cheap, writes nothing
    result.finish(metrics={"val_accuracy": acc})

The file is JSON: ``{"metrics": {...}, "samples": n, "steps": k, "loop_start": t, "loop_end": t}`` (times are
``time.time()``); a program in another language may write the same keys itself. Written atomically, at the first
step and at the end, so a training killed mid-way still says when its loop began.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Mapping, TypedDict

# What gpupack/result.py gives a user (tests/test_layers.py holds it to every public name here).
__all__ = ["ENV", "ResultReport", "write_result", "TrainingResult", "report"]

ENV = "GPUPACK_RESULT"


class ResultReport(TypedDict, total=False):
    """What a program reports at ``$GPUPACK_RESULT`` (the keys above; another language's program may leave some out)."""

    metrics: dict[str, object]
    samples: int
    steps: int
    loop_start: float | None
    loop_end: float | None


def write_result(path: str, data: Mapping[str, object]) -> None:
    """``data`` as JSON at ``path``, atomically (gpupack's record writer: temp file, fsync, rename)."""
    from gpupack.core.store.records import write_json_atomic  # the standard library only: no torch, nothing slow

    write_json_atomic(Path(path), dict(data))


class TrainingResult:
    """What one training reports: when its loop began and ended, samples and steps, and final metrics."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path if path is not None else os.environ.get(ENV)
        self.loop_start: float | None = None
        self.loop_end: float | None = None
        self.samples = 0
        self.steps = 0

    @property
    def active(self) -> bool:
        """True when gpupack is listening (``$GPUPACK_RESULT`` is set)."""
        return bool(self.path)

    def first_step(self) -> None:
        """Call right before the first training step: the time until now is start-up."""
        self.loop_start = time.time()
        self._write({})

    def step(self, samples: int = 0) -> None:
        """Call after each step with the samples it used (for samples/s); writes nothing."""
        if self.loop_start is None:
            self.loop_start = time.time()
        self.steps += 1
        self.samples += int(samples)

    def finish(self, metrics: Mapping[str, object] | None = None, samples: int | None = None) -> None:
        """Call once at the end with the final metrics (numbers: val_accuracy, train_loss, ...)."""
        self.loop_end = time.time()
        if samples is not None:
            self.samples = int(samples)
        self._write(dict(metrics or {}))

    def _write(self, metrics: dict[str, object]) -> None:
        if not self.path:
            return
        report: ResultReport = {"metrics": metrics, "samples": self.samples, "steps": self.steps,
                                "loop_start": self.loop_start, "loop_end": self.loop_end}
        write_result(self.path, report)


def report(metrics: Mapping[str, object] | None = None, samples: int | None = None) -> None:
    """One call at the end of a program that reports only its metrics (start-up and loop stay one)."""
    TrainingResult().finish(metrics, samples)
