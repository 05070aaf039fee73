"""A tiny real sweep, in a subprocess, on the embedded default (this machine, submitit's local executor)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpupack.core.jobenv import job_cores
from tests.conftest import verdict
from tests.doc_commands import pasted, pasted_env

TINY = ["+sweep=mnist_pack", "packing.factors=[1,2]", "packing.repeats=1", "sweep.grid.lr=[0.1]",
        "sweep.grid.batch_size=[128]", "sweep.fixed.train_samples=2000", "sweep.fixed.val_samples=1000",
        "sweep.fixed.epochs=1"]


def _gpupack(args, env, cwd):
    return subprocess.run([sys.executable, "-m", "gpupack", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


@pytest.mark.slow
def test_tiny_sweep_runs_records_and_names_the_best_n(tmp_path, subprocess_env):
    run_dir = tmp_path / "run"
    proc = _gpupack(TINY + [f"run_dir={run_dir}"], subprocess_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads((run_dir / "plan.json").read_text())
    expected = sum(p["factor"] for p in plan["packs"])
    # N=1: one pack of 1, and one at its 1-thread set-up where this CPU gives N=1 more; N=2: one pack of 2 (one
    # training reseeded)
    setup = sum(1 for p in plan["packs"] if p.get("threads"))
    assert expected == 3 + setup and setup == (job_cores() > 1)
    trainings = sorted(run_dir.glob("packs/*/trainings/*.json"))
    packs = sorted(run_dir.glob("packs/*/pack.json"))
    assert len(trainings) == expected and len(packs) == len(plan["packs"]) == 2 + setup
    for path in trainings:
        rec = json.loads(path.read_text())
        assert rec["status"] == "completed", rec
        assert rec["metrics"]["val_accuracy"] > 0.5  # real digits, really learned
        assert "MNIST (shipped copy" in rec["data"]
        assert rec["framework"] == f"torch {torch.__version__}"  # what its figures were measured with
    assert re.search(verdict("mnist_torch", "local"), proc.stdout), proc.stdout
    assert (run_dir / "summary.csv").exists() and (run_dir / "config.yaml").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {g["factor"] for g in summary["groups"]} == {1, 2}

    # Same command, same run directory: everything is complete, so nothing runs and nothing changes.
    before = {p: p.read_bytes() for p in trainings + packs}
    again = _gpupack(TINY + [f"run_dir={run_dir}"], subprocess_env, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{2 + setup} pack(s) already complete, 0 to run" in again.stdout
    assert {p: p.read_bytes() for p in before} == before

    # Another sweep into the same run directory is refused, and the run is untouched.
    other = _gpupack(TINY[:-1] + ["sweep.fixed.epochs=2", f"run_dir={run_dir}"], subprocess_env, tmp_path)
    assert other.returncode == 2 and "holds another sweep's plan" in other.stderr
    assert {p: p.read_bytes() for p in before} == before

    # collect, on demand, from the records alone
    collected = subprocess.run([sys.executable, "-m", "gpupack.collect", str(run_dir)], capture_output=True,
                               text=True, env=subprocess_env, timeout=120)
    assert collected.returncode == 0 and re.search(verdict("mnist_torch", "local"), collected.stdout), collected.stdout


@pytest.mark.slow
def test_workload_from_own_package_and_own_config_folder(tmp_path, subprocess_env):
    """A user's workload module and sweep YAML outside gpupack (examples/own_workload), end to end."""
    repo = Path(__file__).resolve().parent.parent
    # examples/README.md's command as pasted from the repository's root (its relative paths are the root's)
    text = ("PYTHONPATH=examples python -m gpupack 'hydra.searchpath=[file://examples/own_workload/conf]' "
            "+sweep=quadratic_pack")
    env = dict(subprocess_env, PYTHONPATH=f"{pasted_env(text)['PYTHONPATH']}:{subprocess_env['PYTHONPATH']}")
    run_dir = tmp_path / "run"
    proc = _gpupack([*pasted(text), f"run_dir={run_dir}"], env, repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(p.read_text()) for p in run_dir.glob("packs/*/trainings/*.json")]
    # N=1 and N=2, N=1 at its 1-thread set-up too, and the drift check
    assert len(records) == 8 + 4 + 1 and all(r["status"] == "completed" for r in records)
    assert all(r["workload"] == "own_workload.quadratic" for r in records)
    assert re.search(verdict("own_workload.quadratic", "local"), proc.stdout), proc.stdout


@pytest.mark.slow
def test_knob_sweep_records_metrics_and_shows_the_loader_bound(tmp_path, subprocess_env):
    run_dir = tmp_path / "run"
    proc = _gpupack(["+sweep=mnist_knobs", "packing.factors=[1]", "sweep.grid.batch_size=[128]",
                     "sweep.fixed.train_samples=12000", "sweep.fixed.val_samples=500", "packing.sample_interval_s=0.05",
                     f"run_dir={run_dir}"], subprocess_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trainings = [json.loads(p.read_text()) for p in run_dir.glob("packs/*/trainings/*.json")]
    assert len(trainings) == 4 + 2  # amp x num_workers, and the loader alone per num_workers
    for rec in trainings:
        assert rec["throughput"]["samples_per_s"] > 0 and rec["throughput"]["curve"]
        assert rec["memory"]["peak_rss_mb"] > 50
        assert set(rec["knobs"]) == {"batch_size", "amp", "num_workers", "pin_memory"}
    for path in run_dir.glob("packs/*/pack.json"):
        sampler = json.loads(path.read_text())["sampler"]
        assert sampler["source"] in ("cpu", "nvml") and sampler["n_samples"] >= 1
        if sampler["source"] == "cpu":
            assert "sampling the CPU" in sampler["note"]
            assert any(sample["trainings"] for sample in sampler["samples"])
    assert "Throughput by knob setting" in proc.stdout and "loader-only samples/s" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["knobs"]) == 4 and all(k["loader_bound_samples_per_s"] for k in summary["knobs"])
