"""How good a packed search's answers are (issue 52, item 3): at one budget, the median best over seeds of gpupack's
study with N slots (each freed slot asks at once, as a streaming search lane does), against Optuna's own sequential
study and Optuna's own study with N workers (``n_jobs=N``), with the same sampler; random search as the floor.

The objective is Branin (minimum 0.397887 at three points; x in [-5, 10], y in [0, 15]), reported as the distance of
the best value to that minimum. A trial's length depends on its x (1 to 3 time units), so slots free out of order as
real trials do. Time is simulated: each side asks and tells in the order its trials would end, on one clock; nothing
sleeps, so the table measures what each side asks, not this machine.

    .venv/bin/python benchmarks/search_quality.py            # 24 trials, N=4, 100 seeds (about 30 s)
    .venv/bin/python benchmarks/search_quality.py --quick    # 16 trials, 20 seeds
"""
from __future__ import annotations

import heapq
import math
import statistics
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna  # noqa: E402

from benchmarks._bench import parser  # noqa: E402
from gpupack.core.store.claims import Claimant  # noqa: E402
from gpupack.search.options import read_search  # noqa: E402
from gpupack.search.study import COMPLETE, Study, TrialRow  # noqa: E402

BRANIN_MIN = 0.397887
SPACE = {"x": "interval(-5, 10)", "y": "interval(0, 15)"}


def branin(x: float, y: float) -> float:
    b, c, r, s, t = 5.1 / (4 * math.pi ** 2), 5 / math.pi, 6.0, 10.0, 1 / (8 * math.pi)
    return (y - b * x ** 2 + c * x - r) ** 2 + s * (1 - t) * math.cos(x) + s


def length(x: float) -> float:
    """A trial's length in time units: 1 at x=-5, 3 at x=10."""
    return 1.0 + 2.0 * (x + 5) / 15


def optuna_side(sampler: optuna.samplers.BaseSampler, n_trials: int, slots: int) -> float:
    """Optuna's own study, asked and told with ``slots`` trials in flight (1: sequential), in end order."""
    study = optuna.create_study(direction="minimize", sampler=sampler)
    dists = {k: optuna.distributions.FloatDistribution(*bounds) for k, bounds in (("x", (-5, 10)), ("y", (0, 15)))}
    running: list[tuple[float, int, optuna.trial.Trial, float]] = []
    now, asked = 0.0, 0
    while asked < n_trials or running:
        while asked < n_trials and len(running) < slots:
            trial = study.ask(dists)
            x, y = trial.params["x"], trial.params["y"]
            heapq.heappush(running, (now + length(x), asked, trial, branin(x, y)))
            asked += 1
        now, _, trial, value = heapq.heappop(running)
        study.tell(trial, value)
    return study.best_value - BRANIN_MIN


def gpupack_side(seed: int, n_trials: int, slots: int, sampler: str) -> float:
    """gpupack's study (its journal, its per-trial seeds), asked by ``slots`` slots of one lane, in end order."""
    search = read_search({"space": SPACE, "n_trials": n_trials, "seed": seed, "sampler": sampler, "pruner": "none"},
                         "loss", "min", None)
    with tempfile.TemporaryDirectory() as tmp:
        study = Study(Path(tmp) / "study.log")
        study.create(search, "branin", {})
        who = Claimant.here("lane0", None)
        running: list[tuple[float, int, float]] = []
        now = 0.0
        while True:
            while len(running) < slots:
                row = study.ask(who)
                if not isinstance(row, TrialRow):
                    break
                x, y = float(row.params["x"] or 0.0), float(row.params["y"] or 0.0)
                heapq.heappush(running, (now + length(x), row.number, branin(x, y)))
            if not running:
                break
            now, number, value = heapq.heappop(running)
            study.tell(number, COMPLETE, value)
        values = [t.value for t in study.read().trials.values() if t.state == COMPLETE and t.value is not None]
    return min(values) - BRANIN_MIN


def main() -> None:
    ap = parser("search_quality", __doc__ or "", "16 trials, 20 seeds")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=100, help="seeds a side (10 is too few: medians swing 3x)")
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--sampler", default="TPESampler")
    args = ap.parse_args()
    n_trials, seeds = (16, range(20)) if args.quick else (args.trials, range(args.seeds))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    make = getattr(optuna.samplers, args.sampler)
    sides: dict[str, Callable[[int], float]] = {
        f"gpupack search=optuna, N={args.slots}": lambda s: gpupack_side(s, n_trials, args.slots, args.sampler),
        f"Optuna's own, {args.slots} workers": lambda s: optuna_side(make(seed=s), n_trials, args.slots),
        "Optuna's own, sequential": lambda s: optuna_side(make(seed=s), n_trials, 1),
        "random search": lambda s: optuna_side(optuna.samplers.RandomSampler(seed=s), n_trials, 1),
    }
    print(f"Branin, {n_trials} trials, {args.sampler}, seeds {seeds.start}-{seeds.stop - 1}, Optuna "
          f"{optuna.__version__}: distance of the best value to the minimum (lower is better)")
    medians: dict[str, float] = {}
    print(f"{'side':<34}  {'median':>7}  {'q25':>7}  {'q75':>7}")
    for name, side in sides.items():
        got = sorted(side(s) for s in seeds)
        q = statistics.quantiles(got, n=4)
        medians[name] = statistics.median(got)
        print(f"{name:<34}  {medians[name]:7.3f}  {q[0]:7.3f}  {q[2]:7.3f}")
    ours, own = medians[next(iter(sides))], medians["Optuna's own, sequential"]
    ratio = ours / own if own > 0 else math.inf
    print(f"gpupack / Optuna's own sequential: {ratio:.2f}x (goal, issue 52: <= 1.5x) — "
          f"{'met' if ratio <= 1.5 else 'not met'}")


if __name__ == "__main__":
    main()
