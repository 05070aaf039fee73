"""What a person reads, from what :mod:`gpupack.analysis.collect` computes: the terminal tables (rich), the summary files
(CSV, JSON, Parquet), PNG plots (matplotlib, headless) and one self-contained HTML report (images embedded) that can
be copied off a cluster and opened anywhere. The CLI and :mod:`gpupack.sweep` decide when to print and write."""
from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table

from gpupack.analysis.collect import GROUP, Collected, aggregate, shared_host
from gpupack.core.records import SCHEMA_VERSION, write_json_atomic
from gpupack.core.rundir import RunDir

WIDTH = 120  # the main table fits this many columns unless --wide

MODE_STYLE = {"process": "-", "tf_logical": "--"}
MODE_LABEL = {"process": "no split (process)", "tf_logical": "split (TF logical)"}


def _fmt(x: Any, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def _trainings(n: int) -> str:
    return f"{n} training" + ("" if n == 1 else "s")


def _num(r: pd.Series, key: str) -> float | None:
    value = r.get(key)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _util(r: pd.Series) -> str:
    """GPU utilization where NVML sampled it, else the trainings' CPU % (100 = one core)."""
    gpu, cpu = _num(r, "gpu_util_mean"), _num(r, "cpu_percent_mean")
    return f"gpu {gpu:.0f}" if gpu is not None else (f"cpu {cpu:.0f}" if cpu is not None else "-")


def _memory(r: pd.Series) -> str:
    gpu, rss = _num(r, "gpu_mem_peak_mb"), _num(r, "peak_rss_mb")
    return f"gpu {gpu:.0f}" if gpu is not None else (f"rss {rss:.0f}" if rss is not None else "-")


def _throughput(r: pd.Series) -> str:
    text = _fmt(r.get("samples_per_s"), ".0f")
    bound = _num(r, "loader_bound_samples_per_s")
    if bound is not None:
        text += f" / {bound:.0f}" + (" loader-bound" if r.get("loader_bound") else "")
    return text


def _failed(r: pd.Series) -> str:
    """Failed attempts of all attempts (an attempt kept from before a resume counts), and OOMs apart."""
    text = f"{int(r['failed'])}/{int(r.get('attempts', r['failed']))}"
    if r.get("oom"):
        text += f" ({int(r['oom'])} OOM: infeasible)"
    elif r.get("oom_cleared"):
        text += f" ({int(r['oom_cleared'])} OOM cleared)"
    return text


def _tpt(r: pd.Series) -> str:
    """Median time per training and its bootstrap interval (min-max where one pack gives no interval)."""
    low, high = _num(r, "tpt_ci_low_s"), _num(r, "tpt_ci_high_s")
    if low is not None and high is not None:
        return f"{_fmt(r['time_per_training_s'])} [{low:.2f}-{high:.2f}]"
    return _fmt(r["time_per_training_s"])


def _n(r: pd.Series) -> str:
    """N, marked: * the chosen N, ~ within noise of the lowest median."""
    mark = "*" if r.get("chosen") else ("~" if r.get("within_noise") else "")
    return f"{int(r['factor'])}{mark}"


def best_line(row: Mapping[str, Any]) -> str:
    speed = row.get("speedup_vs_n1")
    gain = f", {speed:.2f}x the trainings per hour of N=1" if speed == speed and speed is not None else ""
    provisional = " (provisional)" if row.get("provisional") else ""
    return (f"Best packing factor for {row['workload']} on {row['partition']} ({row['gpu_type']}), "
            f"mode {row['mode']}: N={int(row['factor'])} — {row['time_per_training_s']:.2f} s per training"
            f"{gain}{provisional}.")


def make_console() -> Console:
    """A console that does not squeeze the table to 80 columns when output goes to a file or a pipe."""
    console = Console()
    return console if console.is_terminal else Console(width=150)


# ---------------- terminal ----------------

def pending_lines(c: Collected) -> list[str]:
    """What a run with no finished pack has so far: its plan, the packs still to come, the trainings recorded."""
    r = c.records
    if not r.planned and r.trainings.empty and r.packs.empty:
        where = ", ".join(r.runs) or "the directory given"
        return [f"Nothing to collect yet in {where}: no plan.json and no records (give the run directory a sweep "
                "printed)."]
    done = r.planned - len(r.pending)
    lines = [f"No pack has finished yet: {done} of {r.planned} planned pack(s) have a record, "
             f"{len(r.pending)} pending." if r.planned else "No pack record yet."]
    if not r.trainings.empty:
        lines.append(f"{len(r.latest())} training record(s) so far; the table follows once a pack finishes.")
    lines += [f"Follow it: python -m gpupack status {run}" for run in r.runs[:1]]
    return lines


def shared_cores_line(c: Collected) -> str | None:
    host = shared_host(c.records)
    if host is None:
        return None
    return (f"note: all packs ran on one host ({host}), sharing its cores as on the local test cluster: timings "
            "measure overhead.")


def render(c: Collected, console: Console, wide: bool = False) -> None:
    for w in c.records.warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)
    if c.summary.empty:
        for line in pending_lines(c):
            console.print(line, highlight=False)
    else:
        title = "Time per training by packing factor N (pack wall time / N; median [95% interval])"
        console.print(summary_table(c.summary, ("probe (packing.factors=auto): " if c.auto_lines else "") + title,
                                    {tuple(r[GROUP + ["factor"]]) for _, r in c.best.iterrows()}, wide=wide))
        console.print("N*: the chosen N; N~: within noise of the lowest median."
                      + ("" if wide else " Every column: --wide (and summary.csv)."), highlight=False)
    shared = shared_cores_line(c)
    if shared:
        console.print(shared, highlight=False)
    for line in c.auto_lines:
        console.print(line, highlight=False)
    if not c.production.empty:
        console.print(summary_table(c.production, "The rest of the grid at the best N (packing.then=run)", set(),
                                    wide=wide))
    if not c.summary.empty:
        if unsplit_trainings(c):
            console.print(f"start-up s / loop s: '-' for {unsplit_trainings(c)} training(s) whose program did not mark "
                          "its first step, so their wall time is one figure (from gpupack.result import "
                          "TrainingResult; call first_step() before the first step to split it).", highlight=False)
    for line in failure_lines(c):
        console.print(line, highlight=False)
    if not c.hyper.empty:
        console.print("Best hyperparameters by validation accuracy (mean over runs):")
        for line in hyper_lines(c.hyper):
            console.print(f"  {line}", highlight=False)
    elif not c.summary.empty:
        console.print("Best hyperparameters: nothing to rank (one grid point, or only the seed varies).",
                      highlight=False)
    if not c.knobs.empty:
        render_knobs(c, console)
    if not c.records.trainings.empty and "data" in c.records.trainings:
        for data in sorted(map(str, c.records.trainings["data"].dropna().unique())):
            console.print(f"Data: {data}", highlight=False)
    if c.records.pending and not c.summary.empty:  # with no table, pending_lines said it
        console.print(f"[yellow]{len(c.records.pending)} planned pack(s) have no record yet[/] (still running, "
                      "or lost: re-run the same command with run_dir=... to resume).")
    if not c.cost.empty:
        render_cost(c, console)
    for _, r in c.best.iterrows():
        console.print(f"[bold]{best_line(r)}[/]")
        for line in choice_lines(r):
            console.print(f"  {line}", highlight=False)
    for line in mode_lines(c):
        console.print(f"[bold]{line}[/]")
    if not c.layouts.empty:
        render_layouts(c, console)
    if not c.summary.empty and c.best.empty:
        console.print("[red]No packing factor finished without failures: no best N.[/]")


