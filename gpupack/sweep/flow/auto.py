"""``packing.factors=auto``: find the best N by experiment, then run the grid at it (docs/auto.md says how).

N climbs packing.auto.ladder a step at a time on one device per partition, each step a run directory of its own
(RUN_DIR/probe/nNN/: the new N, the best so far and the reference, in rounds), until it stops paying, fails, or would
not fit. The best N is the noise-aware choice over every probed N (:mod:`gpupack.results.analysis.choose`); with
packing.then=run the grid points the probe did not complete run at it in RUN_DIR/run/. Every step is an ordinary run
directory, so the same command resumes the probe; with ``wait=false`` each call submits the next step and returns.
RUN_DIR/auto.json says what was probed and why it stopped.
"""
from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path
from typing import Callable, Hashable, Mapping, Sequence

import pandas as pd
from omegaconf import DictConfig

from gpupack.core.cost.billing import Bundle, bill
from gpupack.core.memory.figures import candidate_runs, check_memory, estimate, find_measured, setting_key
from gpupack.core.plan import Pack, Plan, expand_grid, make_plan, run_order, training_id
from gpupack.core.store.journal import RunRecords
from gpupack.core.store.records import COMPLETED, write_json_atomic, write_text_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackResult
from gpupack.errors import ConfigError
from gpupack.results.analysis.aggregate import Collected, aggregate
from gpupack.results.analysis.choose import choose, keeps_improving
from gpupack.results.analysis.disturbance import loaded_packs
from gpupack.results.analysis.load import Records, load_records
from gpupack.results.analysis.summary import Timings, pack_times, summarize
from gpupack.search.plan import search_plan
from gpupack.sweep.flow.collect import PROBE, RUN, AutoReport, Step, collect
from gpupack.sweep.flow.run import (
    Opened,
    Outcome,
    Prepared,
    config_yaml,
    open_run_dir,
    part_prepared,
    run_plain,
    target_devices,
)
from gpupack.sweep.setup.validate import AutoSpec, SweepSpec

# ---------------- pure decisions ----------------

def verdict(factor: int, times: Mapping[int, Sequence[float]], best_so_far: int | None, oom: int, unfinished: int,
            min_gain: float, skipped: int = 0, rounds: Mapping[int, Sequence[Hashable]] | None = None) -> str:
    """Whether a partition climbs past ``factor`` ("climb") or why it stops there; with ``rounds`` (each time's), the
    new N is weighed against the best so far paired within the rounds they share. Pure."""
    if oom:
        return f"N={factor} ran out of memory ({oom} training(s))"
    if skipped:  # not started: what its setting measured passed the memory share (gpupack.core.memory.pack_fit)
        return f"N={factor} was skipped for memory ({skipped} training(s))"
    if unfinished:
        return f"N={factor}: {unfinished} training(s) did not complete"
    if not times.get(factor):
        return f"N={factor}: no pack of it finished with all its trainings together"
    if best_so_far is None:
        return "climb"
    paired = (rounds[best_so_far], rounds[factor]) if rounds and best_so_far in rounds and factor in rounds else None
    better, why = keeps_improving(times[best_so_far], times[factor], min_gain,
                                  names=(f"N={best_so_far}", f"N={factor}"), rounds=paired)
    return "climb" if better else why


