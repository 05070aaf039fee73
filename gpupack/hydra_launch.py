"""What a gpupack launcher does with one batch of a Hydra multirun: check the options, plan the jobs into packs of
N in sweep order, run them through :func:`gpupack.sweep.run`, and hand Hydra one ``JobReturn`` per job, in sweep order.

Each batch is one run directory under ``hydra.launcher.records_dir`` (``MULTIRUN_DIR/.gpupack/launch_<first job
number>``), so ``python -m gpupack collect MULTIRUN_DIR`` gives time per job for the whole multirun.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, cast

from hydra.core.config_loader import ConfigLoader
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.errors import CompactHydraException
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf

from gpupack import sweep
from gpupack.core.memory.figures import Measured, estimate
from gpupack.core.plan import Pack, Training, plan_in_order
from gpupack.core.preload import check_importable
from gpupack.core.store import pickling
from gpupack.core.store.journal import RunRecords, log_where
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import Options, PackSettings
from gpupack.errors import ConfigError, GpupackError, UnreachableError, require_positive
from gpupack.job import HYDRA_JOB
from gpupack.job.pack import load_packer
from gpupack.job.workloads import load_workload
from gpupack.submit import ClusterConfig, Submitter, backend_class
from gpupack.sweep.setup.cluster_facts import ClusterFacts
from gpupack.sweep.setup.config import PackingConfig
from gpupack.sweep.setup.validate import check_job_options, check_packs
from gpupack.sweep.stop import Stopped, after_stop, stop_on_signals, stopped_line

KEY = "hydra.launcher"
# The launcher's options that are its mode's too (packing.<mode>.<name>), given to the mode when it has them.
MODE_OPTIONS = ("mps", "start")

log = logging.getLogger(__name__)


class HydraLauncher(Protocol):
    """What gpupack reads of a launcher (hydra_plugins.gpupack_launcher's, after Hydra's setup())."""

    @property
    def backend(self) -> str:
        """The module under gpupack/submit/ that runs its packs."""

    params: dict[str, Any]  # hydra.launcher.*, plain: user input of any type, checked by check_options
    config: DictConfig
    hydra_context: HydraContext
    said_short_batch: bool


class LauncherConfigError(ConfigError, CompactHydraException):
    """Bad launcher input: Hydra prints a CompactHydraException as its one line, without a traceback."""


class LauncherError(CompactHydraException):
    """gpupack refusing or failing a batch for a reason other than bad input (no scheduler answers here, sbatch
    refused a job, the run directory's disk is full): its one line, as Hydra prints a CompactHydraException."""


class JobFailed(CompactHydraException, RuntimeError):
    """A job that failed, as Hydra prints it: the app's own traceback (or how a job that handed back no JobReturn
    ended) and the path of its log; compact, without the launcher's and sweeper's frames."""


# The launcher's names of what a pack's trainings are given, where packing.* names them otherwise.
JOB_OPTION_NAMES = {"threads_per_training": "threads_per_job", "training_timeout_s": "job_timeout_s"}


def check_options(p: Mapping[str, object]) -> None:
    """The launcher's own options, before anything runs; those it shares with packing.* by the same checks."""
    pack = p.get("pack")
    if isinstance(pack, bool) or not isinstance(pack, int) or pack < 1:
        raise ConfigError(f"{KEY}.pack", pack, "a pack holds at least one job",
                          f"{KEY}.pack=N puts N jobs on each GPU, e.g. {KEY}.pack=4")
    for name in ("tasks_per_node", "nodes"):
        if p.get(name, 1) != 1:
            raise ConfigError(f"{KEY}.{name}", p[name], "a pack is one task on one node",
                              f"leave it at 1; {KEY}.pack=N runs N jobs in that task")
    check_job_options(p, KEY, {}, JOB_OPTION_NAMES)
    for name, whole in (("timeout_min", True), ("cpus_per_task", False), ("mem_gb", False),
                        ("max_parallel_packs", True), ("array_parallelism", True), ("poll_s", False)):
        if name in p:
            require_positive(p.get(name), f"{KEY}.{name}", f"{KEY}.{name}=1", whole=whole,
                             allow_none=name != "timeout_min")
    preload = cast("Sequence[object]", p.get("preload") or [])  # a list: its schema says so (BaseGpupackConf.preload)
    for i, module in enumerate(preload):  # found, not imported: that is the server's
        check_importable(module, f"{KEY}.preload[{i}]", f"{KEY}.preload")


class ComposedOnce(ConfigLoader):
    """Hydra's config loader, keeping each job config it composes until a launch takes it: a sweeper composes every
    job's config to check the batch, and a job composing it again costs 0.11 s of a core against 4 ms to unpickle.
    Kept pickled (nothing done to a config after it was composed reaches a job), at most ``limit`` bytes of them."""

    def __init__(self, loader: ConfigLoader, limit: int = 64 * 2**20) -> None:
        self.loader = loader
        self.limit = limit
        self.kept: dict[tuple[int, tuple[str, ...]], bytes] = {}
        self.held = 0  # bytes kept

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        config = self.loader.load_sweep_config(master_config, sweep_overrides)
        if self.held >= self.limit:  # full: no config fits, so none is pickled to be let go
            return config
        data = pickling.dumps(config)
        if self.held + len(data) <= self.limit:
            self.kept[(id(master_config), tuple(sweep_overrides))] = data
            self.held += len(data)
        return config

    def take(self, master_config: DictConfig, batch: Sequence[Sequence[str]], first: int) -> dict[int, bytes]:
        """The batch's configs it kept, by job number (``first`` the batch's first); it keeps none after."""
        kept, self.kept, self.held = self.kept, {}, 0
        return {first + i: kept[key] for i, o in enumerate(batch) if (key := (id(master_config), tuple(o))) in kept}

    def __getattr__(self, name: str) -> Any:
        """What else code reads off Hydra's loader (``repository``, ...): the loader's own."""
        if name == "loader":  # not set yet (a copy being made): no loader to ask
            raise AttributeError(name)
        return getattr(self.loader, name)

    # the rest of a ConfigLoader: the loader's own
    def load_configuration(self, *args: Any, **kwargs: Any) -> DictConfig:
        return self.loader.load_configuration(*args, **kwargs)

    def get_search_path(self) -> Any:
        return self.loader.get_search_path()

    def get_sources(self) -> Any:
        return self.loader.get_sources()

    def list_groups(self, parent_name: str) -> list[str]:
        return self.loader.list_groups(parent_name)

    def get_group_options(self, *args: Any, **kwargs: Any) -> list[str]:
        return self.loader.get_group_options(*args, **kwargs)

    def compute_defaults_list(self, *args: Any, **kwargs: Any) -> Any:
        return self.loader.compute_defaults_list(*args, **kwargs)


def keep_compositions(hydra_context: HydraContext) -> None:
    """From the launcher's setup on, the sweeper's context (the launcher's too) composes through a ComposedOnce."""
    if not isinstance(hydra_context.config_loader, ComposedOnce):
        hydra_context.config_loader = ComposedOnce(hydra_context.config_loader)


def for_jobs(launcher: HydraLauncher) -> HydraLauncher:
    """The launcher as its jobs get it: with Hydra's own config loader (a job composes only a config not kept)."""
    loader = launcher.hydra_context.config_loader
    if not isinstance(loader, ComposedOnce):
        return launcher
    out = copy.copy(launcher)
    out.hydra_context = dataclasses.replace(launcher.hydra_context, config_loader=loader.loader)
    return out


def fresh_dir(parent: Path, name: str) -> Path:
    """A records directory no earlier launch used (``name``, ``name.2``...): a multirun run again into the same sweep
    directory runs its jobs again, as Hydra's launchers do, and keeps the earlier records."""
    path, k = parent / name, 1
    while path.exists():
        k += 1
        path = parent / f"{name}.{k}"
    return path


def app_dir() -> str:
    """The app's folder (sys.path[0] for `python my_app.py`), so the job imports the app's sibling modules."""
    first = sys.path[0] if sys.path and sys.path[0] else os.getcwd()
    return str(Path(first).resolve())


# A Hydra app's jobs are not sized from earlier records (their memory is the app's, per its overrides): the launcher's
# mem_gb, else the default, and the request and every refusal say so
NOT_MEASURED = estimate(None, Measured(why_none=f"a Hydra app's jobs are not sized from earlier records ({KEY}.mem_gb "
                                                "states one job's)"))


def prepare(launcher: HydraLauncher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> sweep.Prepared:
    """Check everything and plan the batch; nothing is written or submitted."""
    p = launcher.params
    check_options(p)
    run = RunDir(fresh_dir(Path(str(p["records_dir"])).absolute(), RunDir.launch_name(initial_job_idx)))
    # the backend's config from the launcher's options (hydra-submitit-launcher's names); its errors name those keys
    backend = backend_class(launcher.backend)
    cluster = backend.launcher_config(p, KEY)
    submitter = backend(cluster, run, key_prefix=KEY, key_names=backend.launcher_names(cluster))
    submitter.measured_host_mb = NOT_MEASURED.host
    return sweep.prepare_run(submitter, [], lambda facts: check_batch(launcher, job_overrides, initial_job_idx, run,
                                                                     submitter, facts))


def check_batch(launcher: HydraLauncher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, run: RunDir,
                submitter: Submitter[ClusterConfig], facts: ClusterFacts) -> sweep.Prepared:
    """The batch against the submitter's answers: packs that fit, the mode's own limits; its plan in sweep order."""
    p = launcher.params
    # The largest pack this batch really makes: pack=8 with 2 jobs asks for 2 jobs' share, not 8.
    largest = min(p["pack"], len(job_overrides))
    # No memory share per job here yet (packing.memory_share): the launcher has no option to size or turn it off
    settings = PackSettings(device=p["device"], threads_per_training=p.get("threads_per_job"),
                            training_timeout_s=p.get("job_timeout_s"), gpu_model=p.get("gpu_model"),
                            sample_interval_s=float(p["sample_interval_s"]), mode_options=launcher_mode_options(p))
    try:
        check_packs(load_workload(HYDRA_JOB), [p["mode"]], [largest], facts, settings, NOT_MEASURED,
                    PackingConfig.memory_fraction, lambda i: f"{KEY}.pack", noun="jobs")
    except ConfigError as err:  # a mode speaks of gpupack's own keys: say the launcher's
        if err.key == f"{KEY}.pack":
            raise
        raise ConfigError(f"{KEY}.mode", p["mode"], err.why, f"use {KEY}.mode=process") from None
    cfg = launcher.config
    jobs = [{"overrides": list(o), "job_num": initial_job_idx + i, "launch_dir": str(run.root), "app_dir": app_dir(),
             "cwd": str(cfg.hydra.runtime.cwd)} for i, o in enumerate(job_overrides)]
    task = str(cfg.hydra.job.name)
    plan = plan_in_order(sweep=task, workload=HYDRA_JOB, params=jobs, factor=int(p["pack"]),
                         partition=facts.partitions[0], mode=str(p["mode"]), label=f"hydra:{task}",
                         names=[f"job{j['job_num']}" for j in jobs],
                         stream_jobs=launcher_stream_jobs(p, facts.stream_jobs(facts.partitions[0])))
    record = {"cluster": dataclasses.asdict(submitter.cluster), "hydra_launcher": dict(p), "hydra_task": task,
              "collect": {"metric": None, "goal": sweeper_goal(cfg.hydra.sweeper)}}
    return sweep.Prepared(name=task, plan=plan, run=run, submitter=submitter, settings=settings, config=record)


def launcher_stream_jobs(p: Mapping[str, Any], at_once: int) -> int | None:
    """K streaming jobs for a batch (stream auto or on: a launch is a production run), hydra.launcher.jobs or as many
    as run at once; None: whole packs (stream=off, or auto with a mode that cannot stream). Pure."""
    stream = str(p.get("stream", "auto"))
    if stream == "off":
        return None
    if not load_packer(str(p["mode"]), key=f"{KEY}.mode").streams:
        if stream == "on":
            raise ConfigError(f"{KEY}.stream", "on", f"mode {p['mode']} runs a pack's jobs in one process, so a slot "
                              "cannot take a new job while the others run", f"use {KEY}.mode=process or "
                              f"{KEY}.stream=off")
        return None
    return int(p.get("jobs") or at_once)


def sweeper_goal(sweeper: DictConfig) -> str | None:
    """collect.goal from the sweeper's ``direction`` (Optuna's; a multi-objective list: its first), or None. Pure."""
    direction: Any = sweeper.get("direction") if hasattr(sweeper, "get") else None
    if isinstance(direction, (list, tuple)) or OmegaConf.is_list(direction):
        direction = direction[0] if len(direction) else None
    name = str(getattr(direction, "name", direction) or "").lower()
    return {"minimize": "min", "maximize": "max"}.get(name)


def launcher_mode_options(p: Mapping[str, Any]) -> dict[str, Options]:
    """The mode's own options (its ``Options``) from the launcher's MODE_OPTIONS (packing.process.mps from
    hydra.launcher.mps); none when it has none. An unknown hydra.launcher.mode is refused here."""
    mode = str(p["mode"])
    options = load_packer(mode, key=f"{KEY}.mode").Options
    given = {f.name: p[f.name] for f in dataclasses.fields(options) if f.name in MODE_OPTIONS and f.name in p} \
        if options else {}
    if not options or not given:
        return {}
    built = options(**given)
    try:
        built.check()
    except ConfigError as err:  # packing.<mode>.<name> is hydra.launcher.<name> here
        raise ConfigError(err.key.replace(f"packing.{mode}.", f"{KEY}."), err.value, err.why,
                          err.hint.replace(f"packing.{mode}.", f"{KEY}.")) from None
    return {mode: built}


def _err_log(records: RunRecords, pack: Pack, training_id: str, rec: Mapping[str, object] | None) -> str:
    """Where a job's stderr is: its pack's folder, or where its lane folded it (``rec``: its record, if any)."""
    run = records.run
    return log_where(run.root, rec, "err") if rec else str(run.log(pack.pack_id, training_id, "err"))


def failed_return(launcher: HydraLauncher, training_params: Mapping[str, Any], pack: Pack, records: RunRecords,
                  training_id: str) -> JobReturn:
    """Hydra's JobReturn for a job whose process never handed one back (killed, OOM, timeout, never started)."""
    rec = records.current(pack.pack_id, training_id) or {}
    status, error = rec.get("status", "not run"), (rec.get("error") or "").strip().splitlines()
    overrides = list(training_params["overrides"])
    why = (f"job #{training_params['job_num']} ({' '.join(overrides) or 'no overrides'}) {status} in gpupack pack "
           f"{pack.pack_id}" + (f": {error[-1]}" if error else "")
           + f" (logs: {_err_log(records, pack, training_id, rec)})")
    ret = JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=JobFailed(why),
                    task_name=str(launcher.config.hydra.job.name))
    # the config is a courtesy here, the failure what Hydra must get; composed through Hydra's own loader, as a kept
    # copy of it would wait for a batch that never takes it
    with contextlib.suppress(Exception):
        ret.cfg = for_jobs(launcher).hydra_context.config_loader.load_sweep_config(launcher.config, overrides)
    return ret


def raised_failure(ret: JobReturn, training_params: Mapping[str, Any], pack: Pack, records: RunRecords,
                   training_id: str) -> JobReturn:
    """A job's own failure (its task function raised), as Hydra's basic launcher shows it: the app's traceback, then
    where its full log is. The job's exception is the cause."""
    err = ret._return_value
    text = getattr(err, "gpupack_traceback", None) or f"{type(err).__name__}: {err}"
    log = _err_log(records, pack, training_id, records.current(pack.pack_id, training_id))
    overrides = " ".join(training_params["overrides"]) or "no overrides"
    failure = JobFailed(f"job #{training_params['job_num']} ({overrides}) failed in gpupack pack {pack.pack_id}:\n"
                        f"{text}\n(log: {log})")
    failure.__cause__ = err
    ret._return_value = failure
    return ret


def job_returns(launcher: HydraLauncher, prepared: sweep.Prepared) -> list[JobReturn]:
    out = []
    # In sweep order, as Hydra's sweepers expect: a streaming lane's share of the plan is every K-th job
    ordered = sorted(((pack, t) for pack in prepared.plan.packs for t in pack.trainings),
                     key=lambda item: job_num(item[1]))
    records = RunRecords(prepared.run)  # read once for every job: a pack's folder, else its lane's journal
    folder = prepared.run.hydra_returns_dir
    returns = pickling.read_streams(sorted(folder.glob("*.pkls")) if folder.is_dir() else [])
    for pack, t in ordered:
        pickled = returns.get(job_num(t))
        try:
            ret = pickling.loads(pickled) if pickled is not None else None
        except Exception:  # noqa: BLE001 - a return that does not load back: the job failed, as one with none
            ret = None
        if ret is None:
            ret = failed_return(launcher, t.params, pack, records, t.training_id)
        elif ret.status == JobStatus.FAILED:
            ret = raised_failure(ret, t.params, pack, records, t.training_id)
        out.append(ret)
    return out


def job_num(training: Training) -> int:
    """The Hydra job number a training's params carry (:func:`training_params`)."""
    return int(cast(int, training.params["job_num"]))


def short_batch(sweeper: DictConfig, batch: int, pack: int) -> str | None:
    """The line for a batch smaller than ``pack`` because the sweeper sends fewer jobs at a time (n_jobs,
    max_batch_size), with the fix; None where the batch fills a pack or the multirun is simply smaller. Pure."""
    if batch >= pack:
        return None
    for name in ("n_jobs", "max_batch_size"):
        limit = sweeper.get(name) if hasattr(sweeper, "get") else None
        if isinstance(limit, int) and not isinstance(limit, bool) and limit < pack:
            return (f"hydra.sweeper.{name}={limit} sends at most {limit} job(s) at a time, fewer than "
                    f"{KEY}.pack={pack}: each pack holds only {limit}. HINT: set hydra.sweeper.{name}={pack} "
                    f"(or a multiple of it) to fill packs of {pack}, or {KEY}.pack={limit}")
    return None


def launch(launcher: HydraLauncher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    """One batch of the multirun. Stopped by a signal, as gpupack's CLI is (gpupack.sweep.stop): one line, and the
    multirun exits 128 + the signal's number."""
    if not job_overrides:
        return []
    batch: list[sweep.Prepared] = []  # this batch's plan, once it has one (what a stop says became of it)
    try:
        with stop_on_signals():
            return launch_batch(launcher, job_overrides, initial_job_idx, batch)
    except KeyboardInterrupt as stop:
        signum = stop.signum if isinstance(stop, Stopped) else signal.SIGINT
        sys.stderr.write(f"gpupack: {stopped_line(Stopped(signum, stopped_what(batch[0]) if batch else ''))}\n")
        raise SystemExit(128 + signum) from None


def stopped_what(prepared: sweep.Prepared) -> str:
    """What became of a batch stopped by a signal: SLURM's jobs outlive it; this machine's were cancelled."""
    if prepared.submitter.detachable:
        return after_stop(prepared)
    return (f"its pack jobs and their Hydra jobs were cancelled; finished jobs keep their outputs, and gpupack's "
            f"records are in {prepared.run.root}")


def launch_batch(launcher: HydraLauncher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
                 batch: list[sweep.Prepared]) -> list[JobReturn]:
    try:
        prepared = prepare(launcher, job_overrides, initial_job_idx)  # nothing is written before this returns
        prepared.submitter.require_reachable()  # a scheduler that does not answer here: said before the sweep dir
    except ConfigError as err:  # in the user's words: the gres they wrote, the pack they asked for
        value = {f"{KEY}.gres": launcher.params.get("gres"), f"{KEY}.pack": launcher.params.get("pack")}.get(err.key,
                                                                                                         err.value)
        raise LauncherConfigError(err.key, value, err.why, err.hint) from None
    except UnreachableError as err:
        raise LauncherError(str(err.run_here("hydra/launcher=gpupack_local to run here"))) from None
    batch.append(prepared)
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if launcher.config.hydra.sweep.get("mode") is not None:
        os.chmod(sweep_dir, int(str(launcher.config.hydra.sweep.mode), 8))
    _say_batch(launcher, job_overrides, initial_job_idx, prepared)

    loader = launcher.hydra_context.config_loader  # the configs as the sweeper composed them, to check them
    configs = loader.take(launcher.config, job_overrides, initial_job_idx) if isinstance(loader, ComposedOnce) else {}

    def on_open(opened: sweep.Opened) -> None:  # the run directory is ours now: leave the jobs what they need
        where = pickling.dump_indexed(configs, prepared.run.hydra_configs) if configs else {}  # none: none kept
        configs.clear()  # on disk now, not held through the batch's run
        pickling.dump((for_jobs(launcher), Singleton.get_state(), where), prepared.run.hydra_payload)

    try:
        outcome = sweep.run(prepared, on_open=on_open, collect_outputs=False,
                            progress=lambda p, state: log.info(f"gpupack: pack {p.pack_id} {state}"))
    except UnreachableError as err:  # SLURM stopped answering after the batch was prepared: sbatch said so
        raise LauncherError(str(err.run_here("hydra/launcher=gpupack_local to run here"))) from None
    except GpupackError as err:  # sbatch refused a job, a full disk: its one line, not the frames it crossed
        raise LauncherError(str(err)) from None
    for r in outcome.results:
        if not r.ok:
            log.error(f"gpupack: pack {r.pack_id} (job {r.job_id}) did not finish: {r.error}")
    for line in fork_fallbacks(prepared):
        log.warning(f"gpupack: {line}")
    return job_returns(launcher, prepared)


def _say_batch(launcher: HydraLauncher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
               prepared: sweep.Prepared) -> None:
    """Hydra's log lines for a batch: how its jobs are packed, where their prints go, and each job's overrides."""
    pack = launcher.params["pack"]
    gpu = any(c.has_gpu for c in prepared.capacities.values()) and prepared.settings.device != "cpu"
    streamed = any(p.stream for p in prepared.plan.packs)
    how = (f"streaming job(s) of {pack} slots, each slot taking the next job as it frees" if streamed else
           f"pack(s) of up to {pack}")
    log.info(f"gpupack '{launcher.backend}' launcher: {len(job_overrides)} job(s) in {len(prepared.plan.packs)} "
             f"{how} per {'GPU' if gpu else 'device (no GPU: packs share the CPU cores)'}; "
             f"records in {prepared.run.root}")
    log.info(f"gpupack: each job's prints (stdout, stderr) are in its folder under {launcher.config.hydra.sweep.dir}, "
             f"as {launcher.config.hydra.job.name}.out and .err beside Hydra's {launcher.config.hydra.job.name}.log")
    short = short_batch(launcher.config.hydra.sweeper, len(job_overrides), pack)
    if short and not launcher.said_short_batch:  # once per multirun, not once per batch
        log.warning(f"gpupack: {short}")
        launcher.said_short_batch = True
    for i, overrides in enumerate(job_overrides):
        log.info(f"\t#{initial_job_idx + i} : {' '.join(filter_overrides(overrides))}")


def fork_fallbacks(prepared: sweep.Prepared) -> list[str]:
    """One line per pack whose jobs started as fresh interpreters, not forked from its preloaded server, and why."""
    records = RunRecords(prepared.run)  # a pack's folder, else its lane's journal
    whys = {p.pack_id: next((str(r["fork_fallback"]) for t in p.trainings
                             if (r := records.training(p.pack_id, t.training_id)) and r.get("fork_fallback")), None)
            for p in prepared.plan.packs}
    return [f"pack {pack_id} started its jobs as fresh interpreters, not forked: {why}" for pack_id, why in whys.items()
            if why]
