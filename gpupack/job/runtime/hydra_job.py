"""One Hydra job as a gpupack training, run by gpupack's worker in its own process.

The launcher pickles itself and Hydra's singletons once per launch; each job's worker unpickles them, runs the job as
Hydra's own launchers do (``run_job``), and pickles its ``JobReturn`` for the launcher, a failed one too (before its
process exits non-zero), so Hydra gets Hydra's own failure.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import numbers
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, List, Mapping, Protocol, Sequence, cast

from gpupack.core.jobenv import job_id
from gpupack.core.preload import import_libraries, static_imports
from gpupack.core.store import pickling
from gpupack.core.store.rundir import RunDir
from gpupack.core.workload import Launch, TrainingContext, Workload

if TYPE_CHECKING:
    from hydra.types import HydraContext, TaskFunction
    from omegaconf import DictConfig


@dataclass
class HydraJobParams:
    overrides: List[str] = field(default_factory=list)
    job_num: int = 0
    launch_dir: str = ""  # this launch's gpupack run directory (RunDir.hydra_payload, its jobs' RunDir.hydra_returns)
    cwd: str = ""  # the app's working directory when it launched (Hydra's original cwd)
    app_dir: str = ""  # the app's own folder, so its sibling modules import in the job as they did at launch


class _Launcher(Protocol):
    """What a job reads of the launcher the launch pickled (hydra_plugins.gpupack_launcher's)."""

    @property
    def params(self) -> Mapping[str, object]:
        """hydra.launcher.*, checked at launch (gpupack.hydra_launch.check_options)."""

    config: DictConfig
    hydra_context: HydraContext
    task_function: TaskFunction


def metrics_of(value: object) -> dict[str, float]:
    """The numbers a task function returned, as record metrics (a float, or a mapping of them)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return {"return_value": float(value)}
    if isinstance(value, Mapping):
        return {str(k): float(v) for k, v in value.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}
    return {}


def logs_in_job_dir(task_function: TaskFunction, logs: tuple[str, str] | None) -> TaskFunction:
    """The task function, which first links the job's logs into its Hydra output folder, beside Hydra's ``.log``."""
    if logs is None:
        return task_function

    @functools.wraps(task_function)
    def task(cfg: DictConfig) -> object:
        from hydra.core.hydra_config import HydraConfig

        hydra_cfg = HydraConfig.get()
        for log, suffix in zip(logs, (".out", ".err")):  # a hard link (replacing an earlier one), else a symbolic one
            target = Path(hydra_cfg.runtime.output_dir) / f"{hydra_cfg.job.name}{suffix}"
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.unlink(missing_ok=True)
            try:
                os.link(log, tmp)
            except OSError:
                tmp.symlink_to(log)
            os.replace(tmp, target)
        return task_function(cfg)

    return task


def portable_failure(err: BaseException) -> BaseException:
    """The job's exception, made to cross to the launcher's process: its traceback as text (a traceback does not
    pickle), and a plain RuntimeError with its text where the exception would not unpickle."""
    import pickle

    # the failure as Hydra's own launcher prints it: the app's frames only, from below run_job down
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_name != "run_job":
        tb = tb.tb_next
    frames = tb.tb_next if tb is not None else err.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename == __file__:  # logs_in_job_dir's wrapper
        frames = frames.tb_next
    text = "".join(traceback.format_exception(type(err), err, frames)).rstrip()
    try:
        pickle.loads(pickling.dumps(err))
    except Exception:  # any failure to round-trip: the text is what the launcher needs
        err = RuntimeError(f"{type(err).__name__}: {err}")
    try:
        err.gpupack_traceback = text  # type: ignore[attr-defined]
    except AttributeError:  # an exception that takes no attributes: its text alone
        err = RuntimeError(text)
        err.gpupack_traceback = text  # type: ignore[attr-defined]
    return err


@dataclass(frozen=True)
class Payload:
    """What a launch left its jobs: the launcher, Hydra's state, and each job's config's (offset, length)."""

    launcher: _Launcher
    singleton_state: object
    configs: Mapping[int, tuple[int, int]]


# launch dir -> its payload, unpickled once a process
_PAYLOADS: dict[str, Payload] = {}


def payload(params: HydraJobParams) -> Payload:
    """The launch's payload, with the app's folder first on sys.path; read once per process (a fork finds it)."""
    if params.app_dir and params.app_dir not in sys.path:
        sys.path.insert(0, params.app_dir)
    if params.launch_dir not in _PAYLOADS:
        # (launcher, Singleton.get_state(), where the configs lie); an earlier gpupack's launch left no configs
        launcher, state, *configs = pickling.load(RunDir(Path(params.launch_dir)).hydra_payload)
        _PAYLOADS[params.launch_dir] = Payload(launcher, state, configs[0] if configs else {})
    return _PAYLOADS[params.launch_dir]


def job_config(params: HydraJobParams) -> DictConfig:
    """The job's config: as the sweeper composed it, else composed here as Hydra's launchers do."""
    from omegaconf import DictConfig

    launch = payload(params)
    where = launch.configs.get(params.job_num)
    if where is None:
        return launch.launcher.hydra_context.config_loader.load_sweep_config(launch.launcher.config,
                                                                             list(params.overrides))
    path = RunDir(Path(params.launch_dir)).hydra_configs
    config = pickling.read_at(path, where)
    if not isinstance(config, DictConfig):  # only the launch writes the file: a bug, said where it is
        raise TypeError(f"{path} holds no job config at {where} for job #{params.job_num}: {type(config).__name__}")
    return config


class HydraJob(Workload):
    name = "hydra_job"
    framework = "hydra"  # a whole Python program of its own: only process mode hosts it
    Params = HydraJobParams
    forkable = True  # the server preloads the app (unpickling the task function imports it) and forks each job

    def preload(self, params: Sequence[HydraJobParams]) -> None:
        for p in params[:1]:  # one launch: every job of the pack shares its payload
            launch = payload(p)
            launcher = launch.launcher
            preload = cast("Sequence[object]", launcher.params.get("preload") or ())  # a list (check_options)
            for module in preload:  # hydra.launcher.preload: what the app imports late
                importlib.import_module(str(module))
            # what the file that defines the task function (none for a partial, a callable object, a builtin) imports
            # anywhere (inside its task function too): each job would import it
            try:
                files = [Path(source)] if (source := inspect.getsourcefile(launcher.task_function)) else []
            except TypeError:
                files = []
            import_libraries(static_imports(files, sys.modules), "imported by the app's files")
            # one job's config made here warms what each job's would build cold (lexer caches, imports, node classes)
            from hydra.core.singleton import Singleton

            Singleton.set_state(launch.singleton_state)
            job_config(p)

    def launch(self, params: Mapping[str, object], spec_path: str, result_path: str) -> Launch:
        cwd = params.get("cwd")  # the app's working directory (HydraJobParams.cwd)
        return Launch([sys.executable, "-m", "gpupack.job.runtime.worker", spec_path], cwd=str(cwd) if cwd else None)

    def train(self, params: HydraJobParams, ctx: TrainingContext) -> dict[str, float]:
        from hydra.core.singleton import Singleton
        from hydra.core.utils import JobStatus, run_job, setup_globals
        from omegaconf import open_dict

        launch = RunDir(Path(params.launch_dir))
        shipped = payload(params)
        launcher = shipped.launcher
        Singleton.set_state(shipped.singleton_state)
        setup_globals()
        config = job_config(params)
        with open_dict(config.hydra.job):  # the pack's job, as its backend named it to the pack (jobenv.job_id)
            config.hydra.job.id = f"{job_id()}_{params.job_num}"
            config.hydra.job.num = params.job_num
        ctx.reporter.loop_started()  # start-up: process, imports, unpickling, the sweep config
        ret = run_job(hydra_context=launcher.hydra_context, config=config,
                      task_function=logs_in_job_dir(launcher.task_function, ctx.logs),
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        ctx.reporter.loop_ended()
        failure = ret._return_value if ret.status == JobStatus.FAILED else None
        if failure is not None:
            ret._return_value = portable_failure(failure)
        pickling.append(ret, params.job_num, launch.hydra_returns(job_id()))  # one file a gpupack job, not a job
        if failure is not None:
            raise failure  # recorded as failed, with the traceback in the job's .err log
        return metrics_of(ret.return_value)


WORKLOAD = HydraJob()