def step_plan(spec: SweepSpec, partitions: Sequence[str], n: int, best_so_far: Mapping[str, int | None],
              repeats: int, reference: int | None = None) -> Plan:
    """One probe step: ``repeats`` packs of the new N on each partition still climbing, as many of its best N so far
    and of the ``reference`` N (the final choice weighs every N against it), all in one interleaved order. Pure."""
    points = expand_grid(spec.grid)
    packs: list[Pack] = []
    for partition in partitions:
        best = best_so_far.get(partition)
        factors = list(dict.fromkeys(f for f in (n, best, reference) if f is not None))
        for factor in factors:
            part = make_plan(sweep=spec.name, workload=spec.workload_ref, grid=spec.grid, fixed=spec.fixed,
                             factors=[factor], modes=spec.modes, partitions=[partition], repeats=repeats,
                             seed_key=spec.filler_seed, order="by_factor",
                             points=probe_points(points, factor * repeats, spec.order_seed), phase=PROBE,
                             reference_threads=spec.reference_threads if factor == reference else None)
            packs += part.packs
    ordered = run_order(packs, spec.order, spec.order_seed)
    return Plan(sweep=spec.name, workload=spec.workload_ref, grid_size=len(points), packs=tuple(ordered),
                order=f"{spec.order} (seed {spec.order_seed})" if spec.order == "interleaved" else spec.order,
                phase=PROBE)


def probe_points(points: Sequence[Mapping[str, object]], count: int, seed: int) -> list[Mapping[str, object]]:
    """The grid points a probe step of ``count`` trainings trains: the first of one seeded shuffle, the same at every
    step, so each step draws the grid's mix of settings and a bigger step extends the smaller ones' sample. Pure."""
    shuffled = list(points)
    random.Random(seed).shuffle(shuffled)
    return shuffled[:count]


def remaining_points(points: Sequence[Mapping[str, object]], fixed: Mapping[str, object], workload: str,
                     completed: set[str]) -> list[Mapping[str, object]]:
    """The grid points whose own training (not a reseeded copy) the probe did not complete. Pure."""
    return [p for p in points if training_id(workload, {**fixed, **p}) not in completed]


# ---------------- the run ----------------

def run_auto(prepared: Prepared, *, progress: Callable[..., None] | None = None,
             on_step: Callable[[Step], None] | None = None, plots: bool = True) -> Outcome:
    """Probe, choose, and (packing.then=run) run the rest of the grid at the best N; ``Outcome.auto``: the probe."""
    spec, auto, config = auto_parts(prepared)
    root = prepared.run
    report = AutoReport(then=auto.then)
    results: list[PackResult] = []
    with open_run_dir(root, None) as (resumed, _):
        if not resumed:
            write_text_atomic(root.config, config_yaml(config))
        climbing = list(spec.partitions)
        best_so_far: dict[str, int | None] = {p: None for p in climbing}
        for i, n in enumerate(auto.ladder):
            if not climbing:
                break
            step_run = root.probe_step(n)
            plan = step_plan(spec, climbing, n, best_so_far, auto.repeats, reference=auto.ladder[0])
            pending = run_part(prepared, plan, step_run, progress, results)
            if pending is not None:
                return waiting(prepared, report, f"the probe at N={n} in {step_run.root}", pending)
            _judge_step(prepared, auto, report, climbing, best_so_far, step_run, auto.ladder[i:], on_step)
        runs_at, collected = _choose_from_probes(prepared, spec, auto, report)
        if auto.then == RUN and any(v is not None for v in runs_at.values()):
            report.left, production = production_of(spec, runs_at, probe_completed(collected.records))
            report.search = spec.search.n_trials if spec.search is not None else None
            if production is not None:
                run_dir = root.auto_run
                pending = run_part(prepared, production, run_dir, progress, results)
                if pending is not None:
                    return waiting(prepared, report, f"the grid at the best N in {run_dir.root}", pending)
                report.run_dir = str(run_dir.root)
        _write_auto_record(root, auto, report)
    collected, written = collect([root.root], plots=plots)
    return Outcome(prepared, Opened(resumed=False, todo=[], complete=0, queued={}), results=results,
                         collected=collected, written=written, auto=report)


