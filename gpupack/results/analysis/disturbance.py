"""Disturbance: which packs were measured under load from outside the job, per (workload, partition, GPU type, mode).

A pack is *disturbed* when other processes kept at least :func:`threshold` of its cores busy on average (its
sampler's ``sampler_foreign_*`` figures, :mod:`gpupack.job.runtime.foreign`), or another process used its GPU: its wall
is then not the quiet figure the choice of N compares. Pure pandas.
"""
from __future__ import annotations

import pandas as pd

from gpupack.results.analysis.summary import GROUP, numeric

# A core's background on a quiet Linux node (kernel threads, daemons, the readings' tick rounding) stays well under a
# tenth of a core; a quarter of a core, averaged over a whole pack, is one busy process for a quarter of the time, not
# noise. On a large job a quarter of a core is less than the noise of its own timings: there a tenth of its cores
# (a tenth of the CPU its trainings could have had) is the bar.
MIN_FOREIGN_CORES = 0.25
FOREIGN_SHARE_OF_CORES = 0.10

COLUMNS = [*GROUP, "packs", "disturbed", "pack_ids", "factors", "pack_s", "disturbed_s", "share",
           "foreign_cores_mean", "cores", "gpu_disturbed", "foreign_gpu_procs_max", "foreign_gpu_mem_mb_max"]


def threshold(cores: float) -> float:
    """The foreign load, in cores averaged over a pack, from which a job of ``cores`` cores is disturbed."""
    return max(MIN_FOREIGN_CORES, FOREIGN_SHARE_OF_CORES * cores)


def disturbed(packs: pd.DataFrame) -> pd.DataFrame:
    """Every pack record whose sampler measured the load from outside, each flagged ``disturbed``."""
    if packs.empty or "sampler_foreign_cpu_cores_mean" not in packs:
        return pd.DataFrame()
    foreign = numeric(packs, "sampler_foreign_cpu_cores_mean")
    gpu_procs = numeric(packs, "sampler_foreign_gpu_procs_max")
    measured = foreign.notna() | gpu_procs.notna()
    p = packs[measured].assign(  # a hand-made record may lack a GROUP column: its packs form a group of their own
        **{column: None for column in GROUP if column not in packs}, foreign_cores=foreign[measured],
        foreign_gpu_procs=gpu_procs[measured], foreign_gpu_mem_mb=numeric(packs, "sampler_foreign_gpu_mem_mb_max"))
    p["cores"] = numeric(p, "sampler_job_cores").fillna(numeric(p, "cores")).fillna(numeric(p, "sampler_host_cores"))
    p["cpu_disturbed"] = p["foreign_cores"] >= p["cores"].fillna(0).map(threshold)  # NaN (not measured): not disturbed
    p["gpu_disturbed"] = p["foreign_gpu_procs"].fillna(0) > 0
    p["disturbed"] = p["cpu_disturbed"] | p["gpu_disturbed"]
    p["wall_s"] = numeric(p, "wall_s").fillna(0.0)
    return p


def disturbance(packs: pd.DataFrame) -> pd.DataFrame:
    """One row per group whose packs measured the load from outside (:data:`COLUMNS`): pack records (every attempt),
    the disturbed ones, their ids and N, their share of the pack time, the foreign cores over them (weighted by wall),
    the job's cores, and what other processes did on the GPU."""
    p = disturbed(packs)
    if p.empty:
        return pd.DataFrame(columns=COLUMNS)
    rows = []
    for key, group in p.groupby(GROUP, dropna=False, sort=True):
        hit = group[group["disturbed"]]
        total, hit_s = float(group["wall_s"].sum()), float(hit["wall_s"].sum())
        weights = hit["wall_s"].where(hit["wall_s"] > 0, 1.0)
        cores = hit["foreign_cores"].notna()
        rows.append({
            **dict(zip(GROUP, key)), "packs": len(group), "disturbed": len(hit),
            "pack_ids": [str(x) for x in hit["pack_id"]], "factors": [int(x) for x in numeric(hit, "factor")],
            "pack_s": total, "disturbed_s": hit_s, "share": hit_s / total if total > 0 else None,
            "foreign_cores_mean": float((hit["foreign_cores"][cores] * weights[cores]).sum() / weights[cores].sum())
            if cores.any() else None,
            "cores": float(group["cores"].max()) if group["cores"].notna().any() else None,
            "gpu_disturbed": int(hit["gpu_disturbed"].sum()),
            "foreign_gpu_procs_max": int(group["foreign_gpu_procs"].max())
            if group["foreign_gpu_procs"].notna().any() else None,
            "foreign_gpu_mem_mb_max": float(group["foreign_gpu_mem_mb"].max())
            if group["foreign_gpu_mem_mb"].notna().any() else None,
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def with_disturbed(summary: pd.DataFrame, packs: pd.DataFrame) -> pd.DataFrame:
    """``summary`` with ``disturbed_packs``: how many of each (group, N)'s pack records were disturbed."""
    if summary.empty:
        return summary
    p = disturbed(packs)
    if p.empty:
        return summary.assign(disturbed_packs=0)
    keys = [*GROUP, "factor"]
    counts = p[p["disturbed"]].assign(factor=numeric(p, "factor")).groupby(keys, dropna=False).size()
    return summary.assign(disturbed_packs=[int(counts.get(tuple(k), 0)) for k in summary[keys].itertuples(index=False)])


def loaded_packs(packs: pd.DataFrame) -> frozenset[tuple[str, str]]:
    """The (run, pack id) of every disturbed pack: what the choice of N leaves out where it can."""
    p = disturbed(packs)
    if p.empty:
        return frozenset()
    hit = p[p["disturbed"]]
    runs = hit["run_dir"].astype(str) if "run_dir" in hit else pd.Series("", index=hit.index)
    return frozenset(zip(runs, hit["pack_id"].astype(str)))


def disturbed_rounds(packs: pd.DataFrame, run: str) -> dict[str, set[int]]:
    """Each partition's rounds of ``run`` that hold a disturbed pack: what packing.remeasure measures again."""
    p = disturbed(packs)
    if p.empty or "round" not in p:
        return {}
    hit = p[p["disturbed"] & (p["run_dir"].astype(str) == run if "run_dir" in p else True)]
    rounds = pd.to_numeric(hit["round"], errors="coerce").dropna()
    return {str(p): set(map(int, r)) for p, r in rounds.groupby(hit.loc[rounds.index, "partition"].astype(str))}
