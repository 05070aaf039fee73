"""A user's own files in the working directory do not shadow gpupack's built-in workloads (issue 19).

The built-ins used to be the top-level package ``jobs``; ``python -m gpupack`` puts the working directory first on
sys.path, so a user's ``jobs.py`` was imported in its place (``+sweep=command`` failed with an AttributeError:
module 'jobs' has no attribute '__path__') and a user's ``jobs/`` package hid every built-in ("no such workload in
jobs/"). They now live in gpupack.job.workloads. Each case runs the CLI in a subprocess whose working directory holds
the user's files; each of those files, if imported, leaves a marker file (and the SystemExit ones stop the process).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MARK = "import-marker-{}"

# Each: files relative to the working directory → their text. {mark} is the file's import marker.
USER_FILES = {
    # unrelated names, as a user's own jobs.py has: the old layout then failed with an AttributeError
    "jobs.py": {"jobs.py": "open({mark!r}, 'w').close()\nJOBS = ['a', 'b']\n\ndef submit():\n    return 1\n"},
    "jobs.py exits": {"jobs.py": "open({mark!r}, 'w').close()\nraise SystemExit(\"user's jobs.py imported\")\n"},
    # a user's own package jobs/ with modules of the built-ins' names: the old layout then found no workload
    "jobs/ package": {"jobs/__init__.py": "open({mark!r}, 'w').close()\n",
                      "jobs/mnist_torch.py": "open({mark!r}, 'w').close()\nWORKLOAD = None\n",
                      "jobs/command.py": "open({mark!r}, 'w').close()\nWORKLOAD = None\n"},
    # gpupack's configs are found by path, not as a package named conf
    "conf/ package": {"conf/__init__.py": "open({mark!r}, 'w').close()\nraise SystemExit(\"user's conf imported\")\n",
                      "conf/config.yaml": "defaults: []\nx: 1\n", "conf/sweep/mnist_pack.yaml": "x: 2\n"},
}


def user_dir(tmp_path: Path, case: str) -> Path:
    cwd = tmp_path / "user"
    for i, (name, text) in enumerate(USER_FILES[case].items()):
        path = cwd / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(mark=str(cwd / MARK.format(i))))
    return cwd


def gpupack(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PYTHONSAFEPATH", None)  # keep Python's habit: the working directory first on sys.path, as users have it
    return subprocess.run([sys.executable, "-m", "gpupack", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def assert_not_imported(cwd: Path) -> None:
    assert sorted(p.name for p in cwd.glob(MARK.format("*"))) == []


@pytest.mark.parametrize("case", list(USER_FILES))
@pytest.mark.slow
def test_mnist_pack_resolves_the_built_in_workload(tmp_path, case):
    cwd = user_dir(tmp_path, case)
    proc = gpupack(cwd, "+sweep=mnist_pack", "dry_run=true", f"run_dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "workload mnist_torch" in proc.stdout and "hyperparameters of the first training: epochs=2" in proc.stdout
    assert "dry run: nothing was written" in proc.stdout and not (tmp_path / "run").exists()
    assert_not_imported(cwd)


@pytest.mark.parametrize("case", [c for c in USER_FILES if c.startswith("jobs")])
@pytest.mark.slow
def test_command_sweep_runs_from_a_folder_with_a_users_jobs(tmp_path, case):
    """A real (tiny) run: the workload is resolved in this process and again in the pack job's."""
    cwd = user_dir(tmp_path, case)
    run = tmp_path / "run"
    proc = gpupack(cwd, "+sweep=command", f'sweep.fixed.argv=[{sys.executable},-c,"print(1)","{{seed}}"]',
                   "sweep.grid.seed=[0,1]", "packing.factors=[2]", "packing.repeats=1", f"run_dir={run}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "workload command" in proc.stdout
    records = [json.loads(p.read_text()) for p in run.glob("packs/*/trainings/*.json")]
    assert len(records) == 2 and all(r["status"] == "completed" for r in records), records
    assert_not_imported(cwd)