def _judge_step(prepared: Prepared, auto: AutoSpec, report: AutoReport, climbing: list[str],
                best_so_far: dict[str, int | None], step_run: RunDir, ladder: Sequence[int],
                on_step: Callable[[Step], None] | None) -> None:
    """Each climbing partition's verdict on the step of N = ``ladder[0]``: it climbs on, the new N its best so far,
    or stops and says why. This step alone is weighed (paired within its rounds, packs under foreign load left out),
    so drift between steps or inside one cannot decide it."""
    n, rest = ladder[0], ladder[1:]
    records = load_records([step_run.root])
    summary = summarize(records.trainings, records.packs, records.cleared)
    timings = pack_times(records, loaded_packs(records.packs))
    for partition in list(climbing):
        row = _row(summary, partition, n)
        timed = timings.get(partition, Timings({}, {}))
        by_n = weighed(prepared, partition, timed.times, auto.objective)
        why = verdict(n, by_n, best_so_far[partition], int(row.get("oom", 0)), int(row.get("unfinished", 0)),
                      auto.min_gain, int(row.get("skipped_memory", 0)), rounds=timed.rounds)
        if why != "climb" and timed.said:  # what the packs it weighed leave out, or kept, under foreign load
            why += timed.said
        if why == "climb":  # the new N beat the best so far (paired, beyond noise): it is the best now
            best_so_far[partition] = n
            why = next_rung_fits(prepared, partition, rest, records_roots=prepared.run.probe_steps()) \
                or ("climb" if rest else (auto.cut or f"the ladder ends at N={n}"))
        step = Step(partition, n, str(step_run.root), why)
        report.steps.append(step)
        if on_step:
            on_step(step)
        if why != "climb":
            report.stopped[partition] = why
            climbing.remove(partition)


def _choose_from_probes(prepared: Prepared, spec: SweepSpec, auto: AutoSpec, report: AutoReport,
                        ) -> tuple[dict[str, int | None], Collected]:
    """The best N of each partition from every probe step (by time, or by cost), into ``report``; returns the N the
    rest runs at (where no N is named: the ladder's reference, which needs no comparison) and the probes' aggregate."""
    collected = aggregate(prepared.run.probe_steps())
    chosen = {r["partition"]: int(r["factor"]) for _, r in collected.best.iterrows()}
    if auto.objective == "cost":  # the same noise-aware choice, over the RGU billed per training
        chosen = cheapest_n(prepared, collected)
    unnamed = {str(r["partition"]): str(r["no_answer"]) for _, r in collected.withheld.iterrows()}
    report.best = {p: None if p in unnamed else chosen.get(p) for p in spec.partitions}
    report.runs_at = {p: auto.ladder[0] for p in spec.partitions if p in unnamed}
    report.unnamed = {p: why for p, why in unnamed.items() if p in spec.partitions}
    runs_at = {p: report.best[p] if report.best[p] is not None else report.runs_at.get(p) for p in report.best}
    return runs_at, collected


def _write_auto_record(root: RunDir, auto: AutoSpec, report: AutoReport) -> None:
    """auto.json: the ladder and its options, each step's verdict, and what was chosen and run."""
    write_json_atomic(root.auto_record, {
        "schema": 1, "written_at": time.time(), "ladder": list(auto.ladder), "cut": auto.cut,
        "min_gain": auto.min_gain, "repeats": auto.repeats, "then": auto.then,
        "steps": [dataclasses.asdict(s) for s in report.steps], "stopped": report.stopped, "best": report.best,
        "run_dir": report.run_dir, "left": report.left, "search": report.search, "runs_at": report.runs_at,
        "unnamed": report.unnamed})


def settled(prepared: Prepared, step: RunDir, plan: Plan) -> bool:
    """wait=false: every pack of a step has its pack record (a failure or an OOM is what the verdict weighs), so a
    later call decides from it and never submits it again. wait=true resumes a step as any run, failures included."""
    if prepared.wait or not step.plan.exists():
        return False
    records = RunRecords(step)
    return all(records.pack(p.pack_id) is not None for p in plan.packs)


def run_part(prepared: Prepared, plan: Plan, run: RunDir, progress: Callable[..., None] | None,
             results: list[PackResult]) -> Outcome | None:
    """Run a probe step or the grid at the best N in ``run`` unless it has settled, its results added to ``results``;
    its Outcome where it has not ended (wait=false: it submitted packs, or finds some still queued), else None."""
    if settled(prepared, run, plan):
        return None
    outcome = run_plain(sub_prepared(prepared, plan, run), progress=progress, collect_outputs=False)
    results += outcome.results
    return outcome if outcome.submitted or outcome.opened.queued else None


