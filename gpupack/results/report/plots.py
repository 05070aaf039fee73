"""The PNG plots (matplotlib, headless, imported only when a plot is drawn): each returns its path, or None where it
would carry no information."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupack.core.store.records import atomic_file
from gpupack.results.analysis.aggregate import Collected
from gpupack.results.analysis.occupancy import STREAMED, WHOLE
from gpupack.results.analysis.search import SearchReport
from gpupack.results.analysis.summary import packer_of
from gpupack.results.report.text import mode_label, params_label, trainings_phrase

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _line_style(mode: object) -> str:
    """A mode's curves' line style: its Packer's ``line_style`` (":" for a name the registry does not hold)."""
    packer = packer_of(mode)
    return packer.line_style if packer is not None else ":"


def _subplots(*args: Any, **kwargs: Any) -> tuple[Figure, Any]:
    """pyplot.subplots, headless (nodes and CI have no display); matplotlib, heavy, imported only here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def plot_time_per_training(c: Collected, path: Path) -> Path | None:
    """Time per training against N with its interval, one line per (run, partition, mode), the chosen N ringed."""
    if "time_per_training_s" not in c.summary or (s := c.summary.dropna(subset=["time_per_training_s"])).empty:
        return None  # no pack has finished yet
    workloads = sorted(s["workload"].unique())
    fig, axes = _subplots(1, len(workloads), figsize=(min(7 * len(workloads), 14), 4.5), squeeze=False)
    lines = ["run", "partition", "gpu_type", "mode"] if "run" in s else ["partition", "gpu_type", "mode"]
    for ax, workload in zip(axes[0], workloads):
        said = 0  # the chosen N's names on this plot, stacked so that two lines' answers never overprint
        for key, g in s[s["workload"] == workload].groupby(lines):
            *run, partition, gpu, mode = key
            g = g.sort_values("factor")
            low = g.get("tpt_ci_low_s", g["tpt_min_s"]).fillna(g["tpt_min_s"])  # the interval; min-max for one pack
            high = g.get("tpt_ci_high_s", g["tpt_max_s"]).fillna(g["tpt_max_s"])
            err = [(g["time_per_training_s"] - low).clip(lower=0), (high - g["time_per_training_s"]).clip(lower=0)]
            drawn = ax.errorbar(g["factor"], g["time_per_training_s"], yerr=err, marker="o", capsize=3,
                                linestyle=_line_style(mode),
                                label=(f"{run[0]}: " if run else "") + f"{partition} ({gpu}), {mode}")
            chosen = g[g["chosen"].fillna(False).astype(bool)] if "chosen" in g else g.iloc[:0]
            for _, r in chosen.iterrows():  # the answer, ringed and named on the curve it was read from
                ax.plot(r["factor"], r["time_per_training_s"], marker="o", markersize=14, fillstyle="none",
                        color=drawn.lines[0].get_color())
                ax.annotate(f"chosen N={int(r['factor'])}" + (f" ({run[0]})" if run else ""),
                            (r["factor"], r["time_per_training_s"]), textcoords="offset points",
                            xytext=(8, 10 + 11 * said), fontsize=8, color=drawn.lines[0].get_color())
                said += 1
        ax.set(xlabel="packing factor N (trainings per GPU)", xticks=sorted(s["factor"].unique()),
               ylabel="time per training (s): pack wall / N (lower is better)",
               ylim=(0, ax.get_ylim()[1] * (1.12 + 0.06 * said)))  # headroom: the names above the points stay inside
        ax.set_title(f"{workload}: time per training against N (median, 95% interval)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    return _save(fig, path)


def plot_split_vs_no_split(c: Collected, path: Path) -> Path | None:
    if "time_per_training_s" not in c.summary or (s := c.summary.dropna(subset=["time_per_training_s"])).empty \
            or s["mode"].nunique() < 2:
        return None
    groups = list(s.groupby(["workload", "partition", "gpu_type"]))
    fig, axes = _subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, ((workload, partition, gpu), g) in zip(axes[0], groups):
        for mode, m in g.groupby("mode"):
            m = m.sort_values("factor")
            ax.plot(m["factor"], m["time_per_training_s"], marker="o", linestyle=_line_style(mode),
                    label=mode_label(mode))
        ax.set(title=f"{workload} on {partition} ({gpu}): split vs no split", xlabel="packing factor N",
               ylabel="time per training (s)", ylim=(0, None))
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, path)


def plot_throughput_curves(c: Collected, path: Path) -> Path | None:
    """The samples/s curve of every training in one pack: the first pack of the best (partition, mode, N)."""
    t = c.records.trainings
    if c.best_overall.empty or t.empty:
        return None
    best = c.best_overall.iloc[0]
    match = c.records.with_detached(t[(t["partition"] == best["partition"]) & (t["mode"] == best["mode"])
                                   & (t["factor"] == best["factor"])], ("curve",))
    if "curve" not in match:
        return None
    match = match[match["curve"].map(lambda v: isinstance(v, str) and v not in ("[]", "null"))]  # JSON text (collect)
    if match.empty:
        return None
    pack_id = sorted(match["pack_id"].unique())[0]
    fig, ax = _subplots(figsize=(8, 4.5))
    rows = match[match["pack_id"] == pack_id]
    params = [json.loads(p) if isinstance(p, str) else dict(p or {}) for p in rows.get("params", [None] * len(rows))]
    varying = [k for k in dict.fromkeys(k for p in params for k in p) if len({str(p.get(k)) for p in params}) > 1]
    for (_, r), p in zip(rows.iterrows(), params):  # each curve named by what sets it apart, not its hash
        xs, ys = zip(*json.loads(r["curve"]))
        ax.plot(xs, ys, label=params_label(p, varying) if varying and p else f"{r['training_id']}")
    ax.set(title=f"Throughput of the {int(best['factor'])} trainings of pack {pack_id}", ylim=(0, None),
           xlabel="seconds since the training loop started", ylabel="samples/s (per window)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_cost(c: Collected, path: Path) -> Path | None:
    """The sweep's device-hours (and RGU-hours) per partition at its best N, where partitions compare."""
    if c.cost.empty or c.cost["partition"].nunique() < 2:
        return None
    cost = c.cost
    labels = [f"{r['partition']}\n{r['gpu_model'] or r['gpu_type']}\nN={int(r['factor'])}" for _, r in cost.iterrows()]
    has_rgu = cost["sweep_rgu_hours"].notna().any()
    fig, axes = _subplots(1, 2 if has_rgu else 1, figsize=(11 if has_rgu else 6, 4.5), squeeze=False)
    axes[0][0].bar(labels, cost["sweep_hours"], color="tab:blue")
    axes[0][0].set(title=f"Sweep of {trainings_phrase(c.sweep_trainings)}: device-hours (lower finishes first)",
                   ylabel="hours on one GPU (or CPU) at the best N")
    if has_rgu:
        axes[0][1].bar(labels, cost["sweep_rgu_hours"].fillna(0), color="tab:orange")
        axes[0][1].set(title="Sweep cost: RGU-hours (lower costs less)", ylabel="RGU-hours")
    for ax in axes[0]:
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_layouts(c: Collected, path: Path) -> Path | None:
    """Time per training and device time per training against devices used per training (1/N packed, k spread)."""
    if c.layouts.empty:
        return None
    fig, axes = _subplots(1, 2, figsize=(11, 4))
    for key, group in c.layouts.groupby(["workload", "partition", "gpu_type"]):
        for answer, marker in (("packing", "o"), ("spread", "s")):
            part = group[group["answer"] == answer].sort_values("devices_per_training")
            for mode, rows in part.groupby("mode"):
                label = f"{key[1]} {mode}"
                axes[0].plot(rows["devices_per_training"], rows["wall_s"], marker=marker, label=label)
                axes[1].plot(rows["devices_per_training"], rows["device_s_per_training"], marker=marker, label=label)
    ticks = sorted(set(c.layouts["devices_per_training"]))
    labels = [f"1/{round(1 / x)}\n(N={round(1 / x)})" if x < 1 else f"{x:g}\n(k={x:g})" if x > 1 else "1"
              for x in ticks]
    for ax, ylabel in zip(axes, ("one training, start to end (s)", "device-seconds per training")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, labels)
        ax.minorticks_off()
        ax.set(xlabel="devices per training (1/N packed, k spread)", ylabel=ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Spread over k devices beside packing N on one")
    return _save(fig, path)


TIMELINE_ROWS = 48  # more slots than this: the first ones, and the title says so


def plot_timeline(c: Collected, path: Path) -> Path | None:
    """The slots' timeline (a Gantt chart): one row per slot of each job (a whole pack's slots share a row per slot
    index, pack after pack), one bar per training; the white between bars is an idle slot."""
    t = c.timeline
    if t.empty:
        return None
    rows = t.assign(row=[f"{g} {job} slot {slot}" if how == STREAMED else f"{g} packs slot {slot}"
                         for g, job, slot, how in zip(t["group"], t["job"], t["slot"], t["how"])])
    names = list(dict.fromkeys(rows["row"]))[:TIMELINE_ROWS]
    fig, ax = _subplots(figsize=(11, 0.35 * len(names) + 1.5))
    colours = {STREAMED: "tab:green", WHOLE: "tab:blue"}
    for y, name in enumerate(names):
        bars = rows[rows["row"] == name]
        ax.broken_barh(list(zip(bars["start_s"], bars["end_s"] - bars["start_s"])), (y - 0.4, 0.8),
                       facecolors=[colours[h] if s == "completed" else "tab:red"
                                   for h, s in zip(bars["how"], bars["status"])], edgecolor="white", linewidth=0.5)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the first training's start")
    more = len(dict.fromkeys(rows["row"])) - len(names)
    ax.set_title("Slots over time: a bar per training (blue: whole packs, green: streaming, red: not completed)"
                 + (f"; {more} more rows not shown" if more > 0 else ""), fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def plot_search_history(s: SearchReport, path: Path) -> Path | None:
    """The study's history, two panels: each trial's value and the best so far, against the trial number and against
    the device-hours the trials had taken by then (pruned trials at the step they were pruned, not in the best)."""
    h = s.history
    if h.empty or h["value"].notna().sum() == 0:
        return None
    fig, axes = _subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, x, label in ((axes[0], "number", "trial number (in the order asked)"),
                         (axes[1], "device_hours", "device-hours spent (Σ the trials' walls up to it)")):
        for state, marker, colour in (("complete", "o", "tab:blue"), ("pruned", "x", "tab:gray")):
            rows = h[h["state"] == state]
            if not rows.empty:
                ax.scatter(rows[x], rows["value"], marker=marker, color=colour, s=18, label=f"{state} trial")
        ax.step(h[x], h["best_so_far"], where="post", color="tab:green", label="best so far")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"{s.metric} ({'higher' if s.direction == 'maximize' else 'lower'} is better)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Search history: {s.metric}, best so far against trials and device-hours", fontsize=10)
    return _save(fig, path)


def _save(fig: Figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        with atomic_file(path, binary=True) as f:  # a full disk leaves the last plot, never half a PNG
            fig.savefig(f, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path
