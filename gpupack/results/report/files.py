"""The files a run's collect writes: summary.csv (every column of the table), summary.json, trainings.parquet, and
(with plots) the PNG plots and report.html (:mod:`gpupack.results.report.html`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, TypedDict

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from gpupack.core.store.records import SCHEMA_VERSION, atomic_file, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.results.analysis.aggregate import Collected
from gpupack.results.analysis.load import Records
from gpupack.results.report.html import write_report
from gpupack.results.report.text import RunConfig, best_line, disturbance_lines, no_answer_line


class RankedBy(TypedDict):
    """What the best hyperparameters were ranked by (:class:`gpupack.results.analysis.tables.Ranking`)."""

    metric: str | None
    goal: str | None
    note: str
    caution: str
    origin: str


class Summary(TypedDict):
    """summary.json: each table of the report as a list of rows (column → value, as JSON has it), and its lines."""

    schema: int
    runs: list[str]
    groups: list[dict[str, object]]
    best: list[dict[str, object]]
    best_overall: list[dict[str, object]]
    best_lines: list[str]
    no_answer_lines: list[str]  # the groups that name no best N, and why
    cost: list[dict[str, object]]
    sweep_trainings: int
    best_hyperparameters: list[dict[str, object]]
    ranked_by: RankedBy
    knobs: list[dict[str, object]]
    spread: list[dict[str, object]]
    layouts: list[dict[str, object]]
    verdicts: list[str]
    occupancy: list[dict[str, object]]
    drift: list[dict[str, object]]
    disturbance: list[dict[str, object]]
    disturbance_lines: list[str]
    warnings: list[str]
    pending_packs: list[str]


def _jsonable(df: pd.DataFrame) -> list[dict[str, object]]:
    if df.empty:
        return []
    rows: list[dict[str, object]] = json.loads(df.to_json(orient="records"))  # a JSON array of objects
    return rows


def _text_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Lists, dicts and errors as JSON text, as trainings.parquet has always held them."""
    table = table.copy(deep=False)  # the columns replaced below are new; the rest are shared (copy on write)
    for col in ("params", "knobs", "curve", "cpus"):
        if col in table and table[col].dtype == object:  # dicts and lists (a frame built by hand)
            table[col] = [json.dumps(v, default=str) if v is not None else None for v in table[col]]
    if "error" in table:
        error = table["error"]
        # text (a str column: every value that is not missing) quoted as JSON; anything else, no error
        text = error.notna() if error.dtype != object else error.map(lambda v: isinstance(v, str)).astype(bool)
        quoted = pd.Series(None, index=table.index, dtype=object)
        quoted[text] = error[text].astype(str).map(json.dumps)
        table["error"] = quoted
    objects = [col for col in table.columns if table[col].dtype == object]
    return table.astype({col: "string" for col in objects})


def write_trainings(records: Records, out: Path) -> Path | None:
    """trainings.parquet: every training record read, a row each (None: there is none). Arrow's writer lets go of
    the interpreter while it compresses: collect writes it while it aggregates (gpupack.sweep.flow.collect)."""
    if records.trainings.empty:
        return None
    path = out / "trainings.parquet"
    table = pa.Table.from_pandas(_text_columns(records.trainings), preserve_index=False)
    for name, column in records.detached_of(records.trainings).items():  # the curves and logs, from where they lie
        table = table.append_column(name, column)
    # Dictionaries for the text columns alone (a number column is mostly distinct: Arrow would try one and drop it),
    # and no statistics (one row group of a million rows: nothing to skip by them): 1.2 s instead of 1.6 s for a
    # million trainings here, the same size.
    texts = [f.name for f in table.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    with atomic_file(path, binary=True) as f:  # a full disk leaves the last whole file (or none), never half of one
        pq.write_table(table, f, use_dictionary=texts, write_statistics=False)
    return path


def write_outputs(c: Collected, out: Path, plots: bool = True, trainings: Path | None | bool = True,
                  configs: Mapping[str, RunConfig] | None = None) -> list[Path]:
    """summary.csv, summary.json, trainings.parquet (``trainings``: True to write it, else what
    :func:`write_trainings` wrote), and with ``plots`` the PNGs and report.html (``configs``: each run's config)."""
    run = RunDir(out)
    with atomic_file(run.summary_csv) as f:  # each file whole or not at all, as the records are
        c.summary.to_csv(f, index=False)
    summary: Summary = {
        "schema": SCHEMA_VERSION,
        "runs": sorted(str(r) for r in c.records.trainings.get("run_dir", pd.Series(dtype=str)).dropna().unique()),
        "groups": _jsonable(c.summary), "best": _jsonable(c.best), "best_overall": _jsonable(c.best_overall),
        "best_lines": [best_line(r) for _, r in c.best.iterrows()],
        "no_answer_lines": [no_answer_line(r) for _, r in c.withheld.iterrows()], "cost": _jsonable(c.cost),
        "sweep_trainings": c.sweep_trainings, "best_hyperparameters": _jsonable(c.hyper.table),
        "ranked_by": {"metric": c.hyper.metric, "goal": c.hyper.goal, "note": c.hyper.note,
                      "caution": c.hyper.caution, "origin": c.hyper.origin},
        "knobs": _jsonable(c.knobs),
        "spread": _jsonable(c.spread.drop(columns=["walls"], errors="ignore")),
        "layouts": _jsonable(c.layouts.drop(columns=["times"], errors="ignore")), "verdicts": c.verdicts,
        "occupancy": _jsonable(c.occupancy), "drift": _jsonable(c.drift),
        # the packs measured under load from outside the run, per group, and what the report says of them
        "disturbance": _jsonable(c.disturbance), "disturbance_lines": disturbance_lines(c.disturbance),
        "warnings": c.records.warnings, "pending_packs": c.records.pending,
    }
    write_json_atomic(run.summary_json, summary)
    written = [run.summary_csv, run.summary_json]
    parquet = write_trainings(c.records, out) if trainings is True else trainings or None
    written += [parquet] if isinstance(parquet, Path) else []
    if plots:
        written += write_report(c, out, configs)
    return written
