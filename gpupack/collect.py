"""Collect: records → time per training per (workload, partition, GPU type, mode, N) → the best N → cost.

Reads records only (never job objects), so it works on a run in progress, on a run copied off a
cluster, and on several runs at once::

    python -m gpupack collect RUN_DIR [RUN_DIR ...] [--trainings K] [--rgu FILE.yaml] [--out DIR]
    python -m gpupack.collect RUN_DIR ...

Aggregation is pure pandas on flat columns (nested record fields are flattened once, at load), so a
million training records aggregate in about a second (benchmarks/collect_scale.py).
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd
from omegaconf import OmegaConf
from rich.console import Console

from gpupack.choose import choose, tie_label
from gpupack.records import COMPLETED, OOM, SCHEMA_VERSION, read_json, write_json_atomic
from gpupack.rundir import RunDir

GROUP = ["workload", "partition", "gpu_type", "mode"]
# Nested record fields the tables need, flattened to columns at load: column → (field, key).
FLAT = {
    "startup_s": ("timings", "startup_s"), "loop_s": ("timings", "loop_s"),
    "timing_split": ("timings", "split"),  # False: a program that never marked its first step (command workload)
    "samples": ("throughput", "samples"), "samples_per_s": ("throughput", "samples_per_s"),
    "curve": ("throughput", "curve"),
    "val_accuracy": ("metrics", "val_accuracy"), "train_loss": ("metrics", "train_loss"),
    "peak_rss_mb": ("memory", "peak_rss_mb"), "peak_gpu_mem_mb": ("memory", "peak_gpu_mem_mb"),
}
NESTED = {"timings", "throughput", "metrics", "memory"}
# Pack record: the sampler's summary, flattened (its raw samples stay in pack.json).
PACK_FLAT = ("source", "note", "gpu_util_mean", "gpu_util_max", "gpu_mem_used_peak_mb", "gpu_mem_total_mb",
             "cpu_percent_mean", "overhead_cpu_s", "overhead_fraction")
CLEARED_OOM = "cleared_oom.json"  # RUN_DIR/cleared_oom.json: OOMs the user cleared (python -m gpupack clear-oom)
LOADER_BOUND_FRACTION = 0.9  # training throughput at >= 90 % of the loader's own: loader-bound, not GPU-bound


@dataclass
class Records:
    trainings: pd.DataFrame
    packs: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # planned packs with no pack record yet
    # Trainings in each sweep's grid: one entry per run, or per Hydra multirun (its launches, launch_*, add up).
    grid_sizes: dict[str, int] = field(default_factory=dict)
    rgu: dict[str, float] = field(default_factory=dict)  # the RGU table the first run was configured with
    cleared: list[dict[str, Any]] = field(default_factory=list)  # OOMs a user cleared, per run directory

    def latest(self) -> pd.DataFrame:
        """Each training's latest record (earlier attempts, kept under attempts/, left out)."""
        t = self.trainings
        return t[t["attempt"] == 0] if not t.empty and "attempt" in t else t


def flatten(rec: dict[str, Any]) -> dict[str, Any]:
    """A training record as one flat row: nested fields the tables use lifted to columns."""
    row = {k: v for k, v in rec.items() if k not in NESTED}
    for col, (outer, inner) in FLAT.items():
        row[col] = (rec.get(outer) or {}).get(inner)
    return row


def flatten_pack(rec: dict[str, Any]) -> dict[str, Any]:
    row = {k: v for k, v in rec.items() if k != "sampler"}
    sampled = rec.get("sampler") or {}
    for key in PACK_FLAT:
        row[f"sampler_{key}"] = sampled.get(key)
    # The sampler's peak RSS of each training's process: what a program that reports nothing itself is known by.
    row["sampler_peak_rss_by_training"] = {tid: t.get("peak_rss_mb") for tid, t in
                                           (sampled.get("per_training") or {}).items()}
    return row


def _read_all(paths: Iterable[Path], kind: str, run_root: Path, warnings: list[str],
              attempt: int = 0) -> list[dict[str, Any]]:
    """Records of one kind; ``attempt`` 0 for the latest, k for an earlier attempt kept under attempts/<k>/."""
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
            warnings.append(f"skipped {path}: record schema {rec.get('schema')!r}, this gpupack reads schema "
                            f"{SCHEMA_VERSION} (collect it with the gpupack version that wrote it)")
        else:
            rows.append({**(flatten(rec) if kind == "training" else flatten_pack(rec)), "run_dir": str(run_root),
                         "attempt": attempt})
    return rows