def failure_lines(c: Collected, most: int = 3) -> list[str]:
    """Why trainings failed: each distinct last error line, how many trainings hit it, and one log to read."""
    t = c.records.trainings
    if t.empty or "status" not in t:
        return []
    probe = t.get("probe", pd.Series(False, index=t.index)).fillna(False).astype(bool)
    failed = t[(t["status"] != "completed") & ~probe]
    if failed.empty:
        return []
    reasons: dict[str, list[Any]] = {}
    for _, r in failed.iterrows():
        error = r.get("error")  # text, or missing (None, or NaN in a text column)
        text = (error if isinstance(error, str) and error.strip() else str(r["status"])).strip().splitlines()
        reasons.setdefault(f"{r['status']}: {text[-1] if text else r['status']}", []).append(r)
    lines = [f"{len(failed)} training(s) did not complete:"]
    for reason, rows in sorted(reasons.items(), key=lambda kv: -len(kv[1]))[:most]:
        first = rows[0]
        log = (Path(str(first.get("run_dir", "."))) / "packs" / str(first["pack_id"]) / "logs"
               / f"{first['training_id']}.err")
        lines.append(f"  {len(rows)} x {reason[:160]}  (e.g. {log})")
    if len(reasons) > most:
        lines.append(f"  ... and {len(reasons) - most} other reason(s): see summary.json and each record's error")
    return lines


