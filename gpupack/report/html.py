"""The self-contained HTML report: report.html with its tables and the PNG plots embedded (base64), so it can be
copied off a cluster and opened anywhere."""
from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from gpupack.analysis.aggregate import Collected
from gpupack.core.records import write_text_atomic
from gpupack.report import text
from gpupack.report.plots import (
    plot_cost,
    plot_layouts,
    plot_split_vs_no_split,
    plot_throughput_curves,
    plot_time_per_training,
    plot_timeline,
)

LAYOUT_COLUMNS = {"partition": "partition", "gpu_type": "GPU type", "layout": "layout",
                  "devices_per_training": "devices/training", "packs": "packs", "wall_s": "one training s",
                  "time_per_training_s": "s/training", "device_s_per_training": "device-s/training",
                  "trainings_per_device_hour": "trainings/device-h", "rgu_hours_per_1000": "RGU-h/1000",
                  "samples_per_s": "samples/s", "job_wall_s": "job wall s",
                  "allreduce_bytes_per_step": "all-reduce B/step", "allreduce_s_per_step": "all-reduce s/step",
                  "best": "best"}


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"><figcaption>' \
           f"{html.escape(alt)}</figcaption></figure>"


def _table(df: pd.DataFrame, columns: dict[str, str], formats: dict[str, str]) -> str:
    if df.empty:
        return "<p>(none)</p>"
    view = pd.DataFrame({label: [text.fmt(v, formats[col]) if col in formats else ("-" if v is None else v)
                                 for v in df[col]] for col, label in columns.items() if col in df})
    return "<div class='scroll'>" + str(view.to_html(index=False, escape=True, border=0, classes="t")) + "</div>"


SUMMARY_COLUMNS = {"workload": "workload", "partition": "partition", "gpu_type": "GPU", "mode": "mode", "factor": "N",
                   "packs": "packs", "disturbed_packs": "under foreign load", "time_per_training_s": "s/training",
                   "tpt_ci_low_s": "95% low", "tpt_ci_high_s": "95% high", "chosen": "chosen",
                   "within_noise": "within noise", "tpt_min_s": "min", "tpt_max_s": "max",
                   "startup_s": "start-up s", "loop_s": "loop s",
                   "trainings_per_hour": "trainings/h", "gain": "gain", "gain_ref": "gain over N=",
                   "paired": "paired in rounds", "beyond_bound": "gain beyond N/ref",
                   "samples_per_s": "samples/s/training", "pack_samples_per_s": "samples/s/pack",
                   "loader_bound_samples_per_s": "loader-only samples/s", "loader_bound": "loader-bound",
                   "gpu_util_mean": "GPU util %", "cpu_percent_mean": "CPU %", "gpu_mem_peak_mb": "GPU mem peak MB",
                   "peak_rss_mb": "RSS peak MB", "attempts": "attempts", "failed": "failed", "oom": "OOM",
                   "oom_cleared": "OOM cleared"}
SUMMARY_FORMATS = {"time_per_training_s": ".2f", "tpt_ci_low_s": ".2f", "tpt_ci_high_s": ".2f", "tpt_min_s": ".2f",
                   "tpt_max_s": ".2f", "startup_s": ".2f",
                   "loop_s": ".2f", "trainings_per_hour": ".0f", "gain": ".2f", "gain_ref": ".0f",
                   "samples_per_s": ".0f",
                   "pack_samples_per_s": ".0f", "packs": ".0f", "loader_bound_samples_per_s": ".0f",
                   "gpu_util_mean": ".0f", "cpu_percent_mean": ".0f", "gpu_mem_peak_mb": ".0f", "peak_rss_mb": ".0f"}
COST_COLUMNS = {"workload": "workload", "partition": "partition", "gpu_model": "GPU model", "rgu": "RGU",
                "mode": "mode", "factor": "best N", "time_per_training_s": "s/training",
                "billed_term": "billed by", "billed_multiple": "x GPU's RGU",
                "rgu_hours_per_training": "RGU-h/training", "rgu_hours_at_bundle": "RGU-h at bundle",
                "sweep_hours": "sweep hours",
                "sweep_rgu_hours": "sweep RGU-h", "fastest": "fastest", "cheapest": "cheapest"}
COST_FORMATS = {"rgu": ".2f", "time_per_training_s": ".2f", "rgu_hours_per_training": ".2e", "sweep_hours": ".3g",
                "billed_multiple": ".2f", "rgu_hours_at_bundle": ".2e",
                "sweep_rgu_hours": ".3g"}
CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em}.best{background:#e8f5e9;padding:.6em 1em;border-radius:6px}
table.t{border-collapse:collapse;font-size:.85em}table.t td,table.t th{padding:3px 8px;border-bottom:1px solid #ddd;
text-align:right}table.t th{background:#f3f3f3}img{max-width:100%}figcaption{font-size:.8em;color:#666}
.warn{color:#a15c00}.scroll{overflow-x:auto}"""


def _knob_section(c: Collected) -> str:
    if c.knobs.empty:
        return ""
    columns = {**{k: k for k in ["partition", *text.knob_columns(c.knobs)]}, "factor": "N",
               "samples_per_s": "samples/s/training", "loader_bound_samples_per_s": "loader-only samples/s",
               "loader_bound": "loader-bound"}
    return ("<h2>Throughput by knob setting, beside the loader-only bound</h2>"
            + _table(c.knobs, columns, {"samples_per_s": ".0f", "loader_bound_samples_per_s": ".0f"}))


def _layout_section(c: Collected) -> str:
    if c.layouts.empty:
        return ""
    return ("<h2>One training on k devices beside N trainings on one device</h2>"
            + _table(c.layouts, {"workload": "workload", **LAYOUT_COLUMNS},
                     {"wall_s": ".2f", "job_wall_s": ".2f", "time_per_training_s": ".2f",
                      "device_s_per_training": ".2f", "trainings_per_device_hour": ".0f", "rgu_hours_per_1000": ".3g",
                      "samples_per_s": ".0f",
                      "allreduce_bytes_per_step": ".0f", "allreduce_s_per_step": ".4f", "devices_per_training": ".3g"})
            + "".join(f"<p>{html.escape(line)}</p>" for line in c.verdicts))


OCCUPANCY_COLUMNS = {"partition": "partition", "gpu_type": "GPU", "mode": "mode", "factor": "N", "how": "how",
                     "jobs": "jobs", "trainings": "trainings", "device_s_per_training": "device-s/training",
                     "slot_occupancy": "slot occupancy", "gap_mean_s": "gap s", "span_s": "span s"}
OCCUPANCY_FORMATS = {"device_s_per_training": ".2f", "slot_occupancy": ".2f", "gap_mean_s": ".2f",
                     "span_s": ".1f"}


def write_report(c: Collected, out: Path) -> list[Path]:
    """plots/*.png and report.html in ``out``."""
    plots_dir = out / "plots"
    made = [
        (plot_time_per_training(c, plots_dir / "time_per_training.png"), "Time per training against N, per GPU type"),
        (plot_split_vs_no_split(c, plots_dir / "split_vs_no_split.png"), "Split (TF logical GPUs) against no split"),
        (plot_throughput_curves(c, plots_dir / "throughput_curves.png"), "Throughput of the trainings of one pack"),
        (plot_cost(c, plots_dir / "cost.png"), "Time and RGU cost of the sweep per partition"),
        (plot_layouts(c, plots_dir / "spread_vs_packing.png"), "One training on k devices beside N on one device"),
        (plot_timeline(c, plots_dir / "timeline.png"), "The slots over time: a bar per training"),
    ]
    plots = [(p, alt) for p, alt in made if p is not None]
    best = "".join(f"<p>{html.escape(line)}</p>" for line in [said for _, r in c.best.iterrows()
                                                                 for said in [text.best_line(r), *text.choice_lines(r)]]
                   + text.mode_lines(c) + [text.drift_line(d) for _, d in c.drift.iterrows()]) or \
        "<p>No packing factor finished without failures yet: no best N.</p>"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>gpupack report</title>",
        f"<style>{CSS}</style></head><body><h1>gpupack report</h1>",
        f"<p>Runs: {html.escape(', '.join(sorted(set(map(str, c.records.trainings.get('run_dir', []))))))}</p>",
        f"<div class='best'>{best}</div>",
        "".join(f"<p class='warn'>{html.escape(line)}</p>" for line in text.disturbance_lines(c.disturbance)),
        "<h2>Time per training by packing factor N</h2>",
        _table(c.summary, SUMMARY_COLUMNS, SUMMARY_FORMATS),
        f"<h2>Cost at the best N (a sweep of {text.trainings_phrase(c.sweep_trainings)} on one device)</h2>",
        _table(c.cost, COST_COLUMNS, COST_FORMATS),
        "".join(f"<p>{html.escape(line)}</p>" for line in (text.cost_lines(c) if not c.cost.empty else [])),
        _knob_section(c),
        _layout_section(c),
        "<h2>Slot occupancy</h2>" + _table(c.occupancy, OCCUPANCY_COLUMNS, OCCUPANCY_FORMATS) if not c.occupancy.empty
        else "",
        "<h2>Plots</h2>", "".join(_img(p, alt) for p, alt in plots),
        f"<h2>{html.escape(text.hyper_title(c.hyper))}</h2>",
        "".join(f"<p>{html.escape(line)}</p>" for line in text.hyper_lines(c.hyper))
        or f"<p>{html.escape(c.hyper.note or '(none)')}</p>",
        "".join(f"<p>{html.escape(line)}</p>" for line in text.hyper_notes(c.hyper)),
    ]
    if c.records.warnings or c.records.pending:
        parts.append("<h2>Warnings</h2>" + "".join(f"<p class='warn'>{html.escape(w)}</p>"
                                                     for w in c.records.warnings))
        if c.records.pending:
            parts.append(f"<p class='warn'>{len(c.records.pending)} planned pack(s) have no record yet.</p>")
    parts.append("</body></html>")
    report = out / "report.html"
    write_text_atomic(report, "\n".join(parts))
    return [p for p, _ in plots] + [report]