def waiting(prepared: Prepared, report: AutoReport, what: str, step: Outcome) -> Outcome:
    """wait=false: the probe stops at a step whose jobs were just submitted or still run, for a later call."""
    report.waiting = what
    return Outcome(prepared, step.opened, submitted=dict(step.submitted), auto=report)


def auto_parts(prepared: Prepared) -> tuple[SweepSpec, AutoSpec, DictConfig]:
    """An auto sweep's spec, its probe's settings and its config (always gpupack's own: a Hydra batch is never auto)."""
    spec = prepared.spec
    if spec is None or spec.auto is None or not isinstance(prepared.config, DictConfig):
        raise TypeError("packing.factors=auto runs a sweep prepared from gpupack's config (gpupack.sweep.prepare)")
    return spec, spec.auto, prepared.config


def billed_multiple(prepared: Prepared, partition: str, n: int) -> float:
    """How many times its GPU's RGU a pack of N is billed on ``partition`` (its request against the GPU's bundle)."""
    cap = prepared.capacities.get(partition)
    if cap is None:
        return 1.0
    req = prepared.submitter.request(n)
    return bill(Bundle(1.0, cap.bundle_cores, cap.bundle_mem_gb), req.cpus,
                req.mem_mb / 1024 if req.mem_mb else None).multiple


def weighed(prepared: Prepared, partition: str, times: Mapping[int, Sequence[float]],
            objective: str) -> dict[int, list[float]]:
    """Time per training of each N, or (objective cost) what it bills: time x the pack's billed multiple (its GPU's
    RGU is the same at every N of a partition, so the multiple alone orders them)."""
    return {n: [x * billed_multiple(prepared, partition, n) for x in t] if objective == "cost" else list(t)
            for n, t in times.items()}


def cheapest_n(prepared: Prepared, collected: Collected) -> dict[str, int]:
    """Per partition, the time choice's own noise-aware choice of N (among those that ran without an OOM or a
    failure), on each pack's time x its N's billed multiple."""
    summary = collected.summary  # each partition's N blocked as the summary's choice blocks them (with_choices)
    stopped = summary[summary["infeasible"] | (summary["unfinished"] > 0)] if not summary.empty else None
    blocked = {str(p): set(map(int, g["factor"])) for p, g in stopped.groupby("partition")} if stopped is not None \
        else {}
    records = collected.records
    out: dict[str, int] = {}
    for partition, timed in pack_times(records, loaded_packs(records.packs), blocked).items():
        cost = weighed(prepared, partition, timed.times, "cost")
        best = choose(cost, infeasible=blocked.get(partition, set()), rounds=timed.rounds).best
        if best is not None:
            out[partition] = best
    return out


def sub_prepared(prepared: Prepared, plan: Plan, run: RunDir) -> Prepared:
    """A Prepared for one step: the same sweep and backend options, this plan, its own run directory."""
    spec, _, config = auto_parts(prepared)
    factors = sorted({p.factor for p in plan.packs})
    step = dataclasses.replace(spec, auto=None, factors=tuple(factors))  # a step is a plain run
    return dataclasses.replace(part_prepared(prepared, config, plan, run, {"packing": {"factors": list(factors)}}),
                               spec=step)


def next_rung_fits(prepared: Prepared, partition: str, rest: Sequence[int],
                   records_roots: Sequence[Path]) -> str | None:
    """None when the next N fits the partition's memory budget by what was measured so far; else why not."""
    if not rest:
        return None
    spec, _, config = auto_parts(prepared)
    settings = {setting_key({**spec.fixed, **p}, spec.workload.seed_key) for p in expand_grid(spec.grid)}
    measured = find_measured([*records_roots, *candidate_runs(prepared.run.root)], spec.workload_ref, settings,
                             spec.workload.seed_key,
                             devices=target_devices(str(config.packing.device), prepared.capacities, [partition]))
    memory = estimate(config.sweep.training_memory_mb, measured)
    try:
        check_memory([rest[0]], {partition: prepared.capacities[partition]}, memory,
                     float(config.packing.memory_fraction), key=lambda _: "packing.auto.ladder")
    except ConfigError as err:
        return f"N={rest[0]} not tried: {err.why}"
    return None