def _gpu(r: pd.Series) -> str:
    """The partition and its GPU, by the RGU table's short name where known (a device name can be 30 characters)."""
    model = r.get("gpu_model")
    return f"{r['partition']} ({model if isinstance(model, str) and model else r['gpu_type']})"


# The main table's columns: (header, cell, where: "both", "default" or "wide"). The default fits WIDTH columns;
# --wide shows every column, and summary.csv has every figure.
COLUMNS: list[tuple[str, Any, str]] = [
    ("partition (GPU)", _gpu, "both"),
    ("mode", lambda r: str(r["mode"]), "both"),
    ("N", _n, "both"),
    ("packs", lambda r: _fmt(r["packs"], ".0f"), "both"),
    ("s/training", _tpt, "both"),
    ("start/loop s", lambda r: f"{_fmt(r['startup_s'])}/{_fmt(r['loop_s'])}", "wide"),
    ("speedup", lambda r: _fmt(r["speedup_vs_n1"]), "both"),
    ("samples/s", _throughput, "wide"),  # per training, with the loader-only bound beside it
    ("util %", _util, "wide"),
    ("mem MB", _memory, "both"),
    ("failed/attempts", _failed, "both"),
]


def summary_table(summary: pd.DataFrame, title: str, best_keys: set[tuple[Any, ...]], wide: bool = False) -> Table:
    """The main table: one row per (partition, mode, N), in :data:`WIDTH` columns unless ``wide`` (no outer edge,
    rules between columns only)."""
    columns = [(h, cell) for h, cell, where in COLUMNS if where in ("both", "wide" if wide else "default")]
    table = Table(title=title, box=box.MINIMAL, show_edge=False, pad_edge=False)
    for header, _ in columns:
        table.add_column(header, justify="left" if header in ("partition (GPU)", "mode") else "right")
    for _, r in summary.iterrows():
        mark = "bold green" if tuple(r[GROUP + ["factor"]]) in best_keys else None
        table.add_row(*(cell(r) for _, cell in columns), style=mark)
    return table


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


def unsplit_trainings(c: Collected) -> int:
    """Trainings whose start-up and loop are one figure (a command that reported no first step)."""
    t = c.records.trainings
    if t.empty or "timing_split" not in t:
        return 0
    return int((t["timing_split"] == False).sum())  # noqa: E712 (None: not a command training)


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
                     f"{MODE_LABEL.get(r['mode'], r['mode'])} N={int(r['factor'])} — "
                     f"{r['time_per_training_s']:.2f} s per training" + (f" ({versus})." if versus else "."))
    return lines


def knob_columns(knobs: pd.DataFrame) -> list[str]:
    return [k for k in knobs.columns if k not in ("workload", "partition", "factor", "samples_per_s", "trainings",
                                                  "loader_bound_samples_per_s", "loader_bound")]


def render_knobs(c: Collected, console: Console) -> None:
    probed = c.knobs["loader_bound_samples_per_s"].notna().any()
    table = Table(title="Throughput by knob setting (samples/s per training, median)"
                  + (" beside the loader-only bound" if probed else ""))
    names = knob_columns(c.knobs)
    columns = ["partition", *names, "N", "samples/s/training"] + (["loader-only samples/s", "flag"] if probed else [])
    for col in columns:
        table.add_column(col, justify="left" if col in ("partition", "flag") else "right")
    for _, r in c.knobs.iterrows():
        row = [r["partition"], *(str(r[k]) for k in names), str(int(r["factor"])), _fmt(r["samples_per_s"], ".0f")]
        if probed:
            row += [_fmt(r["loader_bound_samples_per_s"], ".0f"), "loader-bound" if r["loader_bound"] else ""]
        table.add_row(*row)
    console.print(table)


