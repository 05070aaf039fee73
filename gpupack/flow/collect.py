"""Collect one or more runs: aggregate their records (:mod:`gpupack.analysis`), add what a ``packing.factors=auto``
run's probe did (RUN_DIR/auto.json, read here and written by :mod:`gpupack.flow.auto`), and write the files a person
reads (:mod:`gpupack.report`). Records are only read; what ``--metric/--goal/--pattern`` ranked by is remembered
beside them (RUN_DIR/rank.json, :mod:`gpupack.core.rank_choice`), so a later collect of the run ranks the same way."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from rich.console import Console

from gpupack.analysis.aggregate import Collected, aggregate_records, load
from gpupack.analysis.tables import Ranking, reported_metrics
from gpupack.core.goal import check_goal, check_metric
from gpupack.core.rank_choice import RankChoice, choose, remember
from gpupack.core.records import read_json
from gpupack.core.rundir import RunDir
from gpupack.core.storage import storage_faults
from gpupack.report.files import write_outputs, write_trainings
from gpupack.report.terminal import render_collected

# The phases of an auto sweep (plan.phase; packing.then=run): their folders are RunDir.probe_step(n) and RunDir.auto_run
PROBE, RUN = "probe", "run"


@dataclass
class Step:
    partition: str
    factor: int
    run_dir: str
    verdict: str  # "climb" or why this partition stopped here


@dataclass
class AutoReport:
    """What the probe did: each step, and per partition the best N and why it stopped."""

    steps: list[Step] = field(default_factory=list)
    stopped: dict[str, str] = field(default_factory=dict)  # partition → why it stopped climbing
    best: dict[str, int | None] = field(default_factory=dict)  # partition → the best N (None: none finished)
    then: str = RUN
    run_dir: str | None = None  # RUN_DIR/run, where the grid ran at the best N (then=run)
    left: int | None = None  # grid points the probe had not completed (then=run)
    # wait=false: the step whose jobs are queued or running now (its run directory), decided on a later call
    waiting: str | None = None

    def lines(self) -> list[str]:
        if self.waiting:
            return [f"Waiting for {self.waiting}: run the same command again once its jobs have ended (python -m "
                    f"gpupack watch {self.waiting.rpartition(' ')[2]}); it decides from their records and goes on."]
        out = []
        for partition, why in self.stopped.items():
            best = self.best.get(partition)
            out.append(f"{partition}: probe stopped — {why}. Best N: {best if best is not None else 'none'}.")
        if self.run_dir:
            out.append(f"The rest of the grid ({self.left} grid point(s) the probe did not complete) ran at the best N:"
                       f" {self.run_dir}")
        elif self.then == RUN and self.left == 0:
            out.append("The probe completed every grid point: nothing was left to run at the best N.")
        elif self.then == "stop":
            out.append("packing.then=stop: measured only; run the grid with packing.factors=[N].")
        return out


def read_auto(root: Path) -> AutoReport | None:
    """What an auto run's probe did, from RUN_DIR/auto.json (None: not an auto run)."""
    path = RunDir(root).auto_record
    if not path.exists():
        return None
    rec = read_json(path)
    return AutoReport(steps=[Step(**s) for s in rec["steps"]], stopped=rec["stopped"], best=rec["best"],
                      then=rec["then"], run_dir=rec.get("run_dir"), left=rec.get("left"))


def collect(run_dirs: Sequence[Path | str], *, weights: Mapping[str, float] | None = None,
            sweep_trainings: int | None = None, out: Path | str | None = None, plots: bool = True,
            console: Console | None = None, wide: bool = False, metric: str | None = None,
            goal: str | None = None, pattern: str | None = None) -> tuple[Collected, list[Path]]:
    """Aggregate the records of one or more runs and write the derived outputs (into ``out``, default the first
    run directory). Records are only read. With a ``console``, print there what ``python -m gpupack collect`` prints
    (every column with ``wide``): the one call a notebook or a test makes. ``metric``/``goal``: rank hyperparameters by
    that metric, that way (default: what an earlier collect of the runs was given, else as they were configured,
    collect.metric and collect.goal); ``pattern``: read ``metric`` from each training's kept stdout (a regular
    expression, its one group or ``value`` the number). What is given is remembered in each run (its rank.json); a
    ``metric`` no completed training reported is refused (ConfigError) before anything is written."""
    given = [Path(d) for d in run_dirs]
    if goal is not None:
        check_goal(goal, "--goal")
    runs = find_runs(given)
    records = load(runs, metric, pattern)
    if metric is not None:  # refused before anything is written or remembered
        check_metric(metric, reported_metrics(records.trainings), "--metric",
                     f"the trainings of {', '.join(map(str, given))}")
    where = Path(out) if out else given[0] if given else None
    # a full disk (or quota, or a folder not ours) while writing the files is one line naming where, not a traceback;
    # they are written whole or not at all, so a collect after space is freed writes them all
    with storage_faults(where or "."):
        with ThreadPoolExecutor(1) as pool:  # trainings.parquet is the records: written while they are aggregated
            parquet = pool.submit(write_trainings, records, where) if where is not None else None
            c = aggregate_records(records, weights, sweep_trainings, metric, goal)
            trainings = parquet.result() if parquet is not None else None
        if (metric, goal, pattern) != (None, None, None):
            c.records.warnings += remember_choice(runs, records.rank, RankChoice(metric, goal, pattern), c.hyper)
        for path in given:  # a packing.factors=auto run says what its probe did
            report = read_auto(path)
            if report is not None:
                c.auto_lines += report.lines()
        written = write_outputs(c, where, plots=plots, trainings=trainings) if where is not None else []
    if console is not None:
        render_collected(c, written, console, wide=wide)
    return c, written


def remember_choice(runs: Sequence[Path], kept: RankChoice, asked: RankChoice, ranked: Ranking) -> list[str]:
    """Keep what this collect ranked by in each run's rank.json (core.rank_choice), so that a later collect of any of
    them ranks the same way: the metric and goal the ranking used (the default metric pinned, the goal known for it),
    or, where nothing was ranked, what was asked. A run that cannot be written (copied read-only, someone else's)
    keeps its old choice and the collect goes on: what could not be remembered is a warning, never a failure."""
    chosen, _ = choose(asked, kept)
    choice = RankChoice(ranked.metric or chosen.metric, ranked.goal or chosen.goal, chosen.pattern)
    warnings = []
    for path in runs:
        run = RunDir(path)
        if not run.plan.exists():
            continue  # not a run directory: nothing of it is read back by a later collect
        try:
            remember(run, choice)
        except OSError as err:
            flags = " ".join(f"--{k} {v}" for k, v in choice.as_json().items())
            warnings.append(f"{run.rank_choice}: the ranking ({flags}) not remembered, give it again next time: {err}")
    return warnings


def find_runs(paths: Sequence[Path], depth: int = 3) -> list[Path]:
    """The run directories given, or found beneath a folder that is not one itself (a Hydra multirun directory
    holds one per launch under .gpupack/; runs/<sweep>/ holds one per date)."""
    out: list[Path] = []
    for path in paths:
        if RunDir(path).plan.exists() or not path.is_dir():
            out.append(path)
            continue
        out += RunDir.below(path, depth) or [path]
    return out
