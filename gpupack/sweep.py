"""The one owner of gpupack's flow, printing nothing: prepare → run → status → collect, on typed objects.

    prepared = prepare(["+sweep=mnist_pack", "packing.factors=[1,2]"])   # compose → validate → plan; writes nothing
    outcome = run(prepared)                                               # run dir, lock, resume, submit, wait, collect
    status(outcome.run_dir); collect([outcome.run_dir])

The CLI (:mod:`gpupack.cli`) parses arguments and prints what these return; the Hydra launcher plugin
(``hydra_plugins.gpupack_launcher``) builds its own :class:`Prepared` from a Hydra multirun and calls :func:`run`;
a notebook calls them directly.
"""
from __future__ import annotations

import datetime as _dt
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from gpupack import collect as collect_mod
from gpupack.compose import compose_config
from gpupack.errors import RunDirError
from gpupack.memory import candidate_runs, find_measured
from gpupack.pack import Capacity
from gpupack.pack.job import PackSettings
from gpupack.plan import Pack, Plan
from gpupack.records import OOM, is_completed, make_dirs, read_json, write_json_atomic, write_text_atomic
from gpupack.rundir import RunDir, RunLock, check_name
from gpupack.submit import DONE, FAILED, PENDING, RUNNING, PackResult, ProgressFn, Submitter, load_submitter
from gpupack.validate import ClusterFacts, require_sweep, validate

__all__ = ["Prepared", "Opened", "Outcome", "PackStatus", "RunStatus", "prepare", "ask_backend", "run", "status",
           "collect", "clear_oom", "default_run_dir"]


@dataclass
class Prepared:
    """A checked sweep, ready to run: its plan, where it goes, and the backend that runs it. Nothing is written yet."""

    name: str
    plan: Plan
    run: RunDir
    backend: Submitter
    settings: PackSettings
    config: Any  # what config.yaml records (a DictConfig or a plain mapping)
    wait: bool = True
    spec: Any = None  # the validated SweepSpec, when prepared from gpupack's own config
    capacities: Mapping[str, Capacity] = field(default_factory=dict)  # what the backend said each partition holds
    warnings: tuple[str, ...] = ()  # for the user before anything runs (e.g. a request leaving GPUs idle)

    @property
    def resumes(self) -> bool:
        """True when the run directory already holds this plan (read-only; a different plan is refused)."""
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
    collected: collect_mod.Collected | None = None
    written: list[Path] = field(default_factory=list)
    auto: Any = None  # packing.factors=auto: what the probe did (gpupack.auto.AutoReport)

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
    def ok(self) -> bool:
        if self.auto is not None:  # a probe stopping at an OOM or a failure is an answer, not a failed run
            production = self.collected.production if self.collected is not None else None
            unfinished = int(production["unfinished"].sum()) if production is not None and not production.empty else 0
            return any(n is not None for n in self.auto.best.values()) and unfinished == 0
        return all(r.ok for r in self.results) and self.failed_trainings == 0


def default_run_dir(sweep: str, now: _dt.datetime | None = None) -> Path:
    stamp = (now or _dt.datetime.now()).strftime("%Y-%m-%d_%H-%M-%S")
    return Path("runs") / sweep / stamp


def ask_backend(backend: Submitter, requested_partitions: Sequence[str]) -> ClusterFacts:
    """The backend's answers, asked once: partitions, its own options, what each partition's pack job can have."""
    partitions = backend.resolve_partitions(list(requested_partitions))
    for i, name in enumerate(partitions):
        check_name(f"partitions[{i}]", name)
    backend.check(partitions)
    return ClusterFacts(partitions=partitions, capacities=backend.capacities(partitions), request=backend.request)


def prepare(overrides: Sequence[str] = (), *, cfg: DictConfig | None = None) -> Prepared:
    """Compose (unless ``cfg`` is given), validate against the backend's answers and plan. Writes nothing."""
    cfg = compose_config(overrides) if cfg is None else cfg
    require_sweep(cfg)
    run = RunDir(Path(cfg.run_dir) if cfg.run_dir else default_run_dir(check_name("sweep.name", cfg.sweep.name)))
    backend = load_submitter(cfg.cluster.backend, cfg.cluster, run)
    facts = ask_backend(backend, cfg.partitions)
    spec = validate(cfg, facts, measure=lambda workload, settings, seed_key: find_measured(
        candidate_runs(run.root), workload, settings, seed_key))
    if spec.memory is not None and spec.memory.host.measured:
        backend.measured_host_mb = spec.memory.host.mb  # what SLURM requests are sized by
    if not cfg.wait:
        backend.require_detachable()  # said before anything is written
    return Prepared(name=spec.name, plan=spec.plan(), run=run, backend=backend, settings=spec.settings, config=cfg,
                    wait=bool(cfg.wait), spec=spec, capacities=dict(facts.capacities), warnings=spec.warnings)


