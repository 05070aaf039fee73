"""The knob and hyperparameter tables: throughput per setting of the workload's knobs (and the loader's own bound
beside it), and grid points ranked by a metric the trainings reported. Knobs, hyperparameters and metrics are JSON
text in the frame (:data:`gpupack.results.analysis.frames.TEXT_COLUMNS`), parsed here in bulk (:func:`json_columns`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from gpupack.core.goal import KNOWN_GOALS, contradiction, goal_hint, suggested_goal
from gpupack.core.store.columnar import STRING
from gpupack.core.store.records import COMPLETED
from gpupack.results.analysis.frames import POOL
from gpupack.results.analysis.summary import (
    LOADER_BOUND_FRACTION,
    first_value,
    loader_alone_completed,
    only_columns,
    rows_where,
    without_loader_alone,
)

SEED_NAMES = ("seed",)  # hyperparameters that repeat a grid point rather than make a new one


def knob_table(trainings: pd.DataFrame) -> pd.DataFrame:
    """Throughput per knob setting and N, beside the loader-only bound; a row per mode where several ran."""
    if trainings.empty or "knobs" not in trainings:
        return pd.DataFrame()
    trainings = only_columns(trainings, ("workload", "partition", "mode", "factor", "status", "loader_alone", "knobs",
                                         "loader_setting", "samples_per_s"))
    t = without_loader_alone(trainings)
    keep = (t["status"] == COMPLETED) & _has_object(t["knobs"])
    if not keep.any():
        return pd.DataFrame()
    codes, distinct = pd.factorize(t["knobs"][keep])  # a few settings, a million trainings: each setting parsed once
    settings = json_columns(pd.Series(distinct))
    varying = [c for c in settings.columns if _nunique(settings[c]) > 1]
    alone = loader_alone_completed(trainings)
    if not varying and alone.empty:
        return pd.DataFrame()  # no knob varied and no loader bound: nothing the main table does not say
    t = rows_where(t, keep)
    knobs = settings.iloc[codes].set_axis(t.index)
    varying = varying or list(knobs.columns)
    frame = knobs[varying].astype(str).assign(
        workload=t["workload"], partition=t["partition"], mode=t.get("mode"), factor=t["factor"],
        loader_setting=t.get("loader_setting"), samples_per_s=pd.to_numeric(t["samples_per_s"], errors="coerce"))
    modes = ["mode"] if "mode" in t and t["mode"].nunique() > 1 else []
    keys = ["workload", "partition", *modes, *varying, "factor"]
    out = frame.groupby(keys, dropna=False).agg(samples_per_s=("samples_per_s", "median"),
                                               trainings=("samples_per_s", "count"),
                                               loader_setting=("loader_setting", first_value)).reset_index()
    bound = {}
    if not alone.empty and "loader_setting" in alone:
        rates = pd.to_numeric(alone["samples_per_s"], errors="coerce")
        bound = rates.groupby([alone["partition"], alone["loader_setting"]]).median().to_dict()
    out["loader_bound_samples_per_s"] = [bound.get((p, s), math.nan)
                                         for p, s in zip(out["partition"], out["loader_setting"])]
    out["loader_bound"] = out["samples_per_s"] >= LOADER_BOUND_FRACTION * out["loader_bound_samples_per_s"]
    return out.drop(columns=["loader_setting"])


def with_knob_bounds(knobs: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """The knob table with ``beyond_bound``: N trainings of one setting got through more samples per second (N x each
    one's) over the reference N's of the same setting than the summary's ``gain_bound`` allows (the main table's ``!``).
    A table of one mode is weighed by the summary's rows of any mode, the most they allow."""
    if knobs.empty:
        return knobs
    out = knobs.assign(beyond_bound=False)
    if summary.empty or not {"gain_bound", "gain_ref"} <= set(summary):
        return out
    group = ["workload", "partition", *(["mode"] if "mode" in out and "mode" in summary else [])]
    bounds: dict[tuple[object, ...], tuple[float, float]] = {}
    for *at, n, bound, ref in summary[[*group, "factor", "gain_bound", "gain_ref"]].itertuples(index=False, name=None):
        if bound == bound and ref == ref:
            key = (*at, int(n))
            bounds[key] = max(bounds.get(key, (bound, ref)), (float(bound), float(ref)))
    setting = [*group, *(c for c in out.columns if c not in (
        *group, "factor", "samples_per_s", "trainings", "loader_bound_samples_per_s", "loader_bound", "beyond_bound"))]
    rates = {(*k[:-1], int(k[-1])): v for k, v in zip(out[setting + ["factor"]].itertuples(index=False, name=None),
                                                      out["samples_per_s"])}
    beyond = []
    for row, n, rate in zip(out[setting].itertuples(index=False, name=None), out["factor"], out["samples_per_s"]):
        bound, ref = bounds.get((*row[:len(group)], int(n)), (math.nan, math.nan))
        ref_rate = rates.get((*row, int(ref))) if ref == ref else None
        beyond.append(bool(ref_rate and rate == rate and int(n) * rate / (ref * ref_rate) > bound))
    out["beyond_bound"] = beyond
    return out


