"""Collect one or more runs: aggregate their records (only read), add what a ``packing.factors=auto`` probe did
(RUN_DIR/auto.json) and what was measured again, and write the files a person reads."""
from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence, cast

import yaml
from omegaconf import OmegaConf
from rich.console import Console

from gpupack.core.goal import check_goal, check_metric
from gpupack.core.store.rank_choice import RankChoice, choose, remember
from gpupack.core.store.records import read_json, read_json_or_none
from gpupack.core.store.rundir import RunDir
from gpupack.core.store.storage import storage_faults
from gpupack.results.analysis.aggregate import Collected, aggregate_records, load
from gpupack.results.analysis.tables import Ranking, reported_metrics
from gpupack.results.report.files import write_outputs, write_trainings
from gpupack.results.report.html import RunPage, compared, write_comparison
from gpupack.results.report.terminal import render_collected
from gpupack.results.report.text import RunConfig, what_ran

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
    search: int | None = None  # search=optuna: the trials its study ran at the best N (then=run), not a grid
    # wait=false: the step whose jobs are queued or running now (its run directory), decided on a later call
    waiting: str | None = None
    # partition → why its probe named no N (gpupack.results.analysis.summary.no_answer), and the N the rest ran at
    # instead
    unnamed: dict[str, str] = field(default_factory=dict)
    runs_at: dict[str, int] = field(default_factory=dict)

    def run_title(self) -> str:
        """What ran after the probe (packing.then=run), and at which N: the title of its table."""
        what = f"The search ({self.search} trials)" if self.search is not None else "The rest of the grid"
        at = (", ".join(f"N={n} on {p}" for p, n in self.runs_at.items()) + ", the ladder's reference (no N was named)"
              if self.runs_at else "the best N")
        return f"{what} at {at} (packing.then=run)"

    def lines(self) -> list[str]:
        if self.waiting:
            return [f"Waiting for {self.waiting}: run the same command again once its jobs have ended (python -m "
                    f"gpupack watch {self.waiting.rpartition(' ')[2]}); it decides from their records and goes on."]
        out = []
        for partition, why in self.stopped.items():
            best = self.best.get(partition)
            named = best if best is not None else "none named (no answer: see below)" \
                if partition in self.unnamed else "none"
            out.append(f"{partition}: probe stopped — {why}. Best N: {named}.")
        at = "the best N"
        if self.runs_at:
            at = ", ".join(f"N={n} on {p}" for p, n in self.runs_at.items())
            out.append(f"No N was named ({', '.join(f'{p}: {why}' for p, why in self.unnamed.items())}): "
                       f"{'the search streamed' if self.search is not None else 'the rest ran'} at the ladder's "
                       f"reference ({at}), which needs no comparison to be trusted.")
        if self.run_dir and self.search is not None:
            out.append(f"The search ({self.search} trials) streamed at {at}: {self.run_dir}")
        elif self.run_dir:
            out.append(f"The rest of the grid ({self.left} grid point(s) the probe did not complete) ran at {at}:"
                       f" {self.run_dir}")
        elif self.then == RUN and self.left == 0:
            out.append("The probe completed every grid point: nothing was left to run at the best N.")
        elif self.then == "stop":
            out.append("packing.then=stop: measured only; run the grid with packing.factors=[N].")
        return out


def again_lines(root: Path) -> list[str]:
    """What a run measured again (packing.remeasure: RUN_DIR/again/NN/), from each measurement's plan notes."""
    lines = []
    for again in RunDir(root).agains():
        plan = read_json_or_none(RunDir(again).plan) or {}  # one that cannot be read says nothing
        lines += [f"{again.name}: {note}" for note in plan.get("notes") or []]
    return [f"Measured again in {RunDir(root).again(1).root.parent}/: " + "; ".join(lines) + "."] if lines else []


def read_auto(root: Path) -> AutoReport | None:
    """What an auto run's probe did, from RUN_DIR/auto.json (None: not an auto run)."""
    path = RunDir(root).auto_record
    if not path.exists():
        return None
    rec = read_json(path)
    return AutoReport(steps=[Step(**s) for s in rec["steps"]], stopped=rec["stopped"], best=rec["best"],
                      then=rec["then"], run_dir=rec.get("run_dir"), left=rec.get("left"),
                      search=rec.get("search"), unnamed=rec.get("unnamed") or {}, runs_at=rec.get("runs_at") or {})


def collect(run_dirs: Sequence[Path | str], *, weights: Mapping[str, float] | None = None,
            sweep_trainings: int | None = None, out: Path | str | None = None, plots: bool = True,
            console: Console | None = None, wide: bool = False, metric: str | None = None,
            goal: str | None = None, pattern: str | None = None) -> tuple[Collected, list[Path]]:
    """Aggregate the records of one or more runs (only read) and write the derived outputs into ``out`` (default the
    first run directory); with a ``console``, print what ``python -m gpupack collect`` prints (every column: ``wide``).
    ``metric``/``goal``: rank hyperparameters by that metric, that way (default: what an earlier collect was given,
    else collect.metric and collect.goal), remembered in each run's rank.json; ``pattern``: read ``metric`` from each
    training's kept stdout (a regular expression, its one group the number). A ``metric`` no completed training
    reported is refused (ConfigError) before anything is written."""
    given = [Path(d) for d in run_dirs]
    if goal is not None:
        check_goal(goal, "--goal")
    runs = find_runs(given)
    sweeps = apart(runs)
    if len(sweeps) > 1:  # unrelated runs: a report each, and one page comparing them
        return compare_runs(sweeps, given, weights=weights, sweep_trainings=sweep_trainings, out=out, plots=plots,
                            console=console, wide=wide, metric=metric, goal=goal, pattern=pattern)
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
        for path in given:  # a packing.factors=auto run says what its probe did, a run what it measured again
            report = read_auto(path)
            if report is not None:
                c.auto_lines += report.lines()
                c.production_title = report.run_title()
            c.again_lines += again_lines(path)
        written = (write_outputs(c, where, plots=plots, trainings=trainings, configs=run_configs(runs))
                   if where is not None else [])
    if console is not None:
        render_collected(c, written, console, wide=wide)
    return c, written


