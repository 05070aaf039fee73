"""The report's sentences and figures as plain text, shared by the terminal, the HTML, the plots and summary.json. A
packing mode is named as its :class:`gpupack.job.pack.Packer` says."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TypedDict

import pandas as pd

from gpupack.results.analysis.aggregate import Collected
from gpupack.results.analysis.drift import STEADY
from gpupack.results.analysis.load import Records
from gpupack.results.analysis.search import SearchReport
from gpupack.results.analysis.summary import BY_CORES, BY_ONE_PROCESS, UNDER_LOAD, numeric, packer_of
from gpupack.results.analysis.tables import Ranking, value_text


class SweepSection(TypedDict, total=False):
    name: str
    grid: dict[str, object]  # hyperparameter → its values


class PackingSection(TypedDict, total=False):
    factors: object  # a list of N, or auto
    repeats: object
    modes: object


class ClusterSection(TypedDict, total=False):
    name: str


class RunConfig(TypedDict, total=False):
    """What the report reads of a run's config.yaml (read back unresolved and unchecked: a key may be missing)."""

    sweep: SweepSection
    packing: PackingSection
    cluster: ClusterSection


def fmt(x: object, spec: str = ".2f") -> str:
    """``x`` formatted, or "-" where it is missing (None or NaN)."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def trainings_phrase(n: int) -> str:
    return f"{n} training" + ("" if n == 1 else "s")


def mode_label(mode: object) -> str:
    """How the report names a mode beside another: its Packer's ``split_label``, else the name itself."""
    packer = packer_of(mode)
    return packer.split_label if packer is not None and packer.split_label else str(mode)


def best_line(row: pd.Series) -> str:
    gain, ref = row.get("gain"), row.get("gain_ref")
    rounds = int(row["gain_rounds"]) if row.get("paired") else 0
    how = f"paired within {rounds} round{'s' if rounds != 1 else ''}" if rounds else "ratio of medians"
    known = pd.notna(gain) and pd.notna(ref) and int(row["factor"]) != int(ref)
    said = f", {gain:.2f}x the trainings per hour of N={int(ref or 1)} ({how})" if known else ""
    beyond = f" — not to be trusted: {bound_phrase(row)}" if row.get("beyond_bound") else ""
    provisional = " (provisional)" if row.get("provisional") else ""
    return (f"Best packing factor for {row['workload']} on {row['partition']} ({row['gpu_type']}), "
            f"mode {row['mode']}: N={int(row['factor'])} — {row['time_per_training_s']:.2f} s per training"
            f"{said}{beyond}{provisional}.")


def bound_phrase(row: pd.Series) -> str:
    """An N whose gain passes its bound: which gain, which bound, and whether its interval holds it."""
    n, ref = int(row["factor"]), int(row["gain_ref"])
    over = "one alone" if ref == 1 else f"N={ref}"
    low = row.get("gain_low")
    within = (f" (its interval {low:.2f}x–{row['gain_high']:.2f}x holds it: within noise of the bound)"
              if pd.notna(low) and low <= row["gain_bound"] else "")
    return (f"N={n}'s gain {row['gain']:.2f}x exceeds the {row['gain_bound']:.3g}x that {n} trainings at once can give "
            f"over {over}{device_phrase(row)}{within}")


def device_phrase(row: pd.Series) -> str:
    """What the bound is of: a CPU's cores, one shared process, or one GPU and how busy it was."""
    if row["gain_bound_by"] == BY_ONE_PROCESS:
        return " in one process, whose start a pack pays once"
    if row["gain_bound_by"] == BY_CORES:
        return f" on {int(row['cores'])} cores"
    if str(row.get("gpu_type")) == "cpu":
        return ""  # its cores unknown
    busy = row.get("ref_gpu_util")
    return f" on one GPU (N={int(row['gain_ref'])} kept it {busy:.0f} % busy)" if pd.notna(busy) else " on one GPU"


