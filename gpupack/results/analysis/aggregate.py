"""Collect: records → time per training per (workload, partition, GPU type, mode, N) → the best N → cost.

Records in, frames out: this package reads records (never job objects), so it works on a run in progress, on a run
copied off a cluster and on several runs at once, and it prints nothing (:mod:`gpupack.results.report` does).
:func:`aggregate` loads the runs (:mod:`.load`) and computes everything collect shows (:func:`aggregate_records`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from gpupack.core.cost.rgu import billed_packs, cost_table
from gpupack.core.store.rank_choice import RankChoice, choose
from gpupack.core.store.rundir import PROBE
from gpupack.errors import ConfigError
from gpupack.results.analysis.disturbance import disturbance, loaded_packs, with_disturbed
from gpupack.results.analysis.drift import drift_checks
from gpupack.results.analysis.layouts import compare, split_spread, spread_summary, training_walls, verdicts
from gpupack.results.analysis.load import Records, load_records, with_stdout_metric
from gpupack.results.analysis.occupancy import occupancy, timeline, with_lanes
from gpupack.results.analysis.search import SearchReport, search_reports
from gpupack.results.analysis.summary import (
    best_factors,
    not_checks,
    packing_times,
    split_phase,
    summarize,
    withheld_choices,
)
from gpupack.results.analysis.tables import Ranking, best_hyperparameters, knob_table, with_knob_bounds

__all__ = ["Collected", "aggregate", "aggregate_records", "load"]


@dataclass
class Collected:
    records: Records
    summary: pd.DataFrame
    best: pd.DataFrame  # per (workload, partition, GPU type, mode)
    best_overall: pd.DataFrame  # per (workload, partition, GPU type): the best (mode, N)
    hyper: Ranking  # grid points ranked by collect.metric towards collect.goal, or why not
    cost: pd.DataFrame
    sweep_trainings: int
    knobs: pd.DataFrame = field(default_factory=pd.DataFrame)
    # packing.factors=auto: the grid run at the best N, apart from the probe (the main summary) that chose it.
    production: pd.DataFrame = field(default_factory=pd.DataFrame)
    production_title: str = "The rest of the grid at the best N (packing.then=run)"  # what ran there, and at which N
    auto_lines: list[str] = field(default_factory=list)  # what the probe did and why it stopped (auto.json)
    again_lines: list[str] = field(default_factory=list)  # the rounds measured again (packing.remeasure)
    spread: pd.DataFrame = field(default_factory=pd.DataFrame)  # one training on k devices (.layouts)
    layouts: pd.DataFrame = field(default_factory=pd.DataFrame)  # every layout beside packing's, with verdicts
    verdicts: list[str] = field(default_factory=list)
    occupancy: pd.DataFrame = field(default_factory=pd.DataFrame)  # how busy the slots were (.occupancy)
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame)  # a bar per training on its job's slot
    drift: pd.DataFrame = field(default_factory=pd.DataFrame)  # the drift checks (.drift)
    disturbance: pd.DataFrame = field(default_factory=pd.DataFrame)  # packs under foreign load, per group
    searches: list[SearchReport] = field(default_factory=list)  # search=optuna: each run's study (.search)
    withheld: pd.DataFrame = field(default_factory=pd.DataFrame)  # per group naming no best N, the N withheld


def aggregate_records(records: Records, weights: Mapping[str, float] | None = None,
                      sweep_trainings: int | None = None, metric: str | None = None,
                      goal: str | None = None) -> Collected:
    """Everything collect shows, from loaded records; ranked by ``metric``/``goal``, else as configured. Pure."""
    packing_t, spread_t = split_spread(records.trainings)  # one training on k devices: apart, then beside
    packing_p, spread_p = split_spread(records.packs)
    probe_t, run_t = split_phase(packing_t, "run")
    probe_p, run_p = split_phase(packing_p, "run")
    packed = occupancy(packing_p)
    probed = packed if probe_p is packing_p else occupancy(probe_p)  # no grid run at the best N: the same packs
    summary = with_disturbed(with_lanes(summarize(probe_t, probe_p, records.cleared, loaded_packs(probe_p)),
                                        probed), not_checks(probe_p))  # N's packs, not the check
    production = (with_lanes(summarize(run_t, run_p, records.cleared), occupancy(run_p)) if not run_t.empty
                  else pd.DataFrame())
    best = best_factors(summary)
    overall = best_factors(summary, by=("workload", "partition", "gpu_type"))
    n = sweep_trainings or max(records.grid_sizes.values(), default=0) or int(records.trainings["training_id"].nunique()
                                                                 if not records.trainings.empty else 0)
    weights = weights if weights is not None else records.rgu
    cost = cost_table(overall, weights, n, billed_packs(probe_p))
    spread = spread_summary(spread_t, spread_p)
    layouts = (compare(summary, spread, packing_times(probe_t, probe_p), weights, training_walls(probe_t))
               if not spread.empty else pd.DataFrame())
    # Hyperparameters and knobs are ranked over packed trainings: a spread one repeats an N=1 training on k devices
    choice, kept = choose(RankChoice(metric, goal), records.rank)
    # a search's trainings without an auto probe's: the probe trained no trial of the study
    ranked = packing_t[packing_t["phase"] != PROBE] if records.studies and "phase" in packing_t else packing_t
    ranking = best_hyperparameters(ranked, metric=choice.metric, goal=choice.goal)
    if kept:
        ranking = dataclasses.replace(ranking, origin=origin_line(choice, kept, records.rank_from))
    return Collected(records, summary, best, overall, ranking, cost, n,
                     with_knob_bounds(knob_table(packing_t), summary), production, spread=spread, layouts=layouts,
                     verdicts=verdicts(layouts),
                     occupancy=packed, timeline=timeline(packing_t, packing_p),
                     drift=drift_checks(probe_p), disturbance=disturbance(records.packs),
                     searches=search_reports(records.studies, records.trainings), withheld=withheld_choices(summary))


def origin_line(choice: RankChoice, kept: Sequence[str], where: str) -> str:
    """Where the ranking's ``kept`` keys came from: the run's rank.json or its config. Pure."""
    said = ", ".join(f"{k} {getattr(choice, k)}" for k in kept)
    if where.endswith(".yaml"):
        return f"Ranked by {said}: as the run was configured ({where}: collect.*); --metric/--goal override it."
    return (f"Ranked by {said}: remembered from an earlier collect ({where}); --metric/--goal override it, and are "
            "remembered in turn.")


def aggregate(run_dirs: Sequence[Path], weights: Mapping[str, float] | None = None,
              sweep_trainings: int | None = None, metric: str | None = None, goal: str | None = None,
              pattern: str | None = None) -> Collected:
    """Load the runs' records (:func:`load`) and aggregate them (:func:`aggregate_records`). Reads only."""
    return aggregate_records(load(run_dirs, metric, pattern), weights, sweep_trainings, metric, goal)


def load(run_dirs: Sequence[Path], metric: str | None = None, pattern: str | None = None) -> Records:
    """The runs' records; with ``pattern``, ``metric`` read from the kept stdout too. Reads only."""
    if pattern is not None and metric is None:
        raise ConfigError("--pattern", pattern, "reads a metric, and no --metric names it",
                          f"add --metric NAME, e.g. --metric val_loss --pattern {pattern!r}")
    records = load_records(run_dirs)
    # a pattern the run remembers reads its metric again, unless another metric is asked for
    choice, _ = choose(RankChoice(metric, pattern=pattern), records.rank)
    if choice.pattern is not None and choice.metric is not None:
        return with_stdout_metric(records, choice.metric, choice.pattern)
    return records
