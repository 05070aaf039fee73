from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """The environment for gpupack subprocesses: the repo on PYTHONPATH so tests.fake_workloads imports."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture(autouse=True)
def _repo_on_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    # Worker processes started by packers in-process inherit os.environ.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


@pytest.fixture(autouse=True)
def _no_cluster_unless_asked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    # A test not marked slurm runs away from any cluster, as on a laptop: a SLURM_CONF left in the shell (the local
    # slurmctld's env) would make an Alliance preset's checks ask that cluster's sinfo, whose GPU types differ.
    if request.node.get_closest_marker("slurm") is None:
        monkeypatch.delenv("SLURM_CONF", raising=False)


PYTHON = sys.executable


def verdict(workload: str, partition: str) -> str:
    """The pattern of the line a run or collect prints for a (workload, partition) group: its named N, or why none is
    named. A real run's packs may all be measured under foreign load (another test, CI's own processes, the local
    cluster's 3 nodes on 2 cores), and then withholding the answer is right; the choice itself is tested by tables."""
    return rf"(Best packing factor|No answer) for {re.escape(workload)} on {re.escape(partition)}\b"


SLURM_CONF_DEFAULT = "/tmp/gpupack-slurm/etc/slurm.conf"


@pytest.fixture(scope="session")
def slurm_env() -> dict[str, str]:
    """The environment for talking to the real local slurmctld (scripts/local_slurm.sh start).

    Where it is not running the SLURM tests fail, never skip: a suite that skips them silently says nothing about
    SLURM. Opt out explicitly with -m "not slurm" (then this fixture is never reached).
    """
    import shutil
    import subprocess

    env = dict(os.environ)
    env.setdefault("SLURM_CONF", SLURM_CONF_DEFAULT)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    ok = shutil.which("sinfo") is not None and subprocess.run(
        ["sinfo", "-h"], env=env, capture_output=True, timeout=30).returncode == 0
    if not ok:
        pytest.fail("the local SLURM is not running: start it with scripts/local_slurm.sh start, or leave the SLURM "
                    "tests out explicitly with -m 'not slurm'")
    return env


def training_process(err_log) -> "object | None":
    """The running process of a training: the one whose stderr (fd 2) is its log. A fresh interpreter and a child
    forked by the fork server both have it there (only the first has the spec in its command line); the packer
    holds the same file for a moment while it starts a fresh child, but never as its fd 2 — matching any open file
    once picked the packer (pytest itself) and killed it."""
    import psutil

    target = str(err_log)
    for proc in psutil.process_iter():
        try:
            if any(f.path == target and f.fd == 2 for f in proc.open_files()):
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def kill_when_found(find: Callable[[], "object | None"], tries: int, sig: int = 9) -> None:
    """Send ``sig`` (SIGKILL) to the process ``find`` returns, half a second after it first exists (past its start)."""
    import time

    for _ in range(tries):
        proc = find()
        if proc is not None:
            time.sleep(0.5)
            proc.send_signal(sig)  # type: ignore[attr-defined]
            return
        time.sleep(0.05)


def wait_for(predicate: "Callable[[], bool]", timeout_s: float = 240, every_s: float = 0.5) -> bool:
    """True as soon as ``predicate()`` is; False after ``timeout_s``."""
    import time

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return False


def as_from_a_terminal() -> None:
    """A child's signals as a terminal starts a process: a shell's background job (CI started with `cmd &`) inherits
    SIGINT ignored, and Python keeps it ignored, so Ctrl-C could not reach what the test starts (preexec_fn)."""
    import signal

    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# hydra-optuna-sweeper pins optuna<3, so it stays out of gpupack's environment (which has Optuna >= 4): its tests run in
# a side environment of their own (scripts/side_envs.sh, part of the README's test command) and skip elsewhere.
def has_hydra_optuna_sweeper() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is not None
    except ModuleNotFoundError:
        return False


_SIDE_ENV = pytest.mark.skipif(not has_hydra_optuna_sweeper(), reason="hydra-optuna-sweeper (optuna<3) runs in its "
                               "side environment: scripts/side_envs.sh")
HYDRA_OPTUNA = [pytest.mark.hydra_optuna, _SIDE_ENV]  # the marks of a test that needs it (-m hydra_optuna selects)


def needs_hydra_optuna_sweeper(test: Callable[..., None]) -> Callable[..., None]:
    for mark in HYDRA_OPTUNA:
        test = mark(test)
    return test
