"""Issue 42, item 3: two commands on one run directory. The second is refused in one line that names who holds it,
whatever the timing: the run lock is taken before the directory is looked at, and no probe file is shared; and while
the local jobs of an earlier command killed by SIGKILL still run, a new command is refused naming them (they hold the
run lock with it: gpupack.core.store.rundir.RunLock says why)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from gpupack.core.store.rundir import Holder, RunDir, RunLock, busy_refusal
from gpupack.errors import RunDirError
from gpupack.sweep.flow.run import open_run_dir
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parent.parent
SEARCHPATH = f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]"
HERE = socket.gethostname()


@pytest.mark.parametrize("text, holder", [
    ("12 node1 2024-05-01T12:00:00\n", Holder(12, "node1", "2024-05-01T12:00:00")),
    ("12 node1\n", Holder(12, "node1")),  # a lock an earlier gpupack wrote
    ("12 node1 2024-05-01T12:00:00\njob 40\njob 41\n", Holder(12, "node1", "2024-05-01T12:00:00", (40, 41))),
    ("12 node1 2024-05-01T12:00:00\njob x\nnoise\n", Holder(12, "node1", "2024-05-01T12:00:00")),
    ("", None),
    ("12\n", Holder(12, "")),  # a bare pid: the host not said
    ("1", Holder(1, "")),
    ("x node1\n", None),
])
def test_a_lock_files_holder(text, holder):
    assert Holder.parse(text) == holder


ROOT = Path("/r")
ALIVE = {40, 12}


@pytest.mark.parametrize("holder, says, not_says", [
    (Holder(12, HERE, "T"), [f"run_dir='/r': another gpupack sweep is running in it (pid 12 on {HERE}, since T). "
                             "HINT: wait for it to end (or stop it: kill 12), or choose another run_dir=..."], []),
    (Holder(12, "elsewhere", "T", (40,)), ["another gpupack sweep is running in it (pid 12 on elsewhere, since T)"],
     ["kill"]),  # another host's: nothing here can tell or stop it
    (Holder(13, HERE, "T", (40, 41)), ["the pack jobs of an earlier gpupack (pid 13 on", "no longer running) still "
                                       "run in it: pid 40. HINT: wait for them to end (python -m gpupack watch /r)"],
     ["41"]),  # its dead job is not named
    (Holder(13, HERE, "T", (41,)), ["another gpupack sweep is running in it"], []),  # none alive: the lock was let go
    (None, ["run_dir='/r': another gpupack sweep is running in it. HINT: wait for it to end, or"], []),
])
def test_a_refusal_names_who_holds_the_run(holder, says, not_says):
    line = str(busy_refusal(ROOT, holder, lambda pid: pid in ALIVE, HERE))
    assert "\n" not in line and all(s in line for s in says) and not any(s in line for s in not_says), line


def test_a_second_opener_of_a_run_being_written_is_refused_for_the_lock_not_for_what_it_reads(tmp_path):
    """The race of issue 42: the first command holds the lock and has written config.yaml but not yet plan.json. The
    second used to read that as "exists and is not a gpupack run"; it now takes the lock first and is refused for it,
    naming the holder; and nothing of the first's is touched."""
    run = RunDir(tmp_path / "run")
    with open_run_dir(run, None) as (resumed, _):
        assert not resumed
        run.config.write_text("half: written\n")  # the first command's config.yaml, its plan.json still to come
        for plan in (None, _plan()):
            with pytest.raises(RunDirError, match=rf"another gpupack sweep is running in it \(pid {os.getpid()} on "):
                with open_run_dir(run, plan):
                    pass
    assert sorted(p.name for p in run.root.iterdir()) == [".lock", "config.yaml"]  # no probe file, ever


def test_the_lock_is_the_only_file_an_opener_writes(tmp_path):
    run = RunDir(tmp_path / "new")
    with open_run_dir(run, _plan()) as (resumed, lock):
        assert not resumed and lock.fd is not None
        assert [p.name for p in run.root.iterdir()] == [".lock"]
        assert Holder.parse(run.lock.read_text()) == Holder(os.getpid(), HERE, Holder.parse(
            run.lock.read_text()).since)  # type: ignore[union-attr]
        lock.add_job(4242)
        assert Holder.parse(run.lock.read_text()).jobs == (4242,)  # type: ignore[union-attr]
    with RunLock(run):  # let go when the opener's block ends
        pass


