"""How busy the slots were: whole packs (a pack waits for its slowest training) and streaming lanes (a freed slot
takes the next training) side by side, per (workload, partition, GPU type, mode, N). Pure pandas.

- ``slot_occupancy`` = Σ training wall / (N × job wall), over the jobs of a group: 1.0 is every slot busy from the
  job's start (its first training's: a preload is set-up) to its end.
- ``device_s_per_training`` = Σ job wall / trainings finished: a training's device time as the jobs ran.
"""
from __future__ import annotations

import pandas as pd

from gpupack.results.analysis.load import Records
from gpupack.results.analysis.summary import without_loader_alone

KEYS = ["workload", "partition", "gpu_type", "mode", "factor", "how"]
WHOLE, STREAMED = "whole packs", "streaming"


def how_of(packs: pd.DataFrame) -> pd.Series:
    stream = packs["stream"] if "stream" in packs else pd.Series(None, index=packs.index)
    return stream.notna().map({True: STREAMED, False: WHOLE})


def occupancy(packs: pd.DataFrame) -> pd.DataFrame:
    """One row per (workload, partition, GPU type, mode, N, whole packs | streaming): packs (or lanes), jobs,
    trainings finished, device-seconds per training, slot occupancy, mean idle gap between two trainings of a slot,
    and the span from the first job's start to the last one's end."""
    if packs.empty or "busy_s" not in packs:
        return pd.DataFrame()
    p = without_loader_alone(Records.latest_of(packs))  # the latest attempts that say how busy their slots were
    p = p[pd.to_numeric(p["busy_s"], errors="coerce").notna()].copy()
    if p.empty:
        return pd.DataFrame()
    p["how"] = how_of(p)
    for col in ("wall_s", "busy_s", "slots", "n_completed", "slot_gap_mean_s", "started_at", "ended_at", "factor"):
        p[col] = pd.to_numeric(p.get(col), errors="coerce")
    # a search's pruned trials are finished trainings too (ended early by its pruner, their slot taken at once)
    pruned = pd.to_numeric(p["n_pruned"], errors="coerce").fillna(0) if "n_pruned" in p else 0
    p["finished"] = p["n_completed"] + pruned
    p["slot_s"] = p["slots"].fillna(p["factor"]) * p["wall_s"]
    if "workload" not in p:
        p["workload"] = None
    # a job runs its lane of packs in turn (the run header's jobs): jobs are counted by job id, packs (or streaming
    # lanes) by record; a record with no job id (written by hand, an old one) counts as a job of its own
    p["job"] = p["job_id"].fillna(p["pack_id"]) if "job_id" in p else p["pack_id"]
    out = p.groupby(KEYS, dropna=False).agg(
        packs=("pack_id", "count"), jobs=("job", "nunique"), trainings=("finished", "sum"),
        device_s=("wall_s", "sum"),
        busy_s=("busy_s", "sum"), slot_s=("slot_s", "sum"), gap_mean_s=("slot_gap_mean_s", "mean"),
        started=("started_at", "min"), ended=("ended_at", "max")).reset_index()
    out["device_s_per_training"] = out["device_s"] / out["trainings"].where(out["trainings"] > 0)
    out["slot_occupancy"] = out["busy_s"] / out["slot_s"].where(out["slot_s"] > 0)
    out["span_s"] = out["ended"] - out["started"]
    return out.drop(columns=["started", "ended", "slot_s"]).sort_values(KEYS).reset_index(drop=True)


def with_lanes(summary: pd.DataFrame, occ: pd.DataFrame) -> pd.DataFrame:
    """The main table's rows with ``lanes`` and ``stream_s_per_training`` (the lanes' device-seconds per training)
    where no whole pack timed the row, so a streaming run's row leads with its time, not dashes."""
    out = summary.copy()
    out["lanes"], out["stream_s_per_training"] = 0, float("nan")
    if out.empty or occ.empty:
        return out
    streamed = occ[occ["how"] == STREAMED].set_index(KEYS[:-1])
    for i, r in out.iterrows():
        key = tuple(r[k] for k in KEYS[:-1])
        if key in streamed.index and not (pd.to_numeric(r.get("packs"), errors="coerce") > 0):
            row = streamed.loc[[key]].iloc[0]
            out.loc[i, ["lanes", "stream_s_per_training"]] = [int(row["packs"]), row["device_s_per_training"]]
    return out


def timeline(trainings: pd.DataFrame, packs: pd.DataFrame) -> pd.DataFrame:
    """A row per latest training that ran in a slot: its job, slot, start, end, and whether it streamed."""
    if trainings.empty or "slot" not in trainings:
        return pd.DataFrame()
    t = without_loader_alone(Records.latest_of(trainings))
    t = t[pd.to_numeric(t["slot"], errors="coerce").notna()]
    if t.empty:
        return pd.DataFrame()
    start = pd.to_numeric(t["started_at"], errors="coerce")
    origin = start.min()
    return pd.DataFrame({
        "group": t["partition"].astype(str) + " " + t["mode"].astype(str) + " N=" + t["factor"].astype(str),
        "job": t["pack_id"], "slot": pd.to_numeric(t["slot"]).astype(int),
        "how": how_of(t),
        "start_s": start - origin, "end_s": pd.to_numeric(t["ended_at"], errors="coerce") - origin,
        "status": t["status"]}).sort_values(["group", "how", "start_s"]).reset_index(drop=True)
