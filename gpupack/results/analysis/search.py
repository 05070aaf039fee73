"""A search's trials (``search=optuna``): the study's journal and the trials' training records → the trials ranked
(:func:`trials_frame`) and the study's history (:func:`history`). Pure.

A trial's device-seconds are its records' walls, every attempt's, as the study counts them against
``search.device_hours``; where a trial has no record (it died with its lane), the journal's own figure."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from gpupack.search.study import COMPLETE, FAILED, PRUNED, RUNNING, Journal, trial_number

WAITING = "waiting"  # a trial's state here while it is planned for a lane whose job has not started it
TRIAL_COLUMNS = ["rank", "number", "value", "state", "params", "wall_s", "device_s", "why", "lane"]


@dataclass(frozen=True)
class SearchReport:
    """One run's search: what it optimised, its budget, its trials ranked and its history."""

    run: str
    metric: str
    direction: str  # maximize | minimize
    n_trials: int  # the budget: finished trials
    trials: pd.DataFrame  # TRIAL_COLUMNS, best first (trials_frame)
    history: pd.DataFrame  # number, state, value, best_so_far, device_hours, by trial number (history)

    def best(self) -> pd.Series | None:
        """The best completed trial's row (None: none completed yet)."""
        done = self.trials[self.trials["state"] == COMPLETE]
        return done.iloc[0] if not done.empty and pd.notna(done["value"].iloc[0]) else None

    def counts(self) -> dict[str, int]:
        """Trials by state, every state named."""
        said = self.trials["state"].value_counts() if not self.trials.empty else pd.Series(dtype=int)
        return {state: int(said.get(state, 0)) for state in (COMPLETE, PRUNED, FAILED, RUNNING, WAITING)}

    @property
    def device_hours(self) -> float:
        return float(self.trials["device_s"].fillna(0.0).sum()) / 3600 if not self.trials.empty else 0.0


def trial_walls(trainings: pd.DataFrame) -> pd.DataFrame:
    """A row per trial with records, by number: its latest wall and its attempts' summed. Pure."""
    if trainings.empty or not {"training_id", "wall_s"} <= set(trainings.columns):
        return pd.DataFrame({"wall_s": pd.Series(dtype=float), "device_s": pd.Series(dtype=float)},
                            index=pd.Index([], name="number", dtype=int))
    numbers = trainings["training_id"].map(lambda tid: trial_number(str(tid)))
    rows = trainings.assign(number=numbers, wall_s=pd.to_numeric(trainings["wall_s"], errors="coerce"))
    rows = rows[rows["number"].notna()].astype({"number": int})
    attempt = rows["attempt"] if "attempt" in rows else pd.Series(0, index=rows.index)
    latest = rows[attempt == 0].groupby("number")["wall_s"].last()
    spent = rows.groupby("number")["wall_s"].sum(min_count=1)
    return pd.DataFrame({"wall_s": latest, "device_s": spent}).rename_axis("number")


def trials_frame(journal: Journal, walls: pd.DataFrame) -> pd.DataFrame:
    """The study's trials, best first, each with its rank, params, wall and device-seconds. Pure."""
    rows = []
    rank = 0
    for t in journal.ranked():
        ranked = t.state == COMPLETE and t.value is not None
        rank += ranked
        told = t.device_s if t.device_s > 0 else np.nan
        wall, spent = (walls[c].get(t.number, np.nan) for c in ("wall_s", "device_s"))  # trial_walls's columns
        rows.append({"rank": rank if ranked else pd.NA, "number": t.number, "value": t.value,
                     "state": WAITING if t.waiting else t.state,
                     "params": dict(t.params), "wall_s": wall if pd.notna(wall) else told,
                     "device_s": spent if pd.notna(spent) else told, "why": t.why, "lane": t.lane})
    frame = pd.DataFrame(rows, columns=TRIAL_COLUMNS)
    return frame.astype({"rank": "Int64", "number": int, "value": float, "wall_s": float, "device_s": float})


def history(trials: pd.DataFrame, direction: str) -> pd.DataFrame:
    """A row per trial in the order asked: its value, the best completed so far, device-hours. Pure."""
    t = trials.sort_values("number")  # trials_frame's columns, with no row where none was asked
    done = t["value"].where(t["state"] == COMPLETE)
    best = (done.cummax() if direction == "maximize" else done.cummin()).ffill()  # cummax leaves NaN where NaN was
    return pd.DataFrame({"number": t["number"].to_numpy(), "state": t["state"].to_numpy(),
                         "value": t["value"].to_numpy(), "best_so_far": best.to_numpy(),
                         "device_hours": (t["device_s"].fillna(0.0).cumsum() / 3600).to_numpy()})


def search_reports(studies: Mapping[str, Journal], trainings: pd.DataFrame) -> list[SearchReport]:
    """Each run's search (``studies``: run directory → its journal) with its trials. Pure."""
    out = []
    for run, journal in studies.items():
        mine = trainings[trainings["run_dir"] == run] if "run_dir" in trainings else trainings.iloc[:0]
        trials = trials_frame(journal, trial_walls(mine))
        s = journal.search
        out.append(SearchReport(run, s.metric, s.direction, s.n_trials, trials, history(trials, s.direction)))
    return out
