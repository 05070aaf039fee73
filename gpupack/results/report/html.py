"""report.html, read top-down: what ran, the answer in the terminal's words (:mod:`gpupack.results.report.text`), the
best hyperparameters, then the evidence (tables that fit a 1,280 px window, the rest behind a disclosure; the plots;
the failures and every training's logs). Self-contained: plots embedded (base64), log links relative to the page.
:func:`build_report` and :func:`build_comparison` are pure; the ``write_*`` functions draw, find logs and write."""
from __future__ import annotations

import base64
import contextlib
import html
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd

from gpupack.core.store.journal import kept_log
from gpupack.core.store.records import PRUNED, SKIPPED_MEMORY, write_text_atomic
from gpupack.results.analysis.aggregate import Collected
from gpupack.results.analysis.search import SearchReport
from gpupack.results.analysis.summary import without_loader_alone
from gpupack.results.report import text
from gpupack.results.report.plots import (
    plot_cost,
    plot_layouts,
    plot_search_history,
    plot_split_vs_no_split,
    plot_throughput_curves,
    plot_time_per_training,
    plot_timeline,
)
from gpupack.results.report.terminal import COLUMNS, Cell, gain_legend

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
h3{font-size:1em}.answer{background:#e8f5e9;padding:.6em 1em;border-radius:6px}
.answer.none{background:#fff3e0}.answer p.best{font-weight:600}
table.t{border-collapse:collapse;font-size:.85em;max-width:100%}table.t td,table.t th{padding:3px 8px;
border-bottom:1px solid #ddd;text-align:left;overflow-wrap:anywhere}table.t th{background:#f3f3f3}
table.t .num{text-align:right}table.about th{text-align:left;padding-right:1.5em;
font-weight:600}table.about td{text-align:left}img{max-width:100%}figure{margin:1em 0}figcaption{font-size:.8em;
color:#666}.warn{color:#a15c00}.note{font-size:.85em;color:#555}details{margin:.6em 0}summary{cursor:pointer}"""


@dataclass(frozen=True)
class Plot:
    """One plot on the page: its caption (and alt text) and its image (a data: URI, or a path relative to the page)."""

    caption: str
    src: str


@dataclass
class Page:
    """What one run's page shows beside what collect computed: what ran, the plots, a row per training."""

    about: list[tuple[str, str]]
    figures: list[Plot] = field(default_factory=list)
    trainings: pd.DataFrame = field(default_factory=pd.DataFrame)
    title: str = "gpupack report"
    search_figures: list[Plot | None] = field(default_factory=list)  # each search's history plot, in c.searches' order


def _esc(value: object) -> str:
    return html.escape(str(value))


def _cell(value: object, spec: str | None) -> str:
    """A value as a person reads it: a flag as ✓/—, a number in its format, a missing one as -."""
    if isinstance(value, bool) or (spec is None and str(value) in ("True", "False")):
        return "✓" if value is True or str(value) == "True" else "—"
    if spec is not None:
        with contextlib.suppress(TypeError, ValueError):
            return text.fmt(value, spec)
    return text.fmt(value, "")  # as it prints


def table(df: pd.DataFrame, columns: Mapping[str, str], formats: Mapping[str, str] | None = None,
          cells: Mapping[str, Cell] | None = None, raw: Sequence[str] = ()) -> str:
    """An HTML table of ``df``: ``columns`` (column → header, those present, in order), each value formatted by
    ``formats`` or by ``cells`` (column → a function of the row), escaped unless its column is in ``raw``."""
    formats, cells = formats or {}, cells or {}
    shown = {col: label for col, label in columns.items() if col in df or col in cells}
    if df.empty or not shown:
        return "<p>(none)</p>"
    rows = [r for _, r in df.iterrows()]  # once: a row's Series costs more than its cells
    view = pd.DataFrame({label: [cells[col](r) if col in cells else _cell(r.get(col), formats.get(col))
                                 for r in rows] for col, label in shown.items()})
    escaped = [col not in raw for col in shown]
    numeric = [bool(view[label].map(lambda v: bool(NUMBER.match(str(v)))).all()) for label in view.columns]
    head = "".join(f"<th{' class=num' if num else ''}>{_esc(label)}</th>" for label, num in zip(view.columns, numeric))
    body = "".join("<tr>" + "".join(f"<td{' class=num' if num else ''}>{_esc(v) if esc else v}</td>"
                                    for v, num, esc in zip(row, numeric, escaped)) + "</tr>"
                   for row in view.itertuples(index=False))
    return f"<table class='t'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


NUMBER = re.compile(r"^[-+]?[\d.,]+(e[-+]?\d+)?( \[[\d.,-]+\]| \(\d+L\)|p|!|p!|/\d+)?$|^-$")


def _paragraphs(lines: Sequence[str], cls: str = "") -> str:
    attr = f" class='{cls}'" if cls else ""
    return "".join(f"<p{attr}>{_esc(line)}</p>" for line in lines)


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{_esc(summary)}</summary>{body}</details>" if body else ""


def _keys(df: pd.DataFrame) -> dict[str, str]:
    """The columns that tell rows apart: the run where several are compared, the workload where several ran."""
    return {key: key for key in ("run", "workload") if key in df and df[key].nunique() > 1}


def answer_lines(c: Collected) -> tuple[list[str], list[str], list[str]]:
    """The answer in the terminal's words: the best N per GPU type, how each was chosen, and what qualifies it."""
    best = [text.best_line(r) for _, r in c.best.iterrows()]
    best += [text.no_answer_line(r) for _, r in c.withheld.iterrows()]
    how = [line for _, r in pd.concat([c.best, c.withheld]).iterrows() for line in text.choice_lines(r)]
    more = text.mode_lines(c) + (text.cost_lines(c) if not c.cost.empty else []) + c.auto_lines + c.again_lines \
        + text.drift_lines(c)
    return best, how, more


def answer_section(c: Collected) -> str:
    best, how, more = answer_lines(c)
    body = (_paragraphs(best, "best") if best else
            "<p>No packing factor finished without failures yet: no best N.</p>")
    if c.withheld.empty:
        body += _paragraphs(more) + _details("How the best N was chosen", _paragraphs(how))
    else:  # what to do is the answer here, not a detail
        body += _paragraphs(how) + _paragraphs(more)
    warn = _paragraphs(text.disturbance_lines(c.disturbance), "warn")
    kind = "answer" if c.withheld.empty else "answer none"  # not green where an N is withheld
    return f"<section id='answer'><h2>The answer</h2><div class='{kind}'>{body}</div>{warn}</section>"


def hyper_section(c: Collected) -> str:
    ranking = c.hyper
    title = f"<h2>{_esc(text.hyper_title(ranking))}</h2>"
    if ranking.table.empty:
        body = f"<p>{_esc(ranking.note or 'Nothing to rank.')}</p>"
    else:
        t = ranking.table
        metric = ranking.column or ranking.metric or ""
        params = [k for k in t.columns if k not in ("workload", metric, "runs", "trainings")]
        columns = {**_keys(t), **{k: k for k in params}, metric: str(ranking.metric), "runs": "runs"}
        body = table(t, columns, {metric: ".4g", "runs": ".0f"})
    notes = _paragraphs(text.hyper_notes(ranking), "note")
    return f"<section id='best-hyperparameters'>{title}{body}{notes}</section>"


SEARCH_TOP = 20  # the ranked trials shown; the rest behind a disclosure


def _search_table(s: SearchReport, rows: pd.DataFrame) -> str:
    columns = {"number": "trial", "value": s.metric, "state": "state", "params": "params", "wall_s": "wall s"}
    return table(rows, columns, {"number": ".0f", "value": ".4g", "wall_s": ".2f"},
                 cells={"params": lambda r: text.param_text(r["params"])})


def search_section(c: Collected, figures: Sequence[Plot | None] = ()) -> str:
    """Each search's best trial, its trials ranked and its history plot; empty without a study."""
    parts = []
    for i, s in enumerate(c.searches):
        head = f"<h3>{_esc(s.run)}</h3>" if len(c.searches) > 1 else ""
        best = (f"<div class='answer'>{_paragraphs([text.search_best_line(s)], 'best')}"
                f"{_paragraphs([text.search_counts_line(s)])}</div>")
        ranked = (f"<h3>Trials ranked by {_esc(s.metric)} ({_esc(s.direction)})</h3>"
                  + _search_table(s, s.trials.head(SEARCH_TOP)))
        if len(s.trials) > SEARCH_TOP:
            ranked += _details(f"The other {len(s.trials) - SEARCH_TOP} trials",
                               _search_table(s, s.trials.iloc[SEARCH_TOP:]))
        figure = figures[i] if i < len(figures) else None
        parts.append(head + best + ranked + (_figure(figure) if figure is not None else ""))
    return (f"<section id='search'><h2>Search: best trial</h2>{''.join(parts)}</section>" if parts else "")


def main_table(summary: pd.DataFrame) -> str:
    """The main table: the columns that decide (the terminal's, N plain and its verdict in words)."""
    cells: dict[str, Cell] = {header: cell for header, cell, where in COLUMNS if where == "both"}
    cells.update(N=lambda r: str(int(r["factor"])),
                 verdict=lambda r: "chosen" if r.get("chosen") else "within noise" if r.get("within_noise") else "")
    columns = {header: header for header in cells} | {"s/training": "s/training (median [95% interval])"}
    return table(summary, {**_keys(summary), **columns}, cells=cells)


# The rest of the summary's columns, a narrow table each, behind a disclosure (every one is in summary.csv)
MORE_COLUMNS: list[tuple[str, dict[str, str]]] = [
    ("Timing", {"tpt_min_s": "min s", "tpt_max_s": "max s", "startup_s": "start-up s", "loop_s": "loop s",
                "trainings_per_hour": "trainings/h", "gain_ref": "gain over N=", "paired": "paired in rounds",
                "beyond_bound": "gain beyond N/ref"}),
    ("Throughput", {"samples_per_s": "samples/s/training", "pack_samples_per_s": "samples/s/pack",
                    "loader_bound_samples_per_s": "loader-only samples/s", "loader_bound": "loader-bound"}),
    ("Resources and failures", {"gpu_util_mean": "GPU util %", "cpu_percent_mean": "CPU %",
                                "gpu_mem_peak_mb": "GPU mem peak MB", "peak_rss_mb": "RSS peak MB",
                                "disturbed_packs": "packs under foreign load", "attempts": "attempts",
                                "failed": "failed", "oom": "OOM", "oom_cleared": "OOM cleared"}),
]
MORE_FORMATS = {col: ".2f" if col in ("tpt_min_s", "tpt_max_s", "startup_s", "loop_s") else ".0f"
                for _, cols in MORE_COLUMNS for col in cols if col not in ("paired", "beyond_bound", "loader_bound")}


COST_COLUMNS = {"partition": "partition", "gpu_model": "GPU model", "mode": "mode", "factor": "best N",
                "time_per_training_s": "s/training", "rgu_hours_per_training": "RGU-h/training",
                "sweep_hours": "sweep hours", "sweep_rgu_hours": "sweep RGU-h"}
COST_MORE = {"partition": "partition", "rgu": "RGU", "billed_term": "billed by", "billed_multiple": "x GPU's RGU",
             "rgu_hours_at_bundle": "RGU-h at bundle"}
COST_FORMATS = {"rgu": ".2f", "time_per_training_s": ".2f", "rgu_hours_per_training": ".2e", "sweep_hours": ".3g",
                "billed_multiple": ".2f", "rgu_hours_at_bundle": ".2e", "sweep_rgu_hours": ".3g", "factor": ".0f"}


LAYOUT_COLUMNS = {"partition": "partition", "layout": "layout", "devices_per_training": "devices/training",
                  "packs": "packs", "wall_s": "one training s", "device_s_per_training": "device-s/training",
                  "trainings_per_device_hour": "trainings/device-h", "rgu_hours_per_1000": "RGU-h/1000",
                  "best": "best"}
LAYOUT_FORMATS = {"wall_s": ".2f", "device_s_per_training": ".2f", "trainings_per_device_hour": ".0f",
                  "rgu_hours_per_1000": ".3g", "devices_per_training": ".3g", "packs": ".0f"}


OCCUPANCY_COLUMNS = {"partition": "partition", "mode": "mode", "factor": "N", "how": "how", "packs": "packs",
                     "jobs": "jobs", "trainings": "trainings", "device_s_per_training": "device-s/training",
                     "slot_occupancy": "slot occupancy", "gap_mean_s": "gap s", "span_s": "span s"}
OCCUPANCY_FORMATS = {"device_s_per_training": ".2f", "slot_occupancy": ".2f", "gap_mean_s": ".2f",
                     "span_s": ".1f", "factor": ".0f", "packs": ".0f", "jobs": ".0f", "trainings": ".0f"}


def _figure(f: Plot) -> str:
    return (f"<figure><img alt='{_esc(f.caption)}' src='{_esc(f.src)}'><figcaption>{_esc(f.caption)}"
            "</figcaption></figure>")


def _log_links(r: pd.Series) -> str:
    links = [f"<a href='{_esc(r[k])}'>{name}</a>" for k, name in (("log_out", "out"), ("log_err", "err"))
             if isinstance(r.get(k), str) and r[k]]
    return " ".join(links) or "-"


def failures_section(trainings: pd.DataFrame, most: int = 50) -> str:
    """Each training that did not complete, named by its hyperparameters, with its last error line and its log."""
    failed = trainings[trainings["outcome"] == "failed"] if "outcome" in trainings else trainings
    if failed.empty:
        return ""
    items = "".join(
        f"<li>{_esc(r['training'])} (N={int(r['factor'])}, {_esc(r['status'])}): {_esc(r['error'] or '')} "
        f"({_log_links(r) if _log_links(r) != '-' else 'no log'})</li>"
        for _, r in failed.head(most).iterrows())
    more = f"<p class='note'>… and {len(failed) - most} more: see trainings.parquet.</p>" if len(failed) > most else ""
    return (f"<section id='failures'><h2>Failures</h2><p>{len(failed)} training(s) did not complete:</p>"
            f"<ul>{items}</ul>{more}</section>")


def trainings_section(trainings: pd.DataFrame, metric: str | None, most: int = 500) -> str:
    """Every training by its hyperparameters, with its outcome and its logs (the rest in trainings.parquet)."""
    if trainings.empty:
        return ""
    shown = trainings.head(most)
    columns = {**_keys(shown), "training": "hyperparameters", "factor": "N", "pack_id": "pack", "status": "status",
               **({"metric": metric} if metric else {}), "logs": "logs"}
    body = table(shown, columns, {"factor": ".0f", "metric": ".4g"}, cells={"logs": _log_links}, raw=("logs",))
    if len(trainings) > most:
        body += f"<p class='note'>The first {most} of {len(trainings)}: every one is in trainings.parquet.</p>"
    return _details(f"Every training, its hyperparameters and its logs ({len(trainings)})", body)


def evidence_section(c: Collected, page: Page) -> str:
    parts = ["<section id='evidence'><h2>The evidence</h2>"]
    if not c.summary.empty:
        title = "Time per training by packing factor N (pack wall time / N)"
        keys = {**_keys(c.summary), "partition": "partition", "mode": "mode", "factor": "N"}
        more = [f"<h3>{_esc(name)}</h3>" + table(c.summary, {**keys, **cols}, MORE_FORMATS)
                for name, cols in MORE_COLUMNS if any(col in c.summary for col in cols)]
        parts += [f"<h3>{'Probe (packing.factors=auto): ' if c.auto_lines else ''}{title}</h3>",
                  main_table(c.summary), f"<p class='note'>{_esc(gain_legend(c.summary))}</p>",
                  _details("More columns (every one is in summary.csv)", "".join(more))]
    if not c.production.empty:
        parts += [f"<h3>{_esc(c.production_title)}</h3>", main_table(c.production)]
    parts += [_figure(f) for f in page.figures]
    if not c.cost.empty:
        columns = {**_keys(c.cost), **COST_COLUMNS, **({"verdict": "verdict"} if len(c.cost) > 1 else {})}
        verdict = {"verdict": lambda r: ", ".join(w for w in ("fastest", "cheapest") if r[w])}
        parts.append(f"<h3>Cost at the best N, for a sweep of {_esc(text.trainings_phrase(c.sweep_trainings))} on one "
                     "device</h3>" + table(c.cost, columns, COST_FORMATS, cells=verdict)
                     + _details("How each is billed", table(c.cost, {**_keys(c.cost), **COST_MORE}, COST_FORMATS)))
    if not c.knobs.empty:
        columns = {**{k: k for k in ["partition", *text.knob_columns(c.knobs)]}, "factor": "N",
                   "samples_per_s": "samples/s/training", "loader_bound_samples_per_s": "loader-only samples/s",
                   "loader_bound": "loader-bound", "beyond_bound": "beyond the device's bound"}
        parts.append("<h3>Throughput by knob setting, beside the loader-only bound</h3>" + table(
            c.knobs, columns, {"samples_per_s": ".0f", "loader_bound_samples_per_s": ".0f", "factor": ".0f"}))
    if not c.layouts.empty:
        parts.append("<h3>One training on k devices beside N trainings on one device</h3>"
                     + table(c.layouts, {**_keys(c.layouts), **LAYOUT_COLUMNS}, LAYOUT_FORMATS)
                     + _paragraphs(c.verdicts))
    if not c.occupancy.empty:
        parts.append("<h3>Slot occupancy</h3>" + table(c.occupancy, {**_keys(c.occupancy), **OCCUPANCY_COLUMNS},
                                                          OCCUPANCY_FORMATS))
    parts.append(trainings_section(page.trainings, c.hyper.metric))
    parts.append("</section>")
    return "".join(parts)


def _page(title: str, body: Sequence[str]) -> str:
    return "\n".join(["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
                      "<meta name='viewport' content='width=device-width, initial-scale=1'>",
                      f"<title>{_esc(title)}</title><style>{CSS}</style></head><body>", *body, "</body></html>"])


def build_report(c: Collected, page: Page) -> str:
    """One run's page, top-down. Pure."""
    about = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in page.about)
    pending = c.records.pending
    warnings = c.records.warnings + ([f"{len(pending)} planned pack(s) have no record yet."] if pending else [])
    return _page(page.title, [f"<h1>{_esc(page.title)}</h1>", "<section id='what-ran'><h2>What ran</h2>"
                              f"<table class='t about'>{about}</table></section>",
                              search_section(c, page.search_figures), answer_section(c),
                              hyper_section(c), evidence_section(c, page), failures_section(page.trainings),
                              f"<section id='warnings'><h2>Warnings</h2>{_paragraphs(warnings, 'warn')}</section>"
                              if warnings else ""])


@dataclass
class RunPage:
    """One run of a comparison: its label (the run column), its page's address, what collect computed of it."""

    label: str
    href: str
    collected: Collected
    about: list[tuple[str, str]]


def compared(runs: Sequence[RunPage], frame: Callable[[Collected], pd.DataFrame]) -> pd.DataFrame:
    """One frame of every run, a ``run`` column first."""
    parts = [frame(r.collected).assign(run=r.label) for r in runs if not frame(r.collected).empty]
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    return out[["run", *[c for c in out.columns if c != "run"]]]


def build_comparison(runs: Sequence[RunPage], figures: Sequence[Plot] = ()) -> str:
    """One page comparing several runs, a run column in every table, each run's own report linked. Pure."""
    about = pd.DataFrame([{"run": r.label, **dict(r.about)} for r in runs])
    links = "".join(f"<li><a href='{_esc(r.href)}'>{_esc(r.label)}</a></li>" for r in runs)
    answers = "".join(f"<h3>{_esc(r.label)}</h3>" + (_paragraphs(answer_lines(r.collected)[0], "best")
                                                      or "<p>No best N yet.</p>") for r in runs)
    summary = compared(runs, lambda c: c.summary)
    body = [f"<h1>gpupack: {len(runs)} runs compared</h1>",
            "<section id='what-ran'><h2>What ran</h2>"
            + table(about, {k: k for k in ("run", "sweep", "workload", "partitions", "date", "wall time", "trainings")})
            + f"<p>Each run's own report:</p><ul>{links}</ul></section>",
            f"<section id='answer'><h2>The answer, run by run</h2><div class='answer'>{answers}</div></section>",
            "<section id='evidence'><h2>The evidence</h2><h3>Time per training by packing factor N</h3>"
            + (main_table(summary) if not summary.empty else "<p>(none)</p>")
            + "".join(_figure(f) for f in figures) + "</section>"]
    return _page("gpupack: runs compared", body)


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def training_rows(c: Collected, out: Path, configs: Mapping[str, text.RunConfig]) -> pd.DataFrame:
    """A row per latest training (no loader alone): hyperparameters in words, N, status, error, logs."""
    t = c.records.latest()
    if t.empty or "status" not in t:
        return pd.DataFrame()
    t = c.records.with_detached(without_loader_alone(t), ("logs",))
    params = [json.loads(p) if isinstance(p, str) else dict(p or {}) for p in t.get("params", [None] * len(t))]
    # the hyperparameters that name a training: the grid's keys, else those that vary between trainings
    keys = list(dict.fromkeys(str(k) for cf in configs.values() for k in ((cf.get("sweep") or {}).get("grid") or {}))) \
        or [k for k in dict.fromkeys(k for p in params for k in p) if len({str(p.get(k)) for p in params}) > 1]
    metric = c.hyper.metric
    rows = []
    for (_, r), p in zip(t.iterrows(), params):
        rec = r.to_dict()
        run = str(rec.get("run_dir", "."))
        logs = {s: kept_log(run, rec, s) for s in ("out", "err")}
        error = rec.get("error")
        rows.append({"run": run, "workload": rec.get("workload"), "training": text.params_label(p, keys) or
                     str(rec["training_id"]), "factor": rec.get("factor"), "pack_id": rec.get("pack_id"),
                     "status": rec.get("status"),
                     "outcome": OUTCOMES.get(str(rec.get("status")), "failed"),
                     "metric": rec.get(metric) if metric else None,
                     "error": error.strip().splitlines()[-1][:200] if isinstance(error, str) and error.strip()
                     else "",
                     **{f"log_{s}": os.path.relpath(log.path, out) if log is not None else None
                        for s, log in logs.items()}})
    frame = pd.DataFrame(rows)
    return frame.drop(columns=["run"]) if frame["run"].nunique() <= 1 else frame


OUTCOMES = {"completed": "completed", SKIPPED_MEMORY: "skipped", PRUNED: "pruned"}  # a status → how the page says it


def draw(c: Collected, plots_dir: Path) -> list[tuple[Path, str]]:
    """The plots that carry information for this run (each None where it would not), with their captions."""
    made = [
        (plot_time_per_training(c, plots_dir / "time_per_training.png"),
         "Time per training against N, median and 95% interval, one line per partition and mode; the chosen N "
         "ringed"),
        (plot_split_vs_no_split(c, plots_dir / "split_vs_no_split.png"), "Split (TF logical GPUs) against no split"),
        (plot_cost(c, plots_dir / "cost.png"), "Time and RGU cost of the sweep per partition, at each one's best N"),
        (plot_throughput_curves(c, plots_dir / "throughput_curves.png"),
         "Throughput of the trainings of one pack at the best N"),
        (plot_layouts(c, plots_dir / "spread_vs_packing.png"), "One training on k devices beside N on one device"),
        (plot_timeline(c, plots_dir / "timeline.png"), "The slots over time: a bar per training"),
    ]
    return [(p, caption) for p, caption in made if p is not None]


def write_report(c: Collected, out: Path, configs: Mapping[str, text.RunConfig] | None = None) -> list[Path]:
    """plots/*.png and report.html in ``out``; ``configs``: each run's config (what ran)."""
    configs = configs or {}
    plots = draw(c, out / "plots")
    history = [plot_search_history(s, out / "plots" / f"search_history{f'_{i}' if i else ''}.png")
               for i, s in enumerate(c.searches)]
    name = ", ".join(dict.fromkeys(str((cf.get("sweep") or {}).get("name")) for cf in configs.values()
                                   if (cf.get("sweep") or {}).get("name")))
    page = Page(about=text.what_ran(c, configs), figures=[Plot(caption, data_uri(p)) for p, caption in plots],
                trainings=training_rows(c, out, configs), title=f"gpupack report: {name}" if name else "gpupack report",
                search_figures=[Plot("The search's history: each trial's value and the best so far, against the trial "
                                     "number and against the device-hours spent", data_uri(p)) if p is not None
                                else None for p in history])
    report = out / "report.html"
    write_text_atomic(report, build_report(c, page))
    return [p for p, _ in plots] + [p for p in history if p is not None] + [report]


def write_comparison(runs: Sequence[RunPage], out: Path) -> list[Path]:
    """comparison.html (and its plot) in ``out``: several runs side by side, each linked to its own report."""
    summary = compared(runs, lambda c: c.summary)
    plots: list[tuple[Path, str]] = []
    if not summary.empty:
        pooled = Collected(records=runs[0].collected.records, summary=summary, best=pd.DataFrame(),
                           best_overall=pd.DataFrame(), hyper=runs[0].collected.hyper, cost=pd.DataFrame(),
                           sweep_trainings=runs[0].collected.sweep_trainings)
        drawn = plot_time_per_training(pooled, out / "plots" / "comparison_time_per_training.png")
        plots = [(drawn, "Time per training against N, one line per run, partition and mode; each run's chosen N "
                         "ringed")] if drawn is not None else []
    page = out / "comparison.html"
    write_text_atomic(page, build_comparison(runs, [Plot(caption, data_uri(p)) for p, caption in plots]))
    return [p for p, _ in plots] + [page]
