"""The terminal: rich tables and lines from what :mod:`gpupack.results.analysis.aggregate` computes."""
from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence, Set
from pathlib import Path

import pandas as pd
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpupack.core.store.journal import log_where
from gpupack.core.store.records import FINISHED, SKIPPED_MEMORY
from gpupack.results.analysis.aggregate import Collected
from gpupack.results.analysis.load import shared_host
from gpupack.results.analysis.occupancy import STREAMED
from gpupack.results.analysis.search import SearchReport
from gpupack.results.analysis.summary import GROUP, loader_alone_rows
from gpupack.results.report.text import (
    best_line,
    choice_lines,
    cost_lines,
    disturbance_lines,
    drift_lines,
    fmt,
    hyper_lines,
    hyper_notes,
    hyper_title,
    knob_columns,
    mode_lines,
    no_answer_line,
    param_text,
    search_best_line,
    search_counts_line,
    trainings_phrase,
)

WIDTH = 120  # the main table fits this many columns unless --wide

Cell = Callable[[pd.Series], str]  # a table's cell: a function of its row


def _text(column: str) -> Cell:
    return lambda r: str(r[column])


def _int(column: str) -> Cell:
    return lambda r: str(int(r[column]))


def _fig(column: str, spec: str = ".2f") -> Cell:
    return lambda r: fmt(r[column], spec)


def _num(r: pd.Series, key: str) -> float | None:
    return float(value) if pd.notna(value := r.get(key)) else None


def _gpu_else(gpu_column: str, name: str, column: str) -> Cell:
    """The GPU's figure where NVML sampled it, else the trainings' (``name``: what it is, e.g. cpu, 100 = one core)."""
    def cell(r: pd.Series) -> str:
        gpu, other = _num(r, gpu_column), _num(r, column)
        return f"gpu {gpu:.0f}" if gpu is not None else (f"{name} {other:.0f}" if other is not None else "-")
    return cell


def _throughput(r: pd.Series) -> str:
    text = fmt(r.get("samples_per_s"), ".0f")
    bound = _num(r, "loader_bound_samples_per_s")
    if bound is not None:
        text += f" / {bound:.0f}" + (" loader-bound" if r.get("loader_bound") else "")
    return text


def _failed(r: pd.Series) -> str:
    """Failed attempts of all attempts (those before a resume too), OOMs and victims of another's fault apart."""
    text = f"{int(r['failed'])}/{int(r.get('attempts', r['failed']))}"
    if r.get("victims"):
        text += f" (+{int(r['victims'])} victims, run again)"
    if r.get("oom"):
        text += f" ({int(r['oom'])} OOM: infeasible)"
    elif r.get("oom_cleared"):
        text += f" ({int(r['oom_cleared'])} OOM cleared)"
    if r.get("skipped_memory"):
        text += f" ({int(r['skipped_memory'])} skipped for memory: infeasible)"
    return text


def skipped_lines(summary: pd.DataFrame) -> list[str]:
    """Each N skipped for memory (gpupack.core.memory.pack_fit): where, and why, in one line."""
    lines = []
    for _, r in summary[summary["skipped_memory"] > 0].iterrows():
        why = str(r.get("skipped_memory_why") or "").removeprefix("skipped for memory: ")
        refit = int(r.get("skipped_refit") or 0)  # run at the largest N that fits instead: counted at that N
        lines.append(f"N={int(r['factor'])} skipped for memory on {r['partition']} ({r['gpu_type']}), {r['mode']}: "
                     f"{int(r['skipped_memory'])} training(s) not started; {why}"
                     + (f"; {refit} of them went on at the largest N that fits instead (its row)" if refit else ""))
    return lines


def _tpt(r: pd.Series) -> str:
    """Median time per training and its interval; a row that only streamed: the lanes' figure."""
    if _num(r, "time_per_training_s") is None and _num(r, "stream_s_per_training") is not None:
        return f"{fmt(r['stream_s_per_training'])} stream"
    low, high = _num(r, "tpt_ci_low_s"), _num(r, "tpt_ci_high_s")
    if low is not None and high is not None:
        return f"{fmt(r['time_per_training_s'])} [{low:.2f}-{high:.2f}]"
    return fmt(r["time_per_training_s"])


