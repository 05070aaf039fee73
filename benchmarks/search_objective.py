"""The objective both sides of benchmarks/search_vs_hydra_optuna.py optimise: a trial with params (x, y) sleeps a time
that depends on x (0.2 s at x=0, 2.0 s at x=1: slow and fast trials mixed in one batch, as real trials are) and scores
the loss (x - 0.3)^2 + (y - 0.7)^2. As a program (gpupack's ``command`` workload) it prints ``loss: VALUE``; the Hydra
app imports :func:`trial`."""
from __future__ import annotations

import argparse
import time

FASTEST_S, SLOWEST_S = 0.2, 2.0


def duration(x: float) -> float:
    return FASTEST_S + (SLOWEST_S - FASTEST_S) * min(max(x, 0.0), 1.0)


def trial(x: float, y: float) -> float:
    """Sleep the trial's time, return its loss."""
    time.sleep(duration(x))
    return (x - 0.3) ** 2 + (y - 0.7) ** 2


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--x", type=float, required=True)
    ap.add_argument("--y", type=float, required=True)
    args = ap.parse_args()
    print(f"loss: {trial(args.x, args.y)!r}", flush=True)
