from __future__ import annotations

import os
import sys
from pathlib import Path

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


PYTHON = sys.executable