def _packs(r: pd.Series) -> str:
    """Whole packs that timed this N, or the streaming lanes that ran it (``2 lanes``)."""
    lanes = int(_num(r, "lanes") or 0)
    if _num(r, "packs") is None and lanes:
        return f"{lanes} lane{'s' if lanes > 1 else ''}"
    loaded = int(_num(r, "disturbed_packs") or 0)  # measured under foreign load (gpupack.results.analysis.disturbance)
    return fmt(r["packs"], ".0f") + (f" ({loaded}L)" if loaded else "")


def _n(r: pd.Series) -> str:
    """N, marked: * the chosen N, ? the choice withheld (no answer), ~ within noise of the lowest median."""
    mark = "*" if r.get("chosen") else "?" if r.get("withheld") else ("~" if r.get("within_noise") else "")
    return f"{int(r['factor'])}{mark}"


def _gain(r: pd.Series) -> str:
    """N's gain over the reference N: p where paired within rounds, ! where it passes what N trainings can give."""
    if r.get("gain") != r.get("gain"):
        return "-"
    return fmt(r["gain"]) + ("p" if r.get("paired") else "") + ("!" if r.get("beyond_bound") else "")


def gain_legend(summary: pd.DataFrame) -> str:
    """What the gain column holds: against which N, paired or not, and what its ! marks."""
    refs = sorted({int(n) for n in summary["gain_ref"].dropna()}) if "gain_ref" in summary else []
    ref = f"N={refs[0]}" if len(refs) == 1 else "the smallest N"
    said = [f"gain: trainings per hour against {ref}'s"
            + (f"; p: paired, each pack against {ref}'s pack in its round" if summary["paired"].any() else "")]
    if "disturbed_packs" in summary and summary["disturbed_packs"].any():
        said.append("(kL): k of its packs measured under foreign load (named below)")
    if summary["beyond_bound"].any():
        said.append("!: more than the device can give (min(N, cores)x a training alone on a CPU, Nx on a GPU or in "
                    "one process; see below)")
    if "withheld" in summary and summary["withheld"].any():
        said.append("N?: what the choice would name, withheld: no answer (see below)")
    return "; ".join(said) + "."


def pending_lines(c: Collected) -> list[str]:
    """What a run with no finished pack has so far."""
    r = c.records
    if not r.planned and r.trainings.empty and r.packs.empty:
        where = ", ".join(r.runs) or "the directory given"
        return [f"Nothing to collect yet in {where}: no plan.json and no records (give the run directory a sweep "
                "printed)."]
    done = r.planned - len(r.pending)
    lines = [f"No pack has finished yet: {done} of {r.planned} planned pack(s) have a record, "
             f"{len(r.pending)} pending." if r.planned else "No pack record yet."]
    if not r.trainings.empty:
        lines.append(f"{len(r.latest())} training record(s) so far; the table follows once a pack finishes.")
    lines += [f"Follow it: python -m gpupack status {run}" for run in r.runs[:1]]
    return lines


def render(c: Collected, console: Console, wide: bool = False) -> None:
    """What collect prints, the answer last."""
    for w in c.records.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, markup=True)
    for search in c.searches:  # a search's answer first: its best trial, then the trials ranked
        render_search(search, console, several=len(c.searches) > 1)
    _render_times(c, console, wide)
    _render_hyperparameters(c, console)
    _render_answer(c, console)


