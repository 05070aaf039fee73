"""Faults inside a pack, on real processes: the other trainings finish and are recorded; the faulty one's
record says why. Plus records that cannot be torn, the run-directory lock, and values that stay values."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpupack.cli import main
from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir, RunLock
from gpupack.core.types import PackSettings
from gpupack.errors import RunDirError
from gpupack.job.body import run_pack
from gpupack.job.pack.process import ProcessOptions

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = "tests.fake_workloads"


def _pack(tmp_path, faulty: dict, n_ok: int = 2):
    """One pack: n_ok well-behaved trainings and one with the fault given as Probe params."""
    run = RunDir(tmp_path / "run")
    grid = {"tag": [f"ok{i}" for i in range(n_ok)] + ["faulty"]}
    plan = make_plan(sweep="t", workload=WORKLOAD, grid=grid, fixed={"steps": 10, "sleep_s": 0.02},
                     factors=[n_ok + 1], modes=["process"], partitions=["local"], repeats=1)
    # the fault applies to the 'faulty' training only
    pack = plan.packs[0]
    for t in pack.trainings:
        if t.params["tag"] == "faulty":
            t.params.update(faulty)  # type: ignore[attr-defined]
    write_json_atomic(run.plan, plan.to_json())
    return run, pack


def _records(run: RunDir, pack) -> dict[str, dict]:
    return {t.params["tag"]: read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings}


def _assert_others_completed(recs: dict[str, dict]) -> None:
    others = {k: v for k, v in recs.items() if k != "faulty"}
    assert others and all(r["status"] == "completed" and r["metrics"]["tag"] == k for k, r in others.items())


FAULTS = [
    # (fault params, settings, expected status, text the record's error must hold)
    ({"fail": True}, {}, "failed", "probe failure on purpose"),
    ({"allocate_gb": 4.0}, {"memory_limit_gb_per_training": 1.0}, "oom", "MemoryError"),
    ({"raise_text": "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity)"}, {},
     "oom", "CUDA out of memory"),
    ({"raise_text": "ResourceExhaustedError: OOM when allocating tensor with shape[4096,4096]"}, {}, "oom",
     "OOM when allocating"),
    ({"hang": True}, {"training_timeout_s": 3.0}, "timeout", "training_timeout_s"),
]


@pytest.mark.parametrize("fault, settings, status, text", FAULTS, ids=["raises", "host-oom", "cuda-oom", "tf-oom",
                                                                       "hangs"])
@pytest.mark.slow
def test_fault_is_recorded_and_others_finish(tmp_path, fault, settings, status, text):
    run, pack = _pack(tmp_path, fault)
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu", **settings))
    recs = _records(run, pack)
    _assert_others_completed(recs)
    assert recs["faulty"]["status"] == status, recs["faulty"]
    assert text in recs["faulty"]["error"]
    assert rec["n_completed"] == 2 and rec["n_failed"] == 1
    assert rec["n_oom"] == (1 if status == "oom" else 0)


@pytest.mark.parametrize("start", ["fork", "fresh"])
@pytest.mark.slow
def test_sigkilled_training_is_recorded_as_killed(tmp_path, start):
    run, pack = _pack(tmp_path, {"hang": True})
    faulty = next(t for t in pack.trainings if t.params["tag"] == "faulty")
    err_log = run.log(pack.pack_id, faulty.training_id, "err")

    def kill_when_started() -> None:
        from tests.conftest import kill_when_found, training_process

        kill_when_found(lambda: training_process(err_log), tries=400)

    killer = multiprocessing.Process(target=kill_when_started)
    killer.start()
    rec = run_pack(str(run.root), pack.pack_id,
                   PackSettings(device="cpu", mode_options={"process": ProcessOptions(start=start)}))
    killer.join()
    recs = _records(run, pack)
    _assert_others_completed(recs)
    assert recs["faulty"]["status"] == "killed" and recs["faulty"]["signal"] == 9
    assert "signal 9" in recs["faulty"]["error"] or "SIGKILL" in recs["faulty"]["error"]
    assert {r["start"] for r in recs.values()} == {start} and rec["n_completed"] == len(pack.trainings) - 1


@pytest.mark.slow
def test_killed_packer_takes_no_training_with_it_and_resume_runs_only_the_rest(tmp_path, subprocess_env):
    run, pack = _pack(tmp_path, {"hang": True})
    code = ("import sys; from gpupack.job.body import PackSettings, run_pack; "
            "run_pack(sys.argv[1], sys.argv[2], PackSettings(device='cpu'))")
    packer = subprocess.Popen([sys.executable, "-c", code, str(run.root), pack.pack_id], env=subprocess_env)
    ok = [t for t in pack.trainings if t.params["tag"] != "faulty"]
    deadline = time.time() + 120
    while not all(run.training_record(pack.pack_id, t.training_id).exists() for t in ok):
        assert time.time() < deadline
        time.sleep(0.1)
    children = psutil.Process(packer.pid).children(recursive=True)
    assert children  # the hanging training is still running under the packer
    packer.send_signal(signal.SIGKILL)  # the job is killed (scancel, node failure)
    packer.wait()
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive  # no orphan training holds the device
    before = {t.training_id: run.training_record(pack.pack_id, t.training_id).read_bytes() for t in ok}

    faulty = next(t for t in pack.trainings if t.params["tag"] == "faulty")
    plan = read_json(run.plan)  # the rerun of the lost training now finishes
    for t in plan["packs"][0]["trainings"]:
        t["params"]["hang"] = False
    write_json_atomic(run.plan, plan)
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    assert rec["training_ids"] == [faulty.training_id]  # only the lost one ran again
    for t in ok:
        assert run.training_record(pack.pack_id, t.training_id).read_bytes() == before[t.training_id]
    assert read_json(run.training_record(pack.pack_id, faulty.training_id))["status"] == "completed"


def _writer(args) -> None:
    path, i = args
    for k in range(20):
        write_json_atomic(Path(path), {"writer": i, "k": k, "payload": "x" * 20000})


@pytest.mark.slow
def test_64_concurrent_writers_never_tear_a_record(tmp_path):
    shared = tmp_path / "shared.json"
    jobs = [(str(shared), i) for i in range(32)] + [(str(tmp_path / f"own{i}.json"), i) for i in range(32)]
    with multiprocessing.Pool(64) as pool:
        pool.map(_writer, jobs)
    for path in [shared] + [tmp_path / f"own{i}.json" for i in range(32)]:
        data = json.loads(path.read_text())
        assert data["k"] == 19 and len(data["payload"]) == 20000
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["shared.json"] + [f"own{i}.json" for i in range(32)])


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o000, 0o664)])
def test_records_follow_the_umask_and_are_never_world_writable(tmp_path, monkeypatch, umask, mode):
    from gpupack.core.store import records

    old = os.umask(umask)
    monkeypatch.setattr(records, "_umask", None)  # as a process started under this umask: read once, at first use
    try:
        write_json_atomic(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(old)
        records._umask = None
    assert stat.S_IMODE(os.stat(tmp_path / "r.json").st_mode) == mode


def test_a_second_sweep_in_the_same_run_dir_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["+sweep=mnist_pack", "packing.factors=[1]", "sweep.grid.lr=[0.1]", "sweep.grid.batch_size=[64]",
            f"run_dir={run_dir}"]
    run_dir.mkdir()
    with RunLock(RunDir(run_dir)):  # as if another gpupack were running in it
        with pytest.raises(RunDirError):
            with RunLock(RunDir(run_dir)):
                pass
        # the CLI: it writes the plan first time round, then stops at the lock with one clear line
        code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2 and "another gpupack sweep is running in it" in err
    assert not list(run_dir.glob("packs/*"))  # nothing ran


ODD_VALUES = ["it's \"quoted\"", "a; rm -rf /tmp/x", "$(touch {canary})", "`touch {canary}`", "line1\nline2",
              "naïve ünïcødé ✓", "--flag=1"]


@pytest.mark.slow
def test_odd_hyperparameter_values_reach_the_training_unchanged(tmp_path, subprocess_env):
    canary = tmp_path / "canary"
    values = [v.format(canary=canary) for v in ODD_VALUES]
    run_dir = tmp_path / "run"
    overrides = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack",
                 "packing.factors=[1]", f"run_dir={run_dir}"]
    # the grid is written as a Hydra list of quoted strings, the way a user would on the command line
    quoted = ",".join("'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'" for v in values)
    proc = subprocess.run([sys.executable, "-m", "gpupack", *overrides, f"sweep.grid.tag=[{quoted}]"],
                          capture_output=True, text=True, env=subprocess_env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tags = sorted(json.loads(p.read_text())["metrics"]["tag"] for p in run_dir.glob("packs/*/trainings/*.json"))
    assert sorted(set(tags)) == sorted(values)
    assert not canary.exists()  # nothing was executed


@pytest.mark.parametrize("name", ["..", "../x", "a/b", "a\x00b", "", ".hidden", "a b"])
def test_names_used_in_paths_cannot_escape_the_run_directory(tmp_path, name):
    from gpupack.errors import ConfigError

    with pytest.raises(ConfigError):
        RunDir(tmp_path).pack_dir(name)
    with pytest.raises(ConfigError):
        RunDir(tmp_path).training_record("p", name)


def test_lint_no_shell_true_in_the_sources():
    """A lint, not the guarantee: that values reach a training unchanged, never through a shell, is tested by
    behaviour (tests/test_command.py sends quotes, ;, $( ) and newlines and checks they arrive as given)."""
    sources = list((REPO / "gpupack").rglob("*.py")) + list((REPO / "jobs").rglob("*.py"))
    assert sources and not [p for p in sources if "shell=True" in p.read_text()]


def test_a_file_system_without_flock_warns_and_goes_on(tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with RunLock(RunDir(tmp_path)):
        pass
    assert "cannot lock" in capsys.readouterr().err


def test_every_lock_goes_on_unlocked_without_flock_and_says_so_once_per_file(tmp_path, monkeypatch, capsys):
    """A file system without flock (Lustre without -o flock): a job's pickle stream and a lane journal's readers go
    on unlocked, as the run's lock does, with one warning per file however often it is taken, never a traceback."""
    import errno
    import fcntl

    from gpupack.core.store import pickling
    from gpupack.core.store.locks import Hold, held, try_hold

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    stream = tmp_path / "job.pkl"
    for key in (1, 2, 1):
        pickling.append({"key": key}, key, stream)
    assert set(pickling.read_streams([stream])) == {1, 2}
    journal = tmp_path / "lane.jsonl"
    journal.write_text("")
    with open(journal, "rb") as f:
        with held(f.fileno(), journal, shared=True):
            pass
        assert try_hold(f.fileno(), journal, "do not") is Hold.UNLOCKABLE
    err = capsys.readouterr().err
    assert err.count(f"cannot lock {stream}") == 1 and err.count(f"cannot lock {journal}") == 1, err


