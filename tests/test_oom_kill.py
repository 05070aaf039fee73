"""Out-of-memory kills by the kernel or SLURM's cgroup are recorded as oom, not killed: a SIGKILL while the job's
cgroup counted an OOM kill, sacct's OUT_OF_MEMORY, and SLURM's own oom-kill line in the job's stderr."""
from __future__ import annotations

import multiprocessing
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from gpupack.core.monitor import DeviceInfo
from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import DONE, FAILED, PENDING, RUNNING, PackSettings, TrainingOutcome
from gpupack.job.body import run_pack
from gpupack.job.oom import record_job_oom
from gpupack.job.records import OnDevice, build_training_record, status_of
from gpupack.job.runtime import oom
from gpupack.submit.slurm import SlurmConfig, SlurmSubmitter
from gpupack.submit.slurm.commands import out_of_memory, pack_state

WORKLOAD = "tests.fake_workloads"


# ---------------- the cgroup's counter ----------------

def test_memory_events_path_follows_proc_self_cgroup(tmp_path):
    root = tmp_path / "cgroup"
    proc = tmp_path / "proc_self_cgroup"
    v2 = root / "user.slice" / "job_7" / "memory.events"
    v2.parent.mkdir(parents=True)
    v2.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    proc.write_text("0::/user.slice/job_7\n")
    assert oom.memory_events_path(proc, root) == v2
    # v1 (or a hybrid host whose unified tree has no memory controller): the memory controller's oom_control
    v1 = root / "memory" / "slurm" / "uid_0" / "job_7" / "memory.oom_control"
    v1.parent.mkdir(parents=True)
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    proc.write_text("4:memory:/slurm/uid_0/job_7\n1:cpu:/\n0::/\n")
    assert oom.memory_events_path(proc, root) == v1
    # in a container whose cgroup is mounted as the root of the hierarchy
    (root / "memory" / "memory.oom_control").write_text("oom_kill 0\n")
    proc.write_text("4:memory:/host/path/not/mounted/here\n")
    assert oom.memory_events_path(proc, root) == root / "memory" / "memory.oom_control"
    assert oom.memory_events_path(tmp_path / "missing", root) is None


@pytest.mark.parametrize("text, count", [("low 0\nhigh 0\nmax 0\noom 2\noom_kill 2\noom_group_kill 0\n", 2),
                                         ("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n", 5),
                                         ("oom_kill_disable 0\nunder_oom 0\n", None), ("oom_kill x\n", None)],
                         ids=["v2", "v1", "v1-old-kernel", "garbled"])
def test_oom_kill_count_reads_both_cgroup_versions(tmp_path, text, count):
    path = tmp_path / "memory.events"
    path.write_text(text)
    assert oom.oom_kill_count(path) == count
    assert oom.oom_kill_count(tmp_path / "missing") is None


def test_this_machine_gives_its_cgroup_s_counter_or_none():
    """Where this process's cgroup has a readable OOM counter, the count is that file's oom_kill line; else None."""
    path = oom.memory_events_path()
    count = oom.oom_kill_count()
    if path is None:
        assert count is None
    else:
        lines = dict(line.split(" ", 1) for line in path.read_text().splitlines() if " " in line)
        assert count == (int(lines["oom_kill"]) if "oom_kill" in lines else None)


@pytest.mark.parametrize("text, count", [
    ("low 0\nhigh 0\nmax 0\noom 2\noom_kill 2\n", 2),  # cgroup v2 memory.events
    ("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n", 7),  # v1 memory.oom_control
    ("low 0\nhigh 0\n", None),  # no counter in it
    ("oom_kill many\n", None),  # not a number
])
def test_the_counter_is_read_from_the_file(tmp_path, text, count):
    path = tmp_path / "memory.events"
    path.write_text(text)
    assert oom.oom_kill_count(path) == count
    assert oom.oom_kill_count(tmp_path / "missing") is None


# ---------------- a SIGKILL in a pack, with or without an OOM kill counted ----------------