def _render_times(c: Collected, console: Console, wide: bool) -> None:
    """The time per training table (or what is pending), its legends, an auto run's steps and its grid run."""
    if c.summary.empty:
        for line in pending_lines(c):
            console.print(line, highlight=False)
    else:
        title = "Time per training by packing factor N (pack wall time / N; median [95% interval])"
        console.print(summary_table(c.summary, ("probe (packing.factors=auto): " if c.auto_lines else "") + title,
                                    {tuple(r[GROUP + ["factor"]]) for _, r in c.best.iterrows()}, wide=wide))
        console.print("N*: the chosen N; N~: within noise of the lowest median. " + gain_legend(c.summary)
                      + ("" if wide else " Every column: --wide (and summary.csv)."), highlight=False)
        if "lanes" in c.summary and (c.summary["lanes"] > 0).any():
            console.print("lanes, stream: a streaming run (each slot took the next training as one ended); its "
                          "s/training is the lanes' device-seconds per training (job walls / trainings completed), "
                          "with no interval and no best N: a stream times the run, not N (measure N with "
                          "packing.stream=off).", highlight=False)
        for line in skipped_lines(c.summary):
            console.print(line, highlight=False, markup=False)
    if (host := shared_host(c.records)) is not None:
        console.print(f"note: all packs ran on one host ({host}), sharing its cores as on the local test cluster: "
                      "timings measure overhead.", highlight=False)
    for line in c.auto_lines:
        console.print(line, highlight=False)
    if not c.production.empty:
        console.print(summary_table(c.production, c.production_title, set(), wide=wide))
    t = c.records.trainings  # timing_split False: a command that reported no first step (None: not a command's)
    unsplit = int((t["timing_split"] == False).sum()) if "timing_split" in t else 0  # noqa: E712
    if not c.summary.empty and unsplit:
        console.print(f"start-up s / loop s: '-' for {unsplit} training(s) whose program did not mark "
                      "its first step, so their wall time is one figure (from gpupack.result import "
                      "TrainingResult; call first_step() before the first step to split it).", highlight=False)


def _render_hyperparameters(c: Collected, console: Console) -> None:
    """Why trainings failed, the best hyperparameters, the knobs' table and the data the trainings read."""
    for line in failure_lines(c):
        console.print(line, highlight=False)
    if not c.hyper.table.empty:
        console.print(f"{hyper_title(c.hyper)}:", highlight=False, markup=False)
        for line in hyper_lines(c.hyper):
            console.print(f"  {line}", highlight=False, markup=False, emoji=False)
    elif not c.summary.empty and c.hyper.note:
        console.print(f"Best hyperparameters: {c.hyper.note}", highlight=False, markup=False, emoji=False)
    if not c.hyper.table.empty or not c.summary.empty:
        for line in hyper_notes(c.hyper):
            console.print(line, highlight=False, markup=False, emoji=False)
    if not c.knobs.empty:
        render_knobs(c, console)
    if not c.records.trainings.empty and "data" in c.records.trainings:
        for data in sorted(map(str, c.records.trainings["data"].dropna().unique())):
            console.print(f"Data: {data}", highlight=False)


def _render_answer(c: Collected, console: Console) -> None:
    """The plan's trainings against their records, the cost, the answer (or why none), and the tables beside it."""
    counts = c.records.plan_counts()
    if counts.planned:  # the plan's trainings against their records, as status and a run's last line say (a search
        console.print(counts.line(), highlight=False, soft_wrap=True)  # plans none: its trials' line said it above)
    if c.records.pending and not c.summary.empty:  # with no table, pending_lines said it
        console.print(f"[yellow]{len(c.records.pending)} planned pack(s) have no record yet[/] (still running, "
                      "or lost: re-run the same command with run_dir=... to resume).", markup=True)
    if not c.cost.empty:
        render_cost(c, console)
    for _, r in pd.concat([c.best, c.withheld]).iterrows():
        said = best_line(r) if r.get("chosen") else no_answer_line(r)
        console.print(f"[bold]{escape(said)}[/]" if r.get("chosen") else f"[bold red]{escape(said)}[/]", markup=True)
        for line in choice_lines(r):
            console.print(f"  {line}", highlight=False)
    for line in c.again_lines + drift_lines(c):
        console.print(line, highlight=False, markup=False)
    for line in mode_lines(c):
        console.print(f"[bold]{escape(line)}[/]", markup=True)
    # beside the answer: the packs whose times other processes disturbed
    for line in disturbance_lines(c.disturbance):
        console.print(f"[yellow]{escape(line)}[/]", markup=True)
    if not c.layouts.empty:
        render_layouts(c, console)
    if not c.occupancy.empty:
        render_occupancy(c, console)
    streamed_only = not c.occupancy.empty and set(c.occupancy["how"]) == {STREAMED}
    if not c.summary.empty and c.best.empty and c.withheld.empty and not streamed_only:
        console.print("[red]No packing factor finished without failures: no best N.[/]", markup=True)