def remember_choice(runs: Sequence[Path], kept: RankChoice, asked: RankChoice, ranked: Ranking) -> list[str]:
    """Keep what this collect ranked by (or, where nothing was ranked, what was asked) in each run's rank.json, so a
    later collect ranks the same way. A run that cannot be written keeps its old choice: a warning, never a failure."""
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
    """The run directories given, each with its rounds measured again (again/NN/), or found beneath a folder that is
    not one itself (a Hydra multirun's .gpupack/, runs/<sweep>/)."""
    out: list[Path] = []
    for path in paths:
        if RunDir(path).plan.exists() or not path.is_dir():
            out += [path, *RunDir(path).agains()]
            continue
        out += RunDir.below(path, depth) or [path]
    return out


def run_configs(runs: Sequence[Path]) -> dict[str, RunConfig]:
    """Each run's config.yaml as a dict ({} where it has none, or it cannot be read): what the report says ran."""
    out: dict[str, RunConfig] = {}
    for run in runs:
        path = RunDir(run).config
        try:
            config = OmegaConf.to_container(OmegaConf.load(path), resolve=False) if path.is_file() else {}
        except (OSError, ValueError, yaml.YAMLError):
            config = {}
        # the YAML as written (gpupack.sweep.flow.run.config_yaml): the report reads what it finds of it, key by key
        out[str(run)] = cast(RunConfig, {str(k): v for k, v in config.items()}) if isinstance(config, dict) \
            else RunConfig()
    return out


def _measured(run: Path) -> set[tuple[str, str, str]]:
    """What a run's plan measures: (workload, partition, mode) of its packs (none where it has no plan)."""
    packs = (read_json_or_none(RunDir(run).plan) or {}).get("packs", [])
    return {(str(t.get("workload")), str(p.get("partition")), str(p.get("mode")))
            for p in packs for t in p.get("trainings", [])}


def sweep_of(run: Path) -> Path:
    """The sweep a run is part of: an auto sweep's root for its probe steps and its run, else its sweep_root."""
    where = RunDir(run)
    return where.auto_root or where.sweep_root


def apart(runs: Sequence[Path]) -> list[list[Path]]:
    """The runs by sweep where they must be reported apart (sweeps that measured the same (workload, partition, mode),
    or different workloads, would pool unrelated times); else one list, whose pooled report compares partitions."""
    sweeps: dict[Path, list[Path]] = {}
    for run in runs:
        sweeps.setdefault(sweep_of(run), []).append(run)
    if len(sweeps) < 2:
        return [list(runs)]
    measured = [set().union(*(_measured(r) for r in group)) for group in sweeps.values()]
    overlap = any(a & b for i, a in enumerate(measured) for b in measured[i + 1:])
    workloads = {w for m in measured for w, _, _ in m}
    return list(sweeps.values()) if overlap or len(workloads) > 1 else [list(runs)]


def compare_runs(sweeps: Sequence[Sequence[Path]], given: Sequence[Path], *, out: Path | str | None,
                 plots: bool, console: Console | None, wide: bool, weights: Mapping[str, float] | None,
                 sweep_trainings: int | None, metric: str | None, goal: str | None,
                 pattern: str | None) -> tuple[Collected, list[Path]]:
    """Several unrelated runs: each collected on its own (in its own directory), then one comparison.html with a run
    column in ``out`` (default: the folder given, else the one the runs given share). Returns the first run's
    Collected with every run's summary, a run column first."""
    home = Path(out) if out else given[0] if len(given) == 1 else \
        Path(os.path.commonpath([str(p.resolve()) for p in given]))
    pages, written = [], []
    for group in sweeps:
        root = sweep_of(group[0])
        label = os.path.relpath(root, home) if root.resolve().is_relative_to(home.resolve()) else str(root)
        if console is not None:
            console.print(f"── {label} ──", highlight=False)
        c, files = collect(group, out=root, plots=plots, console=console, wide=wide, weights=weights,
                           sweep_trainings=sweep_trainings, metric=metric, goal=goal, pattern=pattern)
        written += files
        pages.append(RunPage(label, os.path.relpath(root / "report.html", home), c,
                             what_ran(c, run_configs(group))))
    with storage_faults(home):
        page = write_comparison(pages, home) if plots else []
    written += page
    if console is not None and page:
        console.print(f"Comparison of {len(pages)} runs: {page[-1]}")
    first = pages[0].collected
    return dataclasses.replace(first, summary=compared(pages, lambda c: c.summary)), written