def test_flock_is_taken_in_one_module():
    """One lock, one fallback, one message: every flock of gpupack goes through gpupack.core.store.locks."""
    users = [p.relative_to(REPO).as_posix() for p in (REPO / "gpupack").rglob("*.py") if "fcntl" in p.read_text()]
    assert users == ["gpupack/core/store/locks.py"]


@pytest.mark.slow
def test_a_local_job_killed_by_sigkill_leaves_nothing_in_the_temporary_space(tmp_path, subprocess_env):
    """A local job SIGKILLed mid-pack (the OOM killer, a user's kill -9) cleans nothing of its own: the command that
    watched it removes the job's temporary space (its packs' work folders) once it has ended, as SLURM removes a
    job's node-local space."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**subprocess_env, "TMPDIR": str(tmp)}
    command = subprocess.Popen([sys.executable, "-m", "gpupack", f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]",
                                "+sweep=probe_pack", "packing.factors=[1]", "sweep.grid.lr=[0.1]",
                                "sweep.fixed.hang=true", f"run_dir={tmp_path / 'run'}"],
                               env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    job = None
    while job is None or not any(tmp.glob("gpupack-job-*/gpupack-*")):  # the job, in its pack's work folder
        assert command.poll() is None and time.time() < deadline, command.stdout.read() if command.stdout else ""
        job = job or next((p for p in psutil.Process(command.pid).children(recursive=True)
                           if "gpupack.submit._local_job" in " ".join(_cmdline(p))), None)
        time.sleep(0.1)
    job.send_signal(signal.SIGKILL)
    out, _ = command.communicate(timeout=120)
    assert command.returncode == 1, f"exit {command.returncode}: {out}"  # the pack failed: no completed record
    assert list(tmp.iterdir()) == [], out  # no job folder, no pack's work folder left behind


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:  # ended, or not yet readable: not the one looked for yet
        return []
