"""Summary and choice: records → time per training per (workload, partition, GPU type, mode, N) → the best N.
Pure pandas on the frames :mod:`gpupack.results.analysis.load` reads."""
from __future__ import annotations

import json
import math
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from gpupack.core.store.records import COMPLETED, OOM, PRUNED, SKIPPED_MEMORY, VICTIM
from gpupack.job.pack import Packer, available_modes, load_packer
from gpupack.results.analysis.choose import Choice, choose, tie_label
from gpupack.results.analysis.load import Cleared, Records, cleared_mask

GROUP = ["workload", "partition", "gpu_type", "mode"]
LOADER_BOUND_FRACTION = 0.9  # training throughput at >= 90 % of the loader's own: loader-bound, not GPU-bound


def numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    """``frame[column]`` as numbers: NaN where a value is none, or where the column is missing."""
    return pd.to_numeric(frame[column], errors="coerce") if column in frame else pd.Series(math.nan, index=frame.index)


def first_value(series: pd.Series) -> object:
    values = series.dropna()
    return values.iloc[0] if len(values) else None


def summarize(trainings: pd.DataFrame, packs: pd.DataFrame, cleared: Sequence[Cleared] = (),
              disturbed: Collection[tuple[str, str]] = ()) -> pd.DataFrame:
    """One row per (workload, partition, GPU type, mode, N): time per training (pack wall / N) over the packs whose N
    trainings all ran together, in any attempt. Every attempt counts: ``failed`` of its own fault, ``victims`` of
    another's (run again, never against N), ``oom`` unless cleared; ``unfinished``: latest record not completed."""
    if trainings.empty or packs.empty:
        return pd.DataFrame()
    trainings = only_columns(trainings, SUMMARY_INPUTS)  # each filter below copies every column it keeps: keep few
    bounds = loader_bounds(trainings)
    trainings, packs = not_checks(without_loader_alone(trainings)), not_checks(without_loader_alone(packs))
    if trainings.empty or packs.empty:
        return pd.DataFrame()
    t = _classified(trainings, packs, cleared)
    keys = GROUP + ["factor"]
    timed, setups, dropped = reference_setups(timed_packs(t, packs))
    kept = ~t["pack_id"].isin(dropped) if dropped else pd.Series(True, index=t.index)
    out = _per_pack(timed, keys).join(_per_training(t, keys, kept), how="outer").reset_index()
    for col in ("failed", "victims", "unfinished", "oom", "oom_cleared", "attempts", "trainings", "skipped_memory",
                "skipped_refit"):
        out[col] = out[col].fillna(0).astype(int)  # an OOM (counted apart) makes N infeasible on this device
    out["loader_bound_samples_per_s"] = [bounds.get(p, math.nan) for p in out["partition"]]
    out["loader_bound"] = out["samples_per_s"] >= LOADER_BOUND_FRACTION * out["loader_bound_samples_per_s"]
    out = out.sort_values(keys).reset_index(drop=True)
    out = with_choices(out, timed, disturbed)
    groups = list(out[GROUP].itertuples(index=False, name=None))
    for key, words in setups.items():  # the method says which set-up of the reference it weighed, and why
        rows = pd.Series([g == key for g in groups], index=out.index)
        out.loc[rows, "choice_method"] = out.loc[rows, "choice_method"].fillna("") + "; " + words
    return out