def hyper_lines(hyper: pd.DataFrame) -> list[str]:
    lines = []
    for _, r in hyper.iterrows():
        params = ", ".join(f"{k}={r[k]}" for k in hyper.columns
                           if k not in ("workload", "val_accuracy", "runs", "trainings"))
        lines.append(f"{r['workload']}: {params}  val_accuracy={r['val_accuracy']:.4f} ({int(r['runs'])} runs)")
    return lines


def cost_lines(c: Collected) -> list[str]:
    lines = []
    for workload, group in c.cost.groupby("workload"):
        fastest = group[group["fastest"]].iloc[0]
        lines.append(f"{workload}: a sweep of {_trainings(c.sweep_trainings)} finishes first on "
                     f"{fastest['partition']} ({_fmt(fastest['sweep_hours'], '.3g')} hours on one device at N="
                     f"{int(fastest['factor'])}, {fastest['mode']}).")
        cheapest = group[group["cheapest"]]
        if len(cheapest):
            row = cheapest.iloc[0]
            lines.append(f"{workload}: it costs least on {row['partition']} ({row['gpu_model']}): "
                         f"{_fmt(row['sweep_rgu_hours'], '.3g')} RGU-hours at N={int(row['factor'])}.")
        else:
            lines.append(f"{workload}: no RGU weight is known for {', '.join(sorted(set(map(str, group['gpu_type']))))}"
                         " (not a GPU model of conf/rgu/), so no RGU cost.")
    return lines


def render_cost(c: Collected, console: Console) -> None:
    table = Table(title=f"Cost at the best N, for a sweep of {_trainings(c.sweep_trainings)} on one device")
    for col in ("partition", "GPU model", "RGU", "mode", "best N", "s/training", "RGU-h/training", "sweep hours",
                "sweep RGU-h", "verdict"):
        table.add_column(col, justify="left" if col in ("partition", "GPU model", "mode", "") else "right")
    for _, r in c.cost.iterrows():
        flags = " ".join(f for f, on in (("fastest", r["fastest"]), ("cheapest", r["cheapest"])) if on)
        table.add_row(r["partition"], str(r["gpu_model"] or "-"), _fmt(r["rgu"], ".1f"), r["mode"],
                      str(int(r["factor"])), _fmt(r["time_per_training_s"]), _fmt(r["rgu_hours_per_training"], ".2e"),
                      _fmt(r["sweep_hours"], ".3g"), _fmt(r["sweep_rgu_hours"], ".3g"), flags)
    console.print(table)
    for line in cost_lines(c):
        console.print(line, highlight=False)


LAYOUT_COLUMNS = {"partition": "partition", "gpu_type": "GPU type", "layout": "layout",
                  "devices_per_training": "devices/training", "packs": "packs", "wall_s": "one training s",
                  "time_per_training_s": "s/training", "device_s_per_training": "device-s/training",
                  "trainings_per_device_hour": "trainings/device-h", "rgu_hours_per_1000": "RGU-h/1000",
                  "samples_per_s": "samples/s", "job_wall_s": "job wall s",
                  "allreduce_bytes_per_step": "all-reduce B/step", "allreduce_s_per_step": "all-reduce s/step",
                  "best": "best"}


def _devices(x: float) -> str:
    return f"1/{round(1 / x)}" if x < 1 else f"{x:g}"


