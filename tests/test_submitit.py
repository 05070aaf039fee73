"""submitit's private internals stay behind one adapter (gpupack/submit/_submitit.py), whose check names any that
moved, and submitit is bounded above the newest release tested (issue 54)."""
from __future__ import annotations

import pickle
from importlib.metadata import version
from pathlib import Path

import pytest
import submitit.local.local
import submitit.slurm.slurm
import tomllib
from packaging.requirements import Requirement

from gpupack.submit import _submitit
from gpupack.submit.slurm import SlurmSubmitter

ROOT = Path(__file__).resolve().parent.parent


def test_every_internal_gpupack_reaches_for_is_in_the_installed_submitit() -> None:
    assert _submitit.missing_internals() == []


@pytest.mark.parametrize("module, name, stand_in, named", [
    (submitit.slurm.slurm, "_make_sbatch_string", None, "submitit.slurm.slurm._make_sbatch_string"),
    (submitit.slurm.slurm, "_make_sbatch_string", lambda command, folder: "",  # a parameter gpupack passes is gone
     "submitit.slurm.slurm._make_sbatch_string(command, folder, map_count"),
    (submitit.local.local, "subprocess", None, "submitit.local.local.subprocess"),
])
def test_an_internal_that_moved_is_named(monkeypatch: pytest.MonkeyPatch, module: object, name: str,
                                         stand_in: object, named: str) -> None:
    if stand_in is None:
        monkeypatch.delattr(module, name)
    else:
        monkeypatch.setattr(module, name, stand_in)
    missing = _submitit.missing_internals()
    assert len(missing) == 1 and missing[0].startswith(named), missing


def test_a_method_that_moved_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(submitit.slurm.slurm.SlurmExecutor, "_internal_process_submissions")
    assert _submitit.missing_internals() == ["submitit.slurm.slurm.SlurmExecutor._internal_process_submissions"]


def test_submitit_is_bounded_above_and_the_installed_release_is_within() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    req = next(Requirement(d) for d in deps if Requirement(d).name == "submitit")
    assert any(s.operator in ("<", "<=") for s in req.specifier), req  # a release past the tested one is not taken
    assert req.specifier.contains(version("submitit")), (req, version("submitit"))


def test_a_job_pickled_before_the_slurm_backend_was_a_package_still_loads() -> None:
    # A requeued job's payload names its backend class by the path it had then: gpupack.submit.slurm.SlurmSubmitter.
    old = b"cgpupack.submit.slurm\nSlurmSubmitter\n."  # pickle protocol 0: one GLOBAL
    assert pickle.loads(old) is SlurmSubmitter
