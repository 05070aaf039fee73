"""The request itself in the dry run (issue 43, item 1): the #SBATCH lines of each kind of job, as submitit writes
them, from the one builder of executor parameters that the submission uses too; the totals against the site's
limits with where each limit comes from; a short pack listing unless dry_run_packs=all."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import submitit.core.utils

from gpupack.cli import main
from gpupack.core.plan import make_plan
from gpupack.core.store.rundir import RunDir
from gpupack.submit.slurm import SlurmSubmitter, commands, sbatch_lines
from gpupack.sweep.setup.compose import compose_config
from tests.fakes import canned_slurm
from tests.test_slurm import PROBE, gpupack

# The lines every job of these presets has, whatever its size: submitit's, and gpupack's one task on one node.
COMMON = ["--account=def-pi", "--nodes=1", "--ntasks-per-node=1", "--open-mode=append",
          "--output=RUN/submitit/%A_%a_0_log.out", "--signal=USR2@90", "--time=60", "--wckey=submitit"]
ERROR = "--error=RUN/submitit/%A_%a_0_log.err"  # where stdout and stderr are two files: a job runs one pack


def plan_packs(partition: str, factor: int, points: int) -> list:
    plan = make_plan(sweep="s", workload="tests.fake_workloads", grid={"lr": [i + 1 for i in range(points)]},
                     fixed={}, factors=[factor], modes=["process"], partitions=[partition], repeats=1)
    return [p for p in plan.packs if p.reference_of is None]  # no drift check: the array's size is the packs'


@pytest.mark.parametrize("preset, partition, factor, points, expected", [
    # Narval, an A100 each: 2 packs of 3 in one array, 3 cores and 3 x 2 GB
    (["cluster=narval"], "a100", 3, 6,
     ["--array=0-1%2", "--cpus-per-task=3", ERROR, "--gpus-per-node=a100:1", "--job-name=gpupack-a100-n3",
      "--mem=6144M"]),
    # Fir, a 1g.10gb MIG slice (the Alliance's model specifier): 3 packs of 1
    (["cluster=fir", "cluster.mem_gb_per_training=4"], "h100_1g_10gb", 1, 3,
     ["--array=0-2%3", "--cpus-per-task=1", ERROR, "--gpus-per-node=nvidia_h100_80gb_hbm3_1g.10gb:1",
      "--job-name=gpupack-h100_1g_10gb-n1", "--mem=4096M"]),
    # Trillium, a whole node of 4 H100s: one job (no array) runs a pack of 2 on each GPU, sized 4 times, its stdout
    # and stderr one file (a lane folds its packs)
    (["cluster=trillium", "cluster.partitions.h100.gpus_per_job=4"], "h100", 2, 8,
     ["--cpus-per-task=8", "--gpus-per-node=h100:4", "--job-name=gpupack-h100-n2-g4", "--mem=16384M",
      "--output=RUN/submitit/%j_0_log.out"]),
])
def test_the_sbatch_lines_of_each_preset(tmp_path, monkeypatch, preset, partition, factor, points, expected):
    monkeypatch.setattr(commands, "slurm_command", canned_slurm(sinfo=None, sacct=None))  # away from the site
    cfg = compose_config(["+sweep=mnist_pack", *preset, "cluster.account=def-pi"])
    sub = SlurmSubmitter(cfg.cluster, RunDir(tmp_path / "run"))
    _forecast, arrays = sub.array_jobs(plan_packs(partition, factor, points))
    assert len(arrays) == 1
    lines = [line.replace(str(tmp_path / "run"), "RUN")
             for line in sbatch_lines(sub.run.submitit_folder, arrays[0].parameters, arrays[0].tasks)]
    common = [c for c in COMMON if not (c.startswith("--output=") and any(e.startswith("--output=") for e in expected))]
    assert lines == [f"#SBATCH {flag}" for flag in sorted(common + expected)]


def test_a_jobs_logs_go_to_a_folder_there_before_it_is_submitted(tmp_path, monkeypatch):
    """SLURM opens a job's stdout as it starts, which an idle node does before sbatch has returned to submitit; a
    folder named by the job's id (%A) is made by submitit only after, and the job failed with "Could not open stdout
    file" (seen in CI). So no log's folder waits on the job's id, and the folder is made before any sbatch."""
    monkeypatch.setattr(commands, "slurm_command", canned_slurm(sinfo=None, sacct=None))
    cfg = compose_config(["+sweep=mnist_pack", "cluster=narval", "cluster.account=def-pi"])
    sub = SlurmSubmitter(cfg.cluster, RunDir(tmp_path / "run"))
    _forecast, arrays = sub.array_jobs(plan_packs("a100", 3, 6))
    logs = [line.split("=", 1)[1] for line in sbatch_lines(sub.run.submitit_folder, arrays[0].parameters,
                                                             arrays[0].tasks)
            if line.startswith(("#SBATCH --output=", "#SBATCH --error="))]
    assert len(logs) == 2 and all("%" not in str(Path(log).parent) for log in logs), logs
    assert submitit.core.utils.JobPaths.get_first_id_independent_folder(sub.run.submitit_folder) == \
        sub.run.submitit_folder  # what submitit makes before its sbatch


