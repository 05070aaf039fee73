"""A lane of whole packs (gpupack/job/turns.py, issue 30: jobs are lanes): one job runs its share of a group's packs
in turn, each measured as alone in a job, completed packs skipped, no pack started past the job's time (fake clock)."""
from __future__ import annotations

import itertools
import signal
import time

import pytest

from gpupack.core.jobenv import JobEnvironment
from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.turns import run_in_turn
from gpupack.submit import PackJob
from tests.test_stream import _Requeueing

SETTINGS = PackSettings(device="cpu")


def _run(tmp_path, n=3):
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload="tests.fake_workloads", grid={"lr": [0.1 * (i + 1) for i in range(n)]},
                     fixed={"steps": 2}, factors=[1], modes=["process"], partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    return run, plan


@pytest.mark.slow
def test_a_lane_runs_its_packs_in_turn_each_with_its_own_records(tmp_path):
    run, plan = _run(tmp_path)
    ids = [p.pack_id for p in plan.packs]
    out = run_in_turn(str(run.root), ids, SETTINGS)
    assert list(out["records"]) == ids and out["unclaimed"] == 0 and out["stopped_claiming"] is None
    for p in plan.packs:  # each pack its own record and timing, as alone in a job
        rec = read_json(run.pack_record(p.pack_id))
        assert rec["n_completed"] == 1 and rec["complete"] is True
        assert read_json(run.training_record(p.pack_id, p.trainings[0].training_id))["status"] == "completed"
    walls = [read_json(run.pack_record(i))["wall_s"] for i in ids]
    again = run_in_turn(str(run.root), ids, SETTINGS)  # a requeued lane: its completed packs are skipped
    assert [read_json(run.pack_record(i))["wall_s"] for i in ids] == walls and list(again["records"]) == ids


def test_a_lane_starts_no_pack_it_could_not_finish_before_its_time_limit(tmp_path):
    run, plan = _run(tmp_path)
    ticks = itertools.count(start=100, step=100)  # each look at the clock: 100 s later
    out = run_in_turn(str(run.root), [p.pack_id for p in plan.packs], PackSettings(device="cpu", claim_until_s=250),
                      job=JobEnvironment(job_id="1_0", started_at=0.0), clock=lambda: float(next(ticks)))
    # pack 1 ran (100 s by the clock); at 400 s nothing of 100 s fits before 250 s: the other two are left
    assert list(out["records"]) == [plan.packs[0].pack_id] and out["unclaimed"] == 2
    assert "a pack takes up to 100 s" in out["stopped_claiming"]
    assert not run.pack_record(plan.packs[1].pack_id).exists()


class _LateLane(_Requeueing):
    """A job that started 1000 s ago: past a 60 s limit once its first pack has given an estimate."""

    @classmethod
    def job_environment(cls) -> JobEnvironment:
        return JobEnvironment(job_id="9_0", started_at=time.time() - 1000)


@pytest.mark.parametrize("requeues", [True, False])
def test_a_lane_of_packs_out_of_time_asks_its_backend_to_requeue(tmp_path, monkeypatch, requeues):
    run, plan = _run(tmp_path, n=2)
    seen: list[int] = []
    monkeypatch.setattr(_LateLane, "requeues", requeues)
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        out = PackJob(_LateLane)(str(run.root), [p.pack_id for p in plan.packs],  # type: ignore[arg-type]
                                 PackSettings(device="cpu", claim_until_s=60.0))
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert out["unclaimed"] == 1 and list(out["records"]) == [plan.packs[0].pack_id]
    assert seen == ([signal.SIGUSR1] if requeues else [])


def test_streaming_lanes_dealt_to_one_job_drain_their_queue_once(tmp_path):
    """Where the user's job limit deals two streaming lanes of a queue to one job, the first drains it and the
    second finds nothing left: every training runs once."""
    from tests.test_stream import _plan, _records

    run, plan = _plan(tmp_path, n_trainings=4, factor=2, jobs=2)
    assert [p.stream is not None for p in plan.packs] == [True, True]
    out = run_in_turn(str(run.root), [p.pack_id for p in plan.packs], SETTINGS)
    recs = _records(run)
    assert len(recs) == 4 and all(r["status"] == "completed" for r in recs.values())
    first, second = (out["records"][p.pack_id] for p in plan.packs)
    assert len(first["claimed"]) == 4 and second["claimed"] == []


