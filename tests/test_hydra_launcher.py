"""The Hydra launcher plugin on real apps (tests/hydra_app, examples/hydra_app.py; neither imports gpupack):
the jobs of a pack run at once, each in its own process with Hydra's own job directory; a failing job returns its
failure and does not take its pack down; Optuna gets its return values; bad input is refused before anything runs;
gpupack_slurm submits one array task per pack to the real slurmctld."""
from __future__ import annotations

import datetime
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from omegaconf import OmegaConf

from gpupack.core.store import pickling
from tests.conftest import as_from_a_terminal, needs_hydra_optuna_sweeper, verdict, wait_for

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "tests" / "hydra_app" / "app.py"
EXAMPLE = REPO / "examples" / "hydra_app.py"
SLURM = ["hydra/launcher=gpupack_slurm", "hydra.launcher.partition=p100", "hydra.launcher.gres=gpu:p100:1",
         "hydra.launcher.poll_s=0.5", "hydra.launcher.timeout_min=5", "hydra.launcher.mem_gb=1"]


def multirun(script: Path, args: list[str], cwd: Path, env: dict[str, str], timeout: int = 300):
    return subprocess.run([sys.executable, str(script), "-m", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


def records(sweep_dir: Path) -> dict[int, dict]:
    """gpupack's training records of a multirun, by Hydra job number."""
    out = {}
    for path in sweep_dir.glob(".gpupack/*/packs/*/trainings/*.json"):
        rec = json.loads(path.read_text())
        out[rec["params"]["job_num"]] = rec
    return out


@pytest.mark.slow
def test_jobs_of_a_pack_run_at_once_each_with_hydras_job_dir(tmp_path, subprocess_env):
    sweep_dir = tmp_path / "mr"
    proc = multirun(APP, ["hydra/launcher=gpupack_local", "hydra.launcher.stream=off", "hydra.launcher.pack=2",
                          "hydra.launcher.sample_interval_s=0.2", "lr=0.1,0.2,0.3,0.4", "sleep_s=1.0", "meet=2",
                          f"hydra.sweep.dir={sweep_dir}"], tmp_path, subprocess_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = records(sweep_dir)
    assert sorted(recs) == [0, 1, 2, 3]
    for num, lr in enumerate([0.1, 0.2, 0.3, 0.4]):
        job_dir = sweep_dir / str(num)
        hydra_cfg = OmegaConf.load(job_dir / ".hydra" / "hydra.yaml").hydra
        assert hydra_cfg.job.num == num and hydra_cfg.mode == "MULTIRUN"
        assert str(hydra_cfg.runtime.output_dir) == str(job_dir)
        assert list(OmegaConf.load(job_dir / ".hydra" / "overrides.yaml")) == [f"lr={lr}", "sleep_s=1.0", "meet=2"]
        assert OmegaConf.load(job_dir / ".hydra" / "config.yaml").lr == lr
        assert (job_dir / "done.txt").exists() and (job_dir / "app.log").exists()
        # its prints, beside Hydra's app.log: the same files as gpupack's logs of the job
        assert (job_dir / "app.out").read_text() == f"job prints lr={lr}\n"
        assert f"job warns lr={lr}" in (job_dir / "app.err").read_text()
        rec = recs[num]
        assert rec["status"] == "completed" and rec["metrics"]["return_value"] == pytest.approx(lr * 10)
        assert rec["workload"] == "hydra:app"  # the app, so two apps collected together stay apart
    # Packs of 2 in sweep order, and the two jobs of a pack run at once: jobs 0 and 1 met at a barrier (meet=2), which
    # jobs run one after the other never pass (a barrier, not a clock).
    assert recs[0]["pack_id"] == recs[1]["pack_id"] != recs[2]["pack_id"] == recs[3]["pack_id"]
    for a, b in ((0, 1), (2, 3)):
        assert {recs[a]["concurrent"], recs[b]["concurrent"]} == {2}
    pids = {(sweep_dir / str(n) / "started.txt").read_text().split()[1] for n in range(4)}
    assert len(pids) == 4  # each job in its own process

    collected = subprocess.run([sys.executable, "-m", "gpupack", "collect", str(sweep_dir), "--no-plots"],
                               capture_output=True, text=True, env=subprocess_env, timeout=120)
    assert collected.returncode == 0, collected.stderr
    assert re.search(verdict("hydra:app", "local"), collected.stdout) and "N=2" in collected.stdout, collected.stdout


@pytest.mark.slow
def test_a_failing_job_returns_its_failure_and_the_pack_finishes(tmp_path, subprocess_env):
    sweep_dir = tmp_path / "mr"
    proc = multirun(APP, ["hydra/launcher=gpupack_local", "hydra.launcher.stream=off", "hydra.launcher.pack=3",
                          "mode=kill,raise,ok",
                          f"hydra.sweep.dir={sweep_dir}"], tmp_path, subprocess_env)
    # Hydra's basic sweeper raises the first failed job's error, in sweep order: job 0, killed by a signal.
    assert proc.returncode != 0
    assert "job #0 (mode=kill) killed in gpupack pack local-process-n03-000" in proc.stderr, proc.stderr
    recs = records(sweep_dir)
    assert {n: r["status"] for n, r in recs.items()} == {0: "killed", 1: "failed", 2: "completed"}
    assert recs[0]["signal"] == 9 and "job failure on purpose" in recs[1]["error"]
    assert len({r["pack_id"] for r in recs.values()}) == 1  # one pack of three, and it ran to its end
    assert (sweep_dir / "2" / "done.txt").exists() and not (sweep_dir / "1" / "done.txt").exists()
    pack = json.loads(next(sweep_dir.glob(".gpupack/*/packs/*/pack.json")).read_text())
    assert pack["concurrent"] == 3 and pack["n_completed"] == 1 and pack["n_failed"] == 2


@pytest.mark.slow
def test_a_raising_job_shows_its_own_traceback_and_its_log_named_by_job_number(tmp_path, subprocess_env):
    """As Hydra's basic launcher shows a failed job: the app's frames, not the launcher's or the sweeper's; and
    where its whole log is, a file named by the job's number."""
    sweep_dir = tmp_path / "mr"
    proc = multirun(APP, ["hydra/launcher=gpupack_local", "hydra.launcher.stream=off", "hydra.launcher.pack=2",
                          "mode=ok,raise", "sleep_s=0",
                          f"hydra.sweep.dir={sweep_dir}"], tmp_path, subprocess_env)
    assert proc.returncode != 0
    err = proc.stderr
    assert "job #1 (mode=raise sleep_s=0) failed in gpupack pack local-process-n02-000:" in err, err
    # The app's file, its line and that line's source, whatever cloudpickle does to code it ships by value
    # (3.1.3 names it "<dynamic-code>"; tests/test_pickling.py holds that for any installed version)
    line = next(i for i, text in enumerate(APP.read_text().splitlines(), 1) if "job failure on purpose" in text)
    assert "Traceback (most recent call last):" in err and f'File "{APP}", line {line}, in main' in err, err
    assert 'raise RuntimeError(f"job failure on purpose (lr={cfg.lr})")' in err, err
    assert "RuntimeError: job failure on purpose (lr=0.1)" in err, err
    for foreign in ("basic_sweeper.py", "hydra_launch.py", "gpupack_launcher.py", "run_job", "hydra_job.py"):
        assert foreign not in err, err  # only the app's own frames
    log = Path(err.split("(log: ")[1].split(")")[0])
    assert log.is_file() and log.name.startswith("job1-") and log.suffix == ".err"
    assert "job failure on purpose" in log.read_text()
    assert (sweep_dir / "1" / "app.err").read_text() == log.read_text()  # the same file, in the job's folder too


SHORT = [  # (sweeper options, batch, pack) -> the key the line names, or None
    ({"n_jobs": 1}, 1, 4, "hydra.sweeper.n_jobs=1"),
    ({"n_jobs": 4}, 1, 4, None),  # Optuna's last batch (n_trials not a multiple of n_jobs): nothing to fix
    ({"n_jobs": 2}, 2, 2, None),
    ({"max_batch_size": 2}, 2, 3, "hydra.sweeper.max_batch_size=2"),
    ({"max_batch_size": None}, 2, 4, None),  # the whole multirun is smaller than pack: one pack of 2, as asked
    ({}, 1, 8, None),
]


@pytest.mark.parametrize("sweeper, batch, pack, key", SHORT)
def test_a_batch_smaller_than_pack_because_of_the_sweeper_is_said_with_the_fix(sweeper, batch, pack, key):
    from gpupack.hydra_launch import short_batch

    line = short_batch(OmegaConf.create(sweeper), batch, pack)
    if key is None:
        assert line is None
    else:
        assert line is not None and line.startswith(key) and "HINT" in line and f"={pack}" in line, line


@pytest.mark.slow
def test_the_sweepers_short_batches_are_said_once_per_multirun(tmp_path, subprocess_env):
    sweep_dir = tmp_path / "mr"
    proc = multirun(APP, ["hydra/launcher=gpupack_local", "hydra.launcher.pack=2", "hydra.sweeper.max_batch_size=1",
                          "lr=0.1,0.2", "sleep_s=0", f"hydra.sweep.dir={sweep_dir}"], tmp_path, subprocess_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = (proc.stdout + proc.stderr).count("hydra.sweeper.max_batch_size=1 sends at most 1 job(s) at a time")
    assert said == 1, proc.stdout + proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.slow
def test_a_stopped_multirun_says_one_line_and_leaves_nothing_running(tmp_path, subprocess_env, sig):
    sweep_dir = tmp_path / "mr"
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, str(APP), "-m", "hydra/launcher=gpupack_local",
                                 "hydra.launcher.pack=2", "lr=0.1,0.2", "sleep_s=600", f"hydra.sweep.dir={sweep_dir}"],
                                stdout=o, stderr=e, cwd=tmp_path, env=subprocess_env, start_new_session=True,
                                preexec_fn=as_from_a_terminal)  # Ctrl-C reaches it, whatever CI inherited
    try:
        assert wait_for(lambda: all((sweep_dir / str(n) / "started.txt").exists() for n in (0, 1)), 120)
        jobs = [int((sweep_dir / str(n) / "started.txt").read_text().split()[1]) for n in (0, 1)]
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        text = err.read_text().strip()
        assert code == 128 + sig, text
        assert "Traceback" not in text, text
        assert text.splitlines()[-1].startswith(f"gpupack: stopped by {signal.Signals(sig).name}: its pack jobs "
                                                "and their Hydra jobs were cancelled"), text
        assert wait_for(lambda: not any(_running(pid) for pid in jobs), 30), "a job outlived its multirun"
    finally:
        if proc.poll() is None:
            proc.kill()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
@needs_hydra_optuna_sweeper
def test_optuna_sweeper_gets_the_return_values(tmp_path, subprocess_env):
    sweep_dir = tmp_path / "mr"
    proc = multirun(EXAMPLE, ["hydra/sweeper=optuna", "hydra/launcher=gpupack_local", "hydra.launcher.pack=2",
                              "lr=interval(0.001,0.3)", "hydra.sweeper.n_trials=4", "hydra.sweeper.n_jobs=2",
                              "hydra.sweeper.sampler.seed=1", "train_samples=1000", f"hydra.sweep.dir={sweep_dir}"],
                    tmp_path, subprocess_env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    losses = [rec["metrics"]["return_value"] for rec in records(sweep_dir).values()]
    assert len(losses) == 4 and results.best_value == pytest.approx(min(losses))
    # Optuna asked in two batches of 2: two launches, each one pack of 2.
    assert sorted(p.name for p in (sweep_dir / ".gpupack").iterdir()) == ["launch_000000", "launch_000002"]


BAD = [
    (["hydra.launcher.pack=0"], "hydra.launcher.pack=0"),
    (["hydra.launcher.pack=-3"], "hydra.launcher.pack=-3"),
    (["hydra.launcher.mode=proces"], "hydra.launcher.mode='proces'"),
    (["hydra.launcher.mode=tf_logical"], "hydra.launcher.mode='tf_logical'"),
    (["hydra.launcher.device=tpu"], "hydra.launcher.device='tpu'"),
    (["hydra.launcher.job_timeout_s=-1"], "hydra.launcher.job_timeout_s=-1"),
    (["hydra.launcher.nodes=2"], "hydra.launcher.nodes=2"),
    (["hydra.launcher.max_parallel_packs=0"], "hydra.launcher.max_parallel_packs=0"),
    (["hydra.launcher.start=sideways"], "hydra.launcher.start='sideways'"),
    (["hydra.launcher.preload=[no_such_module_here]"], "hydra.launcher.preload[0]='no_such_module_here'"),
]


def _refused_before_anything_ran(proc, sweep_dir: Path, needle: str) -> None:
    err = proc.stderr.strip()
    assert proc.returncode == 1, proc.stdout + err
    assert err.splitlines()[0].startswith(needle) and "HINT" in err.splitlines()[0], err
    assert "Traceback" not in err
    assert not (sweep_dir / "0").exists() and not (sweep_dir / ".gpupack").exists()


@pytest.mark.parametrize("overrides, needle", BAD, ids=[" ".join(b[0]) for b in BAD])
@pytest.mark.slow
def test_bad_launcher_input_is_one_line_and_runs_nothing(tmp_path, subprocess_env, overrides, needle):
    sweep_dir = tmp_path / "mr"
    proc = multirun(APP, ["hydra/launcher=gpupack_local", *overrides, "lr=0.1,0.2", f"hydra.sweep.dir={sweep_dir}"],
                    tmp_path, subprocess_env, timeout=120)
    _refused_before_anything_ran(proc, sweep_dir, needle)


def _sacct_jobs(env, since: str, workdir: Path) -> set[str]:
    """The job ids slurmdbd lists as submitted since ``since`` (sacct's time: YYYY-MM-DDTHH:MM:SS) from ``workdir``
    (the test's own: other users of the shared slurmctld submit beside it)."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-a", "-S", since, "-o", "JobID,WorkDir"], capture_output=True,
                         text=True, env=env).stdout
    return {job for job, _, where in (line.partition("|") for line in out.splitlines()) if where == str(workdir)}


SLURM_BAD = [
    (["hydra.launcher.pack=9"], "hydra.launcher.pack=9: 9 jobs x hydra.launcher.cpus_per_task=1"),  # > 8 CPUs
    (["hydra.launcher.pack=4", "hydra.launcher.mem_gb=5"], "hydra.launcher.pack=4: 4 jobs x hydra.launcher.mem_gb=5"),
    # mem_gb unset: the default, said as such (an app's jobs are not sized from earlier records); 9 x 2 GB > 16 GB
    (["hydra.launcher.pack=9", "hydra.launcher.mem_gb=null", "hydra.launcher.cpus_per_task=0.5"],
     "hydra.launcher.pack=9: 9 jobs x hydra.launcher.mem_gb=2 (default: a Hydra app's jobs are not sized from "
     "earlier records (hydra.launcher.mem_gb states one job's))"),
    (["hydra.launcher.gres=gpu:p100:2"], "hydra.launcher.gres='gpu:p100:2'"),
    (["hydra.launcher.gres=gpu:k80:1"], "hydra.launcher.gres='gpu:k80:1'"),
    (["hydra.launcher.gres=null", "hydra.launcher.gpus_per_node=2"], "hydra.launcher.gpus_per_node=2"),
    (["hydra.launcher.partition=nowhere"], "hydra.launcher.partition='nowhere'"),
]


@pytest.mark.slurm
@pytest.mark.parametrize("overrides, needle", SLURM_BAD, ids=[" ".join(b[0]) for b in SLURM_BAD])
def test_bad_slurm_launcher_input_submits_nothing(tmp_path, slurm_env, overrides, needle):
    sweep_dir = tmp_path / "mr"
    # jobs submitted from now on (slurmdbd lists an earlier test's job only once it ended: it may appear in a later
    # listing without being this test's): sacct's window starts at this second
    since = datetime.datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    nine_jobs = "lr=" + ",".join(str(k / 10) for k in range(1, 10))  # a pack of 9 is only made from 9 jobs
    proc = multirun(APP, [*SLURM, *overrides, nine_jobs, f"hydra.sweep.dir={sweep_dir}"], tmp_path, slurm_env,
                    timeout=120)
    _refused_before_anything_ran(proc, sweep_dir, needle)
    assert _sacct_jobs(slurm_env, since, tmp_path) == set()


@pytest.mark.slurm
def test_a_pack_larger_than_the_batch_asks_only_for_the_jobs_it_holds(tmp_path, slurm_env):
    """pack=16 with 2 jobs makes one pack of 2: it asks for 2 jobs' CPUs and is not refused for 16."""
    sweep_dir = tmp_path / "mr"
    proc = multirun(APP, [*SLURM, "hydra.launcher.pack=16", "lr=0.1,0.2", "sleep_s=0", f"hydra.sweep.dir={sweep_dir}"],
                    tmp_path, slurm_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    script = next(sweep_dir.glob(".gpupack/*/submitit/*_submission.sh")).read_text()
    assert "#SBATCH --cpus-per-task=2" in script and "#SBATCH --mem=2048M" in script


@pytest.mark.slurm
def test_gpupack_slurm_runs_one_array_task_per_pack(tmp_path, slurm_env):
    sweep_dir = tmp_path / "mr"
    proc = multirun(APP, [*SLURM, "hydra.launcher.stream=off", "hydra.launcher.pack=2", "lr=0.1,0.2,0.3",
                          f"hydra.sweep.dir={sweep_dir}"],
                    tmp_path, slurm_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = records(sweep_dir)
    assert [recs[n]["status"] for n in range(3)] == ["completed"] * 3
    assert recs[0]["pack_id"] == recs[1]["pack_id"] != recs[2]["pack_id"]
    jobs = json.loads(next(sweep_dir.glob(".gpupack/*/jobs.json")).read_text())
    assert len(jobs) == 2
    job_ids = [j["job_id"] for j in jobs.values()]

    def accounted() -> list[list[str]]:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,Partition,State,AllocTRES", "-j",
                              ",".join(job_ids)], capture_output=True, text=True, env=slurm_env, check=True).stdout
        return [line.split("|") for line in out.splitlines()]

    # gpupack sees a pack's end from its result file at once; slurmdbd records it a moment later: wait for that.
    deadline = time.time() + 60
    while time.time() < deadline and not (len(accounted()) == 2 and all(r[2] == "COMPLETED" for r in accounted())):
        time.sleep(0.5)
    rows = accounted()
    assert len(rows) == 2 and all(r[2] == "COMPLETED" and "gres/gpu=1" in r[3] for r in rows), rows
    scripts = list(sweep_dir.glob(".gpupack/*/submitit/*_submission.sh"))
    assert len(scripts) == 2
    for script in scripts:  # what was asked (sacct's Partition can lag right after a job ends)
        text = script.read_text()
        assert "#SBATCH --partition=p100" in text and "#SBATCH --gres=gpu:p100:1" in text
    for num in range(3):
        hydra_cfg = OmegaConf.load(sweep_dir / str(num) / ".hydra" / "hydra.yaml").hydra
        assert hydra_cfg.job.num == num
        assert str(hydra_cfg.job.id).split("_")[0] in {j.split("_")[0] for j in job_ids}  # the SLURM job's id


def test_a_streamed_batch_returns_its_jobs_in_sweep_order(tmp_path):
    """Two lanes deal the batch out every other job; Hydra still gets job 0, 1, 2, ... in that order."""
    import types

    from hydra.core.utils import JobReturn, JobStatus

    from gpupack.core.plan import plan_in_order
    from gpupack.core.store.rundir import RunDir
    from gpupack.hydra_launch import job_returns

    plan = plan_in_order(sweep="app", workload="w", params=[{"job_num": i} for i in range(6)], factor=2,
                         partition="local", mode="process", stream_jobs=2)
    assert [len(p.trainings) for p in plan.packs] == [3, 3]
    run = RunDir(tmp_path)
    for i in (5, 3, 1, 4, 2, 0):  # each lane's job appends its jobs' returns to its file as they end
        ret = JobReturn(overrides=[f"x={i}"], status=JobStatus.COMPLETED, _return_value=i)
        pickling.append(ret, i, run.hydra_returns(f"7_{i % 2}"))
    returns = job_returns(None, types.SimpleNamespace(plan=plan, run=run))
    assert [r.return_value for r in returns] == [0, 1, 2, 3, 4, 5]
    assert sorted(p.name for p in run.hydra_returns_dir.iterdir()) == ["7_0.pkls", "7_1.pkls"]  # a file a job


def test_a_job_s_later_return_wins_and_a_torn_one_is_left_out(tmp_path):
    from hydra.core.utils import JobReturn, JobStatus

    path = tmp_path / "returns" / "9.pkls"
    for value in ("first", "again"):  # a job run again (a requeue, a resume) appends its new return
        pickling.append(JobReturn(status=JobStatus.COMPLETED, _return_value=value), 3, path)
    pickling.append(JobReturn(status=JobStatus.COMPLETED, _return_value="other"), 4, tmp_path / "returns" / "10.pkls")
    whole = path.stat().st_size
    pickling.append(JobReturn(status=JobStatus.COMPLETED, _return_value="torn"), 5, path)
    with open(path, "r+b") as f:  # killed mid-write: the entry cut short...
        f.truncate(whole + 20)
    pickling.append(JobReturn(status=JobStatus.COMPLETED, _return_value="after"), 6, path)  # ...and a requeue appends
    got = pickling.read_streams(sorted((tmp_path / "returns").glob("*.pkls")))
    assert {k: pickling.loads(v).return_value for k, v in got.items()} == {3: "again", 4: "other", 6: "after"}


@pytest.mark.slow
def test_the_launcher_streams_a_batch_of_unequal_jobs(tmp_path, subprocess_env):
    sweep_dir = tmp_path / "mr"
    proc = multirun(APP, ["hydra/launcher=gpupack_local", "hydra.launcher.pack=2",
                          "hydra.launcher.max_parallel_packs=2", "lr=0.1,0.2,0.3", "sleep_s=0,1",
                          f"hydra.sweep.dir={sweep_dir}"], tmp_path, subprocess_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "streaming job(s) of 2 slots" in proc.stderr + proc.stdout
    recs = records(sweep_dir)
    assert sorted(recs) == list(range(6)) and all(r["status"] == "completed" for r in recs.values())
    assert {r["stream"] for r in recs.values()} == {"local-process-n02-queue"}
    for num, rec in recs.items():
        lr = float(next(o for o in rec["params"]["overrides"] if o.startswith("lr=")).split("=")[1])
        assert rec["metrics"]["return_value"] == pytest.approx(lr * 10)
        assert (sweep_dir / str(num) / "done.txt").exists()
    lanes = list(sweep_dir.glob(".gpupack/*/packs/*/pack.json"))
    assert len(lanes) == 2 and sum(json.loads(p.read_text())["n_completed"] for p in lanes) == 6


STRUCTURED_APP = '''
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf


@dataclass
class Settings:
    lr: float = 0.1
    name: str = "a"


ConfigStore.instance().store(name="settings", node=Settings)


@hydra.main(version_base="1.3", config_path=None, config_name="settings")
def main(cfg) -> float:
    settings = OmegaConf.to_object(cfg)
    # the schema's own class, as the app defined it: not a copy the job's config brought with it
    out = Path(HydraConfig.get().runtime.output_dir)
    (out / "kind.txt").write_text(f"{type(settings).__name__} {isinstance(settings, Settings)}")
    return settings.lr * 10


if __name__ == "__main__":
    main()
'''


@pytest.mark.slow
def test_an_app_whose_schema_is_a_dataclass_of_its_script_gets_its_own_class_in_each_job(tmp_path, subprocess_env):
    """A job's config, composed by Hydra's sweeper to check the batch and pickled apart from the launch's payload, is
    typed by the app's own dataclass in the job: ``OmegaConf.to_object`` gives an instance of the class the task
    function sees (a class defined in the script travels by value, in both pickles)."""
    app = tmp_path / "structured_app.py"
    app.write_text(STRUCTURED_APP)
    sweep_dir = tmp_path / "mr"
    proc = multirun(app, ["hydra/launcher=gpupack_local", "hydra.launcher.pack=2", "lr=0.1,0.2,0.3",
                          f"hydra.sweep.dir={sweep_dir}"], tmp_path, subprocess_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list((sweep_dir / ".gpupack").glob("*/hydra_configs.pkls")), "the sweeper's configs were not kept"
    for num in range(3):
        assert (sweep_dir / str(num) / "kind.txt").read_text() == "Settings True", num
    assert sorted(r["metrics"]["return_value"] for r in records(sweep_dir).values()) == pytest.approx([1.0, 2.0, 3.0])