def _has_object(values: pd.Series) -> pd.Series:
    """True where a value is a non-empty JSON object (text) or dict."""
    if values.dtype != object:
        return values.notna() & ~values.isin(["{}", "null"])
    return values.map(lambda v: bool(v) and (isinstance(v, dict) or (isinstance(v, str) and v not in ("{}", "null"))))


def json_columns(text: pd.Series) -> pd.DataFrame:
    """JSON objects (text, or dicts), one column per name, aligned with ``text``: parsed at once by Arrow, or where it
    cannot type them as Python would (mixed types, nested values, dates), each distinct text by Python's json."""
    if text.dtype == object:  # dicts (a frame built by hand): as the text the columnar files hold
        text = text.map(lambda v: v if isinstance(v, str) or v is None else json.dumps(v))
    try:
        return _arrow_json(text)
    except (pa.ArrowException, ValueError):
        codes, uniques = pd.factorize(text)
        distinct = pd.DataFrame([json.loads(t) for t in uniques])
        if (codes < 0).any():  # rows without an object: a row of None (object columns, so ints stay ints)
            distinct = pd.concat([distinct.astype(object), pd.DataFrame({c: [None] for c in distinct.columns})])
            codes = np.where(codes < 0, len(uniques), codes)
        return distinct.iloc[codes].set_axis(text.index)


def _arrow_json(text: pd.Series) -> pd.DataFrame:
    """One JSON object a line, all in one buffer (joined in Arrow, no Python str per row), read by Arrow."""
    texts = pa.array(text, type=STRING, from_pandas=True)
    texts = texts.combine_chunks(memory_pool=POOL) if isinstance(texts, pa.ChunkedArray) else texts
    lines = pc.binary_join_element_wise(pc.fill_null(texts, "{}"), pa.scalar("", STRING), pa.scalar("\n", STRING))
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset:lines.offset + len(lines) + 1]
    table = pa_json.read_json(pa.BufferReader(lines.buffers()[2].slice(offsets[0], offsets[-1] - offsets[0])))
    if table.num_rows != len(text) or not all(pa.types.is_primitive(f.type) or pa.types.is_string(f.type)
                                              for f in table.schema) or any(pa.types.is_temporal(f.type)
                                                                            for f in table.schema):
        raise ValueError("not one flat object a line of numbers, text and booleans")
    return table.to_pandas(memory_pool=POOL).set_axis(text.index)


HOW_TO_REPORT = ("report one from your program (gpupack.result / $GPUPACK_RESULT, sweep.fixed.metrics regexes over a "
                 "script's stdout, or a Hydra task's return value) and name it with collect.metric=NAME")


