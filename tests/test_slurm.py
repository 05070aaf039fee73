"""Against the real local slurmctld (scripts/local_slurm.sh): submission, arrays, detach + status + collect,
resume after scancel, requeue at the time limit, and bad input refused before submission."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpupack.cli import main
from gpupack.submit.slurm import resources, sbatch_parameters

REPO = Path(__file__).resolve().parent.parent
PROBE = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack", "cluster=slurm",
         "cluster.poll_s=0.5"]


def gpupack(args, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "gpupack", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)


def said(proc: subprocess.CompletedProcess) -> str:
    """What a failed gpupack printed, for an assertion: the head of stdout (where a pack's error is), its tail (the
    table) and stderr's tail."""
    out = proc.stdout if len(proc.stdout) <= 8000 else f"{proc.stdout[:5000]}\n[...]\n{proc.stdout[-3000:]}"
    return f"{out}\n--- stderr ---\n{proc.stderr[-3000:]}"


def sacct(env, job_ids, fields="JobID,State,AllocTRES"):
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", fields, "-j", ",".join(job_ids)], capture_output=True,
                         text=True, env=env, check=True).stdout
    return [line.split("|") for line in out.splitlines()]


def known_jobs(env: dict[str, str]) -> set[str]:
    """Every job the slurmctld knows now, ended ones included (it keeps them MinJobAge, 300 s here): a job submitted
    from now on is one not in this set. (sacct learns of a job from slurmdbd a moment after it ends, and by the
    second: a job the test before submitted in the last second would look like this one's.)"""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    return set(out)


def records(run_dir: Path) -> dict[str, dict]:
    """Each training's latest record: in its pack's folder, or where its lane folded it (gpupack.core.store.journal)."""
    from gpupack.core.store.journal import read_folded
    from gpupack.core.store.rundir import RunDir

    folded = {f"{pack}/{tid}": history[-1] for (pack, tid), history in read_folded(RunDir(run_dir)).trainings.items()}
    return {**folded, **{f"{p.parent.parent.name}/{p.stem}": json.loads(p.read_text())
                         for p in run_dir.glob("packs/*/trainings/*.json")}}


def pack_records(run_dir: Path) -> list[dict]:
    from gpupack.core.store.journal import read_folded
    from gpupack.core.store.rundir import RunDir

    here = {p.parent.name: json.loads(p.read_text()) for p in run_dir.glob("packs/*/pack.json")}
    return [*here.values(), *(h[-1] for k, h in read_folded(RunDir(run_dir)).packs.items() if k not in here)]


from tests.conftest import verdict, wait_for  # noqa: E402

# ---------------- pure builders ----------------

@pytest.mark.parametrize("factor, cpus_per, mem_per, cpus, mem_mb", [
    (1, 1.0, 2.0, 1, 2048), (3, 1.0, 2.0, 3, 6144), (34, 0.25, 0.5, 9, 17408), (5, 0.5, 1.0, 3, 5120)])
def test_resources_scale_with_n(factor, cpus_per, mem_per, cpus, mem_mb):
    assert resources(factor, cpus_per, mem_per) == (cpus, mem_mb)


def test_sbatch_parameters_per_request_form():
    from types import SimpleNamespace as NS

    cluster = NS(cpus_per_training=1.0, mem_gb_per_training=2.0, timeout_min=30, signal_delay_s=60,
                 array_parallelism=8, setup=["module load python/3.11"], additional_parameters={"qos": "x"})
    modern = sbatch_parameters(cluster, "h100", NS(gpu="h100", request="gpus_per_node", slurm_partition=None,
                                                   constraint=None), 3, "def-pi")
    assert modern["gpus_per_node"] == "h100:1" and "gres" not in modern and "partition" not in modern
    assert modern["cpus_per_task"] == 3 and modern["mem"] == "6144M" and modern["account"] == "def-pi"
    assert modern["setup"] == ["module load python/3.11"] and modern["additional_parameters"] == {"qos": "x"}
    old = sbatch_parameters(cluster, "p100", NS(gpu="p100", request="gres", slurm_partition="gpu",
                                                constraint="cascade"), 1, None)
    assert old["gres"] == "gpu:p100:1" and old["partition"] == "gpu" and old["constraint"] == "cascade"
    assert "account" not in old and "gpus_per_node" not in old


