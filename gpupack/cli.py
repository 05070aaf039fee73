"""``python -m gpupack +sweep=NAME [overrides]`` runs a sweep; ``python -m gpupack collect RUN_DIR`` re-collects.

config (Hydra) → validate → plan → run directory → submit (one job per pack) → collect.
Nothing is written or submitted until the whole config has been checked.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Sequence

from omegaconf import OmegaConf
from rich.console import Console
from rich.live import Live
from rich.table import Table

from gpupack import collect as collect_mod
from gpupack.compose import compose_config
from gpupack.errors import GpupackError, RunDirError
from gpupack.plan import Pack, Plan
from gpupack.records import is_completed, read_json, write_json_atomic
from gpupack.rundir import RunDir, RunLock, check_name
from gpupack.submit import load_submitter
from gpupack.validate import require_sweep, validate

USAGE = """usage:
  python -m gpupack +sweep=NAME [key=value ...]   run a sweep (conf/sweep/NAME.yaml), e.g. +sweep=mnist_pack
  python -m gpupack collect RUN_DIR [RUN_DIR ...]  aggregate the records of one or more runs again
  python -m gpupack status RUN_DIR                 where each pack stands (records, and the queue)

overrides use Hydra's grammar: packing.factors=[1,2,4]  sweep.grid.lr=[0.1,0.01]  sweep.grid.seed=range(0,4)
  run_dir=PATH (re-using one resumes it)  dry_run=true (plan only)  cluster=NAME (conf/cluster/NAME.yaml)"""

log = logging.getLogger("gpupack")


def default_run_dir(sweep: str, now: _dt.datetime | None = None) -> Path:
    stamp = (now or _dt.datetime.now()).strftime("%Y-%m-%d_%H-%M-%S")
    return Path("runs") / sweep / stamp


def check_run_dir(run: RunDir, plan: Plan) -> bool:
    """Read-only: True when the run directory holds this same plan (a resume); refuse one holding another."""
    if run.plan.exists():
        try:
            earlier = read_json(run.plan)
        except (OSError, ValueError):
            raise RunDirError(f"run_dir={str(run.root)!r}: plan.json is unreadable. HINT: choose a new "
                              "run_dir=...") from None
        if earlier != json.loads(json.dumps(plan.to_json(), default=str)):  # as it reads back from disk
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
        run.root.mkdir(parents=True, exist_ok=True)
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


def print_plan(console: Console, plan: Plan, spec_name: str, run: RunDir, todo: int, resumed: bool) -> None:
    factors = sorted({p.factor for p in plan.packs})
    modes = sorted({p.mode for p in plan.packs})
    console.print(f"[bold]gpupack[/] sweep [bold]{spec_name}[/]: workload {plan.workload}, "
                  f"{plan.grid_size} grid point(s), N in {factors}, mode(s) {modes}")
    console.print(f"  {len(plan.packs)} packs, {plan.n_trainings} trainings in all; run directory {run.root}")
    for note in plan.notes:
        console.print(f"  note: {note}")
    if resumed:
        console.print(f"  resuming: {len(plan.packs) - todo} pack(s) already complete, {todo} to run")


STATES = ("pending", "running", "done", "failed")


class ProgressView:
    """Packs per partition as they move pending → running → done | failed.

    In a terminal: a live table (rich). Elsewhere (a log, CI): one line per change.
    """

    def __init__(self, console: Console, packs: Sequence[Pack]) -> None:
        self.console = console
        self.partition = {p.pack_id: p.partition for p in packs}
        self.state: dict[str, str] = {p.pack_id: "pending" for p in packs}
        self.live = Live(self.table(), console=console, auto_refresh=False) if console.is_terminal else None

    def counts(self) -> dict[str, Counter[str]]:
        out: dict[str, Counter[str]] = {}
        for pack_id, state in self.state.items():
            out.setdefault(self.partition[pack_id], Counter())[state] += 1
        return out

    def table(self) -> Table:
        table = Table(title="packs")
        table.add_column("partition")
        for state in STATES:
            table.add_column(state, justify="right")
        for partition, c in sorted(self.counts().items()):
            table.add_row(partition, *(str(c[s]) for s in STATES))
        return table

    def __enter__(self) -> "ProgressView":
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.stop()

    def __call__(self, pack: Pack, state: str) -> None:
        if self.state.get(pack.pack_id) == state:
            return
        self.state[pack.pack_id] = state
        self.partition[pack.pack_id] = pack.partition
        if self.live:
            self.live.update(self.table(), refresh=True)
            return
        finished = sum(s in ("done", "failed") for s in self.state.values())
        counts = "; ".join(f"{part}: " + ", ".join(f"{s} {c[s]}" for s in STATES)
                           for part, c in sorted(self.counts().items()))
        self.console.print(f"  [{finished}/{len(self.state)}] {pack.pack_id} {state:7s} ({counts})", highlight=False)


def run_sweep(overrides: Sequence[str], console: Console) -> int:
    cfg = compose_config(overrides)
    require_sweep(cfg)
    run = RunDir(Path(cfg.run_dir) if cfg.run_dir else default_run_dir(check_name("sweep.name", cfg.sweep.name)))
    submitter = load_submitter(cfg.cluster.backend, cfg.cluster, run)
    spec = validate(cfg, submitter)
    plan = spec.plan()
    if not cfg.wait:
        submitter.require_detachable()  # said before anything is written
    if cfg.dry_run:
        print_plan(console, plan, spec.name, run, len(plan.packs), check_run_dir(run, plan))
        first = plan.packs[0].trainings[0]
        console.print("  hyperparameters of the first training: " +
                      ", ".join(f"{k}={v}" for k, v in first.params.items()), highlight=False)
        for p in plan.packs:
            console.print(f"  {p.pack_id}: " + ", ".join(t.training_id for t in p.trainings), highlight=False)
        console.print("dry run: nothing was written or submitted.")
        return 0
    resumed = prepare_run_dir(run, plan)
    with RunLock(run):
        if not run.config.exists():
            run.config.write_text(OmegaConf.to_yaml(cfg, resolve=True))
            write_json_atomic(run.plan, plan.to_json())
        todo = packs_to_run(run, plan)
        queued = submitter.active_packs() if resumed else {}
        print_plan(console, plan, spec.name, run, len(todo), resumed)
        if queued:
            console.print(f"  {len(queued)} pack(s) still queued or running from an earlier submission, not "
                          f"submitted again: " + ", ".join(f"{p} (job {j})" for p, j in sorted(queued.items())))
            todo = [p for p in todo if p.pack_id not in queued]
        if not cfg.wait:
            submitted = submitter.detach(todo, spec.settings)
            console.print(f"Submitted {len(submitted)} pack job(s): " +
                          ", ".join(sorted(set(j.split("_")[0] for j in submitted.values()))) if submitted else
                          "Nothing to submit.")
            console.print(f"Run directory: {run.root}\n  python -m gpupack status {run.root}\n"
                          f"  python -m gpupack collect {run.root}")
            return 0
        with ProgressView(console, todo) as progress:
            results = submitter.run_packs(todo, spec.settings, progress)
        for r in results:
            if not r.ok:
                console.print(f"[red]pack {r.pack_id} (job {r.job_id}) did not finish:[/] {r.error}")
        summary = collect_mod.collect([run.root], console)
    console.print(f"Records and summary: {run.root}")
    failed = int(summary["failed"].sum()) if not summary.empty else 0
    return 0 if all(r.ok for r in results) and failed == 0 else 1


def status(args: Sequence[str], console: Console) -> int:
    """Where each pack of a run stands: from its records, and from the queue for the rest."""
    if len(args) != 1 or not Path(args[0]).is_dir():
        raise RunDirError(f"RUN_DIR={' '.join(args)!r}: give one run directory. HINT: python -m gpupack status "
                          "runs/<sweep>/<date>_<time>")
    run = RunDir(Path(args[0]))
    if not run.plan.exists():
        raise RunDirError(f"RUN_DIR={str(run.root)!r} has no plan.json. HINT: give the directory a sweep printed")
    plan = Plan.from_json(read_json(run.plan))
    cfg = OmegaConf.load(run.config)
    submitter = load_submitter(cfg.cluster.backend, cfg.cluster, run)
    jobs = submitter.jobs()
    states = submitter.job_states([j["job_id"] for j in jobs.values()])
    counts: dict[str, Counter[str]] = {}
    lines = []
    for p in plan.packs:
        done = [t for t in p.trainings if is_completed(run.training_record(p.pack_id, t.training_id))]
        if len(done) == len(p.trainings):
            state = "done"
        elif run.pack_record(p.pack_id).exists() and p.pack_id not in states:
            state = "failed"
        else:
            job = jobs.get(p.pack_id, {}).get("job_id")
            queue = states.get(job, "").split(" ")[0] if job else ""
            state = {"PENDING": "pending", "REQUEUED": "pending", "RUNNING": "running"}.get(
                queue, "failed" if queue else ("submitted" if job else "not submitted"))
            lines.append(f"  {p.pack_id}: {state} ({len(done)}/{len(p.trainings)} trainings done"
                         f"{f', job {job} {queue}' if job else ''})")
        counts.setdefault(p.partition, Counter())[state] += 1
    console.print(f"{run.root}: {len(plan.packs)} packs, sweep {plan.sweep}")
    for partition, c in counts.items():
        console.print(f"  {partition}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())), highlight=False)
    for line in lines:
        console.print(line, highlight=False)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if args and args[0] == "collect":
        return collect_mod.main(args[1:])
    console = collect_mod.make_console()
    try:
        if args and args[0] == "status":
            return status(args[1:], console)
        return run_sweep(args, console)
    except GpupackError as err:
        print(f"gpupack: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("gpupack: interrupted; finished trainings keep their records. Re-run with the same run_dir to "
              "resume.", file=sys.stderr)
        return 130