def _classified(trainings: pd.DataFrame, packs: pd.DataFrame, cleared: Sequence[Cleared]) -> pd.DataFrame:
    """Each attempt of a training with what it counts as: completed, another's victim, out of memory (cleared or
    not), skipped for its memory (refit or not), pruned, unfinished, failed; its figures as numbers."""
    t = trainings.copy()
    if "attempt" not in t:
        t["attempt"] = 0
    t["ok"] = t["status"] == COMPLETED
    t["is_victim"] = t["status"] == VICTIM  # taken down by another's fault and run again: not its own failure
    t["oom_cleared"] = (t["status"] == OOM) & cleared_mask(t, cleared)
    t["is_oom"] = (t["status"] == OOM) & ~t["oom_cleared"]
    # not started: its pack's measured need passed the memory share (gpupack.core.memory.pack_fit); its N is infeasible
    t["was_skipped"] = t["status"] == SKIPPED_MEMORY
    t["is_skipped"] = (t["attempt"] == 0) & t["was_skipped"]
    # ... and run at the largest N that fits instead (a refit pack: gpupack.core.plan.refit_packs), counted there too
    t["is_refit"] = t["is_skipped"] & (t["runs_in"].notna() if "runs_in" in t else False)
    t["skipped_why"] = t.get("error", pd.Series(None, index=t.index)).where(t["is_skipped"])
    t["is_pruned"] = t["status"] == PRUNED  # stopped by its search's pruner: finished, neither failed nor unfinished
    t["unfinished"] = (t["attempt"] == 0) & ~t["ok"] & ~t["is_skipped"] & ~t["is_pruned"]
    t["is_failed"] = ~t["ok"] & ~t["is_victim"] & ~t["was_skipped"] & ~t["is_pruned"]
    for col in ("startup_s", "loop_s", "samples", "samples_per_s", "val_accuracy", "peak_rss_mb", "peak_gpu_mem_mb",
                "threads"):
        t[col] = pd.to_numeric(t.get(col), errors="coerce")
    t["peak_rss_mb"] = t["peak_rss_mb"].fillna(_sampled_rss(t, packs)).where(~t["was_skipped"])
    if "gpu_model" not in t:
        t["gpu_model"] = None
    return t