def render_layouts(c: Collected, console: Console) -> None:
    """One training on k devices beside N trainings on one device: one table (fits 120 columns; every figure is in
    summary.json and the HTML report), then a verdict per GPU type."""
    t = c.layouts
    mib = pd.to_numeric(t.get("allreduce_bytes_per_step"), errors="coerce") / 2**20
    columns: list[tuple[str, Any]] = [
        ("partition (GPU)", _gpu), ("layout", lambda r: str(r["layout"])),
        ("devices", lambda r: _devices(r["devices_per_training"])), ("packs", lambda r: str(int(r["packs"]))),
        ("wall s", lambda r: _fmt(r["wall_s"])), ("device-s", lambda r: _fmt(r["device_s_per_training"])),
    ]
    if t["rgu"].notna().any():
        columns.append(("RGU-h/1000", lambda r: _fmt(r["rgu_hours_per_1000"], ".3g")))
    if mib.notna().any():
        columns += [("MiB/step", lambda r: _fmt(mib[r.name], ".3f")),
                    ("comm s", lambda r: _fmt(r.get("allreduce_s_per_step"), ".4f"))]
    columns.append(("best", lambda r: "*" if r["best"] else ""))
    table = Table(title="One training on k devices (spread) beside N trainings on one device (packing)")
    for header, _ in columns:
        table.add_column(header, justify="left" if header in ("partition (GPU)", "layout") else "right",
                         no_wrap=header == "layout")
    for _, r in t.iterrows():
        table.add_row(*(cell(r) for _, cell in columns))
    console.print(table)
    console.print("devices: per training (1/N packed, k spread). wall s: one training, its start to its end. device-s: "
                  "device time per training, the job's start-up included (packed: the pack's wall / N; spread: k x "
                  "the job's wall); the fewest uses a device-hour, and an RGU-hour, best."
                  + (" MiB/step: handed to the all-reduce each step (at k=1 it stays in the process); comm s: per "
                     "step, the all-reduces in flight on the host clock (overlapping backward)."
                     if mib.notna().any() else ""), highlight=False)
    if (t["gpu_type"] == "cpu").any():
        console.print("note: with no GPU, k processes (DDP) or k logical devices (Mirrored) on the same cores stand in "
                      "for k devices, and each counts as a device: the verdict is the mechanism's, not a GPU's.",
                      highlight=False)
    for line in c.verdicts:
        console.print(f"[bold]{line}[/]", highlight=False)


# ---------------- plots ----------------

def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # headless: compute nodes and CI have no display
    import matplotlib.pyplot as plt

    return plt


def plot_time_per_training(c: Collected, path: Path) -> Path | None:
    if "time_per_training_s" not in c.summary:  # no pack has finished yet
        return None
    s = c.summary.dropna(subset=["time_per_training_s"])
    if s.empty:
        return None
    plt = _plt()
    workloads = sorted(s["workload"].unique())
    fig, axes = plt.subplots(1, len(workloads), figsize=(7 * len(workloads), 4.5), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        for (partition, gpu, mode), g in s[s["workload"] == workload].groupby(["partition", "gpu_type", "mode"]):
            g = g.sort_values("factor")
            low = g.get("tpt_ci_low_s", g["tpt_min_s"]).fillna(g["tpt_min_s"])  # the interval; min-max for one pack
            high = g.get("tpt_ci_high_s", g["tpt_max_s"]).fillna(g["tpt_max_s"])
            err = [(g["time_per_training_s"] - low).clip(lower=0), (high - g["time_per_training_s"]).clip(lower=0)]
            ax.errorbar(g["factor"], g["time_per_training_s"], yerr=err, marker="o", capsize=3,
                        linestyle=MODE_STYLE.get(mode, ":"), label=f"{partition} ({gpu}), {mode}")
        ax.set_xlabel("packing factor N (trainings per GPU)")
        ax.set_ylabel("time per training (s) = pack wall / N, 95% interval")
        ax.set_title(f"{workload}: time per training vs N (lower is better)")
        ax.set_xticks(sorted(s["factor"].unique()))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, plt, path)


