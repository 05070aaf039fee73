"""The sentences and figures of the report as plain text, shared by the terminal (:mod:`gpupack.report.terminal`),
the HTML (:mod:`gpupack.report.html`), the plots and summary.json: the best-N line and how it was chosen, the modes
compared, the cost, the hyperparameters. A packing mode is named as its :class:`gpupack.pack.Packer` says."""
from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from gpupack.analysis.aggregate import Collected
from gpupack.analysis.tables import Ranking
from gpupack.pack import Packer, available_modes, load_packer


def fmt(x: Any, spec: str = ".2f") -> str:
    """``x`` formatted, or "-" where it is missing (None or NaN)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def trainings_phrase(n: int) -> str:
    return f"{n} training" + ("" if n == 1 else "s")


def packer_of(mode: Any) -> Packer | None:
    """The packing mode a record names, or None for a name the registry does not hold (an old record's, or a spread
    layout's label such as ddp-gloo): such a mode is shown by its name."""
    return load_packer(mode) if isinstance(mode, str) and mode in available_modes() else None


def mode_label(mode: Any) -> str:
    """How the report names a mode beside another: its Packer's ``split_label``, else the name itself."""
    packer = packer_of(mode)
    return packer.split_label if packer is not None and packer.split_label else str(mode)


def best_line(row: Mapping[str, Any]) -> str:
    speed = row.get("speedup_vs_n1")
    gain = f", {speed:.2f}x the trainings per hour of N=1" if speed == speed and speed is not None else ""
    provisional = " (provisional)" if row.get("provisional") else ""
    return (f"Best packing factor for {row['workload']} on {row['partition']} ({row['gpu_type']}), "
            f"mode {row['mode']}: N={int(row['factor'])} — {row['time_per_training_s']:.2f} s per training"
            f"{gain}{provisional}.")


def choice_lines(r: pd.Series) -> list[str]:
    """How the best N of one group was picked: its ties, the rule, and whether the answer is settled."""
    lines = []
    if r.get("ties"):
        lines.append(f"{r['ties']} tie (within noise of the lowest median); picked by the rule: {r['tie_rule']}.")
    if r.get("provisional"):
        need = r.get("repeats_needed")
        more = f"; about {int(need)} packs per N would settle it (packing.repeats={int(need)})" if need else ""
        lines.append(f"Provisional: {int(r['packs'])} pack(s) at this N is too few for the interval{more}.")
    elif r.get("repeats_needed"):
        lines.append(f"About {int(r['repeats_needed'])} packs per N would tell the tied N apart.")
    if r.get("choice_method"):
        lines.append(f"Method: {r['choice_method']}.")
    return lines


def mode_lines(c: Collected) -> list[str]:
    """Where a sweep compared modes: the best (mode, N) per partition, split against no split."""
    if c.summary.empty or c.summary["mode"].nunique() < 2:
        return []
    lines = []
    for _, r in c.best_overall.iterrows():
        others = c.best[(c.best["workload"] == r["workload"]) & (c.best["partition"] == r["partition"])
                        & (c.best["gpu_type"] == r["gpu_type"]) & (c.best["mode"] != r["mode"])]
        versus = "; ".join(f"best {o['mode']}: N={int(o['factor'])}, {o['time_per_training_s']:.2f} s"
                           for _, o in others.iterrows())
        lines.append(f"Best (mode, N) for {r['workload']} on {r['partition']} ({r['gpu_type']}): "
                     f"{mode_label(r['mode'])} N={int(r['factor'])} — "
                     f"{r['time_per_training_s']:.2f} s per training" + (f" ({versus})." if versus else "."))
    return lines


def knob_columns(knobs: pd.DataFrame) -> list[str]:
    return [k for k in knobs.columns if k not in ("workload", "partition", "factor", "samples_per_s", "trainings",
                                                  "loader_bound_samples_per_s", "loader_bound")]


def hyper_title(ranking: Ranking) -> str:
    """What the hyperparameters are ranked by, and which way."""
    if ranking.metric is None or ranking.goal is None:
        return "Best hyperparameters"
    return f"Best hyperparameters by {ranking.metric} ({'lowest' if ranking.goal == 'min' else 'highest'} first, " \
           "mean over runs)"


def hyper_lines(ranking: Ranking) -> list[str]:
    lines = []
    table, metric, column = ranking.table, ranking.metric, ranking.column
    for _, r in table.iterrows():
        params = ", ".join(f"{k}={r[k]}" for k in table.columns if k not in ("workload", column, "runs", "trainings"))
        lines.append(f"{r['workload']}: {params}  {metric}={r[column]:.4g} ({int(r['runs'])} runs)")
    return lines


def hyper_notes(ranking: Ranking) -> list[str]:
    """What a person should know of a ranking beside its rows: where its metric or goal came from, where not from
    the flags given now; a goal that goes against its metric's name."""
    return [line for line in (ranking.origin, ranking.caution if not ranking.table.empty else "") if line]


def verdict_line(workload: str, cheapest: Any, fastest: Any) -> str:
    """One line: the partition, mode and N that bill the least per training, and those that finish a sweep first."""
    def where(r: Any) -> str:
        return f"{r['partition']} ({r['mode']}, N={int(r['factor'])})"

    billed = str(cheapest["billed_term"])
    return (f"{workload}: cheapest per training: {where(cheapest)}, {fmt(cheapest['rgu_hours_per_training'], '.3g')} "
            f"RGU-h billed by {billed}; fastest sweep: {where(fastest)}, {fmt(fastest['time_per_training_s'])} s per "
            "training.")


def cost_lines(c: Collected) -> list[str]:
    lines = []
    for workload, group in c.cost.groupby("workload"):
        fastest = group[group["fastest"]].iloc[0]
        lines.append(f"{workload}: a sweep of {trainings_phrase(c.sweep_trainings)} finishes first on "
                     f"{fastest['partition']} ({fmt(fastest['sweep_hours'], '.3g')} hours on one device at N="
                     f"{int(fastest['factor'])}, {fastest['mode']}).")
        cheapest = group[group["cheapest"]]
        if len(cheapest):
            row = cheapest.iloc[0]
            lines.append(f"{workload}: it costs least on {row['partition']} ({row['gpu_model']}): "
                         f"{fmt(row['sweep_rgu_hours'], '.3g')} RGU-hours at N={int(row['factor'])}.")
            lines.append(verdict_line(workload, row, fastest))
        else:
            lines.append(f"{workload}: no RGU weight is known for {', '.join(sorted(set(map(str, group['gpu_type']))))}"
                         " (not a GPU model of conf/rgu/), so no RGU cost.")
    return lines