def _cpu_threads(r: pd.Series) -> tuple[bool, str]:
    """(whether the row is a CPU's with its cores known, the threads each N's trainings had)."""
    known = str(r.get("gpu_type")) == "cpu" and pd.notna(r.get("cores"))
    return known, f"threads per training {r['threads_by_n']}" if r.get("threads_by_n") else ""


def bound_lines(r: pd.Series) -> list[str]:
    """Why a gain can pass its bound, and, on a CPU, the cores and threads a training had at each N."""
    cpu, threads = _cpu_threads(r)
    if r.get("beyond_bound"):
        setup = (f"; on this CPU ({int(r['cores'])} cores), {threads}: more threads than help a small training slow "
                 "it, so measure N=1 as it runs best (packing.threads_per_training=1)" if cpu and threads else "")
        n, ref = int(r["factor"]), int(r["gain_ref"])
        return [f"{bound_phrase(r)}: no N can do that on this device, so the machine changed during the run "
                "(another job beside it; see the drift check and the packs measured under load) "
                f"or N={ref} was set up worse than a training at N={n}{setup}."]
    if threads and str(r.get("gpu_type")) == "cpu":
        return [f"On this CPU ({int(r['cores'])} cores): {threads}." if cpu else f"On this CPU: {threads}."]
    return []


def no_answer_line(r: pd.Series) -> str:
    """A group whose choice is withheld (gpupack.results.analysis.summary.no_answer): what it does not name, and why."""
    where = f"{r['workload']} on {r['partition']} ({r['gpu_type']}), mode {r['mode']}"
    n = int(r["factor"])
    if r.get("no_answer") == UNDER_LOAD:
        why = (f"every pack of every N was measured under foreign load (other processes on the job's cores or GPU), "
               f"so N={n}'s {fmt(r.get('time_per_training_s'))} s per training says how this N fared beside them, "
               "not how it runs")
    else:
        why = f"{bound_phrase(r)}, which no setting of N can do, so the reference was slowed or set up to lose"
    return f"No answer for {where}: {why}."


def no_answer_advice(r: pd.Series) -> list[str]:
    """What to do where no N is named (more packs of a biased reference settle nothing: none is advised)."""
    cpu, threads = _cpu_threads(r)
    lines = ["Run it again on a quiet machine (nothing else on the job's cores: `top` shows what is), or on the "
             "cluster, where a job has its cores to itself."]
    if r.get("no_answer") != UNDER_LOAD and cpu and threads:
        lines.append(f"On this CPU ({int(r['cores'])} cores), {threads}: a training given more threads than it can "
                     "use is the one its neighbours slow most; packing.threads_per_training=1 measures every N with "
                     "one thread each.")
    return lines


def choice_lines(r: pd.Series) -> list[str]:
    """How one group's best N was picked (ties, rule, settled?, bound); withheld: what to do."""
    if r.get("no_answer"):
        return no_answer_advice(r) + ([f"Method: {r['choice_method']}."] if r.get("choice_method") else [])
    lines = bound_lines(r)
    if r.get("ties"):
        lines.append(f"{r['ties']} tie (within noise of the lowest median); picked by the rule: {r['tie_rule']}.")
    if r.get("provisional"):
        need = r.get("repeats_needed")
        more = f"; about {int(need)} packs per N would settle it (packing.repeats={int(need)})" if need else ""
        lines.append(f"Provisional: {int(r['packs'])} pack(s) at this N is too few for the interval{more}.")
    elif r.get("repeats_needed"):
        lines.append(f"About {int(r['repeats_needed'])} packs per N would tell the tied N apart.")
    if r.get("choice_method"):
        lines.append(f"Method: {r['choice_method']}.")
    return lines


