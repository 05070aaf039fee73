"""Spread beside packing: one training on k devices against N trainings on one device, per workload and GPU type.
Pure: record frames in, frames and verdict lines out.

The unit both share is the **device-second per training**: N trainings packed for a pack's wall W spend W/N each;
one training spread over k devices for W spends k x W. The fewest uses a device-hour (and an RGU-hour) best. How long
one training takes is shown beside it: spreading can finish one sooner and still cost more device time.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import pandas as pd

from gpupack.core.store.records import COMPLETED, OOM
from gpupack.results.analysis.choose import gain
from gpupack.results.analysis.summary import numeric, split_by

KEY = ["workload", "partition", "gpu_type"]
# What a spread training's record says it measured (the strategy's stats), flattened by collect.
SPREAD_COLUMNS = ("allreduce_bytes_per_step", "allreduce_s_per_step", "replicas")


def split_spread(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(packing rows, spread rows: their records carry the strategy) of a trainings or packs frame."""
    return split_by(frame, frame["strategy"].notna() if "strategy" in frame else pd.Series(False, index=frame.index))


def spread_summary(trainings: pd.DataFrame, packs: pd.DataFrame) -> pd.DataFrame:
    """One row per (workload, partition, GPU type, layout, k): the job's median wall over its completed packs, k x
    that, one training's own wall, samples/s, failures over every attempt, and the strategy's figures per step."""
    if trainings.empty or packs.empty:
        return pd.DataFrame()
    t = trainings.assign(attempt=trainings["attempt"] if "attempt" in trainings else 0)
    done = packs[numeric(packs, "n_completed").fillna(0) > 0].copy()
    done["wall_s"] = numeric(done, "wall_s")
    done["devices"] = numeric(done, "devices").astype("Int64")
    keys = KEY + ["mode", "devices"]
    per_pack = done.groupby(keys).agg(packs=("pack_id", "count"), wall_s=("wall_s", "median"),
                                      walls=("wall_s", list))
    t = t.assign(devices=numeric(t, "devices").astype("Int64"), ok=t["status"] == COMPLETED,
                 training_wall_s=numeric(t, "wall_s"), samples_per_s=numeric(t, "samples_per_s"),
                 val_accuracy=numeric(t, "val_accuracy"), train_loss=numeric(t, "train_loss"),
                 gpu_model=t["gpu_model"] if "gpu_model" in t else None,
                 **{c: numeric(t, c) for c in SPREAD_COLUMNS})
    t["unfinished"] = (t["attempt"] == 0) & ~t["ok"]
    t["is_oom"] = t["status"] == OOM
    latest = t[(t["attempt"] == 0) & t["ok"]]
    per_training = t.groupby(keys, dropna=False).agg(
        attempts=("training_id", "count"), failed=("ok", lambda s: int((~s).sum())),
        unfinished=("unfinished", "sum"), oom=("is_oom", "sum"), strategy=("strategy", "first"),
        gpu_model=("gpu_model", "first"),
    ).join(latest.groupby(keys, dropna=False).agg(
        trainings=("training_id", "count"), training_wall_s=("training_wall_s", "median"),
        samples_per_s=("samples_per_s", "median"), val_accuracy=("val_accuracy", "median"),
        train_loss=("train_loss", "median"), **{c: (c, "median") for c in SPREAD_COLUMNS}), how="left")
    out = per_pack.join(per_training, how="outer").reset_index()
    for col in ("packs", "attempts", "failed", "unfinished", "oom", "trainings"):
        out[col] = out[col].fillna(0).astype(int)
    out["device_s_per_training"] = out["wall_s"] * out["devices"].astype(float)
    return out.sort_values(keys).reset_index(drop=True)


def training_walls(trainings: pd.DataFrame) -> dict[tuple[Hashable, ...], float]:
    """Packing: one training's own wall (its record), median per (group, mode, N) of the latest completed records."""
    if trainings.empty:
        return {}
    t = trainings[(trainings["status"] == COMPLETED)
                  & ((trainings["attempt"] == 0) if "attempt" in trainings else True)]
    walls = numeric(t, "wall_s").groupby([t[c] for c in KEY + ["mode", "factor"]]).median()
    return {tuple(k): float(v) for k, v in walls.items() if v == v}


def compare(packing: pd.DataFrame, spread: pd.DataFrame, packing_times: Mapping[tuple[Hashable, ...], Sequence[float]],
            weights: Mapping[str, float], walls: Mapping[tuple[Hashable, ...], float] | None = None) -> pd.DataFrame:
    """Every layout of one (workload, partition, GPU type) in one table, packing (mode, N) and spread (label, k):
    devices and device-seconds per training, and the best (the fewest device-seconds, where both answers have a
    usable layout). ``packing_times``: per-pack times, for the noise check; ``walls``: :func:`training_walls`."""
    rows = ([_packing_row(r, packing_times, walls or {}) for _, r in packing.iterrows()] if not packing.empty else [])
    rows += [_spread_row(r) for _, r in spread.iterrows()] if not spread.empty else []
    if not rows:
        return pd.DataFrame()
    out = pd.DataFrame(rows)
    out["rgu"] = pd.to_numeric(pd.Series([weights.get(m) if isinstance(m, str) else None for m in out["gpu_model"]],
                                         index=out.index), errors="coerce")
    out["rgu_hours_per_1000"] = out["device_s_per_training"] / 3600.0 * out["rgu"] * 1000
    out["trainings_per_device_hour"] = 3600.0 / out["device_s_per_training"]
    out["best"] = False
    for _, idx in out.groupby(KEY, dropna=False).groups.items():
        group = out.loc[idx]
        usable = group[group["usable"].astype(bool) & group["device_s_per_training"].notna()]
        if not usable.empty and usable["answer"].nunique() == 2:  # a verdict needs both answers measured
            out.loc[usable["device_s_per_training"].idxmin(), "best"] = True
    return out.sort_values(KEY + ["devices_per_training"]).reset_index(drop=True)