def test_each_pack_of_a_lane_gets_its_own_result_from_the_lanes_job(tmp_path):
    from types import SimpleNamespace

    from gpupack.submit import job_result

    run, plan = _run(tmp_path, n=2)
    ran, left = plan.packs
    lane = {"in_turn": [ran.pack_id, left.pack_id], "records": {ran.pack_id: {"n_completed": 1}},
            "stopped_claiming": "12 s left before the job's time limit", "unclaimed": 1}
    job = SimpleNamespace(job_id="9_3", result=lambda: lane)
    first, second = job_result(ran, job), job_result(left, job)  # type: ignore[arg-type]
    assert first.ok and first.record == {"n_completed": 1} and first.job_id == "9_3"
    assert not second.ok and "its lane left it unrun: 12 s left" in (second.error or "")


def test_a_requeued_lane_takes_no_estimate_from_the_packs_it_had_completed(tmp_path):
    """A pack an earlier run of the lane completed is skipped at once: it says nothing of how long the next takes."""
    run, plan = _run(tmp_path)
    ids = [p.pack_id for p in plan.packs]
    run_in_turn(str(run.root), ids[:1], SETTINGS)  # the lane's earlier run completed its first pack
    ticks = itertools.count(start=100, step=100)  # each look at the clock: 100 s later, skipped pack or not
    out = run_in_turn(str(run.root), ids, PackSettings(device="cpu", claim_until_s=350),
                      job=JobEnvironment(job_id="1_0", started_at=0.0), clock=lambda: float(next(ticks)))
    # the skipped pack gave no estimate, so the second pack started; after it (100 s) none fits before 350 s
    assert list(out["records"]) == ids[:2] and out["unclaimed"] == 1


def _gpu_plan(tmp_path, packs=4, n=2, **fixed):
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload="tests.fake_workloads", grid={"lr": [0.1 * (i + 1) for i in range(packs * n)]},
                     fixed={"steps": 2, "report_env": "CUDA_VISIBLE_DEVICES", **fixed}, factors=[n],
                     modes=["process"], partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    return run, plan


def test_a_job_of_two_gpus_runs_a_pack_on_each_at_once_each_training_seeing_only_its_gpu(tmp_path):
    """A whole-node job (issue 30, item 4): 2 GPUs, N=2 each; the four trainings of two packs meet (a barrier, not a
    clock: they ran at once), and each sees one GPU, its pack's, named in its record."""
    run, plan = _gpu_plan(tmp_path, packs=2, meet=f"{tmp_path / 'meet'}:4", meet_timeout_s=60)
    (tmp_path / "meet").mkdir()
    ids = [p.pack_id for p in plan.packs]
    job = JobEnvironment(job_id="7_0", cuda_visible_devices="2,5", tmp_dir=str(tmp_path / "tmp"))
    out = run_in_turn(str(run.root), ids, PackSettings(device="cpu", job_gpus=2), job=job)
    assert sorted(out["records"]) == sorted(ids)
    seen = {}
    for p in plan.packs:
        recs = [read_json(run.training_record(p.pack_id, t.training_id)) for t in p.trainings]
        assert [r["status"] for r in recs] == ["completed"] * 2, [r.get("error") for r in recs]
        gpus = {r["cuda_visible_devices"] for r in recs} | {r["metrics"]["env"]["CUDA_VISIBLE_DEVICES"] for r in recs}
        assert len(gpus) == 1  # the pack's trainings saw one GPU, the one their record names
        seen[p.pack_id] = gpus.pop()
        assert read_json(run.pack_record(p.pack_id))["cuda_visible_devices"] == seen[p.pack_id]
    assert sorted(seen.values()) == ["2", "5"]  # one pack on each of the job's GPUs


@pytest.mark.slow
def test_a_job_of_two_gpus_takes_the_next_pack_on_whichever_gpu_is_free(tmp_path):
    run, plan = _gpu_plan(tmp_path, packs=5, n=1)
    ids = [p.pack_id for p in plan.packs]
    out = run_in_turn(str(run.root), ids, PackSettings(device="cpu", job_gpus=2),
                      job=JobEnvironment(job_id="7_1", cuda_visible_devices="0,1", tmp_dir=str(tmp_path / "tmp")))
    assert sorted(out["records"]) == sorted(ids) and out["unclaimed"] == 0
    gpus = [read_json(run.pack_record(i))["cuda_visible_devices"] for i in ids]
    assert set(gpus) <= {"0", "1"} and all(g is not None for g in gpus)
    again = run_in_turn(str(run.root), ids, PackSettings(device="cpu", job_gpus=2),  # requeued: nothing runs twice
                        job=JobEnvironment(job_id="7_1", cuda_visible_devices="0,1", tmp_dir=str(tmp_path / "tmp")))
    assert [read_json(run.pack_record(i))["cuda_visible_devices"] for i in ids] == gpus and len(again["records"]) == 5


