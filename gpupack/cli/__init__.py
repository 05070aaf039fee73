"""``python -m gpupack`` (its commands: USAGE): argument parsing and printing. The flow itself is :mod:`gpupack.sweep`;
printing a plan and its progress is :mod:`gpupack.cli.show`, stopping on a signal :mod:`gpupack.sweep.stop`."""
from __future__ import annotations

import argparse
import gc
import logging
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn, Sequence

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape

from gpupack import __version__, sweep
from gpupack.cli.show import (
    ProgressView,
    StatusView,
    make_console,
    print_beside,
    print_opened,
    print_plan,
    print_status,
)
from gpupack.core.plan import Pack
from gpupack.core.store.rundir import RunDir
from gpupack.errors import ConfigError, GpupackError, StorageError
from gpupack.sweep.stop import Stopped, after_stop, stop_on_signals, stopped_line

# The planning side (Hydra's composition, the job side, submitit) is imported by the commands that plan, not here:
# collect and status start without it.

USAGE = """usage:
  python -m gpupack +sweep=NAME [key=value ...]   run a sweep (conf/sweep/NAME.yaml), e.g. +sweep=mnist_pack
  python -m gpupack collect RUN_DIR [RUN_DIR ...]  aggregate the records of one or more runs again
  python -m gpupack status RUN_DIR                 where each pack stands (records, and the queue)
  python -m gpupack watch RUN_DIR [--every S]      follow a run until it ends, from any shell (Ctrl-C: stop watching;
                                                   its SLURM jobs go on)
  python -m gpupack clear-oom RUN_DIR [--partition P] [--mode M] [--factor N]
                                                   an N that ran out of memory stays infeasible until cleared

overrides use Hydra's grammar (quote a value with brackets, braces or parentheses for the shell):
  packing.factors=[1,2,4]  sweep.grid.lr=[0.1,0.01]  'sweep.grid.seed=range(0,4)'  cluster=NAME (conf/cluster/NAME.yaml)
  run_dir=PATH (re-using one resumes it)  dry_run=true (plan only, the first training's command line and the
  request: #SBATCH lines on SLURM; dry_run_packs=all lists every pack)

examples (paste them from the repository's root):
  python -m gpupack +sweep=mnist_pack packing.factors=[1,2,4] 'sweep.grid.seed=range(0,2)'
  python -m gpupack +sweep=command 'sweep.fixed.argv=[{python},examples/train.py,--lr,{lr}]' sweep.grid.lr=[0.1,0.03]
  python -m gpupack +sweep=mnist_pack cluster=narval cluster.account=def-yourpi dry_run=true   # the plan on a cluster
  python -m gpupack +sweep=mnist_pack --cfg job -p packing

Hydra's flags:
  --cfg job|hydra|all [-p PACKAGE] [--resolve]   print the composed config and exit (nothing runs)
  --info                                         version, config search path, groups and what is installed
  -h, --help                                     this help, with the config groups and their options
  -m, --multirun                                 refused: gpupack is itself the sweeper (see below)

Ctrl-C, kill or a closed terminal: the local backend's pack jobs and trainings are cancelled (finished trainings keep
their records: run again with the same run_dir to resume); jobs submitted to SLURM keep running. Exit 128 + the
signal's number: 130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP)."""

MULTIRUN_REFUSAL = (
    "-m/--multirun: gpupack is itself the sweeper, so there is nothing for Hydra's multirun to do. HINT: give the "
    "values as a grid axis and gpupack packs them: sweep.grid.lr=0.1,0.01 (no -m). To pack your own Hydra app's "
    "multirun, run that app with -m hydra/launcher=gpupack_local (or gpupack_slurm) hydra.launcher.pack=N")

log = logging.getLogger("gpupack")

PYTHON_M_GPUPACK = ("python", "-m", "gpupack")  # how a line that says "run the same command again" spells it


# ---------------- commands ----------------