def _packing_row(r: pd.Series, packing_times: Mapping[tuple[Hashable, ...], Sequence[float]],
                 walls: Mapping[tuple[Hashable, ...], float]) -> dict[str, object]:
    n = int(r["factor"])
    key = (*[r[k] for k in KEY], r["mode"], n)
    packs = r.get("packs")
    return {**{k: r[k] for k in KEY}, "answer": "packing", "layout": f"{r['mode']} N={n}",
            "mode": r["mode"], "factor": n, "devices": 1, "devices_per_training": 1.0 / n,
            "time_per_training_s": r["time_per_training_s"], "wall_s": walls.get(key, math.nan),
            "job_wall_s": r["time_per_training_s"] * n, "device_s_per_training": r["time_per_training_s"],
            "samples_per_s": r.get("samples_per_s"), "packs": int(packs) if pd.notna(packs) else 0,
            "usable": not (r.get("oom", 0) or r.get("unfinished", 0)) and pd.notna(packs),
            "gpu_model": r.get("gpu_model"), "times": list(packing_times.get(key, []))}


def _spread_row(r: pd.Series) -> dict[str, object]:
    k = int(r["devices"])
    job_walls = [w for w in (r["walls"] if isinstance(r.get("walls"), list) else []) if w == w]
    return {**{c: r[c] for c in KEY}, "answer": "spread", "layout": f"{r['mode']} k={k}", "mode": r["mode"],
            "factor": 1, "devices": k, "devices_per_training": float(k),
            "time_per_training_s": r["wall_s"], "wall_s": r["training_wall_s"],
            "job_wall_s": r["wall_s"], "device_s_per_training": r["device_s_per_training"],
            "samples_per_s": r.get("samples_per_s"), "packs": int(r.get("packs") or 0),
            "usable": not (r.get("unfinished", 0) or r.get("oom", 0)) and r.get("packs", 0) > 0,
            "gpu_model": r.get("gpu_model"),
            "allreduce_bytes_per_step": r.get("allreduce_bytes_per_step"),
            "allreduce_s_per_step": r.get("allreduce_s_per_step"), "times": [w * k for w in job_walls]}


def _name(r: pd.Series) -> str:
    if r["answer"] == "spread":
        return f"one training on {r['devices']} device{'s' if r['devices'] > 1 else ''} ({r['layout']})"
    return f"{r['factor']} training{'s' if r['factor'] > 1 else ''} on one device ({r['layout']})"


def _s(seconds: object) -> str:
    return f"{seconds:.3g} s" if isinstance(seconds, (int, float)) and seconds == seconds else "an unknown time"


def _noise(a: Sequence[float], b: Sequence[float]) -> str:
    """Whether b's device time differs from a's beyond noise (the bootstrap interval of the gain)."""
    if len(a) < 2 or len(b) < 2:
        return ", a single pack: not told from noise"
    g = gain(a, b)
    return ", within noise" if g.low is not None and g.high is not None and g.low <= 0 <= g.high else ""


def _wider(group: pd.DataFrame, best: pd.Series, other: pd.Series) -> str:
    """Where the spread answer beside the best is one device (k=1: nothing to sync), the best over more than one."""
    if other["answer"] != "spread" or other["devices"] > 1:
        return ""
    wide = group[(group["answer"] == "spread") & (group["devices"] > 1) & group["usable"].astype(bool)]
    if wide.empty:
        return ""
    w = wide.loc[wide["device_s_per_training"].idxmin()]
    ratio = w["device_s_per_training"] / best["device_s_per_training"]
    return (f" Over more than one device the best is {w['layout']}: {ratio:.2f}x the best's device time "
            f"({w['device_s_per_training']:.3g} device-s), one training taking {_s(w['wall_s'])}.")


def verdicts(table: pd.DataFrame) -> list[str]:
    """Per workload and GPU type: which layout uses a device-hour best, and the best of the other answer beside it."""
    lines: list[str] = []
    if table.empty:
        return lines
    for key, idx in table.groupby(KEY, dropna=False).groups.items():
        group = table.loc[idx]
        best = group[group["best"]]
        where = f"{key[0]} on {key[1]} ({key[2]})"
        if best.empty:
            missing = {"packing", "spread"} - set(group.loc[group["usable"].astype(bool), "answer"])
            lines.append(f"{where}: no verdict yet: nothing usable measured for {' or '.join(sorted(missing))}")
            continue
        b = best.iloc[0]
        other = group[(group["answer"] != b["answer"]) & group["usable"].astype(bool)]
        o = other.loc[other["device_s_per_training"].idxmin()]
        ratio = o["device_s_per_training"] / b["device_s_per_training"]
        cost = (f", {b['rgu_hours_per_1000']:.3g} RGU-hours per 1000 trainings" if b["rgu"] == b["rgu"] else "")
        lines.append(f"{where}: a device-hour goes furthest with {_name(b)}: {b['device_s_per_training']:.3g} "
                     f"device-s per training ({b['trainings_per_device_hour']:.0f} trainings per device-hour{cost}). "
                     f"The best {o['answer']}, {_name(o)}, spends {ratio:.2f}x that "
                     f"({o['device_s_per_training']:.3g} device-s"
                     f"{_noise(b['times'], o['times'])}); one training takes {_s(o['wall_s'])} there, "
                     f"{_s(b['wall_s'])} with the best." + _wider(group, b, o))
    return lines