def _per_pack(timed: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Each (group, N)'s packs timed whole: their count, time per training and the sampler's figures."""
    return timed.groupby(keys).agg(
        packs=("pack_id", "count"),
        time_per_training_s=("time_per_training_s", "median"),
        tpt_min_s=("time_per_training_s", "min"),
        tpt_max_s=("time_per_training_s", "max"),
        pack_samples_per_s=("pack_samples_per_s", "median"),
        gpu_util_mean=("sampler_gpu_util_mean", "mean"),
        cpu_percent_mean=("sampler_cpu_percent_mean", "mean"),
        gpu_mem_peak_mb=("sampler_gpu_mem_used_peak_mb", "max"),
        cores=("cores", "max"),
    )


def _per_training(t: pd.DataFrame, keys: list[str], kept: pd.Series) -> pd.DataFrame:
    """Each (group, N)'s attempts by what they count as, and the latest ones' figures (``kept``: the set-up of the
    reference weighed), in one pass: a filter would copy a million rows."""
    latest = t["attempt"] == 0
    figures = latest & kept  # the set-up of the reference not kept counts its trainings, not its times
    return t.assign(
        latest=latest, latest_startup_s=t["startup_s"].where(figures), latest_loop_s=t["loop_s"].where(figures),
        latest_samples_per_s=t["samples_per_s"].where(figures), latest_gpu_model=t["gpu_model"].where(latest),
        kept_threads=t["threads"].where(kept),
    ).groupby(keys, dropna=False).agg(
        attempts=("ok", "size"),
        failed=("is_failed", "sum"),
        victims=("is_victim", "sum"),
        unfinished=("unfinished", "sum"),
        oom=("is_oom", "sum"),
        oom_cleared=("oom_cleared", "sum"),
        peak_rss_mb=("peak_rss_mb", "max"),
        skipped_memory=("is_skipped", "sum"),
        skipped_refit=("is_refit", "sum"),
        skipped_memory_why=("skipped_why", first_value),
        trainings=("latest", "sum"),
        startup_s=("latest_startup_s", "median"),
        loop_s=("latest_loop_s", "median"),
        samples_per_s=("latest_samples_per_s", "median"),
        gpu_model=("latest_gpu_model", first_value),
        threads=("kept_threads", "median"),  # per training, as the job gave them (gpupack.job.pack.threads_for)
    )


# The training columns summarize reads (what cleared_mask, loader_bounds and timed_packs read included).
SUMMARY_INPUTS = (*GROUP, "factor", "attempt", "status", "loader_alone", "run_dir", "ended_at", "training_id",
                  "pack_id", "gpu_model", "startup_s", "loop_s", "samples", "samples_per_s", "val_accuracy",
                  "peak_rss_mb", "peak_gpu_mem_mb", "error", "runs_in", "threads", "reference_of")


def only_columns(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    return frame[[c for c in columns if c in frame]]


def rows_where(frame: pd.DataFrame, mask: pd.Series) -> pd.DataFrame:
    """``frame[mask]``, but ``frame`` itself where every row is kept (a filter copies a million rows)."""
    return frame if bool(mask.all()) else frame[mask]


def timed_packs(t: pd.DataFrame, packs: pd.DataFrame) -> pd.DataFrame:
    """The packs that time a training: its N trainings ran together and at least one completed (a pack whose every
    training failed at once says nothing of how long a training takes). One row per pack and attempt."""
    completed = numeric(packs, "n_completed").fillna(1)
    timed = packs[packs["complete"].astype(bool) & (completed > 0)].copy()
    if "attempt" not in timed:
        timed["attempt"] = 0
    for col in ("wall_s", "factor", "sampler_gpu_util_mean", "sampler_cpu_percent_mean",
                "sampler_gpu_mem_used_peak_mb", "cores", "round"):
        timed[col] = pd.to_numeric(timed.get(col), errors="coerce")
    timed["time_per_training_s"] = timed["wall_s"] / timed["factor"]
    latest = pd.DataFrame({"samples": t["samples"].where(t["attempt"] == 0), "workload": t["workload"]})
    per_pack = latest.groupby(t["pack_id"], sort=False).agg(samples=("samples", "sum"), workload=("workload", "first"))
    pack_samples = per_pack["samples"].replace(0, math.nan)  # none reported: unknown, not 0
    samples = pd.to_numeric(timed["pack_id"].map(pack_samples), errors="coerce").where(timed["attempt"] == 0)
    timed["pack_samples_per_s"] = samples / timed["wall_s"]  # an earlier attempt's samples are not told apart: unknown
    timed["workload"] = timed["pack_id"].map(per_pack["workload"])
    return timed


def _timed_packs_of(trainings: pd.DataFrame, packs: pd.DataFrame) -> pd.DataFrame:
    """The timed packs (no loader alone, the reference at its faster set-up), each with its time."""
    t, packs = not_checks(without_loader_alone(trainings)), not_checks(without_loader_alone(packs))
    if t.empty or packs.empty:
        return pd.DataFrame(columns=["time_per_training_s"])
    t = t.assign(samples=pd.to_numeric(t.get("samples"), errors="coerce"),
                 attempt=t["attempt"] if "attempt" in t else 0)
    return reference_setups(timed_packs(t, packs))[0].dropna(subset=["time_per_training_s"])


def reference_setups(timed: pd.DataFrame) -> tuple[pd.DataFrame, dict[tuple[Hashable, ...], str], set[str]]:
    """Where the reference N was also measured at a set-up of its own (its packs' ``threads_set``), the faster set-up
    is its time, so that no N is weighed against a reference set up to lose. Returns the timed packs kept, each
    group's words for the method, and the pack ids left out. Pure."""
    if "threads_set" not in timed or not timed["threads_set"].notna().any():
        return timed, {}, set()
    keys = GROUP + ["factor"]
    drop = pd.Series(False, index=timed.index)
    words: dict[tuple[Hashable, ...], str] = {}
    for key, g in timed.groupby(keys, dropna=False):
        alt = g["threads_set"].notna()
        if alt.all() or not alt.any():
            continue
        mine, theirs = g.loc[~alt], g.loc[alt]
        own_s, alt_s = mine["time_per_training_s"].median(), theirs["time_per_training_s"].median()
        slower = mine if alt_s < own_s else theirs
        drop[slower.index] = True
        threads = [_threads_of(x) for x in (mine, theirs)]
        kept = threads[1] if alt_s < own_s else threads[0]
        words[tuple(key)[:-1]] = (f"N={int(g['factor'].iloc[0])}, the reference, measured at {threads[0]} and "
                                  f"{threads[1]} thread(s) per training in the same rounds ({own_s:.3g} s and "
                                  f"{alt_s:.3g} s per training): weighed at {kept}, the faster")
    return timed[~drop], words, set(map(str, timed.loc[drop, "pack_id"]))


def _threads_of(packs: pd.DataFrame) -> str:
    values = numeric(packs, "threads_per_training").dropna()
    return str(int(values.median())) if len(values) else "?"


@dataclass(frozen=True)
class Timings:
    """One group's times per training by N, each pack's round, and the loaded packs left out."""

    times: dict[int, list[float]]
    rounds: dict[int, list[Hashable]]
    left_out: int = 0
    said: str = ""
    loaded_only: bool = False  # every pack of every N was measured under foreign load: nothing quiet to weigh


def pack_times(records: Records, disturbed: Collection[tuple[str, str]] = (),
               blocked: Mapping[str, Collection[int]] | None = None) -> dict[str, Timings]:
    """Per partition of one workload and mode (packing.factors=auto's), what the choice weighs, as the summary's
    choice weighs it (``blocked``: each partition's N that cannot be chosen)."""
    timed = _timed_packs_of(records.trainings, records.packs)
    if timed.empty:
        return {}
    every, quiet, loaded = _split_loaded(timed, ["partition", "factor"], disturbed)
    return {str(p): _choice_timings(every, quiet, loaded, (p,), sorted(set(g["factor"].astype(int))),
                                    set((blocked or {}).get(str(p), ())))
            for p, g in timed.groupby("partition")}


def _split_loaded(timed: pd.DataFrame, keys: list[str], disturbed: Collection[tuple[str, str]]
                  ) -> tuple[tuple[pd.Series, pd.Series], tuple[pd.Series, pd.Series], pd.Series]:
    """Each (group, N)'s times and rounds, of every pack and of the quiet ones; the loaded counts."""
    runs = timed["run_dir"].astype(str) if "run_dir" in timed else pd.Series("", index=timed.index)
    named = frozenset(disturbed)
    loaded = pd.Series([(r, str(p)) in named for r, p in zip(runs, timed["pack_id"])] if named else False,
                       index=timed.index, dtype=bool)
    return (_times_by_n(timed, keys), _times_by_n(timed[~loaded], keys),
            loaded.groupby([timed[k] for k in keys]).sum())


def _choice_timings(every: tuple[pd.Series, pd.Series], quiet: tuple[pd.Series, pd.Series], loaded: pd.Series,
                    key: tuple[Hashable, ...], factors: Iterable[int], blocked: Collection[int]) -> Timings:
    """One group's timings for the choice: its quiet packs alone where every N that can be chosen keeps one (load from
    outside slows N=1's threads more than N trainings' single ones, so a round does not share it evenly and pairing
    cannot divide it out); every pack otherwise, and the words say which."""
    factors = list(factors)
    by_n, rounds = _group_times(every, key, factors)
    left_out = int(sum(loaded.get((*key, n), 0) for n in by_n))
    if not left_out:
        return Timings(by_n, rounds)
    calm, calm_rounds = _group_times(quiet, key, factors)
    if set(calm) >= set(by_n) - set(blocked):
        return Timings(calm, calm_rounds, left_out, f"; {left_out} pack(s) measured under foreign load left out")
    every_pack = sum(len(v) for v in by_n.values())
    if not calm:
        return Timings(by_n, rounds, 0, f"; all {every_pack} pack(s) measured under foreign load", loaded_only=True)
    return Timings(by_n, rounds, 0, f"; {left_out} pack(s) measured under foreign load kept (an N has no quiet pack)")


def packing_times(trainings: pd.DataFrame, packs: pd.DataFrame) -> dict[tuple[Hashable, ...], list[float]]:
    """Each (workload, partition, GPU type, mode, N)'s time per training of every timed pack."""
    timed = _timed_packs_of(trainings, packs)
    if timed.empty:
        return {}
    return {tuple(k): [float(v) for v in values]
            for k, values in timed.groupby(GROUP + ["factor"])["time_per_training_s"]}


def split_by(frame: pd.DataFrame, mask: pd.Series) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows not in ``mask``, rows in it); ``frame`` itself where none is (no copy of a million rows)."""
    return (frame[~mask], frame[mask]) if mask.any() else (frame, frame.iloc[0:0])


def split_phase(frame: pd.DataFrame, phase: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows not of ``phase``, rows of it): an auto run's grid at the best N is shown apart from its probe."""
    return split_by(frame, frame["phase"] == phase if "phase" in frame else pd.Series(False, index=frame.index))


# with_choices's columns, and their values before a group's choice sets them
CHOICE_COLUMNS: dict[str, object] = {
    "tpt_ci_low_s": math.nan, "tpt_ci_high_s": math.nan, "within_noise": False, "chosen": False, "infeasible": False,
    "ties": None, "tie_rule": None, "provisional": None, "repeats_needed": None, "choice_method": None,
    "paired": False, "gain": math.nan, "gain_low": math.nan, "gain_high": math.nan, "gain_ref": math.nan,
    "gain_rounds": math.nan, "left_out_disturbed": 0}


def with_choices(summary: pd.DataFrame, timed: pd.DataFrame,
                 disturbed: Collection[tuple[str, str]] = ()) -> pd.DataFrame:
    """The noise-aware choice per (workload, partition, GPU type, mode) as columns (:data:`CHOICE_COLUMNS`), the gain
    over the reference and its bound; the packs ``disturbed`` names ((run, pack id)) are left out as
    :func:`_choice_timings` says."""
    out = summary.assign(**CHOICE_COLUMNS)
    out["infeasible"] = (out["oom"] > 0) | (out["skipped_memory"] > 0)
    timed = timed.dropna(subset=["time_per_training_s"])
    every, quiet, loaded = _split_loaded(timed, GROUP + ["factor"], disturbed)
    loaded_only: dict[Hashable, bool] = {}
    for key, idx in out.groupby(GROUP, dropna=False).groups.items():
        group = out.loc[idx]
        blocked = set(group.loc[group["infeasible"] | (group["unfinished"] > 0), "factor"].astype(int))
        timings = _choice_timings(every, quiet, loaded, key, group["factor"].astype(int), blocked)
        loaded_only[key] = timings.loaded_only
        choice = choose(timings.times, infeasible=blocked, rounds=timings.rounds)
        _mark_choice(out, group, choice, bool(timings.left_out))
        out.loc[idx, ["left_out_disturbed", "ties", "tie_rule", "provisional", "repeats_needed", "choice_method"]] = [
            timings.left_out, tie_label(choice.ties, sorted(timings.times)) if len(choice.ties) > 1 else None,
            choice.rule, choice.provisional, choice.repeats_needed, choice.method + timings.said]
    _with_gains(out)
    _withhold_impossible(out, loaded_only)
    out["threads_by_n"] = out.groupby(GROUP, dropna=False)["threads"].transform(
        lambda col: ", ".join(f"N={int(n)}: {int(t)}" for n, t in zip(out.loc[col.index, "factor"], col) if t == t))
    return out


def _mark_choice(out: pd.DataFrame, group: pd.DataFrame, choice: Choice, left_out: bool) -> None:
    """Each N's row of one group as ``choice`` left it: its interval, within noise or chosen, its paired gain
    (``left_out``: loaded packs were left out, so the row's figures become the quiet packs' the choice weighed)."""
    for i, r in group.iterrows():
        n = int(r["factor"])
        interval = choice.intervals.get(n)
        if interval is not None:
            out.loc[i, ["tpt_ci_low_s", "tpt_ci_high_s"]] = [interval.low, interval.high]
            if left_out:
                out.loc[i, ["time_per_training_s", "packs"]] = [interval.median, interval.packs]
        out.loc[i, ["within_noise", "chosen"]] = [n in choice.ties, choice.best is not None and n == choice.best]
        relative = choice.relative.get(n)
        if relative is not None and choice.reference is not None:
            out.loc[i, ["paired", "gain", "gain_low", "gain_high", "gain_ref", "gain_rounds"]] = [
                True, 1.0 / relative.median, _inverse(relative.high), _inverse(relative.low), choice.reference,
                relative.packs]


def _with_gains(out: pd.DataFrame) -> None:
    """Trainings per hour, the gain over the reference (paired, else the ratio of medians against N=1), the bound N
    trainings at once can give, and the reference's GPU use: from the rows' figures as the choice left them."""
    out["trainings_per_hour"] = 3600.0 / out["time_per_training_s"]
    base = out[out["factor"] == 1].set_index(GROUP)["time_per_training_s"]
    base_of = pd.Series([base.get(tuple(k), math.nan) for k in out[GROUP].itertuples(index=False)], index=out.index)
    out["speedup_vs_n1"] = base_of / out["time_per_training_s"]
    single = out.groupby(GROUP, dropna=False)["factor"].transform("count") < 2
    out.loc[single, "paired"] = False  # one N: nothing was compared
    unpaired = ~out["paired"].astype(bool)  # the ratio of medians, against N=1
    out.loc[unpaired, "gain"] = out.loc[unpaired, "speedup_vs_n1"]
    out.loc[unpaired & out["gain"].notna(), "gain_ref"] = 1
    out["speedup_vs_n1"] = out["gain"].where(out["gain_ref"] == 1)
    out["gain_bound"], out["gain_bound_by"] = gain_bounds(out), bound_kinds(out)
    out["beyond_bound"] = (out["gain"] > out["gain_bound"]).fillna(False).astype(bool)
    # the reference's, by group
    of_n = dict(zip(out[[*GROUP, "factor"]].itertuples(index=False, name=None), numeric(out, "gpu_util_mean")))
    out["ref_gpu_util"] = pd.Series([of_n.get(k, math.nan) for k in out[[*GROUP, "gain_ref"]].itertuples(
        index=False, name=None)], index=out.index, dtype=float)


def _withhold_impossible(out: pd.DataFrame, loaded_only: Mapping[Hashable, bool]) -> None:
    """A group whose answer cannot be named says why; its choice's N is marked withheld."""
    out["withheld"], out["no_answer"] = False, None
    for key, idx in out.groupby(GROUP, dropna=False).groups.items():
        why = no_answer(out.loc[idx], loaded_only.get(key, False))
        if why is not None:
            out.loc[idx, "no_answer"] = why
            out.loc[idx, "withheld"] = out.loc[idx, "chosen"].astype(bool)
            out.loc[idx, "chosen"] = False


# Why a group names no best N (its ``no_answer``), as the report's text says it
BEYOND_DEVICE = "beyond the device"
UNDER_LOAD = "under foreign load"
# A gain at its bound moves a few percent either way with the timings' own jitter (a process's start, a pack's last
# training ending a little late); past this much over the bound, even the interval's low end, it is no jitter.
BOUND_SLACK = 0.05


# What bounds a pack of N's gain over the reference (:func:`bound_kinds`): a CPU's cores; one shared process, whose
# start a pack pays once; or the device's N copies of the reference's work (a GPU, a CPU of unknown cores)
BY_CORES, BY_ONE_PROCESS, BY_COPIES = "cores", "one process", "copies"


def bound_kinds(summary: pd.DataFrame) -> pd.Series:
    """Which bound each row's gain has (BY_CORES, BY_ONE_PROCESS, BY_COPIES). Pure."""
    cores = numeric(summary, "cores")
    modes = summary.get("mode", pd.Series(None, index=summary.index, dtype=object))
    # a mode that runs a pack's N trainings in one shared process (its Packer's one_process)
    shared = modes.map({m: (p := packer_of(m)) is not None and p.one_process for m in modes.unique()})
    shared = shared.fillna(False).astype(bool)
    cpu = summary["gpu_type"].astype(str) == "cpu"
    kinds = pd.Series(BY_COPIES, index=summary.index, dtype=object)
    kinds[cpu & shared] = BY_ONE_PROCESS
    kinds[cpu & ~shared & (cores >= 1)] = BY_CORES
    return kinds


def gain_bounds(summary: pd.DataFrame) -> pd.Series:
    """What the device can give at each N over the reference N, in trainings per hour: min(N, c) / min(ref, c) on a
    CPU of c cores (no more trainings at once than cores); N / ref on a GPU, or where N trainings share one process,
    which pays its start once a pack (its Packer's ``one_process``). Pure."""
    n, ref = summary["factor"].astype(float), summary["gain_ref"].astype(float)
    cores = numeric(summary, "cores")
    by_cores = n.where(n < cores, cores) / ref.where(ref < cores, cores)
    return (n / ref).where(bound_kinds(summary) != BY_CORES, by_cores)


def packer_of(mode: object) -> Packer | None:
    """The packing mode a record names, or None for one the registry does not hold (shown by name)."""
    return load_packer(mode) if isinstance(mode, str) and mode in available_modes() else None


def no_answer(group: pd.DataFrame, loaded_only: bool) -> str | None:
    """Why one group's choice may not be named (None: it may): the chosen N's gain is beyond the device's bound and
    its interval does not reach back to it, give or take :data:`BOUND_SLACK` (more packs would settle nothing), or
    every pack of every N that can be chosen ran under foreign load. Pure."""
    chosen = group[group["chosen"].astype(bool)]
    if chosen.empty:
        return None
    comparable = ~group["infeasible"].astype(bool) & (group["unfinished"] == 0)
    if loaded_only and int(comparable.sum()) > 1:  # one N that can be chosen is the answer, however loaded
        return UNDER_LOAD
    row = chosen.iloc[0]
    low = row.get("gain_low")
    reach = low if low is not None and low == low else row["gain"]
    if bool(row["beyond_bound"]) and reach > row["gain_bound"] * (1 + BOUND_SLACK):
        return BEYOND_DEVICE
    return None


def _times_by_n(timed: pd.DataFrame, keys: list[str]) -> tuple[pd.Series, pd.Series]:
    """Each (group, N)'s times per training and their packs' rounds, in one order: a round as (run, round), told
    apart across runs; None where it has none."""
    by = [timed[k] for k in keys]
    runs = timed["run_dir"] if "run_dir" in timed else pd.Series("", index=timed.index)
    rounds = pd.Series([None if r != r else (str(d), int(r)) for d, r in zip(runs, timed["round"])],
                       index=timed.index, dtype=object)
    return timed["time_per_training_s"].groupby(by).apply(list), rounds.groupby(by).apply(list)


def _group_times(frames: tuple[pd.Series, pd.Series], key: tuple[Hashable, ...],
                 factors: Iterable[int]) -> tuple[dict[int, list[float]], dict[int, list[Hashable]]]:
    """One group's times per N (N with none left out) and each time's round."""
    times, rounds = frames
    by_n = {int(n): list(times.get((*key, n), [])) for n in factors}
    by_n = {n: v for n, v in by_n.items() if v}
    return by_n, {n: list(rounds.get((*key, n), [])) for n in by_n}


def _inverse(x: float | None) -> float:
    return 1.0 / x if x is not None and x > 0 else math.nan


def _sampled_rss(t: pd.DataFrame, packs: pd.DataFrame) -> pd.Series:
    """Each training's peak RSS as the pack's sampler saw it (by training id), for trainings that report none."""
    peaks: dict[str, object] = {}
    if not t["peak_rss_mb"].isna().any():  # every training reported its own: nothing to look up
        return pd.Series(math.nan, index=t.index)
    for by_training in packs.get("sampler_peak_rss_by_training", pd.Series(dtype=object)).dropna():
        peaks.update(json.loads(by_training) if isinstance(by_training, str) else by_training)  # JSON text as loaded
    return pd.to_numeric(t["training_id"].map(peaks), errors="coerce")


def not_checks(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without the drift check's rows: a measure of the machine, not of its N."""
    return rows_where(frame, frame["reference_of"].isna()) if "reference_of" in frame else frame


def loader_alone_rows(frame: pd.DataFrame) -> pd.Series:
    """True on the rows of the data loader's own runs (sweep.loader_alone; records without the field: none)."""
    if "loader_alone" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["loader_alone"].fillna(False).astype(bool)


def without_loader_alone(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of trainings and packs, the data loader's own runs left out (sweep.loader_alone)."""
    return rows_where(frame, ~loader_alone_rows(frame)) if "loader_alone" in frame else frame


def loader_alone_completed(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[loader_alone_rows(frame) & (frame["status"] == COMPLETED)] if "loader_alone" in frame \
        else frame.iloc[0:0]


def loader_bounds(trainings: pd.DataFrame) -> dict[str, float]:
    """The data loader's own samples/s per partition (median over its runs alone)."""
    alone = loader_alone_completed(trainings)
    medians = numeric(alone, "samples_per_s").groupby(alone["partition"]).median()
    return {str(partition): float(value) for partition, value in medians.items()}



def best_factors(summary: pd.DataFrame, by: Sequence[str] = tuple(GROUP)) -> pd.DataFrame:
    """Per group, the chosen N; with ``by`` leaving mode out, the fastest of the modes' chosen N."""
    if summary.empty:
        return summary
    chosen = summary[summary["chosen"].astype(bool)]
    if chosen.empty or list(by) == GROUP:
        return chosen.reset_index(drop=True)
    idx = chosen.groupby(list(by))["time_per_training_s"].idxmin()
    return chosen.loc[idx].reset_index(drop=True)


def withheld_choices(summary: pd.DataFrame) -> pd.DataFrame:
    """Per group that names no best N (:func:`no_answer`), the row of the N its choice withheld."""
    if summary.empty or "withheld" not in summary:
        return summary.iloc[0:0]
    return summary[summary["withheld"].astype(bool)].reset_index(drop=True)