def _plan():
    from gpupack.core.plan import make_plan

    return make_plan(sweep="t", workload="tests.fake_workloads", grid={"lr": [0.1]}, fixed={}, factors=[1],
                     modes=["process"], partitions=["local"], repeats=1)


def completed(run_dir: Path) -> list[str]:
    return [r["training_id"] for r in (json.loads(p.read_text()) for p in run_dir.glob("packs/*/trainings/*.json"))
            if r["status"] == "completed"]


@pytest.mark.slow
def test_two_commands_started_at_once_run_each_training_once_and_the_loser_says_why(tmp_path, subprocess_env):
    """5 pairs of the same command started together on a fresh run directory: whichever is second is refused for
    the lock (or, had it come after the first ended, resumes with nothing to run), never for what it read of the
    first's half-written directory; every training has one completed record."""
    refused = 0
    for i in range(5):  # each pair a whole run (about 4 s): the second of a pair is refused nearly every time
        run_dir = tmp_path / f"run{i}"
        args = [sys.executable, "-m", "gpupack", SEARCHPATH, "+sweep=probe_pack", "packing.factors=[1]",
                "sweep.fixed.steps=3", f"run_dir={run_dir}"]
        pair = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env,
                                 cwd=REPO) for _ in range(2)]
        ended = [(p.wait(timeout=300), *p.communicate()) for p in pair]
        for code, out, err in ended:
            assert "Traceback" not in out + err and "not writable" not in err and "not a gpupack run" not in err, err
            if code != 0:
                refused += 1
                assert code == 2 and err.count("\n") == 1 and "another gpupack sweep is running in it (pid " in err
        assert sum(code == 0 for code, _, _ in ended) >= 1
        ids = completed(run_dir)
        assert len(ids) == len(set(ids)) == 2, ended
    assert refused >= 1  # the race was run, not dodged


@pytest.mark.slow
def test_a_command_after_a_sigkilled_one_is_refused_while_its_local_jobs_run(tmp_path, subprocess_env):
    """The CLI killed by SIGKILL (nothing of it can cancel its jobs): its local pack job goes on, holding the run
    lock it inherited. A new command is refused in one line naming that job's pid, not let in to fail on the pack's
    lock; once the job has ended, the same command resumes and each training has run once."""
    run_dir, marker = tmp_path / "run", tmp_path / "marker"
    args = [sys.executable, "-m", "gpupack", SEARCHPATH, "+sweep=probe_pack", "packing.factors=[2]",
            "sweep.grid.lr=[0.1]", f"sweep.grid.marker=['',{marker}]", "sweep.fixed.first_attempt_sleep_s=600",
            f"run_dir={run_dir}"]
    with open(tmp_path / "first.out", "w") as out:
        first = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=subprocess_env, cwd=REPO,
                                 start_new_session=True)
    tree: list[psutil.Process] = []
    try:
        assert wait_for(lambda: marker.exists(), timeout_s=120, every_s=0.1)  # the slow training runs
        tree = psutil.Process(first.pid).children(recursive=True)
        controllers = [p.pid for p in tree if "submitit.local._local" in " ".join(p.cmdline())]
        assert len(controllers) == 1
        first.send_signal(signal.SIGKILL)  # the CLI alone: its job leads a session of its own
        first.wait(timeout=60)
        second = subprocess.run(args, capture_output=True, text=True, env=subprocess_env, cwd=REPO, timeout=300)
        assert second.returncode == 2 and "Traceback" not in second.stdout + second.stderr
        assert second.stderr.count("\n") == 1, second.stderr
        assert (f"the pack jobs of an earlier gpupack (pid {first.pid} on {HERE}, since " in second.stderr
                and f"no longer running) still run in it: pid {controllers[0]}. HINT: wait for them to end"
                in second.stderr), second.stderr
        assert psutil.pid_exists(controllers[0])  # refused, and nothing of the earlier job was touched
        for proc in tree:  # its job ends (here: stopped, its slow training with it)
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(tree, timeout=30)
        third = subprocess.run(args, capture_output=True, text=True, env=subprocess_env, cwd=REPO, timeout=300)
        assert third.returncode == 0, third.stdout + third.stderr
        ids = completed(run_dir)
        assert len(ids) == len(set(ids)) == 2
    finally:
        if first.poll() is None:
            first.kill()
        for proc in tree:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