def _attempt_of(path: Path) -> int:
    return int(path.parent.name) if path.parent.name.isdigit() else 0


def _read_attempts(run: RunDir, warnings: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Earlier attempts' records (packs/<id>/attempts/<k>/): a resumed pack moves them there, and they still count
    (an OOM there makes its N infeasible; a pack whose N trainings all ran together there is still a timing)."""
    trainings: list[dict[str, Any]] = []
    packs: list[dict[str, Any]] = []
    for path in sorted(run.root.glob("packs/*/attempts/*/*.json")):
        kind, into = ("pack", packs) if path.name == "pack.json" else ("training", trainings)
        into += _read_all([path], kind, run.root, warnings, attempt=_attempt_of(path) or 1)
    return trainings, packs


def read_cleared(run: RunDir) -> list[dict[str, Any]]:
    """The OOMs a user cleared (``gpupack clear-oom``): entries {partition, mode, factor, cleared_at}, None = any."""
    path = run.root / CLEARED_OOM
    rec = read_json(path) if path.exists() else {}
    return list(rec.get("cleared", []))


def cleared_mask(rows: pd.DataFrame, cleared: Sequence[Mapping[str, Any]]) -> pd.Series:
    """True for each OOM record a user cleared: it matches an entry and ended before the entry was written."""
    out = pd.Series(False, index=rows.index)
    if not cleared or rows.empty:
        return out
    ended = pd.to_numeric(rows.get("ended_at"), errors="coerce").fillna(0)
    for entry in cleared:
        match = (rows["run_dir"] == entry["run_dir"]) & (ended <= float(entry["cleared_at"]))
        for key in ("partition", "mode", "factor"):
            if entry.get(key) is not None:
                match &= rows[key] == entry[key]
        out |= match
    return out


def load_records(run_dirs: Sequence[Path]) -> Records:
    out = Records(pd.DataFrame(), pd.DataFrame())
    trainings: list[dict[str, Any]] = []
    packs: list[dict[str, Any]] = []
    for root in run_dirs:
        run = RunDir(Path(root))
        trainings += _read_all(sorted(run.root.glob("packs/*/trainings/*.json")), "training", run.root, out.warnings)
        packs += _read_all(sorted(run.root.glob("packs/*/pack.json")), "pack", run.root, out.warnings)
        earlier_trainings, earlier_packs = _read_attempts(run, out.warnings)
        trainings += earlier_trainings
        packs += earlier_packs
        out.cleared += [{**entry, "run_dir": str(run.root)} for entry in read_cleared(run)]
        if run.plan.exists():
            plan = read_json(run.plan)
            sweep_key = str(run.root.parent if run.root.name.startswith("launch_") else run.root)
            out.grid_sizes[sweep_key] = out.grid_sizes.get(sweep_key, 0) + int(plan.get("grid_size", 0))
            out.pending += [f"{run.root}:{p['pack_id']}" for p in plan["packs"]
                            if not run.pack_record(p["pack_id"]).exists()]
        if run.config.exists() and not out.rgu:
            rgu = OmegaConf.load(run.config).get("rgu")
            out.rgu = dict(rgu.models) if rgu is not None and "models" in rgu else {}
    out.trainings, out.packs = pd.DataFrame(trainings), pd.DataFrame(packs)
    return out


def _first(series: pd.Series) -> Any:
    values = series.dropna()
    return values.iloc[0] if len(values) else None


def summarize(trainings: pd.DataFrame, packs: pd.DataFrame, cleared: Sequence[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """One row per (workload, partition, GPU type, mode, N).

    Time per training = pack wall / N, over packs whose N trainings all ran together (in any attempt); median,
    spread and a bootstrap interval over those packs (:mod:`gpupack.choose`). Every attempt of a training counts:
    ``failed`` counts attempts that did not complete, ``oom`` those that ran out of memory (unless the user cleared
    them), ``unfinished`` the trainings whose latest record is not completed.
    """
    if trainings.empty or packs.empty:
        return pd.DataFrame()
    bounds = loader_bounds(trainings)
    trainings, packs = _not_probes(trainings), _not_probes(packs)
    if trainings.empty or packs.empty:
        return pd.DataFrame()
    t = trainings.copy()
    if "attempt" not in t:
        t["attempt"] = 0
    t["ok"] = t["status"] == COMPLETED
    t["oom_cleared"] = (t["status"] == OOM) & cleared_mask(t, cleared)
    t["is_oom"] = (t["status"] == OOM) & ~t["oom_cleared"]
    t["unfinished"] = (t["attempt"] == 0) & ~t["ok"]
    for col in ("startup_s", "loop_s", "samples", "samples_per_s", "val_accuracy", "peak_rss_mb", "peak_gpu_mem_mb"):
        t[col] = pd.to_numeric(t.get(col), errors="coerce")
    t["peak_rss_mb"] = t["peak_rss_mb"].fillna(_sampled_rss(t, packs))
    if "gpu_model" not in t:
        t["gpu_model"] = None
    keys = GROUP + ["factor"]
    timed = timed_packs(t, packs)
    per_pack = timed.groupby(keys).agg(
        packs=("pack_id", "count"),
        time_per_training_s=("time_per_training_s", "median"),
        tpt_min_s=("time_per_training_s", "min"),
        tpt_max_s=("time_per_training_s", "max"),
        pack_samples_per_s=("pack_samples_per_s", "median"),
        gpu_util_mean=("sampler_gpu_util_mean", "mean"),
        cpu_percent_mean=("sampler_cpu_percent_mean", "mean"),
        gpu_mem_peak_mb=("sampler_gpu_mem_used_peak_mb", "max"),
    )
    latest = t[t["attempt"] == 0]
    per_training = t.groupby(keys, dropna=False).agg(
        attempts=("training_id", "count"),
        failed=("ok", lambda s: int((~s).sum())),
        unfinished=("unfinished", "sum"),
        oom=("is_oom", "sum"),
        oom_cleared=("oom_cleared", "sum"),
        peak_rss_mb=("peak_rss_mb", "max"),
    ).join(latest.groupby(keys, dropna=False).agg(
        trainings=("training_id", "count"),
        startup_s=("startup_s", "median"),
        loop_s=("loop_s", "median"),
        samples_per_s=("samples_per_s", "median"),
        gpu_model=("gpu_model", _first),
    ), how="left")
    out = per_pack.join(per_training, how="outer").reset_index()
    for col in ("failed", "unfinished", "oom", "oom_cleared", "attempts", "trainings"):
        out[col] = out[col].fillna(0).astype(int)  # an OOM (counted apart) makes N infeasible on this device
    out["trainings_per_hour"] = 3600.0 / out["time_per_training_s"]
    base = out[out["factor"] == 1].set_index(GROUP)["time_per_training_s"]
    base_of = pd.Series([base.get(tuple(k), math.nan) for k in out[GROUP].itertuples(index=False)], index=out.index)
    out["speedup_vs_n1"] = base_of / out["time_per_training_s"]
    out["loader_bound_samples_per_s"] = [bounds.get(p, math.nan) for p in out["partition"]]
    out["loader_bound"] = out["samples_per_s"] >= LOADER_BOUND_FRACTION * out["loader_bound_samples_per_s"]
    out = out.sort_values(keys).reset_index(drop=True)
    return with_choices(out, timed)


def timed_packs(t: pd.DataFrame, packs: pd.DataFrame) -> pd.DataFrame:
    """The packs that time a training: its N trainings ran together and at least one completed (a pack whose every
    training failed at once says nothing of how long a training takes). One row per pack and attempt."""
    completed = pd.to_numeric(packs.get("n_completed", pd.Series(1, index=packs.index)), errors="coerce").fillna(1)
    timed = packs[packs["complete"].astype(bool) & (completed > 0)].copy()
    if "attempt" not in timed:
        timed["attempt"] = 0
    for col in ("wall_s", "factor", "sampler_gpu_util_mean", "sampler_cpu_percent_mean",
                "sampler_gpu_mem_used_peak_mb"):
        timed[col] = pd.to_numeric(timed.get(col), errors="coerce")
    timed["time_per_training_s"] = timed["wall_s"] / timed["factor"]
    latest = t[t["attempt"] == 0]
    pack_samples = latest.groupby("pack_id")["samples"].sum().replace(0, math.nan)  # none reported: unknown, not 0
    samples = pd.to_numeric(timed["pack_id"].map(pack_samples), errors="coerce").where(timed["attempt"] == 0)
    timed["pack_samples_per_s"] = samples / timed["wall_s"]  # an earlier attempt's samples are not told apart: unknown
    workload_of = t.drop_duplicates("pack_id").set_index("pack_id")["workload"]
    timed["workload"] = timed["pack_id"].map(workload_of)
    return timed


def pack_times(records: Records) -> dict[str, dict[int, list[float]]]:
    """Per partition and N, the time per training of each timed pack (what :mod:`gpupack.choose` weighs)."""
    t, packs = _not_probes(records.trainings), _not_probes(records.packs)
    if t.empty or packs.empty:
        return {}
    t = t.copy()
    if "attempt" not in t:
        t["attempt"] = 0
    t["samples"] = pd.to_numeric(t.get("samples"), errors="coerce")
    timed = timed_packs(t, packs).dropna(subset=["time_per_training_s"])
    out: dict[str, dict[int, list[float]]] = {}
    for (partition, n), values in timed.groupby(["partition", "factor"])["time_per_training_s"]:
        out.setdefault(str(partition), {})[int(n)] = [float(v) for v in values]
    return out


def split_phase(frame: pd.DataFrame, phase: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows not of ``phase``, rows of it): a packing.factors=auto run's grid at the best N is shown apart from the
    probe that chose it."""
    if frame.empty or "phase" not in frame:
        return frame, frame.iloc[0:0]
    of = frame["phase"] == phase
    return frame[~of], frame[of]


def with_choices(summary: pd.DataFrame, timed: pd.DataFrame) -> pd.DataFrame:
    """The noise-aware choice per (workload, partition, GPU type, mode) (:func:`gpupack.choose.choose`), as columns:
    the bootstrap interval of each N's median, whether N is within noise of the lowest, which N is chosen, and the
    group's verdict (ties, rule, provisional, repeats that would settle it)."""
    out = summary.copy()
    for col, default in (("tpt_ci_low_s", math.nan), ("tpt_ci_high_s", math.nan), ("within_noise", False),
                         ("chosen", False), ("infeasible", False), ("ties", None), ("tie_rule", None),
                         ("provisional", None), ("repeats_needed", None), ("choice_method", None)):
        out[col] = default
    out["infeasible"] = (out["oom"] > 0)
    times = timed.dropna(subset=["time_per_training_s"]).groupby(GROUP + ["factor"])["time_per_training_s"].apply(list)
    for key, idx in out.groupby(GROUP, dropna=False).groups.items():
        group = out.loc[idx]
        blocked = set(group.loc[(group["oom"] > 0) | (group["unfinished"] > 0), "factor"].astype(int))
        by_n = {int(n): times.get((*key, n), []) for n in group["factor"]}
        by_n = {n: v for n, v in by_n.items() if v}
        choice = choose(by_n, infeasible=blocked)
        for i, r in group.iterrows():
            interval = choice.intervals.get(int(r["factor"]))
            if interval is not None:
                out.loc[i, ["tpt_ci_low_s", "tpt_ci_high_s"]] = [interval.low, interval.high]
            out.loc[i, "within_noise"] = int(r["factor"]) in choice.ties
            out.loc[i, "chosen"] = choice.best is not None and int(r["factor"]) == choice.best
        out.loc[idx, "ties"] = tie_label(choice.ties, sorted(by_n)) if len(choice.ties) > 1 else None
        out.loc[idx, "tie_rule"] = choice.rule
        out.loc[idx, "provisional"] = choice.provisional
        out.loc[idx, "repeats_needed"] = choice.repeats_needed
        out.loc[idx, "choice_method"] = choice.method
    return out


def _sampled_rss(t: pd.DataFrame, packs: pd.DataFrame) -> pd.Series:
    """Each training's peak RSS as the pack's sampler saw it (by training id)."""
    peaks: dict[str, Any] = {}
    for by_training in packs.get("sampler_peak_rss_by_training", pd.Series(dtype=object)).dropna():
        peaks.update(by_training)
    return pd.to_numeric(t["training_id"].map(peaks), errors="coerce")


def _not_probes(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[~frame["probe"].fillna(False).astype(bool)] if "probe" in frame else frame


def _probes(frame: pd.DataFrame) -> pd.DataFrame:
    if "probe" not in frame:
        return frame.iloc[0:0]
    return frame[frame["probe"].fillna(False).astype(bool) & (frame["status"] == COMPLETED)]


def loader_bounds(trainings: pd.DataFrame) -> dict[str, float]:
    """The data loader's own samples/s per partition (median over its loader-only probes)."""
    probes = _probes(trainings)
    if probes.empty:
        return {}
    return pd.to_numeric(probes["samples_per_s"], errors="coerce").groupby(probes["partition"]).median().to_dict()


def knob_table(trainings: pd.DataFrame) -> pd.DataFrame:
    """Throughput per setting of the workload's knobs (batch size, AMP, loader workers, pinned memory) and N,
    with the loader-only bound of the same input-pipeline setting beside it."""
    if trainings.empty or "knobs" not in trainings:
        return pd.DataFrame()
    t = _not_probes(trainings)
    t = t[(t["status"] == COMPLETED) & t["knobs"].map(lambda k: isinstance(k, dict) and bool(k))]
    if t.empty:
        return pd.DataFrame()
    knobs = pd.DataFrame(list(t["knobs"]), index=t.index)
    varying = [c for c in knobs.columns if _nunique(knobs[c]) > 1]
    if not varying and _probes(trainings).empty:
        return pd.DataFrame()  # no knob varied and no loader bound: nothing the main table does not say
    varying = varying or list(knobs.columns)
    frame = knobs[varying].astype(str).assign(
        workload=t["workload"], partition=t["partition"], factor=t["factor"], loader_setting=t.get("loader_setting"),
        samples_per_s=pd.to_numeric(t["samples_per_s"], errors="coerce"))
    keys = ["workload", "partition"] + varying + ["factor"]
    out = frame.groupby(keys, dropna=False).agg(samples_per_s=("samples_per_s", "median"),
                                               trainings=("samples_per_s", "count"),
                                               loader_setting=("loader_setting", _first)).reset_index()
    probes = _probes(trainings)
    bound = {}
    if not probes.empty and "loader_setting" in probes:
        rates = pd.to_numeric(probes["samples_per_s"], errors="coerce")
        bound = rates.groupby([probes["partition"], probes["loader_setting"]]).median().to_dict()
    out["loader_bound_samples_per_s"] = [bound.get((p, s), math.nan)
                                         for p, s in zip(out["partition"], out["loader_setting"])]
    out["loader_bound"] = out["samples_per_s"] >= LOADER_BOUND_FRACTION * out["loader_bound_samples_per_s"]
    return out.drop(columns=["loader_setting"])


def best_factors(summary: pd.DataFrame, by: Sequence[str] = tuple(GROUP)) -> pd.DataFrame:
    """Per (workload, partition, GPU type, mode): the N the noise-aware choice picked (see :func:`with_choices`).
    With ``by`` leaving mode out: among each mode's chosen N, the one with the lowest time per training."""
    if summary.empty:
        return summary
    chosen = summary[summary["chosen"].astype(bool)]
    if chosen.empty or list(by) == GROUP:
        return chosen.reset_index(drop=True)
    idx = chosen.groupby(list(by))["time_per_training_s"].idxmin()
    return chosen.loc[idx].reset_index(drop=True)


def best_hyperparameters(trainings: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """Grid points ranked by validation accuracy, averaged over every completed run of them."""
    if trainings.empty:
        return pd.DataFrame()
    t = _not_probes(trainings)
    t = t[(t["status"] == COMPLETED)].copy()
    t["val_accuracy"] = pd.to_numeric(t["val_accuracy"], errors="coerce")
    t = t[t["val_accuracy"].notna()]
    if t.empty:
        return pd.DataFrame()
    dicts = list(t["params"])
    names = sorted(set().union(*dicts))
    # one column per hyperparameter (a comprehension per key: far faster than a frame of a million dicts)
    params = {k: pd.Series([d.get(k) for d in dicts], index=t.index) for k in names}
    varying = [k for k, col in params.items() if _nunique(col) > 1]
    keys = [k for k in varying if k != "seed"] or varying[:1] or names[:1]
    frame = pd.DataFrame({k: params[k].astype(str) for k in keys}).assign(
        workload=t["workload"], val_accuracy=t["val_accuracy"], training_id=t["training_id"])
    ranked = frame.groupby(["workload"] + keys).agg(
        val_accuracy=("val_accuracy", "mean"), runs=("val_accuracy", "count"),
        trainings=("training_id", "nunique"))
    return ranked.sort_values("val_accuracy", ascending=False).head(top).reset_index()


def _nunique(col: pd.Series) -> int:
    try:
        return int(col.nunique(dropna=False))
    except TypeError:  # unhashable values (lists): compare their text
        return int(col.astype(str).nunique(dropna=False))


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


def _jsonable(df: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(df.to_json(orient="records")) if not df.empty else []


@dataclass
class Collected:
    records: Records
    summary: pd.DataFrame
    best: pd.DataFrame  # per (workload, partition, GPU type, mode)
    best_overall: pd.DataFrame  # per (workload, partition, GPU type): the best (mode, N)
    hyper: pd.DataFrame
    cost: pd.DataFrame
    sweep_trainings: int
    knobs: pd.DataFrame = field(default_factory=pd.DataFrame)
    # packing.factors=auto: the grid run at the best N, apart from the probe (the main summary) that chose it.
    production: pd.DataFrame = field(default_factory=pd.DataFrame)
    auto_lines: list[str] = field(default_factory=list)  # what the probe did and why it stopped (auto.json)


def aggregate(run_dirs: Sequence[Path], weights: Mapping[str, float] | None = None,
              sweep_trainings: int | None = None) -> Collected:
    """Everything collect shows and writes, computed from the records. No output."""
    from gpupack.rgu import cost_table

    records = load_records(run_dirs)
    probe_t, run_t = split_phase(records.trainings, "run")
    probe_p, run_p = split_phase(records.packs, "run")
    summary = summarize(probe_t, probe_p, records.cleared)
    production = summarize(run_t, run_p, records.cleared) if not run_t.empty else pd.DataFrame()
    best = best_factors(summary)
    overall = best_factors(summary, by=("workload", "partition", "gpu_type"))
    n = sweep_trainings or max(records.grid_sizes.values(), default=0) or int(records.trainings["training_id"].nunique()
                                                                 if not records.trainings.empty else 0)
    cost = cost_table(overall, weights if weights is not None else records.rgu, n)
    return Collected(records, summary, best, overall, best_hyperparameters(records.trainings), cost, n,
                     knob_table(records.trainings), production)


def write_outputs(c: Collected, out: Path, plots: bool = True) -> list[Path]:
    """summary.csv, summary.json, trainings.parquet, and (with plots) plots/*.png and report.html."""
    from gpupack import report

    out.mkdir(parents=True, exist_ok=True)
    run = RunDir(out)
    c.summary.to_csv(run.summary_csv, index=False)
    write_json_atomic(run.summary_json, {
        "schema": SCHEMA_VERSION, "runs": sorted(set(c.records.trainings.get("run_dir", pd.Series(dtype=str)))),
        "groups": _jsonable(c.summary), "best": _jsonable(c.best), "best_overall": _jsonable(c.best_overall),
        "best_lines": [best_line(r) for _, r in c.best.iterrows()], "cost": _jsonable(c.cost),
        "sweep_trainings": c.sweep_trainings, "best_hyperparameters": _jsonable(c.hyper),
        "knobs": _jsonable(c.knobs),
        "warnings": c.records.warnings, "pending_packs": c.records.pending,
    })
    written = [run.summary_csv, run.summary_json]
    if not c.records.trainings.empty:
        table = c.records.trainings.copy()
        for col in ("params", "curve", "error", "knobs"):
            if col in table:
                table[col] = [json.dumps(v, default=str) if v is not None else None for v in table[col]]
        table = table.astype({col: "string" for col in table.columns if table[col].dtype == object})
        table.to_parquet(out / "trainings.parquet", index=False)
        written.append(out / "trainings.parquet")
    if plots:
        written += report.write_report(c, out)
    return written


def collect(run_dirs: Sequence[Path], console: Console | None = None, write: bool = True,
            weights: Mapping[str, float] | None = None, sweep_trainings: int | None = None,
            out: Path | None = None, plots: bool = True) -> pd.DataFrame:
    """Aggregate, print, and write the outputs into ``out`` (default: the first run directory)."""
    from gpupack import report

    console = console or make_console()
    c = aggregate(run_dirs, weights, sweep_trainings)
    report.render(c, console)
    if write and run_dirs:
        written = write_outputs(c, Path(out) if out else Path(run_dirs[0]), plots=plots)
        report_html = [p for p in written if p.name == "report.html"]
        if report_html:
            console.print(f"Report: {report_html[0]}")
    return c.summary


if __name__ == "__main__":  # python -m gpupack.collect RUN_DIR ...: the CLI's collect command
    from gpupack.cli import main

    sys.exit(main(["collect", *sys.argv[1:]]))