def test_a_pack_that_fails_on_one_gpu_stops_the_lane_and_is_raised(tmp_path, monkeypatch):
    import threading

    import gpupack.job.turns as turns

    run, plan = _gpu_plan(tmp_path, packs=4, n=1)
    ids = [p.pack_id for p in plan.packs]
    ran: list[str] = []
    both_begun, failure_seen = threading.Barrier(2, timeout=30), threading.Event()
    fail = turns.Turns.fail

    def seen(self, err):
        fail(self, err)
        failure_seen.set()

    def run_pack(run_root, pack_id, settings, job, plan, records, resources=None, peaks=None):
        ran.append(pack_id)
        both_begun.wait()  # a pack on each GPU
        if pack_id == ids[0]:
            raise OSError("disk full")
        assert failure_seen.wait(30)  # the other GPU ends its pack after the failure: it takes no next one
        return {"pack_id": pack_id}

    monkeypatch.setattr(turns, "run_pack", run_pack)
    monkeypatch.setattr(turns.Turns, "fail", seen)
    with pytest.raises(OSError, match="disk full"):
        run_in_turn(str(run.root), ids, PackSettings(device="cpu", job_gpus=2),
                    job=JobEnvironment(job_id="7_2", cuda_visible_devices="0,1", tmp_dir=str(tmp_path / "tmp")))
    assert sorted(ran) == sorted(ids[:2])  # the failed pack and the one beside it; no pack began after the failure


@pytest.mark.slow
def test_a_lanes_packs_share_one_fork_server_started_before_the_first_packs_wall(tmp_path):
    """Three packs in turn (N = 1, 2, 1): one server preloads once for all of them (its log in lanes/, removed when
    empty), each pack's wall counts from its first training, and the first pack's setup_s holds the preload."""
    from gpupack.job.pack.process import ProcessOptions

    mark = tmp_path / "preloads"
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload="tests.fake_workloads", grid={"lr": [0.1, 0.2]},
                     fixed={"steps": 2, "preload_mark": str(mark), "preload_sleep_s": 1.0}, factors=[1, 2],
                     modes=["process"], partitions=["local"], repeats=1, order="by_factor")
    write_json_atomic(run.plan, plan.to_json())
    ids = [p.pack_id for p in plan.packs]
    assert len(ids) == 3
    fork = PackSettings(device="cpu", mode_options={"process": ProcessOptions(start="fork")})
    run_in_turn(str(run.root), ids, fork)
    assert len(mark.read_text().splitlines()) == 1  # one server, one preload, for the lane
    recs = [read_json(run.pack_record(i)) for i in ids]
    first, *later = recs
    assert first["setup_s"] >= 1.0 and all(r["setup_s"] < 1.0 for r in later)  # the preload (a sleep: a lower
    trainings = [read_json(p) for p in run.packs.glob("*/trainings/*.json")]    # bound) was paid once
    assert len(trainings) == 4 and {t["start"] for t in trainings} == {"fork"}
    for r in recs:
        starts = [t["started_at"] for t in trainings if t["pack_id"] == r["pack_id"]]
        assert r["started_at"] == min(starts)
    assert not run.lanes.exists() or list(run.lanes.iterdir()) == []  # the server said nothing: no log kept


@pytest.mark.slow
def test_a_shared_servers_children_get_their_packs_thread_share(tmp_path):
    """The server loaded numpy's BLAS and OpenMP pools in the first pack's environment (N=1: every core); a pack of
    N=2 forked from it runs each training's pools at its own share (threadpoolctl in the child)."""
    import os

    from gpupack.job.pack.process import ProcessOptions

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores: N=1 and N=2 then get different thread shares")
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload="tests.fake_workloads", grid={"lr": [0.1, 0.2]},
                     fixed={"steps": 1, "preload_import": "numpy", "report_threads": True}, factors=[1, 2],
                     modes=["process"], partitions=["local"], repeats=1, order="by_factor")
    write_json_atomic(run.plan, plan.to_json())
    ids = [p.pack_id for p in plan.packs]
    assert [plan.pack(i).factor for i in ids] == [1, 1, 2]
    fork = PackSettings(device="cpu", mode_options={"process": ProcessOptions(start="fork")})
    run_in_turn(str(run.root), ids, fork)
    for path in run.packs.glob("*/trainings/*.json"):
        rec = read_json(path)
        pools = rec["metrics"]["thread_pools"]
        assert pools and set(pools.values()) == {rec["threads"]}, (rec["factor"], rec["threads"], pools)