def probe_completed(records: Records) -> dict[str, set[str]]:
    """Per partition, the training ids the probe completed."""
    t = records.latest()
    if t.empty:
        return {}
    done = t[t["status"] == COMPLETED]
    return {p: set(g["training_id"]) for p, g in done.groupby("partition")}


def production_of(spec: SweepSpec, best: Mapping[str, int | None], completed: Mapping[str, set[str]]
                  ) -> tuple[int, Plan | None]:
    """What runs at the best N and how many trainings it has: the grid points the probe did not complete, or
    (search=optuna) the whole budget: the probe trained the space's midpoint, no trial. Pure."""
    if spec.search is not None:  # the search's lanes at each partition's best N, as packing.factors=[N] plans them
        parts = [search_plan(sweep=spec.name, workload=spec.workload_ref, factor=n, partitions=[partition],
                             modes=spec.modes, jobs=spec.stream_jobs, n_trials=spec.search.n_trials, phase=RUN)
                 for partition, n in best.items() if n is not None]
        return spec.search.n_trials, Plan(
            sweep=spec.name, workload=spec.workload_ref, grid_size=spec.search.n_trials,
            packs=tuple(p for part in parts for p in part.packs),
            notes=tuple(f"{part.packs[0].partition}: {note}" for part in parts for note in part.notes), phase=RUN)
    left = max(len(remaining_points(expand_grid(spec.grid), spec.fixed, spec.workload_ref, completed.get(p, set())))
               for p, n in best.items() if n is not None)
    return left, production_plan(spec, best, completed)


def first_step(prepared: Prepared) -> Plan:
    """What an auto run submits first (a dry run shows its request): the probe's first N on every partition. Pure."""
    spec, auto, _ = auto_parts(prepared)
    return step_plan(spec, spec.partitions, auto.ladder[0], {}, auto.repeats)


def production_plan(spec: SweepSpec, best: Mapping[str, int | None], completed: Mapping[str, set[str]]) -> Plan | None:
    """The grid points the probe did not complete, at each partition's best N (None: nothing left to run)."""
    points = expand_grid(spec.grid)
    packs: list[Pack] = []
    notes: list[str] = []
    for partition, n in best.items():
        if n is None:
            continue
        left = remaining_points(points, spec.fixed, spec.workload_ref, completed.get(partition, set()))
        if not left:
            continue
        part = make_plan(sweep=spec.name, workload=spec.workload_ref, grid=spec.grid, fixed=spec.fixed, factors=[n],
                         modes=spec.modes, partitions=[partition], repeats=1, seed_key=spec.filler_seed,
                         order=spec.order, order_seed=spec.order_seed, points=left, phase=RUN,
                         stream_jobs=spec.streams(production=True), cost=spec.workload.cost)
        packs += part.packs
        notes += [f"{partition}: {note}" for note in part.notes]
    if not packs:
        return None
    return Plan(sweep=spec.name, workload=spec.workload_ref, grid_size=len(points), packs=tuple(packs),
                notes=tuple(notes), order=f"{spec.order} (seed {spec.order_seed})", phase=RUN)


def _row(summary: pd.DataFrame, partition: str, factor: int) -> pd.Series:
    """The summary's row of (partition, N), or an empty one (its counts read as 0) where it has none."""
    none = pd.Series(dtype=object)
    if summary.empty:
        return none
    rows = summary[(summary["partition"] == partition) & (summary["factor"] == factor)]
    return rows.iloc[0] if len(rows) else none