def mode_lines(c: Collected) -> list[str]:
    """Where a sweep compared modes: the best (mode, N) per partition, split against no split."""
    if c.summary.empty or c.summary["mode"].nunique() < 2:
        return []
    lines = []
    for _, r in c.best_overall.iterrows():
        mine = of_group(c.best, r)
        others = mine[mine["mode"] != r["mode"]]
        versus = "; ".join(f"best {o['mode']}: N={int(o['factor'])}, {o['time_per_training_s']:.2f} s"
                           for _, o in others.iterrows())
        lines.append(f"Best (mode, N) for {r['workload']} on {r['partition']} ({r['gpu_type']}): "
                     f"{mode_label(r['mode'])} N={int(r['factor'])} — "
                     f"{r['time_per_training_s']:.2f} s per training{alone_text(c, r)}"
                     + (f" ({versus})." if versus else "."))
    return lines


def of_group(frame: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    """The rows of ``frame`` on the same (workload, partition, GPU type) as ``row``: what one device's lines compare."""
    return frame[(frame["workload"] == row["workload"]) & (frame["partition"] == row["partition"])
                 & (frame["gpu_type"] == row["gpu_type"])]


def alone_text(c: Collected, best: pd.Series) -> str:
    """The best (mode, N) against one training alone as a user would otherwise run it: the fastest N=1 of the modes
    that named an N beside it (a withheld mode's N=1 may be the reference set up to lose); "" where no N=1 ran or the
    best is one."""
    ones = of_group(c.summary, best)
    ones = ones[(ones["factor"] == 1) & ones["mode"].isin(of_group(c.best, best)["mode"])]
    ones = ones.dropna(subset=["time_per_training_s"])
    if ones.empty or int(best["factor"]) == 1 or not best["time_per_training_s"] > 0:
        return ""
    fastest = ones.loc[ones["time_per_training_s"].idxmin()]
    times = float(fastest["time_per_training_s"]) / float(best["time_per_training_s"])
    return f", {times:.1f}x one training alone ({mode_label(fastest['mode'])} N=1, " \
           f"{fastest['time_per_training_s']:.2f} s)"


def knob_columns(knobs: pd.DataFrame) -> list[str]:
    return [k for k in knobs.columns if k not in ("workload", "partition", "factor", "samples_per_s", "trainings",
                                                  "loader_bound_samples_per_s", "loader_bound", "beyond_bound")]


def hyper_title(ranking: Ranking) -> str:
    """What the hyperparameters are ranked by, and which way."""
    if ranking.metric is None or ranking.goal is None:
        return "Best hyperparameters"
    return f"Best hyperparameters by {ranking.metric} ({'lowest' if ranking.goal == 'min' else 'highest'} first, " \
           "mean over runs)"


def hyper_lines(ranking: Ranking) -> list[str]:
    table, column = ranking.table, ranking.column
    params = [k for k in table.columns if k not in ("workload", column, "runs", "trainings")]
    return [f"{r['workload']}: {param_text({k: r[k] for k in params})}  {ranking.metric}={r[column]:.4g} "
            f"({int(r['runs'])} runs)" for _, r in table.iterrows()]


def hyper_notes(ranking: Ranking) -> list[str]:
    """Where a ranking's metric or goal came from, and a goal against its metric's name."""
    return [line for line in (ranking.origin, ranking.caution if not ranking.table.empty else "") if line]


def cost_lines(c: Collected) -> list[str]:
    lines = []
    for workload, group in c.cost.groupby("workload"):
        fastest = group[group["fastest"]].iloc[0]
        lines.append(f"{workload}: a sweep of {trainings_phrase(c.sweep_trainings)} finishes first on "
                     f"{fastest['partition']} ({fmt(fastest['sweep_hours'], '.3g')} hours on one device at N="
                     f"{int(fastest['factor'])}, {fastest['mode']}).")
        cheapest = group[group["cheapest"]]
        if len(cheapest):
            row = cheapest.iloc[0]
            lines.append(f"{workload}: it costs least on {row['partition']} ({row['gpu_model']}): "
                         f"{fmt(row['sweep_rgu_hours'], '.3g')} RGU-hours at N={int(row['factor'])}.")
            where = [f"{r['partition']} ({r['mode']}, N={int(r['factor'])})" for r in (row, fastest)]
            lines.append(f"{workload}: cheapest per training: {where[0]}, {fmt(row['rgu_hours_per_training'], '.3g')} "
                         f"RGU-h billed by {row['billed_term']}; fastest sweep: {where[1]}, "
                         f"{fmt(fastest['time_per_training_s'])} s per training.")
        else:
            lines.append(f"{workload}: no RGU weight is known for {', '.join(sorted(set(map(str, group['gpu_type']))))}"
                         " (not a GPU model of conf/rgu/), so no RGU cost.")
    return lines


def drift_lines(c: Collected) -> list[str]:
    """Each drift check in words; where every pack of its partition ran under foreign load, steady says the load
    held, not that the machine was quiet."""
    d = c.disturbance
    loaded = (set(d.loc[(d["packs"] > 0) & (d["disturbed"] >= d["packs"]), "partition"].astype(str))
              if not d.empty and {"packs", "disturbed", "partition"} <= set(d) else set())
    lines = []
    for _, row in c.drift.iterrows():
        change = float(row["change"])
        verdict = (f"steady within {STEADY:.0%}" if abs(change) <= STEADY else
                   "the machine got slower during the run" if change > 0 else "the machine got faster during the run")
        if str(row["partition"]) in loaded and abs(change) <= STEADY:
            verdict += ", but every pack ran under foreign load: the load held steady, the machine was not quiet"
        lines.append(f"Drift check on {row['partition']} ({row['gpu_type']}): {row['pack_id']} run again at the end "
                     f"took {row['end_s']:.2f} s against {row['first_s']:.2f} s at the start ({change:+.0%}, "
                     f"{row['hours'] * 60:.1f} min later): {verdict}.")
    return lines


def disturbance_lines(disturbance: pd.DataFrame) -> list[str]:
    """A line per group with packs measured under foreign load, naming them."""
    lines = []
    for _, r in disturbance.iterrows():
        if not r["disturbed"]:
            continue
        said = []
        if pd.notna(share := r.get("share")):
            said.append(f"{share:.0%} of its pack time")
        if pd.notna(foreign := r.get("foreign_cores_mean")):
            of = f" of {r['cores']:.3g}" if pd.notna(r.get("cores")) else ""
            said.append(f"other processes used {foreign:.2g}{of} cores on average")
        if r.get("gpu_disturbed"):
            mem = r.get("foreign_gpu_mem_mb_max")
            said.append(f"{r['gpu_disturbed']} with another process on its GPU (up to {r['foreign_gpu_procs_max']}"
                        + (f", {mem:.0f} MB" if pd.notna(mem) else "") + ")")
        ids = list(dict.fromkeys(map(str, r["pack_ids"])))  # a pack measured in two attempts is named once
        lines.append(f"Measured under foreign load ({r['workload']} on {r['partition']} ({r['gpu_type']}), mode "
                     f"{r['mode']}): {r['disturbed']} of {r['packs']} packs ({'; '.join(said)}): "
                     f"{', '.join(ids[:5])}{f', … ({len(ids) - 5} more)' if len(ids) > 5 else ''} — their times "
                     "are not trusted as quiet figures.")
    return lines


def params_label(params: Mapping[str, object], keys: Sequence[str]) -> str:
    """A training named by its hyperparameters (``keys``: the grid's, in order; else all): ``lr=0.1, batch_size=64``."""
    shown = [k for k in keys if k in params] or sorted(params)
    return ", ".join(f"{k}={params[k]}" for k in shown)


def duration(seconds: float | None) -> str:
    """A wall time in the unit a person reads it in: 42 s, 3.5 min, 2.1 h."""
    if seconds is None or seconds != seconds:
        return "-"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 \
        else f"{seconds / 3600:.1f} h"


def when(epoch: float | None) -> str:
    """A record's time stamp as a date and time with its zone (the machine's that writes the report)."""
    if epoch is None or epoch != epoch:
        return "-"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).astimezone().strftime("%Y-%m-%d %H:%M %Z")