# ---------------- bad input, refused before anything is submitted ----------------

ALLIANCE_CASES = [
    (["cluster=fir"], "cluster.account=None", "def-yourpi"),
    (["cluster=narval", "cluster.account=def-pi", "partitions=[v100]"], "partitions[0]='v100'", "a100"),
    (["cluster=fir", "cluster.account=def-pi", "packing.factors=[1,13]"], "packing.factors[1]=13",
     "cluster.cpus_per_training"),
    (["cluster=rorqual", "cluster.account=def-pi", "partitions=[h100_1g]"], "partitions[0]='h100_1g'",
     "h100_1g_10gb"),
    (["cluster=local", "wait=false"], "wait=False", "SLURM"),
    (["cluster=local", "partitions=[v100]"], "partitions=['v100']", "cluster=slurm"),
]


@pytest.mark.parametrize("overrides, key, hint", ALLIANCE_CASES, ids=[" ".join(c[0]) for c in ALLIANCE_CASES])
def test_cluster_bad_input_without_slurm(tmp_path, capsys, monkeypatch, overrides, key, hint):
    for var in ("SLURM_ACCOUNT", "SBATCH_ACCOUNT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo here (away from the cluster): the preset alone is checked
    code = main(["+sweep=mnist_pack", *overrides, f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert key in err and hint in err and "HINT:" in err, err
    assert not (tmp_path / "run").exists()


def test_account_from_the_environment_is_accepted(tmp_path, monkeypatch):
    from gpupack.core.store.rundir import RunDir
    from gpupack.submit import load_submitter
    from gpupack.sweep.setup.compose import compose_config

    monkeypatch.setenv("SLURM_ACCOUNT", "def-env")
    monkeypatch.setenv("PATH", str(tmp_path))
    cfg = compose_config(["+sweep=mnist_pack", "cluster=fir"])
    sub = load_submitter("slurm", cfg.cluster, RunDir(Path("unused")))
    sub.check(["h100"])
    assert sub.account() == "def-env"


SLURM_CASES = [
    (["partitions=[v100]", "cluster.partitions.v100.gpu=h100"], "cluster.partitions.v100.gpu='h100'", "v100"),
    (["cluster.partitions.p100.slurm_partition=gpus"], "cluster.partitions.p100.slurm_partition='gpus'", "HINT"),
    (["packing.factors=[1,9]"], "packing.factors[1]=9", "cluster.cpus_per_training"),
    (["cluster.mem_gb_per_training=10"], "packing.factors[1]=2", "mem_gb_per_training"),
    (["partitions=[k80]"], "partitions[0]='k80'", "HINT"),
]


@pytest.mark.slurm
@pytest.mark.parametrize("overrides, key, hint", SLURM_CASES, ids=[" ".join(c[0]) for c in SLURM_CASES])
def test_bad_input_checked_against_sinfo(tmp_path, capsys, monkeypatch, slurm_env, overrides, key, hint):
    monkeypatch.setenv("SLURM_CONF", slurm_env["SLURM_CONF"])
    before = known_jobs(slurm_env)
    code = main(PROBE + overrides + [f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert key in err and hint in err, err
    assert not (tmp_path / "run").exists()
    assert known_jobs(slurm_env) - before == set()  # nothing was submitted


# ---------------- real submissions ----------------

@pytest.mark.slurm
@pytest.mark.slow
def test_sweep_across_partitions_with_arrays(tmp_path, slurm_env):
    run_dir = tmp_path / "run"
    proc = gpupack(PROBE + ["partitions=[p100,a100]", "sweep.grid.lr=[0.1,0.2,0.3]", f"run_dir={run_dir}"],
                   slurm_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads((run_dir / "plan.json").read_text())
    assert len(records(run_dir)) == sum(p["factor"] for p in plan["packs"]) == 2 * (3 + 4 + 1)  # a drift check each
    assert all(r["status"] == "completed" for r in records(run_dir).values())
    for partition in ("p100", "a100"):  # the local cluster's 3 nodes share 2 cores: all its packs may run under
        # each other's load, and then no N is named, and the run says so
        assert re.search(verdict("tests.fake_workloads", partition), proc.stdout), proc.stdout
    jobs = json.loads((run_dir / "jobs.json").read_text())
    n1 = [j["job_id"] for p, j in jobs.items() if "-n01-" in p and p.startswith("p100")]
    assert len(n1) == 3 + 1 and len({j.split("_")[0] for j in n1}) == 1 and all("_" in j for j in n1)  # one array
    ids = [j["job_id"] for j in jobs.values()]
    # slurmdbd records a job shortly after it ends: wait for accounting to list them all, then read it once.
    assert wait_for(lambda: len(sacct(slurm_env, ids, "JobID")) == len(jobs), timeout_s=60)
    rows = sacct(slurm_env, ids, "JobID,Partition,State,AllocTRES")
    assert len(rows) == len(jobs)
    for _job_id, partition, state, tres in rows:
        assert state == "COMPLETED" and "gres/gpu=1" in tres and partition in ("p100", "a100")
    packs = [json.loads(p.read_text()) for p in run_dir.glob("packs/*/pack.json")]
    assert all(p["slurm_job_gpus"] is not None and p["job_id"] for p in packs)


@pytest.mark.slurm
@pytest.mark.slow
def test_detach_then_status_and_collect(tmp_path, slurm_env):
    run_dir = tmp_path / "run"
    proc = gpupack(PROBE + ["partitions=[v100]", "wait=false", f"run_dir={run_dir}"], slurm_env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # N=1 twice, N=2, the drift check
    assert "Submitted 4 pack job(s)" in proc.stdout and f"python -m gpupack status {run_dir}" in proc.stdout

    def status_text() -> str:
        out = gpupack(["status", str(run_dir)], slurm_env, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    first = status_text()
    assert "v100:" in first
    watched = gpupack(["watch", str(run_dir), "--every", "0.5"], slurm_env, timeout=300)  # from another shell
    assert watched.returncode == 0, watched.stdout + watched.stderr
    # N=1 twice, N=2, the drift check
    assert re.search(r"v100: trainings completed \d+, failed 0, running 0, waiting 0; packs done 4", watched.stdout)
    assert re.search(r"v100: trainings completed \d+, failed 0, running 0, waiting 0; packs done 4", status_text())
    collected = gpupack(["collect", str(run_dir)], slurm_env, timeout=120)
    # the local cluster's 3 nodes share 2 cores: where every pack ran under another's load, no N is named, and
    # collect says so for the partition instead
    assert collected.returncode == 0, said(collected)
    assert re.search(verdict("tests.fake_workloads", "v100"), collected.stdout), said(collected)


def slow_once(tmp_path: Path, partition: str, *extra: str) -> tuple[Path, Path, list[str]]:
    """A pack of two trainings on one partition: one fast (no marker), one slow on its first attempt only."""
    run_dir, marker = tmp_path / "run", tmp_path / "slow-once"
    return run_dir, marker, PROBE + [f"partitions=[{partition}]", "packing.factors=[2]", "sweep.grid.lr=[0.1]",
                                     f"sweep.grid.marker=['',{marker}]", "sweep.fixed.first_attempt_sleep_s=600",
                                     *extra, f"run_dir={run_dir}"]


@pytest.mark.slurm
@pytest.mark.slow
def test_resume_after_scancel_reruns_only_missing_trainings(tmp_path, slurm_env):
    run_dir, marker, args = slow_once(tmp_path, "a100")
    proc = gpupack(args + ["wait=false"], slurm_env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = next(iter(json.loads((run_dir / "jobs.json").read_text()).values()))["job_id"]
    # the fast training finishes and is recorded while the slow one still runs
    assert wait_for(lambda: any(r["status"] == "completed" for r in records(run_dir).values()) and marker.exists())
    time.sleep(1.0)
    subprocess.run(["scancel", job_id], env=slurm_env, check=True)
    assert wait_for(lambda: sacct(slurm_env, [job_id], "JobID,State")[0][1].startswith("CANCELLED"))
    done_before = {k: v for k, v in records(run_dir).items() if v["status"] == "completed"}
    assert len(done_before) == 1
    bytes_before = {p: p.read_bytes() for p in run_dir.glob("packs/*/trainings/*.json")
                    if json.loads(p.read_text())["status"] == "completed"}
    # the slow one may have been recorded as killed (scancel signals the whole job): kept, then moved aside
    killed = [k for k, v in records(run_dir).items() if v["status"] != "completed"]

    again = gpupack(args, slurm_env)  # same command, same run directory: resume
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 to run" in again.stdout
    after = records(run_dir)
    assert len(after) == 2 and all(r["status"] == "completed" for r in after.values())
    for path, content in bytes_before.items():
        assert path.read_bytes() == content  # the finished training was neither rerun nor rewritten
    rerun = [r for k, r in after.items() if k not in done_before]
    assert len(rerun) == 1 and rerun[0]["concurrent"] == 1
    for key in killed:
        pack_id, tid = key.split("/")
        assert (run_dir / "packs" / pack_id / "attempts" / "1" / f"{tid}.json").exists()
    pack = json.loads(next(run_dir.glob("packs/*/pack.json")).read_text())
    assert pack["training_ids"] == [rerun[0]["training_id"]] and pack["complete"] is False


@pytest.mark.slurm
@pytest.mark.slow
def test_time_limit_requeues_and_finished_trainings_are_not_rerun(tmp_path, slurm_env):
    # SLURM's limit is 3 minutes; the pack is signalled 60 s before it (SLURM may signal up to 60 s earlier than
    # asked), then requeued by submitit's handler. With 30 s per attempt a loaded CI machine once timed out every
    # attempt; with 30 s before a 2-minute limit, the handler's `scontrol requeue` once waited on a slurmctld busy
    # with the SLURM tier's other jobs until the limit killed it (2026-11-30).
    run_dir, marker, args = slow_once(tmp_path, "p100", "cluster.timeout_min=3", "cluster.signal_delay_s=60")
    proc = gpupack(args, slurm_env, timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = records(run_dir)
    assert len(recs) == 2 and all(r["status"] == "completed" for r in recs.values())
    fast = next(r for r in recs.values() if not r["params"]["marker"])
    slow = next(r for r in recs.values() if r["params"]["marker"])
    assert slow["started_at"] > fast["ended_at"]  # the slow one ran again, in the requeued job
    assert fast["concurrent"] == 2 and slow["concurrent"] == 1  # the fast one was not rerun
    job_id = json.loads((run_dir / "jobs.json").read_text())[fast["pack_id"]]["job_id"]
    log = "".join(p.read_text() for p in (run_dir / "submitit").glob(f"{job_id}_*.err"))
    assert "timed-out" in log or "Requeued" in log or "requeue" in log.lower(), log[-2000:]


# ---------------- the site's limits, as the local slurmctld enforces them (issue 30) ----------------

@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_of_two_gpus_runs_two_packs_each_on_its_gpu_billed_as_two_bundles(tmp_path, slurm_env):
    """Issue 30, item 4: the local cluster's nodes hold 2 GPUs; gpus_per_job=2 runs 2 x N trainings in one job, each
    training seeing only its pack's GPU, and the job is billed as 2 bundles."""
    run_dir = tmp_path / "run"
    proc = gpupack(PROBE + ["partitions=[v100]", "packing.factors=[2]", "sweep.grid.lr=[0.1,0.2,0.3,0.4]",
                            "+sweep.fixed.report_env=CUDA_VISIBLE_DEVICES", "cluster.partitions.v100.gpus_per_job=2",
                            "cluster.partitions.v100.bundle_cores=2", "cluster.partitions.v100.bundle_mem_gb=8",
                            f"run_dir={run_dir}"], slurm_env)
    assert proc.returncode == 0, said(proc)
    assert re.search(r"jobs: 1 \(lanes of packs: up to 2 packs each, one at a time on each GPU\) in 1 job array\(s\)"
                     r".*, 2 GPUs in all", " ".join(proc.stdout.split()))
    recs = records(run_dir)
    assert len(recs) == 4 and all(r["status"] == "completed" for r in recs.values())
    by_pack: dict[str, set] = {}
    for key, r in recs.items():
        seen = r["metrics"]["env"]["CUDA_VISIBLE_DEVICES"]
        assert seen == r["cuda_visible_devices"] and "," not in seen  # one GPU, the one its record names
        by_pack.setdefault(key.split("/")[0], set()).add(seen)
    assert sorted(g for gpus in by_pack.values() for g in gpus) == ["0", "1"]  # a pack on each of the job's GPUs
    packs = pack_records(run_dir)
    assert len(packs) == 2 and len({p["job_id"] for p in packs}) == 1 and all(p["billing"]["gpus"] == 2 for p in packs)
    job = packs[0]["job_id"]
    assert wait_for(lambda: len(sacct(slurm_env, [job], "JobID")) == 1, timeout_s=60)
    assert "gres/gpu=2" in sacct(slurm_env, [job])[0][2]
    collected = gpupack(["collect", str(run_dir)], slurm_env, timeout=120)
    assert collected.returncode == 0, collected.stderr


def site_limits(env: dict[str, str], *numbers: int) -> None:
    """The local cluster's MaxArraySize and this user's MaxSubmitJobs, lowered (numbers) or back to SLURM's own."""
    subprocess.run([str(REPO / "scripts" / "local_slurm.sh"), "limits", *map(str, numbers)], env=env, check=True,
                   capture_output=True, timeout=120)


@pytest.fixture
def limited(slurm_env, request):
    """The local cluster with a site's limits lowered for one test (the parameter: MaxArraySize[, MaxSubmitJobs]),
    then SLURM's own again."""
    site_limits(slurm_env, *request.param)
    try:
        yield request.param
    finally:
        site_limits(slurm_env)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("limited", [(5,)], indirect=True)
def test_a_group_past_max_array_size_runs_as_several_arrays(tmp_path, slurm_env, limited):
    run_dir = tmp_path / "run"
    proc = gpupack(PROBE + ["partitions=[p100]", "packing.factors=[1]", "sweep.grid.lr=range(1,13)",
                            "sweep.fixed.steps=2", "cluster.array_parallelism=12", f"run_dir={run_dir}"], slurm_env)
    assert proc.returncode == 0, said(proc)
    assert "12 job array" not in proc.stdout and "in 3 job array(s) of at most 5 tasks" in " ".join(proc.stdout.split())
    jobs = json.loads((run_dir / "jobs.json").read_text())
    arrays = {j["job_id"].split("_")[0] for j in jobs.values()}
    assert len(jobs) == 12 and len(arrays) == 3  # 5 + 5 + 2 tasks, none refused
    recs = records(run_dir)
    assert len(recs) == 12 and all(r["status"] == "completed" for r in recs.values())  # every training once


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("limited", [(1001, 3)], indirect=True)
def test_a_sweep_past_the_users_job_limit_runs_as_lanes_within_it(tmp_path, slurm_env, limited):
    """6 packs, MaxSubmitJobs=3: three jobs run two packs each in turn; every training completes once."""
    before = known_jobs(slurm_env)
    run_dir = tmp_path / "run"
    proc = gpupack(PROBE + ["partitions=[p100]", "packing.factors=[1]", "sweep.grid.lr=range(1,7)",
                            "sweep.fixed.steps=2", f"run_dir={run_dir}"], slurm_env)
    assert proc.returncode == 0, said(proc)
    assert "jobs: 3 (lanes of packs: up to 2 packs each, in turn)" in " ".join(proc.stdout.split())
    jobs = json.loads((run_dir / "jobs.json").read_text())
    assert len(jobs) == 6 and len({j["job_id"] for j in jobs.values()}) == 3
    recs = records(run_dir)
    assert len(recs) == 6 and all(r["status"] == "completed" for r in recs.values())
    lanes = {p["job_id"] for p in pack_records(run_dir)}
    # each lane folded its packs: a journal and a log per lane, no pack folder left (issue 30, item 3)
    assert len(list(run_dir.glob("lanes/*.jsonl"))) == 3 and not list(run_dir.glob("packs/*"))
    # collect read the journals (the packs may have run under each other's load on the 2 shared cores: no N named)
    assert re.search(verdict("tests.fake_workloads", "p100"), proc.stdout), said(proc)
    assert len(lanes) == 3  # each pack's record names the lane (array task) that ran it
    assert len(known_jobs(slurm_env) - before) <= 3  # never more jobs than the limit (which SLURM enforces here)


@pytest.mark.slurm
@pytest.mark.parametrize("limited", [(1001, 3)], indirect=True)
def test_a_sweep_that_cannot_fit_the_users_job_limit_is_refused_before_any_sbatch(tmp_path, slurm_env, limited):
    before = known_jobs(slurm_env)
    proc = gpupack(PROBE + ["partitions=[p100]", "packing.factors=[1,2,3,4]", f"run_dir={tmp_path / 'run'}"],
                   slurm_env)  # four (partition, mode, N): four lanes at the least, past MaxSubmitJobs=3
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()[-1]
    assert "needs 4 job(s) at the least" in err and "MaxSubmitJobs=3" in err and "nothing was submitted" in err, err
    assert known_jobs(slurm_env) - before == set()  # no sbatch ran


@pytest.mark.slurm
@pytest.mark.slow
def test_a_search_of_8_trials_runs_as_2_lanes_of_one_array_sharing_the_study(tmp_path, slurm_env):
    """search=optuna on the real SLURM (issue 46): 2 lanes of N=2, one job array, both asking the one study journal
    in the run directory (the shared filesystem): every trial once, asked by both lanes, all 8 finished."""
    from gpupack.core.store.rundir import RunDir
    from gpupack.search.study import COMPLETE, Study

    run_dir = tmp_path / "run"
    proc = gpupack(PROBE + ["partitions=[v100]", "search=optuna", "search.n_trials=8", "packing.factors=[2]",
                            "packing.jobs=2", "sweep.fixed.steps=2", "+search.space.lr=interval(0.01, 1)",
                            "search.pruner=none", f"run_dir={run_dir}"], slurm_env)
    assert proc.returncode == 0, said(proc)
    assert proc.stdout.strip().splitlines()[-1].startswith("search: 8 of 8 trials finished (8 completed")
    jobs = json.loads((run_dir / "jobs.json").read_text())
    assert len(jobs) == 2 and len({j["job_id"].split("_")[0] for j in jobs.values()}) == 1  # one array of 2 lanes
    journal = Study(RunDir(run_dir).study).read()
    assert sorted(journal.trials) == list(range(8)) and journal.count(COMPLETE) == 8
    assert {t.lane for t in journal.trials.values()} == set(jobs)  # both lanes asked the one journal
    ran = [r["training_id"] for r in records(run_dir).values()]
    assert len(ran) == len(set(ran)) == 8  # every trial once
