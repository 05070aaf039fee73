"""jobs/: ready-to-submit job scripts (issue 30, item 7), not a package. Each parses as bash and names what it runs;
the Alliance's MPS "GPU farming" recipe runs for real through sbatch on the local cluster."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
JOBS = sorted((REPO / "jobs").glob("*.sbatch"))


def test_the_job_scripts_are_there_and_not_a_package():
    assert {p.name for p in JOBS} >= {"gpu_check.sbatch", "mps_farming.sbatch"}
    assert not (REPO / "jobs" / "__init__.py").exists()


@pytest.mark.parametrize("script", JOBS, ids=[p.name for p in JOBS])
def test_a_job_script_parses_and_runs_what_it_names(script: Path):
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert re.search(r"^#SBATCH --gpus-per-node=1$", text, re.M)  # one GPU of any type: sbatch --gpus-per-node=T:1
    for ran in re.findall(r"\b((?:scripts|examples)/[\w./]+)", text):  # what it runs is in the repository
        assert (REPO / ran).exists(), f"{script.name} runs {ran}, which is not in the repository"


@pytest.mark.slurm
def test_the_mps_farming_recipe_runs_through_sbatch(tmp_path, slurm_env):
    """N copies of the training the README packs, farmed in one job as the Alliance's page does (without MPS here:
    the local cluster has no GPU, which the script says); its time per training is what gpupack is put beside."""
    out = tmp_path / "farm"
    train = (f"{REPO / '.venv' / 'bin' / 'python'} examples/train.py --lr 0.05 --seed {{i}} --train-samples 300"
             if (REPO / ".venv").exists() else None)
    env = {**slurm_env, "N": "2", "OUT": str(out), **({"TRAIN": train} if train else {})}
    proc = subprocess.run(["sbatch", "--wait", "--parsable", "--partition=p100", "--cpus-per-task=2", "--mem=2G",
                           f"--output={tmp_path / 'job.out'}", str(REPO / "jobs" / "mps_farming.sbatch")],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    said = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, proc.stderr + said
    assert "no MPS daemon here" in said
    summary = (out / "summary.txt").read_text()
    assert re.search(r"N=2 copies, MPS off, 0 failed; wall [\d.]+ s, time per training [\d.]+ s", summary), summary
    assert all("Accuracy" in (out / f"train-{i}.out").read_text() for i in range(2))


def test_a_jobs_start_imports_no_tables_nor_hydra_parser():
    """What a pack's or lane's job imports before its first training (its entry, the lane runner, a search's lane kind,
    process mode) holds no pandas, pyarrow, Optuna nor Hydra's override parser: each is imported where it is used (the
    records' columnar files at a pack's end, the parser where a space is read from its text, Optuna beside a search's
    first trials), so every job of a sweep starts without their second."""
    heavy = ("pandas", "pyarrow", "optuna", "hydra.core.override_parser", "matplotlib")
    code = ("import sys, gpupack.submit, gpupack.job.lanes, gpupack.job.turns, gpupack.search.lane, "
            "gpupack.job.pack.process; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