def _pack(tmp_path: Path):
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload=WORKLOAD, grid={"tag": ["ok0", "ok1", "victim"]},
                     fixed={"steps": 10, "sleep_s": 0.02}, factors=[3], modes=["process"], partitions=["local"],
                     repeats=1)
    pack = plan.packs[0]
    for t in pack.trainings:
        if t.params["tag"] == "victim":
            t.params.update({"hang": True})  # type: ignore[attr-defined]
    write_json_atomic(run.plan, plan.to_json())
    return run, pack


def _kill(err_log: Path, events: Path, oom_kills: int) -> None:
    """What the kernel does to the victim: count the OOM kill in the cgroup (when it is one), then SIGKILL it."""
    from tests.conftest import training_process

    for _ in range(400):
        proc = training_process(err_log)
        if proc is not None:
            time.sleep(0.5)
            events.write_text(f"low 0\nhigh 0\nmax 0\noom {oom_kills}\noom_kill {oom_kills}\n")
            proc.send_signal(signal.SIGKILL)
            return
        time.sleep(0.05)


@pytest.mark.parametrize("start", ["fork", "fresh"])
@pytest.mark.parametrize("oom_kills, status", [(1, "oom"), (0, "killed")], ids=["counted", "not-counted"])
@pytest.mark.slow
def test_a_sigkill_is_oom_only_when_the_cgroup_counted_an_oom_kill(tmp_path, monkeypatch, oom_kills, status, start):
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    monkeypatch.setattr(oom, "memory_events_path", lambda: events)
    run, pack = _pack(tmp_path)
    victim = next(t for t in pack.trainings if t.params["tag"] == "victim")
    killer = multiprocessing.Process(target=_kill, args=(run.log(pack.pack_id, victim.training_id, "err"), events,
                                                         oom_kills))
    killer.start()
    from gpupack.job.pack.process import ProcessOptions

    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu",
                                                             mode_options={"process": ProcessOptions(start=start)}))
    killer.join()
    recs = {t.params["tag"]: read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings}
    assert recs["ok0"]["status"] == recs["ok1"]["status"] == "completed"  # counted before they ended: still theirs
    assert recs["victim"]["status"] == status and recs["victim"]["signal"] == 9, recs["victim"]
    assert rec["n_oom"] == (1 if status == "oom" else 0)
    if status == "oom":
        assert "out-of-memory killer" in recs["victim"]["error"] and recs["victim"]["oom_killed_by"]
    else:
        assert "oom_killed_by" not in recs["victim"]


def _outcome(signal_: int | None, extra: dict[str, Any] | None = None, error: str | None = None) -> TrainingOutcome:
    return TrainingOutcome("t0", 0.0, 1.0, -signal_ if signal_ else 1, signal_, error, None, extra=dict(extra or {}))


def test_status_of_a_counted_oom_kill(tmp_path, monkeypatch):
    events = tmp_path / "memory.events"
    monkeypatch.setattr(oom, "memory_events_path", lambda: events)
    events.write_text("oom_kill 3\n")
    for sig, before, timed_out, status in [(9, 2, False, "oom"), (9, 3, False, "killed"), (15, 2, False, "killed"),
                                           (9, None, False, "killed"), (9, 2, True, "timeout")]:
        outcome = _outcome(sig, {"timed_out": timed_out})
        oom.note_oom_kill(outcome, before)
        assert status_of(outcome) == status, (sig, before, timed_out)


# ---------------- SLURM: the queue's word for it ----------------

STATE_TABLE = [
    # (sacct State, gpupack's pack state, ran out of memory)
    ("PENDING", PENDING, False), ("REQUEUED", PENDING, False), ("RUNNING", RUNNING, False),
    ("COMPLETING", RUNNING, False), ("COMPLETED", DONE, False), ("FAILED", FAILED, False),
    ("CANCELLED by 0", FAILED, False), ("TIMEOUT", FAILED, False), ("NODE_FAIL", FAILED, False),
    ("OUT_OF_MEMORY", FAILED, True), ("OUT_OF_MEMORY+", FAILED, False),
]