def failure_lines(c: Collected, most: int = 3) -> list[str]:
    """Each distinct last error line, how many trainings hit it, and one log to read."""
    t = c.records.trainings
    if t.empty or "status" not in t:
        return []
    # skipped: skipped_lines; the loader alone: its own table
    mask = ~t["status"].isin(FINISHED) & (t["status"] != SKIPPED_MEMORY) & ~loader_alone_rows(t)
    if not mask.any():
        return []
    failed = t.loc[mask, ["status"] + [c for c in ("error",) if c in t]]  # a million rows: filter the two read
    reasons: dict[str, list[Hashable]] = {}  # reason → the rows (index labels) that hit it
    for index, status, error in zip(failed.index, failed["status"], failed.get("error", [None] * len(failed))):
        # error: text, or missing (None, or NaN in a text column)
        text = (error if isinstance(error, str) and error.strip() else str(status)).strip().splitlines()
        reasons.setdefault(f"{status}: {text[-1] if text else status}", []).append(index)
    lines = [f"{len(failed)} training(s) did not complete:"]
    for reason, rows in sorted(reasons.items(), key=lambda kv: -len(kv[1]))[:most]:
        first = c.records.with_detached(t.loc[rows[:1]], ("logs",)).iloc[0]  # where its logs are kept
        log = log_where(str(first.get("run_dir", ".")), first.to_dict(), "err")  # its folder's, or its lane's copy
        lines.append(f"  {len(rows)} x {reason if 'HINT:' in reason else reason[:160]}  (e.g. {log})")  # its fix whole
    if len(reasons) > most:
        lines.append(f"  ... and {len(reasons) - most} other reason(s): see summary.json and each record's error")
    return lines


def _gpu(r: pd.Series) -> str:
    """The partition and its GPU, by the RGU table's short name where known (a device name can be 30 characters)."""
    model = r.get("gpu_model")
    return f"{r['partition']} ({model if isinstance(model, str) and model else r['gpu_type']})"


# The main table's columns: (header, cell, where: "both", "default" or "wide"). The default fits WIDTH columns;
# --wide shows every column, and summary.csv has every figure.
COLUMNS: list[tuple[str, Cell, str]] = [
    ("partition (GPU)", _gpu, "both"),
    ("mode", _text("mode"), "both"),
    ("N", _n, "both"),
    ("packs", _packs, "both"),
    ("s/training", _tpt, "both"),
    ("start/loop s", lambda r: f"{fmt(r['startup_s'])}/{fmt(r['loop_s'])}", "wide"),
    ("gain", _gain, "both"),
    ("samples/s", _throughput, "wide"),  # per training, with the loader-only bound beside it
    ("util %", _gpu_else("gpu_util_mean", "cpu", "cpu_percent_mean"), "wide"),
    ("mem MB", _gpu_else("gpu_mem_peak_mb", "rss", "peak_rss_mb"), "both"),
    ("failed/attempts", _failed, "both"),
]


def _table(title: str, columns: Sequence[tuple[str, Cell]], rows: pd.DataFrame, left: Collection[str],
           minimal: bool = False, style: Callable[[pd.Series], str | None] = lambda r: None) -> Table:
    """A table of ``rows``, a column per (header, cell), ``left`` headers left; ``minimal``: no edge."""
    table = Table(title=title, box=box.MINIMAL, show_edge=False, pad_edge=False) if minimal else Table(title=title)
    for header, _ in columns:
        table.add_column(header, justify="left" if header in left else "right", no_wrap=header == "layout")
    for _, r in rows.iterrows():
        table.add_row(*(cell(r) for _, cell in columns), style=style(r))
    return table