def run_sweep(overrides: Sequence[str], console: Console) -> int:
    prepared = sweep.prepare(overrides)
    print_beside(console, prepared, [*PYTHON_M_GPUPACK, *overrides])  # an unfinished run of this sweep: said first
    if isinstance(prepared.config, DictConfig) and prepared.config.dry_run:  # the CLI composes a DictConfig
        return dry_run(prepared, console)
    prepared.submitter.require_reachable()  # a scheduler that does not answer here: one line, before the plan
    print_plan(console, prepared)
    view: ProgressView | None = None

    def on_open(opened: sweep.Opened) -> None:
        nonlocal view
        print_opened(console, opened)
        if prepared.wait:
            view = ProgressView(console, opened.todo).__enter__()

    def on_step(step: sweep.Step) -> None:  # packing.factors=auto: each probed N, as it is decided
        verdict = step.verdict
        console.print(f"  probe {step.partition} N={step.factor}: "
                      + ("climbing" if verdict == "climb" else f"stop — {verdict}"), highlight=False)

    def progress(pack: Pack, state: str) -> None:
        if view is not None:
            view(pack, state)

    if prepared.spec is not None and prepared.spec.auto is not None:
        view = ProgressView(console, []).__enter__()
    try:
        outcome = sweep.run(prepared, on_open=on_open, progress=progress, on_step=on_step)
    except KeyboardInterrupt as stop:  # the local backend cancelled its jobs on the way here: say what became of it
        raise Stopped(getattr(stop, "signum", signal.SIGINT), after_stop(prepared)) from None
    finally:
        if view is not None:
            view.__exit__()
    if not prepared.wait and (outcome.auto is None or outcome.auto.waiting):  # a probe that has ended: its answer
        print_submitted(outcome, console)
        return 0
    return print_outcome(outcome, console)


def print_submitted(outcome: sweep.Outcome, console: Console) -> None:
    """wait=false: the jobs submitted, and how to follow them (an auto run: where its probe stands)."""
    jobs = sorted({j.split("_")[0] for j in outcome.submitted.values()})
    console.print(f"Submitted {len(outcome.submitted)} pack job(s): " + ", ".join(jobs) if jobs else
                  "Nothing to submit.")
    if outcome.auto is not None:
        console.print(*outcome.auto.lines(), highlight=False)
        return
    console.print(f"Run directory: {outcome.run_dir}\n  python -m gpupack status {outcome.run_dir}\n"
                  f"  python -m gpupack collect {outcome.run_dir}")


def print_outcome(outcome: sweep.Outcome, console: Console) -> int:
    """A run that waited for its packs: those that did not finish, collect's tables and answer, and the last line
    (done, or what is left). Returns the exit code."""
    for r in outcome.results:
        if not r.ok:
            console.print(f"[red]pack {r.pack_id} (job {r.job_id}) did not finish:[/] {escape(str(r.error))}",
                          markup=True)
    if outcome.collected is not None:
        from gpupack.results.report.terminal import render_collected  # the tables: only for a run that collected

        render_collected(outcome.collected, outcome.written, console)
    console.print(f"Records and summary: {outcome.run_dir}")
    if (searched := outcome.search) is not None:  # a search's plan has no trainings: its trials of the budget
        console.print(searched.line(), highlight=False, soft_wrap=True)
    elif outcome.collected is not None and outcome.auto is None:  # the last line: done, or what is left (collect's)
        console.print(outcome.collected.records.plan_counts().line(), highlight=False, soft_wrap=True)
    return 0 if outcome.ok else 1


# A dry run lists this many packs, then counts the rest (dry_run_packs=all: every one).
LISTED_PACKS = 5


def dry_run(prepared: sweep.Prepared, console: Console) -> int:
    print_plan(console, prepared)
    if prepared.spec is not None and prepared.spec.auto is not None:
        auto, search = prepared.spec.auto, prepared.spec.search
        console.print(f"  the probe decides each step from the last: it starts with {auto.repeats} pack(s) of "
                      f"N={auto.ladder[0]} per partition, submitted so:")
        for line in prepared.submitter.request_lines(sweep.first_step(prepared).packs):
            console.print(f"  {line}", highlight=False, soft_wrap=True)
        if search is not None:  # its lanes' request is known once N is: said then, before they are submitted
            console.print(f"  then the search: up to {prepared.spec.stream_jobs} lane(s) per (partition, mode) of the "
                          f"best N slots ask the study for its {search.n_trials} trials", highlight=False)
        console.print("dry run: nothing was written or submitted.")
        return 0
    todo: Sequence[Pack] = prepared.plan.packs  # what the run would submit: on a resume, what is left
    if prepared.resumes():
        todo = sweep.packs_to_run(prepared.run, prepared.plan)
        console.print(f"  resuming: the run directory holds this plan; {len(todo)} pack(s) to run")
    if not prepared.plan.packs[0].trainings:  # a search: its lanes ask the study for each trial as they run
        console.print("  hyperparameters: each trial's, asked of the study as a slot frees (search=optuna)")
    else:
        first = prepared.plan.packs[0].trainings[0]
        console.print("  hyperparameters of the first training: " +
                      ", ".join(f"{k}={v}" for k, v in first.params.items()), highlight=False)
        console.print(f"  its command line: {first_command(prepared)}", highlight=False)
    packs = prepared.plan.packs
    listed = len(packs) if prepared.config.get("dry_run_packs") == "all" else LISTED_PACKS
    console.print(f"  order: {prepared.plan.order}; the packs in the order they run:", highlight=False)
    for p in packs[:listed]:
        where = (f"round {p.round}: " if p.round is not None else
                 f"again at the end (drift check of {p.reference_of}): " if p.reference_of else "")
        console.print(f"  {where}{p.pack_id}: " + ", ".join(t.training_id for t in p.trainings), highlight=False)
    if len(packs) > listed:  # the header above says what they are
        console.print(f"  ... and {len(packs) - listed:,} more packs; all with dry_run_packs=all", highlight=False)
    for line in prepared.submitter.request_lines(todo) if todo else ["request: none, no pack is left to run"]:
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    console.print("dry run: nothing was written or submitted.")
    return 0