def _listed(values: object) -> str:
    return ", ".join(map(str, values)) if isinstance(values, (list, tuple)) else str(values)


def what_ran(c: Collected, configs: Mapping[str, RunConfig]) -> list[tuple[str, str]]:
    """What ran, as (what, value) pairs: from the runs' configs (``configs``: run directory → its config.yaml) the
    sweep, grid, N, modes and cluster; from the records the workloads, partitions, date, wall time, trainings by
    outcome, and the jobs and packs. Pure."""
    first = next(iter(configs.values()), RunConfig())
    sweep, packing = first.get("sweep") or {}, first.get("packing") or {}
    grid = sweep.get("grid") or {}
    packs = c.records.packs
    partitions = sorted(set(map(str, c.summary["partition"]))) if "partition" in c.summary else []
    pairs = [("sweep", ", ".join(dict.fromkeys(str((cf.get("sweep") or {}).get("name", "-")) for cf in
                                               configs.values())) or "-"),
             ("workload", ", ".join(sorted(set(map(str, c.records.trainings.get("workload", []))))) or "-"),
             ("grid", "; ".join(f"{k}: {_listed(v)}" for k, v in grid.items()) or "-"),
             ("N (packing factors)", _listed(packing.get("factors", "-"))),
             ("repeats", str(packing.get("repeats", "-"))),
             ("modes", _listed(packing.get("modes", "-"))),
             ("partitions", ", ".join(partitions) or "-"),
             ("cluster", str((first.get("cluster") or {}).get("name", "-")))]
    # the first pack's start and the last one's end (NaN, said "-", where no record says)
    first_start, last_end = (float(numeric(packs, col).agg(how))
                             for col, how in (("started_at", "min"), ("ended_at", "max")))
    pairs += [("date", when(first_start)), ("wall time", duration(last_end - first_start))]
    counts = c.records.plan_counts() if c.records.planned_ids else None
    if counts is not None:
        pairs.append(("trainings", f"{counts.completed} completed, {counts.failed} failed"
                      + (f", {counts.skipped} skipped for memory" if counts.skipped else "")
                      + (f", {counts.unrecorded} without a record" if counts.unrecorded else "")
                      + f" (of {counts.planned} planned)"))
    elif not (latest := c.records.latest()).empty and "status" in latest:
        done = int((latest["status"] == "completed").sum())
        pairs.append(("trainings", f"{done} completed, {len(latest) - done} did not"))
    # the packs (or streaming lanes) and the jobs that ran them, counted by job id (a job runs its lane in turn)
    p = Records.latest_of(packs)
    jobs = p["job_id"].dropna().nunique() if "job_id" in p else 0
    pairs.append(("jobs and packs", f"{len(p)} pack(s)" + (f" run by {jobs} job(s)" if jobs else "")
                  if "pack_id" in p else "-"))
    return pairs


def param_text(params: Mapping[str, object]) -> str:
    """Hyperparameters as a person reads them (:func:`gpupack.results.analysis.tables.value_text`): ``lr=0.0123``."""
    return ", ".join(f"{k}={value_text(v)}" for k, v in params.items())


def search_best_line(s: SearchReport) -> str:
    """The search's answer in one line, params first: ``Best trial: lr=0.0123 → val_accuracy 0.91 (maximize; ...)``."""
    best = s.best()
    if best is None:
        return f"Best trial: none completed yet ({s.metric}, {s.direction}; {len(s.trials)} trial(s) asked)."
    return (f"Best trial: {param_text(best['params'])} → {s.metric} {best['value']:.4g} ({s.direction}; trial "
            f"{int(best['number'])} of {len(s.trials)})")


def search_counts_line(s: SearchReport) -> str:
    """How far the search is: its trials by state against the budget, and the device-hours they took."""
    counts = s.counts()
    said = ", ".join(f"{n} {state}" for state, n in counts.items() if n or state in ("complete", "pruned"))
    return (f"{len(s.trials)} trial(s) asked (budget: {s.n_trials} finished): {said}; "
            f"{s.device_hours:.3g} device-hours (Σ the trials' walls)")