def plot_split_vs_no_split(c: Collected, path: Path) -> Path | None:
    if "time_per_training_s" not in c.summary:
        return None
    s = c.summary.dropna(subset=["time_per_training_s"])
    if s.empty or s["mode"].nunique() < 2:
        return None
    plt = _plt()
    groups = list(s.groupby(["workload", "partition", "gpu_type"]))
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, ((workload, partition, gpu), g) in zip(axes[0], groups):
        for mode, m in g.groupby("mode"):
            m = m.sort_values("factor")
            ax.plot(m["factor"], m["time_per_training_s"], marker="o", linestyle=MODE_STYLE.get(mode, ":"),
                    label=MODE_LABEL.get(mode, mode))
        ax.set_title(f"{workload} on {partition} ({gpu}): split vs no split")
        ax.set_xlabel("packing factor N")
        ax.set_ylabel("time per training (s)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, plt, path)


def plot_throughput_curves(c: Collected, path: Path) -> Path | None:
    """The samples/s curve of every training in one pack: the first pack of the best (partition, mode, N)."""
    t = c.records.trainings
    if c.best_overall.empty or t.empty or "curve" not in t:
        return None
    best = c.best_overall.iloc[0]
    match = t[(t["partition"] == best["partition"]) & (t["mode"] == best["mode"]) & (t["factor"] == best["factor"])
              & t["curve"].map(lambda v: isinstance(v, str) and v not in ("[]", "null"))]  # JSON text (collect)
    if match.empty:
        return None
    pack_id = sorted(match["pack_id"].unique())[0]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for _, r in match[match["pack_id"] == pack_id].iterrows():
        xs, ys = zip(*json.loads(r["curve"]))
        ax.plot(xs, ys, label=f"{r['training_id']}")
    ax.set_title(f"Throughput of the {int(best['factor'])} trainings of pack {pack_id}")
    ax.set_xlabel("seconds since the training loop started")
    ax.set_ylabel("samples/s (per window)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, plt, path)


def plot_cost(c: Collected, path: Path) -> Path | None:
    if c.cost.empty:
        return None
    plt = _plt()
    cost = c.cost.copy()
    labels = [f"{r['partition']}\n{r['gpu_model'] or r['gpu_type']}\nN={int(r['factor'])}" for _, r in cost.iterrows()]
    has_rgu = cost["sweep_rgu_hours"].notna().any()
    fig, axes = plt.subplots(1, 2 if has_rgu else 1, figsize=(11 if has_rgu else 6, 4.5), squeeze=False)
    axes[0][0].bar(labels, cost["sweep_hours"], color="tab:blue")
    axes[0][0].set_title(f"Sweep of {_trainings(c.sweep_trainings)}: device-hours (lower finishes first)")
    axes[0][0].set_ylabel("hours on one GPU (or CPU) at the best N")
    if has_rgu:
        axes[0][1].bar(labels, cost["sweep_rgu_hours"].fillna(0), color="tab:orange")
        axes[0][1].set_title("Sweep cost: RGU-hours (lower costs less)")
        axes[0][1].set_ylabel("RGU-hours")
    for ax in axes[0]:
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, plt, path)


def plot_layouts(c: Collected, path: Path) -> Path | None:
    """Time per training and device time per training against devices used per training (1/N packed, k spread)."""
    if c.layouts.empty:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
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
        ax.set_xlabel("devices per training (1/N packed, k spread)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Spread over k devices beside packing N on one")
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------- HTML ----------------

def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"><figcaption>' \
           f"{html.escape(alt)}</figcaption></figure>"


def _table(df: pd.DataFrame, columns: dict[str, str], formats: dict[str, str]) -> str:
    if df.empty:
        return "<p>(none)</p>"
    view = pd.DataFrame({label: [_fmt(v, formats[col]) if col in formats else ("-" if v is None else v)
                                 for v in df[col]] for col, label in columns.items() if col in df})
    return "<div class='scroll'>" + view.to_html(index=False, escape=True, border=0, classes="t") + "</div>"


SUMMARY_COLUMNS = {"workload": "workload", "partition": "partition", "gpu_type": "GPU", "mode": "mode", "factor": "N",
                   "packs": "packs", "time_per_training_s": "s/training",
                   "tpt_ci_low_s": "95% low", "tpt_ci_high_s": "95% high", "chosen": "chosen",
                   "within_noise": "within noise", "tpt_min_s": "min", "tpt_max_s": "max",
                   "startup_s": "start-up s", "loop_s": "loop s",
                   "trainings_per_hour": "trainings/h", "speedup_vs_n1": "speedup vs N=1",
                   "samples_per_s": "samples/s/training", "pack_samples_per_s": "samples/s/pack",
                   "loader_bound_samples_per_s": "loader-only samples/s", "loader_bound": "loader-bound",
                   "gpu_util_mean": "GPU util %", "cpu_percent_mean": "CPU %", "gpu_mem_peak_mb": "GPU mem peak MB",
                   "peak_rss_mb": "RSS peak MB", "attempts": "attempts", "failed": "failed", "oom": "OOM",
                   "oom_cleared": "OOM cleared"}
SUMMARY_FORMATS = {"time_per_training_s": ".2f", "tpt_ci_low_s": ".2f", "tpt_ci_high_s": ".2f", "tpt_min_s": ".2f",
                   "tpt_max_s": ".2f", "startup_s": ".2f",
                   "loop_s": ".2f", "trainings_per_hour": ".0f", "speedup_vs_n1": ".2f", "samples_per_s": ".0f",
                   "pack_samples_per_s": ".0f", "packs": ".0f", "loader_bound_samples_per_s": ".0f",
                   "gpu_util_mean": ".0f", "cpu_percent_mean": ".0f", "gpu_mem_peak_mb": ".0f", "peak_rss_mb": ".0f"}
COST_COLUMNS = {"workload": "workload", "partition": "partition", "gpu_model": "GPU model", "rgu": "RGU",
                "mode": "mode", "factor": "best N", "time_per_training_s": "s/training",
                "rgu_hours_per_training": "RGU-h/training", "sweep_hours": "sweep hours",
                "sweep_rgu_hours": "sweep RGU-h", "fastest": "fastest", "cheapest": "cheapest"}
COST_FORMATS = {"rgu": ".1f", "time_per_training_s": ".2f", "rgu_hours_per_training": ".2e", "sweep_hours": ".3g",
                "sweep_rgu_hours": ".3g"}
CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em}.best{background:#e8f5e9;padding:.6em 1em;border-radius:6px}
table.t{border-collapse:collapse;font-size:.85em}table.t td,table.t th{padding:3px 8px;border-bottom:1px solid #ddd;
text-align:right}table.t th{background:#f3f3f3}img{max-width:100%}figcaption{font-size:.8em;color:#666}
.warn{color:#a15c00}.scroll{overflow-x:auto}"""


def _knob_section(c: Collected) -> str:
    if c.knobs.empty:
        return ""
    columns = {**{k: k for k in ["partition", *knob_columns(c.knobs)]}, "factor": "N",
               "samples_per_s": "samples/s/training", "loader_bound_samples_per_s": "loader-only samples/s",
               "loader_bound": "loader-bound"}
    return ("<h2>Throughput by knob setting, beside the loader-only bound</h2>"
            + _table(c.knobs, columns, {"samples_per_s": ".0f", "loader_bound_samples_per_s": ".0f"}))


def _layout_section(c: Collected) -> str:
    if c.layouts.empty:
        return ""
    return ("<h2>One training on k devices beside N trainings on one device</h2>"
            + _table(c.layouts, {"workload": "workload", **LAYOUT_COLUMNS},
                     {"wall_s": ".2f", "job_wall_s": ".2f", "time_per_training_s": ".2f",
                      "device_s_per_training": ".2f", "trainings_per_device_hour": ".0f", "rgu_hours_per_1000": ".3g",
                      "samples_per_s": ".0f",
                      "allreduce_bytes_per_step": ".0f", "allreduce_s_per_step": ".4f", "devices_per_training": ".3g"})
            + "".join(f"<p>{html.escape(line)}</p>" for line in c.verdicts))


def write_report(c: Collected, out: Path) -> list[Path]:
    """plots/*.png and report.html in ``out``."""
    plots_dir = out / "plots"
    made = [
        (plot_time_per_training(c, plots_dir / "time_per_training.png"), "Time per training against N, per GPU type"),
        (plot_split_vs_no_split(c, plots_dir / "split_vs_no_split.png"), "Split (TF logical GPUs) against no split"),
        (plot_throughput_curves(c, plots_dir / "throughput_curves.png"), "Throughput of the trainings of one pack"),
        (plot_cost(c, plots_dir / "cost.png"), "Time and RGU cost of the sweep per partition"),
        (plot_layouts(c, plots_dir / "spread_vs_packing.png"), "One training on k devices beside N on one device"),
    ]
    plots = [(p, alt) for p, alt in made if p is not None]
    best = "".join(f"<p>{html.escape(line)}</p>" for line in [text for _, r in c.best.iterrows()
                                                                 for text in [best_line(r), *choice_lines(r)]]
                   + mode_lines(c)) or \
        "<p>No packing factor finished without failures yet: no best N.</p>"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>gpupack report</title>",
        f"<style>{CSS}</style></head><body><h1>gpupack report</h1>",
        f"<p>Runs: {html.escape(', '.join(sorted(set(map(str, c.records.trainings.get('run_dir', []))))))}</p>",
        f"<div class='best'>{best}</div>",
        "<h2>Time per training by packing factor N</h2>",
        _table(c.summary, SUMMARY_COLUMNS, SUMMARY_FORMATS),
        f"<h2>Cost at the best N (a sweep of {_trainings(c.sweep_trainings)} on one device)</h2>",
        _table(c.cost, COST_COLUMNS, COST_FORMATS),
        "".join(f"<p>{html.escape(line)}</p>" for line in (cost_lines(c) if not c.cost.empty else [])),
        _knob_section(c),
        _layout_section(c),
        "<h2>Plots</h2>", "".join(_img(p, alt) for p, alt in plots),
        "<h2>Best hyperparameters by validation accuracy</h2>",
        "".join(f"<p>{html.escape(line)}</p>" for line in hyper_lines(c.hyper)) or "<p>(none)</p>",
    ]
    if c.records.warnings or c.records.pending:
        parts.append("<h2>Warnings</h2>" + "".join(f"<p class='warn'>{html.escape(w)}</p>"
                                                     for w in c.records.warnings))
        if c.records.pending:
            parts.append(f"<p class='warn'>{len(c.records.pending)} planned pack(s) have no record yet.</p>")
    parts.append("</body></html>")
    report = out / "report.html"
    report.write_text("\n".join(parts), encoding="utf-8")
    return [p for p, _ in plots] + [report]


# ---------------- files ----------------

def _jsonable(df: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(df.to_json(orient="records")) if not df.empty else []


def _text_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Lists and dicts as JSON text, for Parquet (params, knobs, the curve and the CPUs already are), and each error
    as JSON text, as trainings.parquet has always held it."""
    table = table.copy()
    for col in ("params", "knobs", "curve", "cpus"):
        if col in table and table[col].dtype == object:  # dicts and lists (a frame built by hand)
            table[col] = [json.dumps(v, default=str) if v is not None else None for v in table[col]]
    if "error" in table:
        error = table["error"].astype(object)
        text = error.map(lambda v: isinstance(v, str))
        table["error"] = error.where(~text, error[text].map(json.dumps)).where(text, None)
    objects = [col for col in table.columns if table[col].dtype == object]
    return table.astype({col: "string" for col in objects})


def write_outputs(c: Collected, out: Path, plots: bool = True) -> list[Path]:
    """summary.csv (every column of the table), summary.json, trainings.parquet, and (with plots) plots/*.png and
    report.html."""
    out.mkdir(parents=True, exist_ok=True)
    run = RunDir(out)
    c.summary.to_csv(run.summary_csv, index=False)
    write_json_atomic(run.summary_json, {
        "schema": SCHEMA_VERSION, "runs": sorted(set(c.records.trainings.get("run_dir", pd.Series(dtype=str)))),
        "groups": _jsonable(c.summary), "best": _jsonable(c.best), "best_overall": _jsonable(c.best_overall),
        "best_lines": [best_line(r) for _, r in c.best.iterrows()], "cost": _jsonable(c.cost),
        "sweep_trainings": c.sweep_trainings, "best_hyperparameters": _jsonable(c.hyper),
        "knobs": _jsonable(c.knobs),
        "spread": _jsonable(c.spread.drop(columns=["walls"], errors="ignore")),
        "layouts": _jsonable(c.layouts.drop(columns=["times"], errors="ignore")), "verdicts": c.verdicts,
        "warnings": c.records.warnings, "pending_packs": c.records.pending,
    })
    written = [run.summary_csv, run.summary_json]
    if not c.records.trainings.empty:
        _text_columns(c.records.trainings).to_parquet(out / "trainings.parquet", index=False)
        written.append(out / "trainings.parquet")
    if plots:
        written += write_report(c, out)
    return written


def collect(run_dirs: Sequence[Path], console: Console | None = None, write: bool = True,
            weights: Mapping[str, float] | None = None, sweep_trainings: int | None = None,
            out: Path | None = None, plots: bool = True, wide: bool = False) -> pd.DataFrame:
    """Aggregate, print, and write the outputs into ``out`` (default: the first run directory): the CLI's collect in
    one call, for a notebook or a test."""
    console = console or make_console()
    c = aggregate(run_dirs, weights, sweep_trainings)
    render(c, console, wide=wide)
    if write and run_dirs:
        written = write_outputs(c, Path(out) if out else Path(run_dirs[0]), plots=plots)
        report_html = [p for p in written if p.name == "report.html"]
        if report_html:
            console.print(f"Report: {report_html[0]}")
    return c.summary