def first_command(prepared: sweep.Prepared) -> str:
    """The first training's command line as its workload will start it (templates filled), with the working folder
    and the variables it adds; its files are named, not written."""
    from gpupack.job.pack import work_file, work_prefix
    from gpupack.job.workloads import load_workload

    pack = prepared.plan.packs[0]
    first = pack.trainings[0]
    work = Path(tempfile.gettempdir()) / f"{work_prefix(pack.pack_id)}XXXXXXXX"  # the job's node-local work folder
    launch = load_workload(first.workload).launch(first.params, str(work_file(work, first.training_id, "spec")),
                                                  str(work_file(work, first.training_id, "result")))
    env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in sorted(launch.env.items()))
    return ((f"(cd {shlex.quote(str(launch.cwd))} && " if launch.cwd else "") + (f"{env} " if env else "")
            + shlex.join(str(a) for a in launch.argv) + (")" if launch.cwd else ""))


def status_command(args: Sequence[str], console: Console) -> int:
    if len(args) != 1:
        raise ConfigError("RUN_DIR", " ".join(args), "give one run directory",
                          "python -m gpupack status runs/<sweep>/<date>_<time>")
    print_status(console, sweep.status(args[0]), time.time())
    return 0


WATCH_EVERY_S = 10.0  # how often `watch` asks the records and the queue (sacct) by default