def summary_table(summary: pd.DataFrame, title: str, best_keys: Set[tuple[Hashable, ...]], wide: bool = False) -> Table:
    """The main table: one row per (partition, mode, N), in :data:`WIDTH` columns unless ``wide``."""
    columns = [(h, cell) for h, cell, where in COLUMNS if where in ("both", "wide" if wide else "default")]
    return _table(title, columns, summary, ("partition (GPU)", "mode"), minimal=True,
                  style=lambda r: "bold green" if tuple(r[GROUP + ["factor"]]) in best_keys else None)


def render_knobs(c: Collected, console: Console) -> None:
    bounded = c.knobs["loader_bound_samples_per_s"].notna().any()
    columns = [("partition", _text("partition")), *((k, _text(k)) for k in knob_columns(c.knobs)),
               ("N", _int("factor")),  # !: N x it over the reference's passes the device's bound
               ("samples/s/training",
                lambda r: fmt(r["samples_per_s"], ".0f") + ("!" if r.get("beyond_bound") else ""))]
    if bounded:
        columns += [("loader-only samples/s", _fig("loader_bound_samples_per_s", ".0f")),
                    ("flag", lambda r: "loader-bound" if r["loader_bound"] else "")]
    console.print(_table("Throughput by knob setting (samples/s per training, median)"
                         + (" beside the loader-only bound" if bounded else ""), columns, c.knobs,
                         ("partition", "mode", "flag")))
    if "beyond_bound" in c.knobs and c.knobs["beyond_bound"].any():
        console.print("!: N x this over the reference N's of the same setting is more than the device can give "
                      "(see the answer's bound).", highlight=False)


def render_cost(c: Collected, console: Console) -> None:
    if c.cost["rgu"].isna().all():  # no partition with a known RGU (a CPU-only run): the lines say so, no table of -
        for line in cost_lines(c):
            console.print(line, highlight=False)
        return
    columns: list[tuple[str, Cell]] = [
        ("partition", _text("partition")), ("GPU model", lambda r: str(r["gpu_model"] or "-")),
        ("RGU", _fig("rgu")), ("mode", _text("mode")), ("best N", _int("factor")),
        ("s/training", _fig("time_per_training_s")),
        ("billed by", lambda r: str(r["billed_term"])
         + (f" x{r['billed_multiple']:.2f}" if r["billed_multiple"] > 1 else "")),
        ("RGU-h/training", _fig("rgu_hours_per_training", ".2e")), ("at bundle", _fig("rgu_hours_at_bundle", ".2e")),
        ("sweep hours", _fig("sweep_hours", ".3g")), ("sweep RGU-h", _fig("sweep_rgu_hours", ".3g")),
        ("verdict", lambda r: " ".join(f for f in ("fastest", "cheapest") if r[f]))]
    console.print(_table(f"Cost at the best N, for a sweep of {trainings_phrase(c.sweep_trainings)} on one device",
                         columns, c.cost, ("partition", "GPU model", "mode", "billed by")))
    for line in cost_lines(c):
        console.print(line, highlight=False)


def _devices(x: float) -> str:
    return f"1/{round(1 / x)}" if x < 1 else f"{x:g}"


