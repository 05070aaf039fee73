"""RGU cost: what a training and a whole sweep cost on each partition at its best packing factor. Pure.

A pack holds one GPU for its wall time, so one training costs (pack wall / N) x what the pack is billed per hour
(:func:`gpupack.core.cost.billing.bill`).
"""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Mapping

from gpupack.core.cost.billing import GPU_ONLY, Bundle, bill
from gpupack.errors import ConfigError

if TYPE_CHECKING:  # the tables only: a job reads a device's model here, and imports no pandas for it
    import pandas as pd

# NVML device names → the RGU table's model names (e.g. "Tesla V100-SXM2-16GB" → V100-16gb).
_NAME_RULES = [
    (re.compile(r"H100.*?(\d)g\.(\d+)gb", re.I), lambda m: f"H100-{m[1]}g.{m[2]}gb"),
    (re.compile(r"A100.*?(\d)g\.(\d+)gb", re.I), lambda m: f"A100-{m[1]}g.{m[2]}gb"),
    # Any other MIG slice (an unreadable profile, a GPU without slice rules): unknown, never its whole GPU's weight.
    (re.compile(r"\bMIG\b"), lambda m: None),
    (re.compile(r"H100", re.I), lambda m: "H100-80gb"),
    (re.compile(r"A100.*80\s*GB", re.I), lambda m: "A100-80gb"),
    (re.compile(r"A100", re.I), lambda m: "A100-40gb"),
    (re.compile(r"V100.*32\s*GB", re.I), lambda m: "V100-32gb"),
    (re.compile(r"V100", re.I), lambda m: "V100-16gb"),
    (re.compile(r"P100.*16\s*GB", re.I), lambda m: "P100-16gb"),
    (re.compile(r"P100", re.I), lambda m: "P100-12gb"),
    (re.compile(r"\bT4\b", re.I), lambda m: "T4-16gb"),
]


def model_from_device_name(name: str | None) -> str | None:
    """The RGU model name of an NVML device name; None when it is not a GPU the table knows."""
    if not name:
        return None
    # the first rule that matches decides, even one that names no model (an unknown MIG slice)
    return next((model(m) for pattern, model in _NAME_RULES if (m := pattern.search(name))), None)


def check_weights(models: Mapping[str, Any], key: str = "rgu.models") -> dict[str, float]:
    """The RGU table's weights, each a finite number > 0 (else the dearest GPU could be 'cheapest'): ConfigError."""
    out: dict[str, float] = {}
    for name, weight in models.items():
        ok = isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight) and weight > 0
        if not ok:
            shown = int(weight) if isinstance(weight, float) and weight.is_integer() else weight
            raise ConfigError(f"{key}.{name}", shown, "an RGU weight must be a number > 0 (what one GPU-hour of the "
                              "model costs)", f"e.g. {key}.{name}=2.2, as in conf/rgu/alliance.yaml")
        out[str(name)] = float(weight)
    return out


def billed_packs(packs: pd.DataFrame) -> pd.DataFrame:
    """Per (partition, mode, N): the term that bills its packs and how many times the GPU's RGU (none: a local run)."""
    import pandas as pd
    rows = []
    for _, p in packs.iterrows() if "billing" in packs else ():
        asked = p["billing"]
        if not isinstance(asked, Mapping):
            continue
        charged = bill(Bundle(1.0, asked.get("bundle_cores"), asked.get("bundle_mem_gb")), asked.get("cpus"),
                       asked.get("mem_gb"), float(asked.get("gpus") or 1))
        rows.append({"partition": p["partition"], "mode": p["mode"], "factor": p["factor"], "billed_term": charged.term,
                     "billed_multiple": charged.multiple})
    if not rows:
        return pd.DataFrame(columns=["partition", "mode", "factor", "billed_term", "billed_multiple"])
    frame = pd.DataFrame(rows)
    return frame.groupby(["partition", "mode", "factor"], as_index=False).agg(
        billed_term=("billed_term", "first"), billed_multiple=("billed_multiple", "max"))


def cost_table(best: pd.DataFrame, weights: Mapping[str, float], sweep_trainings: int,
               billed: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per partition at its best mode and N: RGU-hours billed per training (by ``billed``, else the GPU's RGU) and at
    the bundle, and a sweep of ``sweep_trainings``'s wall time and cost, fastest and cheapest marked."""
    import pandas as pd
    if best.empty:
        return pd.DataFrame()
    out = best[["workload", "partition", "gpu_type", "gpu_model", "mode", "factor", "time_per_training_s"]].copy()
    out["rgu"] = [weights.get(m) if isinstance(m, str) else None for m in out["gpu_model"]]
    out["rgu"] = pd.to_numeric(out["rgu"], errors="coerce")
    if billed is not None and not billed.empty:
        out = out.merge(billed, on=["partition", "mode", "factor"], how="left")
    else:
        out["billed_term"], out["billed_multiple"] = None, float("nan")
    out["billed_term"] = out["billed_term"].where(out["billed_term"].notna(), GPU_ONLY)
    out["billed_multiple"] = pd.to_numeric(out["billed_multiple"], errors="coerce").fillna(1.0)
    out["rgu_hours_at_bundle"] = out["time_per_training_s"] / 3600.0 * out["rgu"]
    out["rgu_hours_per_training"] = out["rgu_hours_at_bundle"] * out["billed_multiple"]
    out["sweep_trainings"] = sweep_trainings
    out["sweep_hours"] = sweep_trainings * out["time_per_training_s"] / 3600.0
    out["sweep_rgu_hours"] = sweep_trainings * out["rgu_hours_per_training"]
    out["fastest"] = out.index.isin(out.groupby("workload")["sweep_hours"].idxmin())
    priced = out.dropna(subset=["sweep_rgu_hours"])  # a workload with no RGU weight known has no cheapest
    out["cheapest"] = out.index.isin(priced.groupby("workload")["sweep_rgu_hours"].idxmin())
    return out.reset_index(drop=True)