def watch_command(argv: Sequence[str], console: Console) -> int:
    """Follow a run from any shell until it has ended; leaving (Ctrl-C) leaves its jobs running. Exit 0 when every
    training completed, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m gpupack watch", add_help=False)
    parser.add_argument("run_dir", nargs="?")
    parser.add_argument("--every", type=float, default=WATCH_EVERY_S)
    args, rest = parser.parse_known_args(list(argv))
    if rest or args.run_dir is None:
        raise ConfigError("RUN_DIR", " ".join(argv), "give one run directory (and --every SECONDS)",
                          "python -m gpupack watch runs/<sweep>/<date>_<time> --every 10")
    if not args.every > 0:
        raise ConfigError("--every", args.every, "must be > 0 seconds", "--every 10")
    last = None
    try:
        with StatusView(console) as view:
            for last in sweep.follow(args.run_dir, args.every):
                view.show(last, time.time())
    except KeyboardInterrupt:
        console.print(f"stopped watching; the run's jobs go on. Come back with: python -m gpupack watch {args.run_dir}")
        return 128 + signal.SIGINT
    assert last is not None  # follow yields at least once: its first look, before any wait
    print_status(console, last, time.time())
    console.print(f"  python -m gpupack collect {last.run_dir}", highlight=False)
    return 0 if all(p.state == "done" for p in last.packs) else 1


def clear_oom_command(argv: Sequence[str], console: Console) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpupack clear-oom",
                                     description="Count again the N whose trainings ran out of memory (the records "
                                                 "are kept; RUN_DIR/cleared_oom.json says what was cleared).")
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--partition", default=None)
    parser.add_argument("--mode", default=None)
    parser.add_argument("--factor", type=int, default=None, help="only this N")
    args = parser.parse_args(list(argv))
    if not Path(args.run_dir).is_dir():
        raise ConfigError("RUN_DIR", args.run_dir, "not a directory", "give the run directory the sweep printed")
    n = sweep.clear_oom(args.run_dir, partition=args.partition, mode=args.mode, factor=args.factor)
    console.print(f"{n} out-of-memory record(s) cleared in {args.run_dir}" if n else
                  "no out-of-memory record to clear there", highlight=False)
    return 0


def collect_command(argv: Sequence[str], console: Console) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpupack collect",
                                     description="Aggregate the records of one or more gpupack runs.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--trainings", type=int, default=None,
                        help="cost a sweep of this many trainings (default: the runs' grid size)")
    parser.add_argument("--rgu", type=Path, default=None,
                        help="a YAML RGU table (models: {NAME: weight}); default: the run's, else conf/rgu/alliance")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: the first RUN_DIR)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots and the HTML report")
    parser.add_argument("--metric", default=None,
                        help="rank hyperparameters by this metric, one the trainings reported (default: what an "
                             "earlier collect of the run was given, kept in RUN_DIR/rank.json, else the run's "
                             "collect.metric, else val_accuracy, or the one metric reported); remembered in the run")
    parser.add_argument("--pattern", default=None,
                        help="read --metric from each training's kept stdout after the run: a regular expression with "
                             "one group holding the number (the last match wins), e.g. --metric val_loss "
                             "--pattern 'val_loss=([0-9.]+)'")
    parser.add_argument("--goal", default=None, help="max or min: which way the metric is better (default: what an "
                                                     "earlier collect of the run was given, else the run's "
                                                     "collect.goal, or known for val_accuracy); remembered in the run")
    parser.add_argument("--wide", action="store_true",
                        help="every column of the table (start-up/loop, utilization, the loader bound); summary.csv "
                             "always has them")
    args = parser.parse_args(list(argv))
    missing = [a for a in args.run_dirs if not Path(a).is_dir()]
    if missing:
        raise ConfigError("RUN_DIR", missing[0], "not a directory", "give the run directory the sweep printed")
    if args.trainings is not None and args.trainings < 1:
        raise ConfigError("--trainings", args.trainings, "must be >= 1", "the number of trainings in the sweep to cost")
    weights = None
    if args.rgu is not None:
        if not args.rgu.is_file():
            raise ConfigError("--rgu", str(args.rgu), "no such file", "see conf/rgu/alliance.yaml for the format")
        table = OmegaConf.load(args.rgu)
        if not isinstance(table, DictConfig):
            raise ConfigError("--rgu", str(args.rgu), "is a list, not a table of models",
                              "see conf/rgu/alliance.yaml for the format")
        weights = dict(table.get("models", {}))
    elif not any(RunDir(Path(d)).config.exists() for d in args.run_dirs):
        from gpupack.sweep.setup import config_dir

        weights = dict(OmegaConf.load(config_dir() / "rgu" / "alliance.yaml").models)
    sweep.collect(args.run_dirs, weights=weights, sweep_trainings=args.trainings, out=args.out,
                  plots=not args.no_plots, console=console, wide=args.wide, metric=args.metric, goal=args.goal,
                  pattern=args.pattern)
    return 0


# ---------------- Hydra's flags ----------------

# The overrides most runs change, with what each does (--help)
USEFUL = (("packing.factors=[1,2,4]", "the N trainings per device to measure, or auto (a ladder until no gain)"),
          ("run_dir=PATH", "where the records go; the same run_dir again resumes, nothing is redone"),
          ("dry_run=true", "the plan, the first training's command line and the request; nothing runs"))


def help_text(overrides: Sequence[str]) -> str:
    from gpupack.sweep.setup.compose import GROUPS, group_options

    lines = [USAGE, "", "Config groups (choose with GROUP=OPTION; the sweep is added: +sweep=NAME):"]
    for group, options in group_options(overrides).items():
        lines.append(f"  {group}: {GROUPS[group]}\n      {', '.join(options)}")
    lines += ["", "The overrides most runs change:"] + [f"  {o:<26} {what}" for o, what in USEFUL]
    lines.append("\nEvery key and its value: python -m gpupack +sweep=NAME --cfg job; each key's type and meaning: "
                 "the schema, gpupack/sweep/setup/config.py")
    return "\n".join(lines)


def info_text(overrides: Sequence[str]) -> str:
    import importlib.util
    import shutil

    import hydra

    from gpupack.job.pack import available_modes
    from gpupack.job.workloads import available_workloads
    from gpupack.submit import available_backends
    from gpupack.sweep.setup.compose import group_options, search_path

    try:  # the Optuna search=optuna would use (imported: --info only)
        import optuna

        optuna_said = f"Optuna {optuna.__version__}"
    except ImportError:
        optuna_said = "Optuna not installed (pip install 'gpupack[search]')"
    # what the browser tier drives: Debian's chromium and Playwright, each found or not
    chromium = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    playwright = importlib.util.find_spec("playwright") is not None
    lines = [f"gpupack {__version__} (Hydra {hydra.__version__})", "", "Config search path:"]
    lines += [f"  {p}" for p in search_path(overrides)]
    lines += ["", "Config groups:"] + [f"  {g}: {', '.join(o)}" for g, o in group_options(overrides).items()]
    lines += ["", "Installed:",
              f"  workloads (gpupack/job/workloads/): {', '.join(available_workloads())} (or a dotted module name)",
              f"  packing modes: {', '.join(available_modes())}", f"  backends: {', '.join(available_backends())}",
              "  Hydra launchers for your own app: gpupack_local, gpupack_slurm (hydra/launcher=...)",
              f"  search=optuna: {optuna_said}",
              f"  the browser tier (pytest -m browser): chromium "
              f"{'at ' + chromium if chromium else 'not found (apt-get install chromium)'}, playwright "
              f"{'installed' if playwright else 'not installed (pip install playwright)'}"]
    return "\n".join(lines)


def print_config(overrides: Sequence[str], which: str, package: str | None, resolve: bool) -> int:
    if which not in ("job", "hydra", "all"):
        raise ConfigError("--cfg", which, "unknown choice", "use --cfg job, --cfg hydra or --cfg all")
    from gpupack.sweep.setup.compose import compose_config

    cfg = compose_config(overrides, with_hydra=which != "job")
    if which == "hydra":
        cfg = OmegaConf.create({"hydra": cfg.hydra})
    elif which == "job" and "hydra" in cfg:
        cfg = OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"])
    node = OmegaConf.select(cfg, package) if package else cfg
    if package and node is None:
        raise ConfigError("-p", package, "no such package in the composed config", "e.g. -p packing or -p sweep.grid")
    if package:
        print(f"# @package {package}")
    print(OmegaConf.to_yaml(node, resolve=resolve) if OmegaConf.is_config(node) else node, end="")
    return 0


SWITCHES = {"-h": "help", "--help": "help", "help": "help", "-m": "multirun", "--multirun": "multirun",
            "--info": "info", "--resolve": "resolve"}  # Hydra's flags that take no value


def split_flags(args: list[str]) -> tuple[dict[str, object], list[str]]:
    """Hydra-style flags out of the argument list; the rest are overrides."""
    flags: dict[str, object] = {}
    rest: list[str] = []
    it = iter(args)
    for a in it:
        if a in SWITCHES:
            flags[SWITCHES[a]] = True
        elif a in ("--cfg", "-c", "-p", "--package"):
            value = next(it, None)
            if value is None:
                raise ConfigError(a, None, "needs a value", "e.g. --cfg job, -p packing")
            flags["cfg" if a in ("--cfg", "-c") else "package"] = value
        elif a.startswith("--cfg="):
            flags["cfg"] = a.split("=", 1)[1]
        else:
            rest.append(a)
    return flags, rest


def console_main(argv: Sequence[str] | None = None) -> NoReturn:
    """``python -m gpupack``, ``python -m gpupack.collect`` and the ``gpupack`` command: :func:`main`, then exit.
    Everything is written and said by then: the interpreter's teardown need not walk every object of the ~2000 modules
    a run imports (0.3 s here), so they are frozen and left to the process's end (atexit handlers still run)."""
    code = main(argv)
    gc.freeze()
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; stopped by a signal at any point, it prints one line (no traceback) and exits 128 + its number."""
    try:
        with stop_on_signals():
            return dispatch(argv)
    except KeyboardInterrupt as stop:
        print(f"gpupack: {stopped_line(stop)}", file=sys.stderr)
        return stop.exit_code if isinstance(stop, Stopped) else 128 + signal.SIGINT


COMMANDS = {"collect": collect_command, "status": status_command, "watch": watch_command,
            "clear-oom": clear_oom_command}


def dispatch(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    console = make_console()
    try:
        command = COMMANDS.get(args[0]) if args else None
        if command is not None:
            return command(args[1:], console)
        flags, overrides = split_flags(args)
        if flags.get("help"):
            print(help_text(overrides))
            return 0
        if flags.get("multirun"):
            raise GpupackError(MULTIRUN_REFUSAL)
        if flags.get("info"):
            print(info_text(overrides))
            return 0
        if "cfg" in flags or "package" in flags:
            return print_config(overrides, str(flags.get("cfg", "job")), flags.get("package"),  # type: ignore[arg-type]
                                bool(flags.get("resolve")))
        return run_sweep(overrides, console)
    except GpupackError as err:
        if isinstance(err, StorageError):  # its fix ends with running this same command again: say which
            err = err.again(shlex.join([*PYTHON_M_GPUPACK, *args]))
        print(f"gpupack: error: {err}", file=sys.stderr)
        return err.exit_code
