"""RGU cost: what a training and a whole sweep cost on each partition at its best packing factor. Pure.

A pack holds one GPU for its wall time, so one training costs (pack wall / N) x the GPU model's RGU weight.
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

import pandas as pd

from gpupack.errors import ConfigError

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
    for pattern, model in _NAME_RULES:
        m = pattern.search(name)
        if m:
            return model(m)
    return None


def check_weights(models: Mapping[str, Any], key: str = "rgu.models") -> dict[str, float]:
    """The RGU table's weights, each a finite number > 0: a zero or negative weight would make the dearest GPU the
    'cheapest'. ConfigError names the model."""
    out: dict[str, float] = {}
    for name, weight in models.items():
        ok = isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight) and weight > 0
        if not ok:
            shown = int(weight) if isinstance(weight, float) and weight.is_integer() else weight
            raise ConfigError(f"{key}.{name}", shown, "an RGU weight must be a number > 0 (what one GPU-hour of the "
                              "model costs)", f"e.g. {key}.{name}=2.2, as in conf/rgu/alliance.yaml")
        out[str(name)] = float(weight)
    return out


def cost_table(best: pd.DataFrame, weights: Mapping[str, float], sweep_trainings: int) -> pd.DataFrame:
    """Per partition (at its best mode and N): RGU-hours per training and for a sweep of
    ``sweep_trainings`` trainings on one GPU, the sweep's wall time, and which is fastest and cheapest."""
    if best.empty:
        return pd.DataFrame()
    out = best[["workload", "partition", "gpu_type", "gpu_model", "mode", "factor", "time_per_training_s"]].copy()
    out["rgu"] = [weights.get(m) if isinstance(m, str) else None for m in out["gpu_model"]]
    out["rgu"] = pd.to_numeric(out["rgu"], errors="coerce")
    out["rgu_hours_per_training"] = out["time_per_training_s"] / 3600.0 * out["rgu"]
    out["sweep_trainings"] = sweep_trainings
    out["sweep_hours"] = sweep_trainings * out["time_per_training_s"] / 3600.0
    out["sweep_rgu_hours"] = sweep_trainings * out["rgu_hours_per_training"]
    out["fastest"] = False
    out["cheapest"] = False
    for _, idx in out.groupby("workload").groups.items():
        group = out.loc[idx]
        out.loc[group["sweep_hours"].idxmin(), "fastest"] = True
        if group["sweep_rgu_hours"].notna().any():
            out.loc[group["sweep_rgu_hours"].idxmin(), "cheapest"] = True
    return out.reset_index(drop=True)
