"""Hydra's own launcher test suites (hydra.test_utils.launcher_common_tests) against gpupack_local and
gpupack_slurm, packing 2 jobs per GPU.

LauncherTestSuite runs sweeps in this process (task functions defined in Hydra's test code, handed to each job by
cloudpickle); IntegrationTestSuite writes a Hydra app to a temporary folder and runs it as `python task.py -m ...`.
No case is excluded. BatchedSweeperTestSuite is Hydra's test of a sweeper, not of a launcher, and is not run.
"""
from __future__ import annotations

import pytest
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite

LOCAL = ["hydra.launcher.pack=2", "hydra.launcher.sample_interval_s=0.2"]
# The local test cluster: partition p100 with typed GPUs; poll the queue often so the suite stays short.
SLURM = ["hydra.launcher.pack=2", "hydra.launcher.partition=p100", "hydra.launcher.gres=gpu:p100:1",
         "hydra.launcher.poll_s=0.5", "hydra.launcher.timeout_min=5", "hydra.launcher.mem_gb=1",
         "hydra.launcher.sample_interval_s=0.2"]


pytestmark = pytest.mark.slow  # each case runs a real multirun through the launcher


@pytest.fixture
def slurm_conf(slurm_env, monkeypatch):
    """Sweeps in this process and apps started by the suite both find the local slurmctld."""
    monkeypatch.setenv("SLURM_CONF", slurm_env["SLURM_CONF"])


@pytest.mark.parametrize("launcher_name, overrides", [("gpupack_local", LOCAL)])
class TestGpupackLocalLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize("task_launcher_cfg, extra_flags",
                         [({}, ["-m", "hydra/launcher=gpupack_local", *LOCAL])])
class TestGpupackLocalLauncherIntegration(IntegrationTestSuite):
    pass


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_conf")
@pytest.mark.parametrize("launcher_name, overrides", [("gpupack_slurm", SLURM)])
class TestGpupackSlurmLauncher(LauncherTestSuite):
    pass


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_conf")
@pytest.mark.parametrize("task_launcher_cfg, extra_flags",
                         [({}, ["-m", "hydra/launcher=gpupack_slurm", *SLURM])])
class TestGpupackSlurmLauncherIntegration(IntegrationTestSuite):
    pass
