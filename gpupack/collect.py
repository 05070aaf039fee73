"""Collect: records → time per training per (workload, partition, GPU type, mode, N) → the best N.

Reads records only (never job objects), so it works on a run in progress, on a run copied off a
cluster, and on several runs at once::

    python -m gpupack.collect RUN_DIR [RUN_DIR ...]
    python -m gpupack collect RUN_DIR [RUN_DIR ...]
"""
from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd
from rich.console import Console
from rich.table import Table

from gpupack.records import COMPLETED, OOM, SCHEMA_VERSION, read_json, write_json_atomic
from gpupack.rundir import RunDir

log = logging.getLogger("gpupack")
GROUP = ["workload", "partition", "gpu_type", "mode"]


@dataclass
class Records:
    trainings: pd.DataFrame
    packs: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # planned packs with no pack record yet


def _read_all(paths: Iterable[Path], kind: str, warnings: list[str]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        try:
            rec = read_json(path)
        except (OSError, ValueError) as err:
            warnings.append(f"skipped {path}: unreadable or torn ({err.__class__.__name__})")
            continue
        if rec.get("kind") != kind:
            warnings.append(f"skipped {path}: not a {kind} record")
        elif rec.get("schema") != SCHEMA_VERSION:
            warnings.append(f"skipped {path}: schema {rec.get('schema')!r}, this gpupack reads {SCHEMA_VERSION}")
        else:
            rows.append({**rec, "run_dir": str(path.parents[2] if kind == "pack" else path.parents[3])})
    return rows


def load_records(run_dirs: Sequence[Path]) -> Records:
    warnings: list[str] = []
    trainings: list[dict[str, Any]] = []
    packs: list[dict[str, Any]] = []
    pending: list[str] = []
    for root in run_dirs:
        run = RunDir(Path(root))
        trainings += _read_all(sorted(run.root.glob("packs/*/trainings/*.json")), "training", warnings)
        packs += _read_all(sorted(run.root.glob("packs/*/pack.json")), "pack", warnings)
        if run.plan.exists():
            planned = [p["pack_id"] for p in read_json(run.plan)["packs"]]
            pending += [f"{run.root}:{p}" for p in planned if not run.pack_record(p).exists()]
    return Records(pd.DataFrame(trainings), pd.DataFrame(packs), warnings, pending)


def _training_columns(trainings: pd.DataFrame) -> pd.DataFrame:
    """Flatten the nested fields the table needs."""
    t = trainings.copy()
    t["ok"] = t["status"] == COMPLETED
    t["startup_s"] = [(x or {}).get("startup_s") for x in t.get("timings", [None] * len(t))]
    t["loop_s"] = [(x or {}).get("loop_s") for x in t.get("timings", [None] * len(t))]
    t["samples"] = [(x or {}).get("samples") for x in t.get("throughput", [None] * len(t))]
    t["samples_per_s"] = [(x or {}).get("samples_per_s") for x in t.get("throughput", [None] * len(t))]
    t["val_accuracy"] = [(x or {}).get("val_accuracy") for x in t.get("metrics", [None] * len(t))]
    for col in ("startup_s", "loop_s", "samples", "samples_per_s", "val_accuracy"):
        t[col] = pd.to_numeric(t[col], errors="coerce")
    return t


def summarize(trainings: pd.DataFrame, packs: pd.DataFrame) -> pd.DataFrame:
    """One row per (workload, partition, GPU type, mode, N).

    Time per training = pack wall / N, over packs whose N trainings all ran together; median and
    spread over those packs. Failures count every training record that did not complete.
    """
    if trainings.empty or packs.empty:
        return pd.DataFrame()
    t = _training_columns(trainings)
    keys = GROUP + ["factor"]
    timed = packs[packs["complete"].astype(bool)].copy()
    for col in ("wall_s", "factor"):
        timed[col] = pd.to_numeric(timed[col], errors="coerce")
    timed["time_per_training_s"] = timed["wall_s"] / timed["factor"]
    pack_samples = t.groupby("pack_id")["samples"].sum()
    timed["pack_samples_per_s"] = pd.to_numeric(timed["pack_id"].map(pack_samples), errors="coerce") / timed["wall_s"]
    workload_of = t.drop_duplicates("pack_id").set_index("pack_id")["workload"]
    timed["workload"] = timed["pack_id"].map(workload_of)

    per_pack = timed.groupby(keys).agg(
        packs=("pack_id", "count"),
        time_per_training_s=("time_per_training_s", "median"),
        tpt_min_s=("time_per_training_s", "min"),
        tpt_max_s=("time_per_training_s", "max"),
        pack_samples_per_s=("pack_samples_per_s", "median"),
    )
    per_training = t.groupby(keys).agg(
        trainings=("training_id", "count"),
        failed=("ok", lambda s: int((~s).sum())),
        oom=("status", lambda s: int((s == OOM).sum())),
        startup_s=("startup_s", "median"),
        loop_s=("loop_s", "median"),
        samples_per_s=("samples_per_s", "median"),
    )
    out = per_pack.join(per_training, how="outer").reset_index()
    out["failed"] = out["failed"].fillna(0).astype(int)
    out["oom"] = out["oom"].fillna(0).astype(int)  # counted apart: an OOM makes N infeasible on this device
    out["trainings_per_hour"] = 3600.0 / out["time_per_training_s"]
    base = out[out["factor"] == 1].set_index(GROUP)["time_per_training_s"]
    out["speedup_vs_n1"] = [
        base.get(tuple(row[GROUP]), math.nan) / row["time_per_training_s"] for _, row in out.iterrows()
    ]
    return out.sort_values(keys).reset_index(drop=True)


def best_factors(summary: pd.DataFrame, by: Sequence[str] = tuple(GROUP)) -> pd.DataFrame:
    """Per group, the N (and mode, when ``by`` leaves mode out) with the lowest time per training,
    among N with no failed training and at least one timed pack."""
    if summary.empty:
        return summary
    eligible = summary[(summary["failed"] == 0) & summary["time_per_training_s"].notna()]
    if eligible.empty:
        return eligible
    idx = eligible.groupby(list(by))["time_per_training_s"].idxmin()
    return eligible.loc[idx].reset_index(drop=True)


def best_hyperparameters(trainings: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """Grid points ranked by validation accuracy, averaged over every completed run of them."""
    if trainings.empty:
        return pd.DataFrame()
    t = _training_columns(trainings)
    t = t[t["ok"] & t["val_accuracy"].notna()]
    if t.empty:
        return pd.DataFrame()
    params = pd.DataFrame(list(t["params"]), index=t.index)
    varying = [c for c in params.columns if params[c].astype(str).nunique() > 1]
    seed_cols = [c for c in varying if c == "seed"]
    keys = [c for c in varying if c not in seed_cols] or varying[:1] or list(params.columns[:1])
    frame = params[keys].astype(str).assign(workload=t["workload"], val_accuracy=t["val_accuracy"],
                                            training_id=t["training_id"])
    ranked = frame.groupby(["workload"] + keys).agg(
        val_accuracy=("val_accuracy", "mean"), runs=("val_accuracy", "count"),
        trainings=("training_id", "nunique"))
    return ranked.sort_values("val_accuracy", ascending=False).head(top).reset_index()


def best_line(row: pd.Series) -> str:
    speed = row.get("speedup_vs_n1")
    gain = f", {speed:.2f}x the trainings per hour of N=1" if speed == speed and speed is not None else ""
    return (f"Best packing factor for {row['workload']} on {row['partition']} ({row['gpu_type']}), "
            f"mode {row['mode']}: N={int(row['factor'])} — {row['time_per_training_s']:.2f} s per training"
            f"{gain}.")


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def render(summary: pd.DataFrame, best: pd.DataFrame, hyper: pd.DataFrame, records: Records,
           console: Console) -> None:
    for w in records.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    if summary.empty:
        console.print("No completed pack records yet.")
    else:
        table = Table(title="Time per training by packing factor N (pack wall time / N)")
        for col in ("partition (GPU)", "mode", "N", "packs", "s/training", "min-max", "start-up s", "loop s",
                    "trainings/h", "speedup", "samples/s/training", "failed"):
            table.add_column(col, justify="left" if col in ("partition (GPU)", "mode") else "right")
        best_keys = {tuple(r[GROUP + ["factor"]]) for _, r in best.iterrows()}
        for _, r in summary.iterrows():
            mark = "bold green" if tuple(r[GROUP + ["factor"]]) in best_keys else None
            table.add_row(
                f"{r['partition']} ({r['gpu_type']})", r["mode"], str(int(r["factor"])), _fmt(r["packs"], ".0f"),
                _fmt(r["time_per_training_s"]), f"{_fmt(r['tpt_min_s'])}-{_fmt(r['tpt_max_s'])}",
                _fmt(r["startup_s"]), _fmt(r["loop_s"]), _fmt(r["trainings_per_hour"], ".0f"),
                _fmt(r["speedup_vs_n1"]), _fmt(r["samples_per_s"], ".0f"),
                str(int(r["failed"])) + (f" ({int(r['oom'])} OOM: infeasible)" if r["oom"] else ""), style=mark)
        console.print(table)
    if not hyper.empty:
        console.print("Best hyperparameters by validation accuracy (mean over runs):")
        for _, r in hyper.iterrows():
            params = ", ".join(f"{k}={r[k]}" for k in hyper.columns
                               if k not in ("workload", "val_accuracy", "runs", "trainings"))
            console.print(f"  {r['workload']}: {params}  val_accuracy={r['val_accuracy']:.4f} "
                          f"({int(r['runs'])} runs)")
    if not records.trainings.empty and "data" in records.trainings:
        for data in sorted({d for d in records.trainings["data"].dropna()}):
            console.print(f"Data: {data}")
    if records.pending:
        console.print(f"[yellow]{len(records.pending)} planned pack(s) have no record yet[/] (still running, "
                      "or lost: re-run the same command with run_dir=... to resume).")
    for _, r in best.iterrows():
        console.print(f"[bold]{best_line(r)}[/]")
    if not summary.empty and best.empty:
        console.print("[red]No packing factor finished without failures: no best N.[/]")


def make_console() -> Console:
    """A console that does not squeeze the table to 80 columns when output goes to a file or a pipe."""
    console = Console()
    return console if console.is_terminal else Console(width=150)


def _jsonable(df: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(df.to_json(orient="records")) if not df.empty else []


def collect(run_dirs: Sequence[Path], console: Console | None = None, write: bool = True) -> pd.DataFrame:
    """Aggregate, print, and write summary.csv/summary.json into the first run directory."""
    console = console or make_console()
    records = load_records(run_dirs)
    summary = summarize(records.trainings, records.packs)
    best = best_factors(summary)
    hyper = best_hyperparameters(records.trainings)
    render(summary, best, hyper, records, console)
    if write and run_dirs:
        out = RunDir(Path(run_dirs[0]))
        summary.to_csv(out.summary_csv, index=False)
        write_json_atomic(out.summary_json, {
            "schema": SCHEMA_VERSION, "runs": [str(r) for r in run_dirs], "groups": _jsonable(summary),
            "best": _jsonable(best), "best_lines": [best_line(r) for _, r in best.iterrows()],
            "best_hyperparameters": _jsonable(hyper), "warnings": records.warnings,
            "pending_packs": records.pending,
        })
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m gpupack collect RUN_DIR [RUN_DIR ...]")
        return 0 if args else 2
    missing = [a for a in args if not Path(a).is_dir()]
    if missing:
        print(f"RUN_DIR={missing[0]!r}: not a directory. HINT: give the run directory the sweep printed",
              file=sys.stderr)
        return 2
    collect([Path(a) for a in args])
    return 0


if __name__ == "__main__":
    sys.exit(main())
