"""Did the machine drift over the run? The drift check (:func:`gpupack.core.plan.drift_check`) runs the first round's
reference pack again at the run's end; its time against the first one's is the drift, which the choice of N, paired
within rounds, cancels but the user should know of. Pure pandas on the packs frame."""
from __future__ import annotations

import pandas as pd

from gpupack.results.analysis.summary import numeric

STEADY = 0.10  # an end pack within 10 % of the first: one training's noise, not a machine that changed

COLUMNS = ["workload", "partition", "gpu_type", "pack_id", "first_s", "end_s", "change", "hours"]


def drift_checks(packs: pd.DataFrame) -> pd.DataFrame:
    """One row per drift check whose pack and first pack both ran whole, and that started once every other pack of
    its run had ended (one run beside them measures no drift): their walls, end / first - 1, and the hours between."""
    if packs.empty or "reference_of" not in packs:
        return pd.DataFrame(columns=COLUMNS)
    latest = packs[packs["attempt"] == 0] if "attempt" in packs else packs
    whole = latest[latest["complete"].astype(bool)]
    ends = whole[whole["reference_of"].notna()]  # a check a partition: the loop below is over a handful of rows
    rows = []
    for _, end in ends.iterrows():
        run = str(end.get("run_dir", ""))
        same_run = (whole["run_dir"].astype(str) == run) if "run_dir" in whole else True
        firsts = whole[same_run & (whole["pack_id"] == end["reference_of"])]
        if firsts.empty or not _after_the_rest(end, latest, run):
            continue
        first = firsts.iloc[0]
        first_s, end_s = float(first["wall_s"]), float(end["wall_s"])
        rows.append({"workload": end.get("workload"), "partition": end["partition"], "gpu_type": end["gpu_type"],
                     "pack_id": first["pack_id"], "first_s": first_s, "end_s": end_s,
                     "change": end_s / first_s - 1.0 if first_s > 0 else float("nan"),
                     "hours": (float(end["started_at"]) - float(first["started_at"])) / 3600.0})
    return pd.DataFrame(rows, columns=COLUMNS)


def _after_the_rest(end: pd.Series, latest: pd.DataFrame, run: str) -> bool:
    """Whether the drift check ``end`` started after every other pack of ``run`` ended."""
    mine = latest[latest["run_dir"].astype(str) == run] if "run_dir" in latest else latest
    mine = mine[mine["pack_id"] != end["pack_id"]]
    others = numeric(mine, "ended_at") if "ended_at" in mine else numeric(mine, "started_at") + numeric(mine, "wall_s")
    return bool(others.empty or float(end["started_at"]) >= float(others.max()) - 1e-6)