def test_the_dry_run_away_from_the_cluster_shows_the_request_and_where_its_limits_come_from(tmp_path, monkeypatch,
                                                                                          capsys):
    """Narval's dry run where no SLURM answers (no SLURM_CONF, no slurmctld): the request as submitit will write it,
    and each limit said known from the preset or unknown, never "0 queued"."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    code = main(["+sweep=mnist_pack", "cluster=narval", "cluster.account=def-someone", "dry_run=true",
                 f"run_dir={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    said = " ".join(out.split())  # as one line, whatever the terminal's width
    for flag in ("--account=def-someone", "--gpus-per-node=a100:1", "--cpus-per-task=3", "--mem=6144M", "--time=60",
                 "--signal=USR2@90", "--array=0-1%2", f"--output={tmp_path / 'run'}/submitit/%A_%a_0_log.out"):
        assert f"#SBATCH {flag}" in said, flag
    assert "a100, N=3 (process): 2 jobs in 1 array:" in said and "a100, N=1 (process): 5 jobs in 1 array:" in said
    assert ("per-user job limit: 1,000, from the preset (cluster.max_jobs_per_user=1000, the site's stated limit); "
            "SLURM's own: unknown (sacctmgr not reachable: sacctmgr") in said
    assert "MaxArraySize: unknown (scontrol not reachable: scontrol" in said
    assert "queued now: unknown (squeue not reachable: squeue" in said and "0 queued" not in said
    assert "sinfo partition check: skipped (sinfo not reachable: sinfo" in said
    assert "... and 6 more packs; all with dry_run_packs=all" in said and not (tmp_path / "run").exists()


def test_dry_run_packs_all_lists_every_pack(tmp_path, capsys):
    assert main(["+sweep=mnist_pack", "dry_run=true", "dry_run_packs=all", f"run_dir={tmp_path / 'run'}"]) == 0
    out = capsys.readouterr().out
    # 4 rounds of N = 1-4 and of N=1's 1-thread set-up (this CPU would give N=1 more), and the drift check
    listed = re.findall(r"^  (?:round \d+|again at the end)", out, re.MULTILINE)
    assert len(listed) == 11 + 4 and "more packs" not in out
    # the local backend says in one line what it runs instead of sbatch
    assert len([line for line in out.splitlines() if "request:" in line]) == 1
    assert "request: no sbatch here: submitit's LocalExecutor runs" in " ".join(out.split())


def submission_lines(run_dir: Path) -> set[tuple[str, ...]]:
    """The #SBATCH lines of each submission.sh submitit wrote in the run's submitit folder (one per sbatch)."""
    scripts = sorted(run_dir.glob("submitit/*_submission.sh"))
    return {tuple(line for line in s.read_text().splitlines() if line.startswith("#SBATCH")) for s in scripts}


def dry_run_blocks(out: str) -> set[tuple[str, ...]]:
    """The #SBATCH lines of each block the dry run printed."""
    blocks: list[list[str]] = []
    for line in out.splitlines():
        if line.strip().startswith("#SBATCH"):
            blocks[-1].append(line.strip())
        elif line.rstrip().endswith(":") and re.match(r"^    \S.*\((?:process|fused)\): ", line):
            blocks.append([])
    return {tuple(b) for b in blocks}


@pytest.mark.slurm
def test_the_dry_run_shows_the_sbatch_lines_submitit_then_writes(tmp_path, slurm_env):
    """A dry run, then the real submission of the same sweep into the same run directory: each submission.sh's
    #SBATCH lines are one of the dry run's blocks, and each block one of theirs (an array of N=1 and its drift
    check, a single job of N=2). Nothing job-specific differs: submitit writes %A/%a/%j, not the job's id."""
    run_dir = tmp_path / "run"
    args = PROBE + ["partitions=[v100]", "packing.factors=[1,2]", "sweep.grid.lr=[0.1,0.2]", f"run_dir={run_dir}"]
    dry = gpupack(args + ["dry_run=true"], slurm_env, timeout=120)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert not run_dir.exists()
    shown = dry_run_blocks(dry.stdout)
    assert len(shown) == 2 and "v100, N=2 (process): 1 job (no array):" in dry.stdout, dry.stdout
    sub = gpupack(args + ["wait=false"], slurm_env, timeout=120)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    job_ids = sorted({j.split("_")[0] for j in re.findall(r"\b\d+(?:_\d+)?\b", sub.stdout.split("pack job(s):")[1])})
    try:
        assert submission_lines(run_dir) == shown
    finally:  # the jobs are not needed past their submission
        subprocess.run(["scancel", *job_ids], env=slurm_env, capture_output=True, timeout=60)


@pytest.mark.parametrize("search", [False, True])
def test_an_auto_dry_run_shows_the_request_of_its_first_step(tmp_path, monkeypatch, capsys, search):
    """packing.factors=auto decides each step from the last, but its first is known: the dry run shows its #SBATCH
    lines (N=1's packs on the partition); a search then says its lanes stream at the best N."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    more = ["search=optuna", "search.n_trials=8", "+search.space.lr=interval(0.01, 0.1)"] if search else []
    code = main(["+sweep=mnist_pack", "cluster=narval", "cluster.account=def-someone", "packing.factors=auto",
                 "packing.auto.repeats=2", *more, "dry_run=true", f"run_dir={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    said = " ".join(out.split())
    assert "it starts with 2 pack(s) of N=1 per partition, submitted so:" in said, said
    assert "a100, N=1 (process): 2 jobs in 1 array:" in said and "#SBATCH --array=0-1%2" in said
    assert "#SBATCH --account=def-someone" in said and "#SBATCH --gpus-per-node=a100:1" in said
    assert ("then the search: up to" in said and "ask the study for its 8 trials" in said) is search
    assert not (tmp_path / "run").exists()