@dataclass(frozen=True)
class Ranking:
    """Grid points ranked by one metric (``table``), or why none are (``note``)."""

    table: pd.DataFrame
    metric: str | None = None
    goal: str | None = None
    note: str = ""
    column: str | None = None  # the table's column of the metric (its name, unless a hyperparameter has it too)
    caution: str = ""  # the goal goes against the metric's name (core.goal.contradiction): said, not overruled
    origin: str = ""  # where the metric or goal came from, where not from this collect's flags (analysis.aggregate)


def _metric_and_goal(values: pd.DataFrame, metric: str | None, goal: str | None) -> tuple[str, str] | Ranking:
    """The metric to rank by and which way is better, or the ranking whose note says why none."""
    reported = [c for c in values.columns if values[c].notna().any()]
    metric = metric or ("val_accuracy" if "val_accuracy" in reported else reported[0] if len(reported) == 1 else None)
    if metric is None or metric not in reported:
        return Ranking(pd.DataFrame(), note=no_metric(metric, reported))
    goal = goal or KNOWN_GOALS.get(metric)
    if goal is None:
        return Ranking(pd.DataFrame(), metric, note=(
            f"not ranked: which way is better for {metric!r} is not known. HINT: {goal_hint(metric)}; "
            f"python -m gpupack collect RUN_DIR --metric {metric} --goal {suggested_goal(metric) or 'max|min'}"))
    return metric, goal


def best_hyperparameters(trainings: pd.DataFrame, top: int = 5, metric: str | None = None,
                         goal: str | None = None) -> Ranking:
    """Grid points ranked by ``metric`` towards ``goal`` (:func:`_metric_and_goal`), averaged over every completed run
    of them. Nothing is ranked where there is no grid (one grid point, or only the seed varies: that would pass noise
    off as a choice), no metric, or no known goal: ``note`` says which and how to fix it. Pure."""
    if trainings.empty:
        return Ranking(pd.DataFrame())
    t = without_loader_alone(only_columns(trainings, ("workload", "training_id", "status", "loader_alone",
                                                      "val_accuracy", "train_loss", "metrics", "params")))
    ok = (t["status"] == COMPLETED).to_numpy()  # kept as a mask: a filter would copy a million texts
    if not ok.any():
        return Ranking(pd.DataFrame())
    values = metric_values(t, metric)[ok]
    chosen = _metric_and_goal(values, metric, goal)
    if isinstance(chosen, Ranking):
        return chosen
    metric, goal = chosen
    score = values[metric]
    keep = ok.copy()
    keep[ok] = score.notna().to_numpy()
    params = hyperparameters(json_columns(t["params"][keep]))
    keys = sorted(k for k in params.columns if k not in SEED_NAMES and _nunique(params[k]) > 1)
    if not keys:
        return Ranking(pd.DataFrame(), metric, goal, "nothing to rank (one grid point, or only the seed varies)")
    frame = pd.DataFrame({k: _groupable(params[k]) for k in keys}).assign(
        workload=t["workload"].to_numpy()[keep], score=score.dropna().to_numpy(),
        training=pd.factorize(t["training_id"])[0][keep])  # distinct ids counted as numbers: a third of the time
    ranked = frame.groupby(["workload"] + keys, dropna=False).agg(
        score=("score", "mean"), runs=("score", "count"), trainings=("training", "nunique"))
    best = ranked.sort_values("score", ascending=goal == "min").head(top).reset_index()
    for k in keys:  # as text, the way the value reads (0.1, 128, adam)
        best[k] = [value_text(v.item() if isinstance(v, np.generic) else v) for v in best[k]]
    column = metric if metric not in keys else f"{metric} (metric)"
    return Ranking(best.rename(columns={"score": column}), metric, goal, column=column,
                   caution=contradiction(metric, goal) or "")