# ---------------- the run directory ----------------

def check_run_dir(run: RunDir, plan: Plan) -> bool:
    """Read-only: True when the run directory holds this same plan (a resume); refuse one holding another."""
    if run.plan.exists():
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
    if run.root.exists() and any(p.name != ".lock" for p in run.root.iterdir()):
        raise RunDirError(f"run_dir={str(run.root)!r} exists and is not a gpupack run. HINT: choose a new "
                          "or empty run_dir=...")
    return False


def prepare_run_dir(run: RunDir, plan: Plan) -> bool:
    """Make the run directory usable; True when it resumes an earlier run of the same plan.

    A directory holding a different plan is refused, never overwritten.
    """
    if check_run_dir(run, plan):
        return True
    try:
        make_dirs(run.root)
        probe = run.root / ".write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise RunDirError(f"run_dir={str(run.root)!r} is not writable ({err.strerror}). HINT: choose a "
                          "writable run_dir=...") from None
    return False


def packs_to_run(run: RunDir, plan: Plan) -> list[Pack]:
    """The plan minus the packs whose every training has a completed record."""
    return [p for p in plan.packs
            if not all(is_completed(run.training_record(p.pack_id, t.training_id)) for t in p.trainings)]


def _config_yaml(config: Any) -> str:
    if isinstance(config, DictConfig):
        return OmegaConf.to_yaml(config, resolve=True)
    return OmegaConf.to_yaml(OmegaConf.create(dict(config)))


# ---------------- run ----------------

def run(prepared: Prepared, *, progress: ProgressFn | None = None, on_open: Callable[[Opened], None] | None = None,
        collect_outputs: bool = True, plots: bool = True, on_step: Callable[[Any], None] | None = None) -> Outcome:
    """Open the run directory (resume or refuse, lock), submit what is left, and — unless the sweep detaches —
    wait for it and collect. ``on_open`` sees what was found before anything is submitted."""
    if prepared.spec is not None and prepared.spec.auto is not None:
        from gpupack.auto import run_auto  # packing.factors=auto: probe for the best N, then run the grid at it

        return run_auto(prepared, progress=progress, plots=plots, on_step=on_step)
    run_dir, plan, backend = prepared.run, prepared.plan, prepared.backend
    resumed = prepare_run_dir(run_dir, plan)
    with RunLock(run_dir):
        if not run_dir.config.exists():
            write_text_atomic(run_dir.config, _config_yaml(prepared.config))
            write_json_atomic(run_dir.plan, plan.to_json())
        if resumed:  # the order the run was planned in (an earlier gpupack's plan may order its packs otherwise)
            plan = Plan.from_json(read_json(run_dir.plan))
        todo = packs_to_run(run_dir, plan)
        queued = backend.active_packs() if resumed else {}
        opened = Opened(resumed=resumed, todo=[p for p in todo if p.pack_id not in queued],
                        complete=len(plan.packs) - len(todo), queued=queued)
        if on_open:
            on_open(opened)
        outcome = Outcome(prepared, opened)
        if not prepared.wait:
            outcome.submitted = backend.detach(opened.todo, prepared.settings)
            return outcome
        outcome.results = backend.run_packs(opened.todo, prepared.settings, progress or (lambda pack, state: None))
        if collect_outputs:
            outcome.collected, outcome.written = collect([run_dir.root], plots=plots)
    return outcome


# ---------------- status ----------------

@dataclass
class PackStatus:
    pack_id: str
    partition: str
    state: str  # pending | running | done | failed | stopped | submitted | not submitted | unknown
    done: int  # trainings with a completed record
    trainings: int
    job_id: str | None = None


@dataclass
class RunStatus:
    run_dir: Path
    sweep: str
    packs: list[PackStatus]
    queue_answered: bool = True

    def counts(self) -> dict[str, Counter[str]]:
        out: dict[str, Counter[str]] = {}
        for p in self.packs:
            out.setdefault(p.partition, Counter())[p.state] += 1
        return out


STOPPED = "stopped"  # started here and ended with no pack record (stopped or killed mid-run): resume it


def pack_status(pack: Pack, done: int, has_record: bool, job_id: str | None,
                states: Mapping[str, str] | None, started: bool = False) -> str:
    """Where one pack stands, from its records first and the queue (gpupack states) for the rest; ``started``: its
    job body began here (its folder exists), which a backend that keeps no job ids (local) tells no other way. Pure."""
    if done == len(pack.trainings):
        return DONE
    if job_id is None:
        return FAILED if has_record else STOPPED if started else "not submitted"
    if states is None:
        return "unknown"
    queue = states.get(job_id)
    if queue in (PENDING, RUNNING):
        return queue
    if queue is None:
        return FAILED if has_record else "submitted"  # sacct does not know it yet, or no longer
    return FAILED  # the job ended (done or failed) and left trainings without a completed record


