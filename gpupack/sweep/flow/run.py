"""A sweep with fixed packing factors: prepare (compose → validate → plan, writing nothing), then run (open the run
directory, submit what is left, wait, collect). :mod:`gpupack.sweep.flow.auto` builds on this."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import errno
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from gpupack.core.memory.figures import candidate_runs, find_measured
from gpupack.core.plan import Pack, Plan, again_packs
from gpupack.core.store.journal import RunRecords
from gpupack.core.store.records import SKIPPED_MEMORY, make_dirs, read_json, write_json_atomic, write_text_atomic
from gpupack.core.store.rundir import HeldLocks, Holder, RunDir, RunLock, check_name, files_forecast
from gpupack.core.store.storage import storage_error
from gpupack.core.types import Capacity, PackResult, PackSettings
from gpupack.core.warm import warm
from gpupack.errors import GpupackError, RunDirError
from gpupack.search.progress import SearchProgress, read_progress
from gpupack.search.study import Study, search_left
from gpupack.submit import ClusterConfig, ProgressFn, Submitter, load_submitter
from gpupack.sweep.setup.compose import compose_config
from gpupack.sweep.setup.validate import (
    ClusterFacts,
    SweepSpec,
    measured_first,
    requested_partitions,
    require_sweep,
    validate,
)

if TYPE_CHECKING:  # collect's tables and plots (pandas, matplotlib) are imported when a run is collected
    from gpupack.results.analysis.aggregate import Collected
    from gpupack.sweep.flow.collect import AutoReport


@dataclass
class Prepared:
    """A checked sweep, ready to run: its plan, where it goes, and the backend that runs it. Nothing is written yet."""

    name: str
    plan: Plan
    run: RunDir
    submitter: Submitter[ClusterConfig]
    settings: PackSettings
    config: DictConfig | Mapping[str, object]  # what config.yaml records
    wait: bool = True
    spec: SweepSpec | None = None  # the validated sweep, when prepared from gpupack's own config
    capacities: Mapping[str, Capacity] = field(default_factory=dict)  # what the backend said each partition holds
    warnings: tuple[str, ...] = ()  # for the user before anything runs (e.g. a request leaving GPUs idle)
    # the user named the run directory (run_dir=...): a choice, so no earlier run beside it is looked for (beside)
    chosen_dir: bool = True

    def resumes(self) -> bool:
        """True when the run directory already holds this plan (it reads it, and refuses another sweep's)."""
        return check_run_dir(self.run, self.plan)


@dataclass
class Opened:
    """What :func:`run` found in the run directory, before submitting anything."""

    resumed: bool
    todo: list[Pack]  # packs to submit now
    complete: int  # packs whose every training already has a completed record
    queued: dict[str, str]  # pack id → job id still queued or running from an earlier submission


@dataclass
class Outcome:
    prepared: Prepared
    opened: Opened
    submitted: dict[str, str] = field(default_factory=dict)  # wait=false: pack id → job id
    results: list[PackResult] = field(default_factory=list)  # wait=true: how each pack's job ended
    collected: Collected | None = None
    written: list[Path] = field(default_factory=list)
    auto: AutoReport | None = None  # packing.factors=auto: what the probe did

    @property
    def run_dir(self) -> Path:
        return self.prepared.run.root

    @property
    def failed_trainings(self) -> int:
        """Trainings whose latest record did not complete: packed ones and those spread over k devices."""
        if self.collected is None:
            return 0
        return sum(int(frame["unfinished"].sum()) for frame in (self.collected.summary, self.collected.spread)
                   if not frame.empty and "unfinished" in frame)

    @property
    def search(self) -> SearchProgress | None:
        """search=optuna: where its study stands (the run's, or packing.factors=auto's at the best N); else None."""
        if self.auto is not None and self.auto.run_dir:
            return read_progress(RunDir(Path(self.auto.run_dir)).study)
        prepared: Prepared | None = self.prepared  # None: an outcome judged from its records alone
        return read_progress(prepared.run.study) if prepared is not None else None

    @property
    def ok(self) -> bool:
        search = self.search
        if self.auto is not None:  # a probe stopping at an OOM or a failure is an answer, not a failed run
            production = self.collected.production if self.collected is not None else None
            unfinished = int(production["unfinished"].sum()) if production is not None and not production.empty else 0
            answered = any(n is not None for n in self.auto.best.values()) or bool(self.auto.runs_at)  # no N named,
            return answered and unfinished == 0 and (search is None or search.ok)  # the rest run at the reference
        if search is not None:  # no planned training to count: the study's trials against its budget
            return all(r.ok for r in self.results) and search.ok
        # done only where every training of the plan has its record: one held by a claim no lane runs, or a pack
        # whose job died unseen, leaves trainings with none, and no failed row says so
        counted = self.collected is None or self.collected.records.plan_counts().done
        return all(r.ok for r in self.results) and self.failed_trainings == 0 and counted


def default_run_dir(sweep: str) -> Path:
    return Path("runs") / sweep / _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def ask_submitter(submitter: Submitter[ClusterConfig], requested_partitions: Sequence[str]) -> ClusterFacts:
    """The submitter's answers, asked once: partitions, its own options, what each partition's pack job can have."""
    partitions = submitter.resolve_partitions(list(requested_partitions))
    for i, name in enumerate(partitions):
        check_name(f"partitions[{i}]", name)
    submitter.check(partitions)
    return ClusterFacts(partitions=partitions, capacities=submitter.capacities(partitions), request=submitter.request,
                        stream_jobs=submitter.stream_jobs)


def prepare_run(submitter: Submitter[ClusterConfig], partitions: Sequence[str],
                check: Callable[[ClusterFacts], Prepared]) -> Prepared:
    """The one preparation of a sweep, whichever front-end read its config (:func:`prepare`, a Hydra launcher's):
    the submitter's answers asked once, ``check`` against them (every value checked, the plan made). Writes nothing."""
    facts = ask_submitter(submitter, partitions)
    prepared = check(facts)
    prepared.capacities = dict(facts.capacities)
    memory = prepared.spec.memory if prepared.spec is not None else None
    if memory is not None:  # what SLURM requests are sized by (measured), or what they say of the records (a default)
        submitter.measured_host_mb = memory.host
    if not prepared.wait:
        submitter.require_detachable()  # said before anything is written
    return prepared


def prepare(overrides: Sequence[str] = (), *, cfg: DictConfig | None = None) -> Prepared:
    """gpupack's own config: compose (unless ``cfg`` is given), then :func:`prepare_run` with validate as its check."""
    cfg = compose_config(overrides) if cfg is None else cfg
    require_sweep(cfg)
    cfg = measured_first(cfg)  # a search given several N measures them first
    # sweep.name is checked with every other value (validate), before anything is written
    run = RunDir(Path(cfg.run_dir) if cfg.run_dir else default_run_dir(str(cfg.sweep.name)))
    submitter = load_submitter(cfg.cluster.backend, cfg.cluster, run)

    def check(facts: ClusterFacts) -> Prepared:
        spec = validate(cfg, facts, measure=lambda workload, settings, seed_key: find_measured(
            candidate_runs(run.root), workload, settings, seed_key,
            devices=target_devices(str(cfg.packing.device), facts.capacities, facts.partitions)))
        return Prepared(name=spec.name, plan=spec.plan(), run=run, submitter=submitter, settings=spec.settings,
                        config=cfg, wait=bool(cfg.wait), spec=spec, warnings=spec.warnings,
                        chosen_dir=bool(cfg.run_dir))

    return prepare_run(submitter, requested_partitions(cfg.partitions), check)


def target_devices(device: str, capacities: Mapping[str, Capacity], partitions: Sequence[str]) -> list[str | None]:
    """The device model each of ``partitions``' trainings run on (what earlier records that size them were measured
    on): the partition's, or the CPU where packing.device is cpu."""
    if device == "cpu":
        return ["cpu"]
    return [capacities[p].device if p in capacities else None for p in partitions]


def forecast(prepared: Prepared) -> list[str]:
    """What the run will make, said before it starts: its jobs against what the site lets the user queue, and about
    how many files its run directory will hold."""
    plan, jobs = prepared.plan, prepared.submitter.job_forecast(prepared.plan.packs)
    arrays = (f" in {jobs.arrays} job array(s)" + (f" of at most {jobs.max_array_size:,} tasks (MaxArraySize)"
                                                    if jobs.max_array_size else "")) if jobs.arrays else ""
    turns = "one at a time on each GPU" if jobs.gpus > jobs.jobs else "in turn"
    lanes = f" (lanes of packs: up to {-(-jobs.packs // jobs.jobs):,} packs each, {turns})" \
        if jobs.packs > jobs.jobs and not jobs.over else ""
    gpus = f", {jobs.gpus:,} GPUs in all" if jobs.gpus > jobs.jobs else ""
    if jobs.idle_gpus:
        gpus += (f", of which {jobs.idle_gpus:,} get no pack (a job's GPUs outnumber its packs: more repeats, or "
                 "fewer gpus_per_job)")
    line = f"jobs: {jobs.jobs:,}{lanes}{arrays}{gpus}"
    if jobs.allowed is not None:
        line += (f"; the site lets you queue {'up to ' if jobs.queued is None else ''}{jobs.allowed:,} more now "
                 f"({jobs.limit}, {jobs.queued_text()})"
                 + (": as it stands, submitting refuses it whole" if jobs.over else ""))
    streams = any(p.stream is not None for p in plan.packs)
    folded = jobs.folds and (jobs.jobs < len(plan.packs) or streams)  # lanes of packs, or streaming lanes
    searched = any(p.search for p in plan.packs)  # its trials are its trainings, and the study
    trainings = plan.grid_size if searched else plan.n_trainings
    files = files_forecast(trainings, len(plan.packs), jobs.jobs, folded) + searched
    each = files / max(1, trainings)
    return [line, f"files: about {files:,} in the run directory ({each:.{1 if each >= 1 else 3}f} per "
            + ("trial" if searched else "training")
            + ((", each lane's trainings folded into its journal)" if streams else
                ", each lane's packs folded into its journal)") if folded else ")")]


# ---------------- the run directory ----------------

def check_run_dir(run: RunDir, plan: Plan | None) -> bool:
    """Read-only: True when the run directory holds this same sweep (a resume); refuse one holding another. ``plan``
    None: a ``packing.factors=auto`` root (config.yaml, auto.json, probe/, run/: no plan.json of its own)."""
    if plan is None:
        if run.plan.exists():
            raise RunDirError(f"run_dir={str(run.root)!r} holds a sweep with fixed packing factors. HINT: choose a "
                              "new run_dir=... for packing.factors=auto")
        if run.config.exists():
            if OmegaConf.select(OmegaConf.load(run.config), "packing.factors") != "auto":
                raise RunDirError(f"run_dir={str(run.root)!r} holds another sweep. HINT: choose a new run_dir=...")
            return True
    elif run.plan.exists():
        try:
            earlier = read_json(run.plan)
        except (OSError, ValueError):
            raise RunDirError(f"run_dir={str(run.root)!r}: plan.json is unreadable. HINT: choose a new "
                              "run_dir=...") from None
        try:
            same = Plan.from_json(earlier).same_sweep(plan)
        except (KeyError, TypeError):
            same = False
        if not same:
            raise RunDirError(f"run_dir={str(run.root)!r} holds another sweep's plan. HINT: choose a new "
                              "run_dir=..., or re-run with the exact config of that run to resume it")
        return True
    if not run.holds_only_lock():
        raise RunDirError(f"run_dir={str(run.root)!r} exists and is not a gpupack run. HINT: choose a new "
                          "or empty run_dir=...")
    return False


@dataclass(frozen=True)
class Beside:
    """A run directory of the same sweep beside the one a command starts: unfinished (stopped), or running (a sweep
    of this host holds its lock)."""

    root: Path
    complete: int  # packs complete, as its resume would count them (packs_to_run)
    packs: int
    holder: Holder | None = None  # who holds its lock: it runs
    submitted: bool = False  # it submitted jobs to a queue (jobs.json): they may still run there


BESIDE_LOOKED = 4  # the newest run directories beside a new one that are read: a few plans, never a whole history


def unfinished_beside(prepared: Prepared) -> list[Beside]:
    """The runs of this same sweep, unfinished or running, among the BESIDE_LOOKED newest run directories beside the one
    ``prepared`` starts, newest first; none where the user chose run_dir=, or for packing.factors=auto (its root has no
    plan). Reads plans and records only: no lock is taken, no queue asked."""
    if prepared.chosen_dir or (prepared.spec is not None and prepared.spec.auto is not None):
        return []
    held: HeldLocks | None = None  # this host's lock table, read once and only where a same sweep is found
    found = []
    for other in prepared.run.siblings()[:BESIDE_LOOKED]:
        try:
            earlier = Plan.from_json(read_json(other.plan))
            if not earlier.same_sweep(prepared.plan):
                continue
        except (OSError, ValueError, KeyError, TypeError):  # unreadable, or no plan gpupack reads: not this sweep's
            continue
        held = held or HeldLocks()
        holder = held.holder(other.lock)
        if holder is None and not unrecorded(other, earlier):
            continue  # ended: every training has its record (some may have failed)
        todo = packs_to_run(other, earlier)
        found.append(Beside(other.root, len(earlier.packs) - len(todo), len(earlier.packs), holder,
                            other.jobs.exists()))
    return found


def unrecorded(run: RunDir, plan: Plan) -> bool:
    """Some training of ``plan`` has no record yet in ``run`` (one skipped for memory, once its refit pack recorded
    it, has): the run was stopped before its end, or still runs."""
    records = RunRecords(run)

    def recorded(pack_id: str, training_id: str) -> bool:
        rec = records.current(pack_id, training_id)
        return rec is not None and not (rec.get("status") == SKIPPED_MEMORY and rec.get("runs_in"))

    return not all(recorded(p.pack_id, t.training_id) for p in plan.packs for t in p.trainings)


@contextlib.contextmanager
def open_run_dir(run: RunDir, plan: Plan | None) -> Iterator[tuple[bool, RunLock]]:
    """The one opener of a run directory, a plain run's (``plan``) or a ``packing.factors=auto`` root's (None): make
    it and hold its lock while the caller runs; yields whether it resumes the same sweep, and the lock. A directory
    holding another sweep is refused, never overwritten.

    The lock comes before the look, so two commands started at once never read each other's half-written directory;
    only a directory no gpupack ever locked is looked at first, so a folder of the user's own gets no lock file. Its
    writability is the lock file itself and os.access: no probe file two commands could share."""
    if run.root.exists() and not run.lock.exists():
        check_run_dir(run, plan)  # another sweep's, or the user's own: refused before anything is written in it
    try:
        make_dirs(run.root)
        lock = RunLock(run).__enter__()
    except OSError as err:
        raise opening_fault(run, err) from None
    try:
        resumed = check_run_dir(run, plan)  # under the lock: no other gpupack writes here now
        if not resumed and not os.access(run.root, os.W_OK | os.X_OK):
            raise opening_fault(run, PermissionError(errno.EACCES, os.strerror(errno.EACCES)))
        yield resumed, lock
    finally:
        lock.__exit__()


def opening_fault(run: RunDir, err: OSError) -> GpupackError:
    """Why a run directory cannot be opened: a full disk or quota as storage_error says it; else, choose another."""
    fault = storage_error(err, run.root) if err.errno in (errno.ENOSPC, errno.EDQUOT) else None
    return fault or RunDirError(f"run_dir={str(run.root)!r} is not writable ({err.strerror}). HINT: choose a "
                                "writable run_dir=...")


def packs_to_run(run: RunDir, plan: Plan) -> list[Pack]:
    """The plan minus the packs whose every training has a completed record and that have their own record (a lost
    one is rebuilt by the pack's run); a streaming queue's lanes all run again while any of its trainings or lanes
    has none, each releasing the claims its own earlier run left."""
    records = RunRecords(run)  # a pack's folder, else its lane's journal

    def done(p: Pack) -> bool:  # every training ran, here or in a refit of it
        return all(records.ran(p.pack_id, t.training_id) for t in p.trainings) and records.pack(p.pack_id) is not None

    unfinished = {p.stream for p in plan.packs if p.stream is not None and not done(p)}
    if search_left(run.study):  # a search's lanes run again while its study has trials to run or to tell
        unfinished |= {p.stream for p in plan.packs if p.stream is not None}
    return [p for p in plan.packs if (p.stream in unfinished if p.stream is not None else not done(p))]


def config_yaml(config: DictConfig | Mapping[str, object]) -> str:
    """What config.yaml records: the composed config, resolved (a front-end's own mapping as it is)."""
    if isinstance(config, DictConfig):
        return OmegaConf.to_yaml(config, resolve=True)
    return OmegaConf.to_yaml(OmegaConf.create(dict(config)))


# ---------------- run ----------------

# What a run's collect imports (about a second here), as import statements: the layers contract sees each of them.
def _import_tables() -> None:
    import pandas  # noqa: F401  (half of collect's imports)
    import pyarrow.parquet  # noqa: F401


def _import_collect() -> None:
    import gpupack.sweep.flow.collect  # noqa: F401


def _import_plots() -> None:  # without pyplot: results.report.plots picks the headless backend before importing it
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401


COLLECT_IMPORTS = (_import_tables, _import_collect, _import_plots)  # a run that draws nothing leaves out the last


def run_plain(prepared: Prepared, *, progress: ProgressFn | None = None,
              on_open: Callable[[Opened], None] | None = None, collect_outputs: bool = True,
              plots: bool = True) -> Outcome:
    """:func:`gpupack.sweep.run` for fixed packing factors."""
    run_dir, plan, submitter = prepared.run, prepared.plan, prepared.submitter
    with open_run_dir(run_dir, plan) as (resumed, lock):
        submitter.lock = lock  # the local backend's jobs hold it with this command (RunLock)
        if not run_dir.config.exists():
            write_text_atomic(run_dir.config, config_yaml(prepared.config))
            write_json_atomic(run_dir.plan, plan.to_json())
        if resumed:  # the order the run was planned in (an earlier gpupack's plan may order its packs otherwise)
            plan = Plan.from_json(read_json(run_dir.plan))
        # its lanes ask it (gpupack.search.study); a probe for N (packing.factors=auto) trains no trial of it
        if prepared.spec is not None and prepared.spec.search is not None and any(
                p.search for p in plan.packs):
            grew = Study(run_dir.study).create(prepared.spec.search, plan.workload, prepared.spec.fixed)
            if grew:
                print(f"gpupack: the search is extended ({'; '.join(grew)}): its lanes run the new trials only",
                      file=sys.stderr)
        todo = packs_to_run(run_dir, plan)
        lanes = {p.pack_id: p.factor for p in todo if p.search}
        if lanes and prepared.spec is not None and prepared.spec.search is not None:  # a fresh study's first trials
            Study(run_dir.study).plan_first(lanes)
        queued = submitter.active_packs() if resumed else {}
        opened = Opened(resumed=resumed, todo=[p for p in todo if p.pack_id not in queued],
                        complete=len(plan.packs) - len(todo), queued=queued)
        if on_open:
            on_open(opened)
        outcome = Outcome(prepared, opened)
        if not prepared.wait:
            outcome.submitted = submitter.detach(opened.todo, prepared.settings)
            return outcome
        # collect's imports, made while the first jobs start and stopped once one has begun a pack: from then on their
        # CPU would be load beside the trainings measured on this host (gpupack.results.analysis.disturbance)
        began = lambda: any(run_dir.pack_dir(p.pack_id).is_dir() for p in opened.todo)  # noqa: E731
        imports = COLLECT_IMPORTS if plots else COLLECT_IMPORTS[:-1]
        warming = warm(imports if collect_outputs else (), began, "gpupack-collect-imports")
        outcome.results = submitter.run_packs(opened.todo, prepared.settings, progress or (lambda pack, state: None))
        warming.join()
        if collect_outputs:
            from gpupack.sweep.flow.collect import collect

            outcome.collected, outcome.written = collect([run_dir.root], plots=plots)
            measure_again(prepared, plan, outcome, progress, plots)
    return outcome


def measure_again(prepared: Prepared, plan: Plan, outcome: Outcome, progress: ProgressFn | None,
                  plots: bool) -> None:
    """packing.remeasure: where the run names no best N for a partition, the rounds measured under foreign load are
    measured again in RUN_DIR/again/NN/ (the same packs on new seeds) and the run is collected with them, up to that
    many times, never where no round was disturbed (the same set-up would answer the same). A resume resumes a
    measurement begun. ``outcome`` takes the packs' results and the new collection."""
    from gpupack.results.analysis.disturbance import disturbed_rounds
    from gpupack.sweep.flow.collect import collect

    config = prepared.config
    if prepared.spec is None or not isinstance(config, DictConfig):  # a Hydra launcher's batch names no best N
        return
    budget = int(config.packing.remeasure)
    base_plan, base = plan, prepared.run
    for k in range(1, budget + 1):
        collected = outcome.collected
        if collected is None or collected.withheld.empty:
            return
        again = prepared.run.again(k)
        if again.plan.exists():
            again_plan = Plan.from_json(read_json(again.plan))
        else:
            partitions = set(map(str, collected.withheld["partition"]))
            disturbed = disturbed_rounds(collected.records.packs, str(base.root))
            asked = {r for partition in partitions for r in disturbed.get(partition, ())}
            if not asked:
                return
            packs = again_packs(base_plan, asked, partitions, k, prepared.spec.filler_seed)
            again_plan = dataclasses.replace(base_plan, packs=tuple(packs), notes=(
                f"measured again ({k} of packing.remeasure={budget}): no best N could be named, so the "
                f"{len(asked)} round(s) measured under foreign load run again on new seeds",))
        # its config.yaml says it measures nothing again itself
        sub = run_plain(part_prepared(prepared, config, again_plan, again, {"packing": {"remeasure": 0}}),
                        progress=progress, collect_outputs=False)
        outcome.results += sub.results
        outcome.collected, outcome.written = collect([prepared.run.root], plots=plots)
        base_plan, base = again_plan, again


def part_prepared(prepared: Prepared, config: DictConfig, plan: Plan, run: RunDir,
                  overrides: dict[str, dict[str, object]]) -> Prepared:
    """A Prepared for a part of a sweep run in its own directory (an auto step, rounds measured again): the same
    options with ``overrides``, this plan, a backend of its own there."""
    merged = OmegaConf.merge(config, {"run_dir": str(run.root)}, overrides)
    assert isinstance(merged, DictConfig)  # a DictConfig merged with a dict stays one (not user input)
    submitter = load_submitter(config.cluster.backend, config.cluster, run)
    submitter.measured_host_mb = prepared.submitter.measured_host_mb
    return dataclasses.replace(prepared, plan=plan, run=run, submitter=submitter, config=merged)