def render_layouts(c: Collected, console: Console) -> None:
    """One training on k devices beside N trainings on one device: a table, then a verdict per GPU type."""
    t = c.layouts
    mib = pd.to_numeric(t.get("allreduce_bytes_per_step"), errors="coerce") / 2**20
    columns: list[tuple[str, Cell]] = [
        ("partition (GPU)", _gpu), ("layout", _text("layout")),
        ("devices", lambda r: _devices(r["devices_per_training"])), ("packs", _int("packs")),
        ("wall s", _fig("wall_s")), ("device-s", _fig("device_s_per_training")),
    ]
    if t["rgu"].notna().any():
        columns.append(("RGU-h/1000", _fig("rgu_hours_per_1000", ".3g")))
    if mib.notna().any():
        columns += [("MiB/step", lambda r: fmt(mib[r.name], ".3f")),
                    ("comm s", lambda r: fmt(r.get("allreduce_s_per_step"), ".4f"))]
    columns.append(("best", lambda r: "*" if r["best"] else ""))
    console.print(_table("One training on k devices (spread) beside N trainings on one device (packing)", columns, t,
                         ("partition (GPU)", "layout")))
    console.print("devices: per training (1/N packed, k spread). wall s: one training, its start to its end. device-s: "
                  "device time per training, the job's start-up included (packed: the pack's wall / N; spread: k x "
                  "the job's wall); the fewest uses a device-hour, and an RGU-hour, best."
                  + (" MiB/step: handed to the all-reduce each step (at k=1 it stays in the process); comm s: per "
                     "step, the all-reduces in flight on the host clock (overlapping backward)."
                     if mib.notna().any() else ""), highlight=False)
    if (t["gpu_type"] == "cpu").any():
        console.print("note: with no GPU, k processes (DDP) or k logical devices (Mirrored) on the same cores stand in "
                      "for k devices, and each counts as a device: the verdict is the mechanism's, not a GPU's.",
                      highlight=False)
    for line in c.verdicts:
        console.print(f"[bold]{escape(line)}[/]", highlight=False, markup=True)


def render_occupancy(c: Collected, console: Console) -> None:
    """How busy the slots were: whole packs beside streaming lanes, per group."""
    columns = [("partition (GPU)", _gpu), ("mode", _text("mode")), ("N", _int("factor")), ("how", _text("how")),
               ("packs", _int("packs")), ("jobs", _int("jobs")), ("trainings", _int("trainings")),
               ("device-s/training", _fig("device_s_per_training")), ("occupancy", _fig("slot_occupancy")),
               ("gap s", _fig("gap_mean_s")), ("span s", _fig("span_s"))]
    console.print(_table("Slot occupancy: Σ training wall / (N × job wall), whole packs and streaming lanes", columns,
                         c.occupancy, ("partition (GPU)", "mode", "how")))
    console.print("packs: whole packs, or streaming lanes; jobs: the jobs that ran them (a job runs its lane of "
                  "packs in turn). device-s/training: the packs' walls over the trainings they completed. "
                  "occupancy: 1.00 is every slot busy from its job's start to its end (a whole pack waits for its "
                  "slowest training; a streaming slot takes the next at once). gap s: mean idle time between two "
                  "trainings of a slot.",
                  highlight=False)


SEARCH_ROWS = 10  # the terminal's ranked trials; report.html shows more


def render_search(s: SearchReport, console: Console, several: bool = False, most: int = SEARCH_ROWS) -> None:
    """A search's best trial in one line, how far it is, then its top trials ranked."""
    console.print(f"[bold]{escape(search_best_line(s))}[/]" + (f" ({escape(s.run)})" if several else ""),
                  markup=True, highlight=False)
    console.print(search_counts_line(s), highlight=False, markup=False)
    if s.trials.empty:
        return
    shown = s.trials.head(most)
    columns = [("trial", _int("number")), (s.metric, _fig("value", ".4g")), ("state", _text("state")),
               ("params", lambda r: param_text(r["params"])), ("wall s", _fig("wall_s"))]
    console.print(_table(f"Trials ranked by {s.metric} ({s.direction}; the best {len(shown)} of {len(s.trials)})",
                         columns, shown, ("state", "params"), minimal=True))


def render_collected(c: Collected, written: Sequence[Path], console: Console, wide: bool = False) -> None:
    """What ``python -m gpupack collect`` prints: the tables and lines, then where the HTML report went."""
    render(c, console, wide=wide)
    report_html = [p for p in written if p.name == "report.html"]
    if report_html:
        console.print(f"Report: {report_html[0]}")