def status(run_dir: Path | str) -> RunStatus:
    """Where each pack of a run stands: from its records, and from the backend's queue for the rest."""
    run = RunDir(Path(run_dir))
    if not run.root.is_dir():
        raise RunDirError(f"RUN_DIR={str(run.root)!r}: not a directory. HINT: python -m gpupack status "
                          "runs/<sweep>/<date>_<time>")
    if not run.plan.exists():
        subs = [p for p in find_runs([run.root]) if p != run.root and (p / "plan.json").exists()]
        if subs:  # packing.factors=auto (probe/nNN/, run/) or a Hydra multirun (.gpupack/launch_*): each one's packs
            parts = [status(p) for p in subs]
            return RunStatus(run.root, parts[0].sweep, [p for part in parts for p in part.packs],
                             queue_answered=all(part.queue_answered for part in parts))
        raise RunDirError(f"RUN_DIR={str(run.root)!r} has no plan.json. HINT: give the directory a sweep printed")
    plan = Plan.from_json(read_json(run.plan))
    cfg = OmegaConf.load(run.config)
    backend = load_submitter(cfg.cluster.backend, cfg.cluster, run)
    jobs = backend.jobs()
    states = backend.pack_states([j["job_id"] for j in jobs.values()])
    packs = []
    for p in plan.packs:
        done = sum(is_completed(run.training_record(p.pack_id, t.training_id)) for t in p.trainings)
        job = jobs.get(p.pack_id, {}).get("job_id")
        state = pack_status(p, done, run.pack_record(p.pack_id).exists(), job, states,
                            started=run.pack_dir(p.pack_id).is_dir())
        packs.append(PackStatus(p.pack_id, p.partition, state, done, len(p.trainings), job))
    return RunStatus(run.root, plan.sweep, packs, queue_answered=states is not None)


# ---------------- collect ----------------

def collect(run_dirs: Sequence[Path | str], *, weights: Mapping[str, float] | None = None,
            sweep_trainings: int | None = None, out: Path | str | None = None,
            plots: bool = True) -> tuple[collect_mod.Collected, list[Path]]:
    """Aggregate the records of one or more runs and write the derived outputs (into ``out``, default the first
    run directory). Records are only read."""
    given = [Path(d) for d in run_dirs]
    c = collect_mod.aggregate(find_runs(given), weights, sweep_trainings)
    from gpupack.auto import read_auto

    for path in given:  # a packing.factors=auto run says what its probe did
        report = read_auto(path)
        if report is not None:
            c.auto_lines += report.lines()
    from gpupack.report import write_outputs  # the files a person reads; report builds on collect, never back

    written = write_outputs(c, Path(out) if out else given[0], plots=plots) if given else []
    return c, written


def find_runs(paths: Sequence[Path], depth: int = 3) -> list[Path]:
    """The run directories given, or found beneath a folder that is not one itself (a Hydra multirun directory
    holds one per launch under .gpupack/; runs/<sweep>/ holds one per date)."""
    out: list[Path] = []
    for path in paths:
        if (path / "plan.json").exists() or not path.is_dir():
            out.append(path)
            continue
        found = sorted({p.parent for k in range(1, depth + 1) for p in path.glob("/".join(["*"] * k) + "/plan.json")})
        out += found or [path]
    return out


# ---------------- clearing OOMs ----------------

def clear_oom(run_dir: Path | str, *, partition: str | None = None, mode: str | None = None,
              factor: int | None = None) -> int:
    """Let N that ran out of memory count again (after the user changed what made them: a smaller batch, another
    GPU): the OOM records so far that match are no longer counted as infeasible. Nothing is deleted — the records
    stay, and RUN_DIR/cleared_oom.json says what was cleared and when. Returns how many OOM records it clears."""
    run = RunDir(Path(run_dir))
    if not run.plan.exists():
        raise RunDirError(f"RUN_DIR={str(run.root)!r} has no plan.json. HINT: give the directory a sweep printed")
    records = collect_mod.load_records([run.root])
    t = records.trainings
    if t.empty:
        return 0
    entry = {"partition": partition, "mode": mode, "factor": factor, "cleared_at": time.time()}
    # What this entry would clear that no earlier one did: the same rule collect applies (cleared_mask).
    match = (t["status"] == OOM) & ~collect_mod.cleared_mask(t, records.cleared) \
        & collect_mod.cleared_mask(t, [{**entry, "run_dir": str(run.root)}])
    if match.any():
        path = run.root / collect_mod.CLEARED_OOM
        write_json_atomic(path, {"cleared": collect_mod.read_cleared(run) + [entry]})
    return int(match.sum())