@pytest.mark.parametrize("state, pack, oom", STATE_TABLE, ids=[s[0] for s in STATE_TABLE])
def test_queue_state_mapping(state, pack, oom):
    assert pack_state(state) == pack
    assert out_of_memory(state) is oom


STDERR_CASES = [
    ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=12.batch. Some of your processes may have been killed "
     "by the cgroup out-of-memory handler.", True),
    ("srun: error: n1: task 0: Out Of Memory", True),
    ("slurmstepd: error: Job 12 exceeded memory limit (2100000 > 2048000), being killed", True),
    ("submitit INFO (2024-01-01) - Job completed successfully", False),
    ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", False),  # a training's words, not SLURM's
]


@pytest.mark.parametrize("stderr, oom", STDERR_CASES, ids=["oom-kill-event", "srun", "exceeded", "clean", "training"])
def test_slurm_oom_lines_in_the_job_stderr(stderr, oom):
    assert out_of_memory("COMPLETED", f"some line\n{stderr}\nlast line\n") is oom
    assert out_of_memory(None, None) is False


def _slurm_pack(tmp_path: Path):
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload=WORKLOAD, grid={"tag": ["done", "killed", "lost"]}, fixed={"steps": 2},
                     factors=[3], modes=["process"], partitions=["v100"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    return run, plan, plan.packs[0]


def _write(run: RunDir, plan, pack, tag: str, outcome: TrainingOutcome) -> None:
    t = next(t for t in pack.trainings if t.params["tag"] == tag)
    outcome.training_id = t.training_id
    info = DeviceInfo(kind="gpu", name="Tesla V100-SXM2-16GB", memory_total_mb=16384.0)
    rec = build_training_record(outcome, t, pack, plan, OnDevice(info, "cuda", 4, 3, "V100-16gb"))
    write_json_atomic(run.training_record(pack.pack_id, t.training_id), rec)


class FakeSlurmJob:
    """A finished SLURM job as submitit shows it: its state, its stderr, its result (or the error it re-raises)."""

    def __init__(self, state: str, stderr: str | None, died: bool, stdout: str = "") -> None:
        self.job_id, self.state, self._stderr, self.died, self._stdout = "12_0", state, stderr, died, stdout

    def stderr(self) -> str | None:
        return self._stderr

    def stdout(self) -> str:  # a lane's job has its stderr merged here (stderr_to_stdout)
        return self._stdout

    def result(self) -> dict[str, Any]:
        if self.died:
            raise RuntimeError("Job 12_0 has not produced any output (state: OUT_OF_MEMORY)")
        return {"n_failed": 1}


@pytest.mark.parametrize("state, stderr", [("OUT_OF_MEMORY", ""),
                                           ("FAILED", "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=12")],
                         ids=["sacct", "stderr"])
def test_a_job_slurm_says_ran_out_of_memory_records_its_killed_and_lost_trainings_as_oom(tmp_path, state, stderr):
    run, plan, pack = _slurm_pack(tmp_path)
    since = time.time()
    _write(run, plan, pack, "done", TrainingOutcome("", since + 1, since + 2, 0, None, None, {"timings": {}}))
    _write(run, plan, pack, "killed", TrainingOutcome("", since + 1, since + 3, -9, 9, "killed by signal 9 (SIGKILL)"))
    submitter = SlurmSubmitter(SlurmConfig(name="slurm", backend="slurm"), run)
    result = submitter.ended(pack, FakeSlurmJob(state, stderr, died=True), since)  # type: ignore[arg-type]
    recs = {t.params["tag"]: read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings}
    assert recs["done"]["status"] == "completed"
    assert recs["killed"]["status"] == "oom" and "ran out of memory" in recs["killed"]["error"]
    lost = recs["lost"]
    assert lost["status"] == "oom" and lost["signal"] == 9 and lost["partition"] == "v100" and lost["factor"] == 3
    assert lost["gpu_type"] == "Tesla V100-SXM2-16GB" and lost["host"] == recs["done"]["host"]
    assert result.ok is False  # the packer died with the job (submitit re-raised)


def test_a_lanes_oom_line_is_read_from_its_one_log(tmp_path):
    """A lane's job writes stderr into its stdout (one file a job): SLURM's oom-kill line is found there."""
    run, plan, pack = _slurm_pack(tmp_path)
    since = time.time()
    _write(run, plan, pack, "killed", TrainingOutcome("", since + 1, since + 3, -9, 9, "killed by signal 9 (SIGKILL)"))
    job = FakeSlurmJob("FAILED", None, died=True, stdout="slurmstepd: error: Detected 1 oom-kill event(s) in StepId=12")
    SlurmSubmitter(SlurmConfig(name="slurm", backend="slurm"), run).ended(pack, job, since)  # type: ignore[arg-type]
    killed = next(t for t in pack.trainings if t.params["tag"] == "killed")
    assert read_json(run.training_record(pack.pack_id, killed.training_id))["status"] == "oom"


def test_a_job_that_ran_out_of_memory_with_no_record_to_go_by_is_reported(tmp_path):
    run, plan, pack = _slurm_pack(tmp_path)
    submitter = SlurmSubmitter(SlurmConfig(name="slurm", backend="slurm"), run)
    result = submitter.ended(pack, FakeSlurmJob("OUT_OF_MEMORY", "", died=True), time.time())  # type: ignore[arg-type]
    assert not any(run.training_record(pack.pack_id, t.training_id).exists() for t in pack.trainings)
    assert result.ok is False and "ran out of memory" in result.error and "mem_gb_per_training" in result.error
    assert all(t.training_id in result.error for t in pack.trainings)


def test_earlier_attempts_and_other_endings_are_left_alone(tmp_path):
    run, plan, pack = _slurm_pack(tmp_path)
    since = time.time()
    _write(run, plan, pack, "killed", TrainingOutcome("", since - 100, since - 90, -9, 9, "an earlier attempt"))
    _write(run, plan, pack, "done", TrainingOutcome("", since + 1, since + 2, 0, None, None, {"timings": {}}))
    _write(run, plan, pack, "lost", TrainingOutcome("", since + 1, since + 2, -15, 15, "killed by signal 15"))
    before = {p: p.read_bytes() for p in run.root.glob("packs/*/trainings/*.json")}
    assert record_job_oom(run, pack.pack_id, since, "SLURM: out of memory") == []
    assert before == {p: p.read_bytes() for p in run.root.glob("packs/*/trainings/*.json")}
    submitter = SlurmSubmitter(SlurmConfig(name="slurm", backend="slurm"), run)
    result = submitter.ended(pack, FakeSlurmJob("COMPLETED", "", died=False), since)  # type: ignore[arg-type]
    assert result.ok and before == {p: p.read_bytes() for p in run.root.glob("packs/*/trainings/*.json")}


def test_a_lane_job_out_of_memory_reads_the_runs_journals_once_for_all_its_packs(tmp_path, monkeypatch):
    """A lane of many packs ends with its one job: each pack is asked about, and the run's journals (every lane's)
    are read once for that job, not once a pack."""
    import gpupack.core.store.journal as journal

    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload=WORKLOAD, grid={"tag": [f"t{i}" for i in range(6)]}, fixed={"steps": 2},
                     factors=[2], modes=["process"], partitions=["v100"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    reads = []
    real = journal.read_folded
    monkeypatch.setattr(journal, "read_folded", lambda *a, **k: reads.append(1) or real(*a, **k))
    submitter = SlurmSubmitter(SlurmConfig(name="slurm", backend="slurm"), run)
    for pack in plan.packs:  # the lane never began them: no folder, nothing folded
        submitter.ended(pack, FakeSlurmJob("OUT_OF_MEMORY", "", died=True), time.time())  # type: ignore[arg-type]
    assert len(plan.packs) == 3 and len(reads) == 1
