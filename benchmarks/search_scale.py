"""A study of many trials (issue 52, item 4): how long one ask of gpupack's study takes at 100, 1,000 and 10,000
trials, with 64 lanes asking and telling in turn (trials of zero length), beside the sampler's own ask on an
in-memory Optuna study holding the same trials; and how many journal lines each ask reads (what is new since the
lane's last decision, not the whole study).

Each size's study is filled with that many finished trials first (Optuna's ``add_trials``, values of a 2-D quadratic
bowl), then each of the 64 lanes (one :class:`gpupack.search.study.Study` each, as each lane's job holds one) asks a
trial and tells its value, ``--rounds`` times over.

    .venv/bin/python benchmarks/search_scale.py            # 100, 1,000, 10,000 trials; TPESampler
    .venv/bin/python benchmarks/search_scale.py --quick    # 100 and 1,000
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna  # noqa: E402
from optuna.distributions import FloatDistribution  # noqa: E402
from optuna.storages import JournalStorage  # noqa: E402
from optuna.storages.journal import JournalFileBackend  # noqa: E402
from optuna.trial import TrialState, create_trial  # noqa: E402

from benchmarks._bench import parser  # noqa: E402
from gpupack.core.store.claims import Claimant  # noqa: E402
from gpupack.search.options import read_search  # noqa: E402
from gpupack.search.study import COMPLETE, Study, TrialRow  # noqa: E402

LANES = 64
DISTS = {"x": FloatDistribution(-5, 5), "y": FloatDistribution(-5, 5)}


def value(x: float, y: float) -> float:
    return (x - 1) ** 2 + (y + 2) ** 2


def filled(n: int, seed: int) -> list[optuna.trial.FrozenTrial]:
    sampler = optuna.samplers.RandomSampler(seed=seed)
    study = optuna.create_study(sampler=sampler)
    trials = []
    for _ in range(n):
        t = study.ask(DISTS)
        study.tell(t, value(t.params["x"], t.params["y"]))
    for t in study.trials:
        trials.append(create_trial(state=TrialState.COMPLETE, value=t.value, params=t.params, distributions=DISTS))
    return trials


class Counted(JournalFileBackend):
    """Optuna's file backend, counting the lines it reads."""

    read = 0

    def read_logs(self, log_number_from: int):  # type: ignore[no-untyped-def]
        for log in super().read_logs(log_number_from):
            Counted.read += 1
            yield log


def gpupack_asks(n: int, sampler: str, rounds: int) -> tuple[list[float], list[int]]:
    """Each ask's seconds and journal lines read, 64 lanes over a study of ``n`` finished trials."""
    space = {"x": "interval(-5, 5)", "y": "interval(-5, 5)"}
    search = read_search({"space": space, "n_trials": n + 10 * LANES * rounds, "sampler": sampler, "pruner": "none"},
                         "loss", "min", None)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "search" / "study.log"
        Study(path).create(search, "bowl", {})
        optuna.load_study(study_name=None, storage=JournalStorage(JournalFileBackend(str(path)))).add_trials(
            filled(n, 0))
        lanes = []
        for i in range(LANES):
            lane = Study(path)
            lane._store = JournalStorage(Counted(str(path), lock_obj=lane._lock))  # type: ignore[arg-type]
            lanes.append((lane, Claimant.here(f"lane{i}", None)))
        seconds, lines = [], []
        for _ in range(rounds):
            for lane, who in lanes:
                Counted.read = 0
                t0 = time.perf_counter()
                row = lane.ask(who)
                seconds.append(time.perf_counter() - t0)
                lines.append(Counted.read)
                assert isinstance(row, TrialRow), row
                lane.tell(row.number, COMPLETE, value(float(row.params["x"] or 0), float(row.params["y"] or 0)))
    return seconds, lines


def own_asks(n: int, sampler: str, asks: int) -> list[float]:
    """The sampler's own ask: Optuna's in-memory study holding the same ``n`` trials."""
    study = optuna.create_study(sampler=getattr(optuna.samplers, sampler)(seed=0))
    study.add_trials(filled(n, 0))
    seconds = []
    for _ in range(asks):
        t0 = time.perf_counter()
        t = study.ask(DISTS)
        seconds.append(time.perf_counter() - t0)
        study.tell(t, value(t.params["x"], t.params["y"]))
    return seconds


def main() -> None:
    ap = parser("search_scale", __doc__ or "", "100 and 1,000 trials only")
    ap.add_argument("--sampler", default="TPESampler")
    ap.add_argument("--rounds", type=int, default=1, help="asks of each of the 64 lanes at each size")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    sizes = (100, 1000) if args.quick else (100, 1000, 10_000)
    print(f"An ask of a study of n finished trials, {LANES} lanes asking and telling in turn; {args.sampler}, "
          f"Optuna {optuna.__version__}")
    print(f"{'trials':>7}  {'gpupack ask ms (median)':>24}  {'sampler own ms':>15}  {'ratio':>6}  "
          f"{'lines read per ask (median, max)':>33}")
    for n in sizes:
        ours, lines = gpupack_asks(n, args.sampler, args.rounds)
        own = own_asks(n, args.sampler, 16)
        a, b = statistics.median(ours) * 1e3, statistics.median(own) * 1e3
        print(f"{n:>7}  {a:>24.1f}  {b:>15.1f}  {a / b:>5.2f}x  {statistics.median(lines):>25.0f}, {max(lines)}")


if __name__ == "__main__":
    main()