def value_text(value: object) -> str:
    """A hyperparameter's value as a person reads it: a float to 4 significant digits (a sampled lr, not its 16), a
    whole one as an integer (60000, not 6e+04 or 60000.0), anything else as it prints. Pure."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else format(value, ".4g")
    return str(value)


def no_metric(asked: str | None, reported: list[str]) -> str:
    """Why nothing is ranked for want of a metric: the one asked for is not reported, or none is known. Pure."""
    if asked is not None:
        return (f"not ranked: collect.metric={asked!r} is no metric the trainings reported "
                f"({', '.join(reported) if reported else 'they reported none'}). HINT: "
                + (f"collect.metric={reported[0]}" if reported else HOW_TO_REPORT))
    if reported:
        return (f"not ranked: no metric chosen, and the trainings report several ({', '.join(reported)}). "
                f"HINT: collect.metric=NAME collect.goal=min|max")
    return f"not ranked: the trainings reported no metric. HINT: {HOW_TO_REPORT}"


FLAT_METRICS = ("val_accuracy", "train_loss")  # metrics records also carry as columns of their own


def metric_values(t: pd.DataFrame, wanted: str | None = None, every: bool = False) -> pd.DataFrame:
    """Every numeric metric the trainings reported, a column each, aligned with ``t``. Where ``wanted`` (default
    val_accuracy) has a flat column of its own, that column alone unless ``every`` (a million parsed take a second)."""
    flat = wanted or "val_accuracy"
    if not every and flat in FLAT_METRICS and flat in t and \
            (values := pd.to_numeric(t[flat], errors="coerce")).notna().any():
        return pd.DataFrame({flat: values}, index=t.index)
    has = _has_object(t["metrics"]) if "metrics" in t else pd.Series(False, index=t.index)
    parsed = (json_columns(t["metrics"].where(has, "{}")).set_axis(t.index) if has.any()
              else pd.DataFrame(index=t.index))
    for col in FLAT_METRICS:  # the flat columns of older records
        if col in t and col not in parsed:
            parsed[col] = t[col]
    numeric = {c: pd.to_numeric(parsed[c], errors="coerce") for c in parsed.columns}
    return pd.DataFrame({c: v for c, v in numeric.items() if v.notna().any()}, index=t.index)


def reported_metrics(trainings: pd.DataFrame) -> list[str]:
    """The numeric metrics any completed training reported: what ``--metric`` may name. Pure."""
    if trainings.empty or "status" not in trainings:
        return []
    t = without_loader_alone(only_columns(trainings, ("status", "loader_alone", "metrics", *FLAT_METRICS)))
    values = metric_values(rows_where(t, t["status"] == COMPLETED), every=True)
    return sorted(values.columns)


def hyperparameters(params: pd.DataFrame) -> pd.DataFrame:
    """The hyperparameters in a frame of training params: as they are, but a Hydra job's are its overrides (``lr=0.1``
    → column lr, value 0.1 as text), not its job number or folders. Pure."""
    if "overrides" not in params or not {"job_num", "launch_dir"} <= set(params.columns):
        return params
    overrides = [items if isinstance(items, (list, np.ndarray)) else [] for items in params["overrides"]]
    # each key=value (Hydra's override grammar: +key=, ++key=, ~key) as key → value text
    rows = [{key.lstrip("+~"): value for key, _, value in (str(o).partition("=") for o in items)}
            for items in overrides]
    return pd.DataFrame(rows, index=params.index)


def _groupable(col: pd.Series) -> pd.Series:
    """Values to group by: lists and dicts (unhashable) as their text."""
    return col.astype(str) if col.dtype == object and col.map(lambda v: isinstance(v, (list, dict, np.ndarray))).any() \
        else col


def _nunique(col: pd.Series) -> int:
    try:
        return int(col.nunique(dropna=False))
    except TypeError:  # unhashable values (lists): compare their text
        return int(col.astype(str).nunique(dropna=False))
