"""Stopping gpupack: the CLI stopped by Ctrl-C, kill or a closed terminal (one line, no traceback, 128 + the signal,
no orphan on the local backend, SLURM jobs left alone), and a second packer of one pack stopped by the pack's lock."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest

from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.errors import RunDirError
from gpupack.job.body import run_pack
from tests.conftest import as_from_a_terminal, training_process, wait_for

REPO = Path(__file__).resolve().parent.parent
SEARCHPATH = f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]"


def sweep_args(run_dir: Path, marker: Path, *more: str) -> list[str]:
    """One pack of two: a training that finishes at once, and one that sleeps 10 minutes on its first attempt only
    (it creates ``marker`` when it starts), so a resume finishes."""
    return [SEARCHPATH, "+sweep=probe_pack", "packing.factors=[2]", "sweep.grid.lr=[0.1]",
            f"sweep.grid.marker=['',{marker}]", "sweep.fixed.first_attempt_sleep_s=600", f"run_dir={run_dir}", *more]


class Cli:
    """``python -m gpupack`` in its own session, as a shell gives a job its own process group (a terminal's Ctrl-C or
    hang-up reaches that whole group, as killpg does here). Its output goes to files, not pipes: an orphan that kept a
    pipe open would keep the test waiting instead of failing."""

    def __init__(self, args: list[str], env: dict[str, str], folder: Path,
                 setup: Callable[[], None] | None = None) -> None:
        self.out, self.err = folder / "cli.out", folder / "cli.err"
        setup = setup or _terminal  # as from a terminal, whatever this test runner inherited (CI may run under nohup)
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "gpupack", *args], stdout=out, stderr=err, text=True,
                                         env=env, cwd=REPO, start_new_session=True, preexec_fn=setup)
        self.pid = self.proc.pid
        self.tree: list[psutil.Process] = []
        self.in_its_group: dict[int, str] = {}

    def stop(self, sig: int, to_group: bool) -> tuple[int, str, str]:
        """Send ``sig`` (to its process group, or to it alone); its exit code, stdout and stderr."""
        self.tree = psutil.Process(self.pid).children(recursive=True)  # controller, packer, fork server, trainings
        self.in_its_group = {p.pid: " ".join(p.cmdline()) for p in [psutil.Process(self.pid), *self.tree]
                             if os.getpgid(p.pid) == self.pid}
        (os.killpg if to_group else os.kill)(self.pid, sig)
        code = self.proc.wait(timeout=60)
        return code, self.out.read_text(), self.err.read_text()

    def gone(self) -> bool:
        return self.proc.poll() is not None

    def stderr(self) -> str:
        return self.err.read_text()

    def clean_up(self) -> None:
        """Whatever a failed test left running, by pid."""
        if self.proc.poll() is None:
            self.proc.kill()
        for p in alive(self.tree):
            p.kill()


def completed(run_dir: Path) -> list[Path]:
    return [p for p in run_dir.glob("packs/*/trainings/*.json") if json.loads(p.read_text())["status"] == "completed"]


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def slow_training(run_dir: Path) -> psutil.Process | None:
    """The process of the training that sleeps (its stderr is a log of the run), forked or fresh."""
    for err_log in run_dir.glob("packs/*/logs/*.err"):
        proc = training_process(err_log)
        if proc is not None and proc.pid != os.getpid():
            return proc
    return None


def one_stop_line(stderr: str, signame: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("gpupack: stopped by")]
    assert len(lines) == 1 and lines[0].startswith(f"gpupack: stopped by {signame}: "), stderr
    return lines[0]


# SIGINT and SIGHUP go to the CLI's whole process group, as a terminal's Ctrl-C and hang-up do; SIGTERM to its pid.
STOPS = [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143), (signal.SIGHUP, True, 129)]


@pytest.mark.slow
@pytest.mark.parametrize("start", ["fork", "fresh"])
@pytest.mark.parametrize("sig, to_group, code", STOPS, ids=[s[0].name for s in STOPS])
def test_a_stopped_cli_cancels_its_local_jobs_and_trainings(tmp_path, subprocess_env, sig, to_group, code, start):
    run_dir, marker = tmp_path / "run", tmp_path / "slow-once"
    args = sweep_args(run_dir, marker, f"packing.process.start={start}")
    cli = Cli(args, subprocess_env, tmp_path)
    try:
        assert wait_for(lambda: marker.exists() and len(completed(run_dir)) == 1 and slow_training(run_dir)), \
            cli.stderr() if cli.gone() else "the trainings did not start"
        slow = slow_training(run_dir)
        assert slow is not None
        exit_code, out, err = cli.stop(sig, to_group)
        assert slow.pid in {p.pid for p in cli.tree}
        # a terminal's Ctrl-C or hang-up reaches gpupack alone: submitit's controller, printing a KeyboardInterrupt
        # traceback or dying of SIGHUP on its own, is in a process group of its own
        assert list(cli.in_its_group) == [cli.pid], cli.in_its_group
        assert exit_code == code, out + err
        line = one_stop_line(err, sig.name)
        assert "local pack jobs and their trainings were cancelled" in line and f"run_dir={run_dir}" in line
        assert wait_for(lambda: not alive(cli.tree), timeout_s=10), [p.cmdline() for p in alive(cli.tree)]  # no orphan
        assert len(completed(run_dir)) == 1  # the finished training keeps its record
    finally:
        cli.clean_up()


@pytest.mark.slow
def test_a_stopped_local_run_resumes_with_the_finished_training_kept(tmp_path, subprocess_env):
    run_dir, marker = tmp_path / "run", tmp_path / "slow-once"
    cli = Cli(sweep_args(run_dir, marker), subprocess_env, tmp_path)
    try:
        assert wait_for(lambda: marker.exists() and len(completed(run_dir)) == 1 and slow_training(run_dir))
        kept = {p: p.read_bytes() for p in completed(run_dir)}
        assert cli.stop(signal.SIGTERM, to_group=False)[0] == 143
    finally:
        cli.clean_up()
    from gpupack import sweep

    states = {p.state for p in sweep.status(run_dir).packs}
    assert states == {"stopped"}, states  # begun here and stopped mid-run: not "not submitted"
    again = subprocess.run([sys.executable, "-m", "gpupack", *sweep_args(run_dir, marker)], capture_output=True,
                           text=True, env=subprocess_env, cwd=REPO, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 to run" in again.stdout
    assert all(p.read_bytes() == content for p, content in kept.items())  # not rerun, not rewritten
    assert len(completed(run_dir)) == 2


_terminal = as_from_a_terminal


def _nohup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.mark.slow
def test_under_nohup_a_hang_up_is_still_ignored(tmp_path, subprocess_env):
    run_dir, marker = tmp_path / "run", tmp_path / "slow-once"
    cli = Cli(sweep_args(run_dir, marker), subprocess_env, tmp_path, setup=_nohup)
    try:
        assert wait_for(lambda: marker.exists() and slow_training(run_dir))
        os.killpg(cli.pid, signal.SIGHUP)
        time.sleep(2)
        assert not cli.gone() and slow_training(run_dir), cli.stderr()
        assert cli.stop(signal.SIGTERM, to_group=False)[0] == 143
    finally:
        cli.clean_up()


@pytest.mark.slurm
def test_a_stopped_cli_leaves_slurm_jobs_running_and_says_how_to_follow_them(tmp_path, slurm_env):
    run_dir, marker = tmp_path / "run", tmp_path / "slow-once"
    args = sweep_args(run_dir, marker, "cluster=slurm", "cluster.poll_s=0.5", "partitions=[v100]")
    cli = Cli(args, slurm_env, tmp_path)
    job_id = None
    try:
        assert wait_for(lambda: (run_dir / "jobs.json").exists() and marker.exists(), timeout_s=240), \
            cli.stderr() if cli.gone() else "the pack job did not start"
        job_id = next(iter(json.loads((run_dir / "jobs.json").read_text()).values()))["job_id"]
        exit_code, out, err = cli.stop(signal.SIGTERM, to_group=False)
        assert exit_code == 143, out + err
        line = one_stop_line(err, "SIGTERM")
        assert f"python -m gpupack status {run_dir}" in line and f"scancel {job_id.split('_')[0]}" in line
        squeue = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                                env=slurm_env, timeout=30)
        assert squeue.stdout.strip() in ("RUNNING", "PENDING", "CONFIGURING"), squeue.stdout + squeue.stderr
    finally:
        cli.clean_up()
        if job_id is not None:
            subprocess.run(["scancel", job_id], env=slurm_env, timeout=30)


# ---------------- a second packer of one pack ----------------

def test_a_second_packer_of_a_pack_stops_and_touches_no_record(tmp_path):
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload="tests.fake_workloads", grid={"tag": ["a", "b"]}, fixed={"steps": 2},
                     factors=[2], modes=["process"], partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    pack = plan.packs[0]
    # the first packer's records: one training finished, one recorded as killed (a second packer would move it aside)
    first = pack.trainings[0].training_id
    write_json_atomic(run.training_record(pack.pack_id, first), {"status": "completed", "training_id": first})
    killed = pack.trainings[1].training_id
    write_json_atomic(run.training_record(pack.pack_id, killed), {"status": "killed", "training_id": killed})
    before = {p: p.read_bytes() for p in run.pack_dir(pack.pack_id).rglob("*") if p.is_file()}
    lock = run.pack_dir(pack.pack_id) / ".lock"
    with open(lock, "a+") as held:  # the first packer, running
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        started = time.time()
        with pytest.raises(RunDirError) as refused:
            run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
        # At once rather than waiting for the lock: a blocking flock would wait as long as the holder holds it (for
        # ever here), so this bound is liveness, not speed.
        assert time.time() - started < 60
    message = str(refused.value)
    assert pack.pack_id in message and "already being run by another packer" in message and "HINT:" in message
    assert "4242" in message
    after = {p: p.read_bytes() for p in run.pack_dir(pack.pack_id).rglob("*") if p.is_file() and p != lock}
    assert after == {p: c for p, c in before.items() if p != lock}  # nothing moved, written or removed
    assert not (run.pack_dir(pack.pack_id) / "attempts").exists()
    assert read_json(run.training_record(pack.pack_id, killed))["status"] == "killed"


def test_the_pack_lock_is_released_when_the_pack_ends(tmp_path):
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload="tests.fake_workloads", grid={"tag": ["a"]}, fixed={"steps": 2},
                     factors=[1], modes=["process"], partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    pack = plan.packs[0]
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    assert rec["n_completed"] == 1
    with open(run.pack_dir(pack.pack_id) / ".lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again: a resume can take it
