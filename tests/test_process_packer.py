"""Process packing on real processes: N at once, each recorded; one failing never stops the others."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.body import run_pack
from gpupack.job.pack import PackContext, threads_for, worker_env
from gpupack.job.pack.process import PACKER

WORKLOAD = "tests.fake_workloads"


@pytest.mark.parametrize("cores, n, override, expected", [
    (2, 1, None, 2), (2, 2, None, 1), (2, 4, None, 1), (16, 3, None, 5), (16, 34, None, 1), (8, 2, 3, 3)])
def test_threads_for(cores, n, override, expected):
    assert threads_for(cores, n, override) == expected


def test_worker_env_caps_thread_pools_and_keeps_the_rest():
    env = worker_env({"CUDA_VISIBLE_DEVICES": "1", "OMP_NUM_THREADS": "64"}, 2)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"  # all N trainings share the job's GPU
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"


def _run_with(tmp_path, grid, factor=None, **fixed):
    run = RunDir(tmp_path / "run")
    points = 1
    for v in grid.values():
        points *= len(v)
    plan = make_plan(sweep="t", workload=WORKLOAD, grid=grid, fixed={"steps": 20, "sleep_s": 0.02, **fixed},
                     factors=[factor or points], modes=["process"], partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    return run, plan


@pytest.mark.slow
def test_pack_records_every_training_and_the_pack(tmp_path):
    run, plan = _run_with(tmp_path, {"lr": [0.1, 0.2, 0.3]}, meet=f"{tmp_path / 'met'}:3")
    pack = plan.packs[0]
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    assert rec["n_completed"] == 3 and rec["n_failed"] == 0 and rec["complete"] is True
    assert rec["wall_s"] == pytest.approx(rec["ended_at"] - rec["started_at"])
    for t in pack.trainings:
        tr = read_json(run.training_record(pack.pack_id, t.training_id))
        assert tr["status"] == "completed" and tr["exit_code"] == 0
        assert tr["metrics"]["val_accuracy"] == pytest.approx(t.params["lr"])
        assert tr["throughput"]["samples"] == 20 * 32 and tr["throughput"]["warmup_excluded"]
        assert tr["timings"]["startup_s"] > 0 and tr["timings"]["loop_s"] > 0
        assert tr["threads"] >= 1 and tr["concurrent"] == 3
        assert tr["started_at"] >= rec["started_at"] and tr["ended_at"] <= rec["ended_at"]
    # All N ran together, not one after the other: each training waited at a barrier for all three (the probe's `meet`),
    # which trainings run one after the other never pass (each then fails after meet_timeout_s).
    assert len(list((tmp_path / "met").glob("arrived-*"))) == 3


@pytest.mark.slow
def test_one_failing_training_does_not_stop_the_others(tmp_path):
    run, plan = _run_with(tmp_path, {"lr": [0.1], "fail": [False, True], "tag": ["x", "boom"]})
    pack = plan.packs[0]
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    assert rec["n_completed"] == 2 and rec["n_failed"] == 2
    for t in pack.trainings:
        tr = read_json(run.training_record(pack.pack_id, t.training_id))
        if t.params["fail"]:
            assert tr["status"] == "failed" and tr["exit_code"] == 1
            assert "probe failure on purpose" in tr["error"] and repr(t.params["tag"]) in tr["error"]
        else:
            assert tr["status"] == "completed" and tr["metrics"]["tag"] == t.params["tag"]


def test_a_killed_training_is_recorded_as_killed(tmp_path):
    run, plan = _run_with(tmp_path, {"lr": [0.1, 0.2]})
    pack = plan.packs[0]
    victim = pack.trainings[0]
    # Make the victim slow so we can kill it mid-training.
    slow = dict(victim.params, steps=500, sleep_s=0.02)
    from gpupack.core.plan import Training

    object.__setattr__(victim, "params", slow)
    ctx = PackContext(run=run, pack=pack, device="cpu", threads=1, env=dict(os.environ))

    def killer() -> None:
        import psutil

        from tests.conftest import kill_when_found

        spec = str(run.work(pack.pack_id, victim.training_id, "spec"))
        kill_when_found(lambda: next((p for p in psutil.process_iter(["cmdline"])
                                      if spec in " ".join(p.info["cmdline"] or [])), None), tries=200)

    thread = threading.Thread(target=killer)
    thread.start()
    outcomes = PACKER.run(pack.trainings, ctx)
    thread.join()
    by_id = {o.training_id: o for o in outcomes}
    assert by_id[victim.training_id].signal == signal.SIGKILL and by_id[victim.training_id].result is None
    other = by_id[pack.trainings[1].training_id]
    assert other.exit_code == 0 and other.result is not None
    assert isinstance(victim, Training)


@pytest.mark.slow
def test_resume_runs_only_trainings_without_a_completed_record(tmp_path):
    run, plan = _run_with(tmp_path, {"lr": [0.1], "fail": [False, True]})
    pack = plan.packs[0]
    run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    ok, bad = pack.trainings
    first_ok = read_json(run.training_record(pack.pack_id, ok.training_id))
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))  # reruns only the failed one
    assert rec["concurrent"] == 1 and rec["complete"] is False and rec["training_ids"] == [bad.training_id]
    assert read_json(run.training_record(pack.pack_id, ok.training_id)) == first_ok  # untouched
    kept = run.pack_dir(pack.pack_id) / "attempts" / "1"
    assert (kept / f"{bad.training_id}.json").exists() and (kept / "pack.json").exists()  # nothing overwritten


# ---------------- one builder of a training's outcome from its child's end ----------------

@pytest.mark.parametrize("code, error, result, timed_out, expected_error, expected_signal", [
    (0, None, {"metrics": {}}, False, None, None),                         # completed
    (0, None, None, False, "exited 0 but wrote no result", None),          # exited 0, wrote nothing
    (1, "RuntimeError: boom", None, False, "RuntimeError: boom", None),    # raised
    (-9, "killed by SIGKILL", None, False, "killed by SIGKILL", 9),         # killed: the signal is -code
    (-15, "killed by SIGTERM", None, True, "stopped after packing.training_timeout_s; killed by SIGTERM", 15),
    (None, "could not start 'x': No such file", None, False, "could not start 'x': No such file", None),
])
def test_ended_outcome(code, error, result, timed_out, expected_error, expected_signal):
    """process mode's training, a DDP training's ranks and a shared process's trainings all end through this one
    builder."""
    from gpupack.job.pack import ended_outcome

    outcome = ended_outcome("t", 1.0, 3.0, code, error=error, result=result, timed_out=timed_out,
                            extra={"slot": 2})
    assert (outcome.exit_code, outcome.signal, outcome.error, outcome.result) == (code, expected_signal,
                                                                                  expected_error, result)
    assert outcome.extra == {"timed_out": timed_out, "slot": 2}
