"""The launchers Hydra instantiates for hydra/launcher=gpupack_local and gpupack_slurm.

Kept light: Hydra imports every module of a plugin package when it looks for plugins (without registering them
in sys.modules, so no ``from __future__ import annotations`` here), so gpupack's machinery lives in
:mod:`gpupack.hydra_launch` and :mod:`gpupack.job.runtime.hydra_job` and is imported only when a multirun launches.
"""
from typing import Any, ClassVar, Dict, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf


class BaseGpupackLauncher(Launcher):
    backend: ClassVar[str]  # a module under gpupack/submit/
    # Set by setup(), which Hydra calls before launch(): a launcher is never asked to launch without them.
    config: DictConfig
    hydra_context: HydraContext
    task_function: TaskFunction

    def __init__(self, **params: Any) -> None:
        # The launcher's options, plain (hydra.launcher.*: user input of any type, checked by gpupack.hydra_launch)
        self.params: Dict[str, Any] = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                                       for k, v in params.items()}
        self.said_short_batch = False  # a short batch is said once per multirun, not once per batch

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from gpupack.hydra_launch import keep_compositions

        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function
        keep_compositions(hydra_context)  # a job config the sweeper composed to check it is not composed again

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from gpupack.hydra_launch import launch

        return launch(self, job_overrides, initial_job_idx)


class GpupackLocalLauncher(BaseGpupackLauncher):
    backend = "local"


class GpupackSlurmLauncher(BaseGpupackLauncher):
    backend = "slurm"
