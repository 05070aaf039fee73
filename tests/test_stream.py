"""Streaming lanes (packing.stream): the plan's lanes, claims exactly once across concurrent jobs, a SIGKILLed lane's
trainings run again on resume and no other does, the time limit (a fake clock), requeue through the backend's
signal, and the CLI end to end. No verdict here depends on how fast anything ran."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpupack.core.jobenv import JobEnvironment
from gpupack.core.plan import Plan, make_plan, plan_in_order, stream_lanes, trainings_for
from gpupack.core.store.claims import (
    STALE,
    Claimant,
    Seen,
    claim,
    claim_path,
    claims,
    read_claim,
    release_stale,
    stale_why,
)
from gpupack.core.store.journal import RunRecords, read_folded
from gpupack.core.store.records import SCHEMA_VERSION, read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.errors import ConfigError
from gpupack.job.lanes import run_lane
from gpupack.job.stream import Lane
from gpupack.results.analysis.load import load_records
from gpupack.submit import PackJob
from gpupack.sweep.flow.run import packs_to_run
from gpupack.sweep.setup.compose import compose_config
from gpupack.sweep.setup.validate import check_packing
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parent.parent
FAKE = "tests.fake_workloads"


def _plan(tmp_path, n_trainings=8, factor=2, jobs=2, **fixed):
    plan = make_plan(sweep="s", workload=FAKE, grid={"tag": [f"t{i}" for i in range(n_trainings)]},
                     fixed={"steps": 1, "sleep_s": 0.0, **fixed}, factors=[factor], modes=["process"],
                     partitions=["local"], repeats=1, stream_jobs=jobs)
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.plan, plan.to_json())
    return run, plan


def _records(run: RunDir) -> dict[str, dict]:
    """Each training's current record, in a lane's folder or folded into a lane's journal."""
    records = RunRecords(run)
    plan = Plan.from_json(read_json(run.plan))
    return {t.training_id: rec for p in plan.packs for t in p.trainings
            if (rec := records.training(p.pack_id, t.training_id)) is not None}


def _ran_twice(run: RunDir) -> list[str]:
    """Trainings with more than one record: an earlier attempt's in a folder, or two in the journals."""
    folded = read_folded(run)
    return sorted({p.stem for p in run.packs.glob("*/attempts/*/*.json") if p.name != "pack.json"}
                  | {tid for (_, tid), history in folded.trainings.items() if len(history) > 1})


# ---------------- the plan ----------------

@pytest.mark.parametrize("n, factor, jobs, lanes, shares", [
    (8, 2, 2, 2, [4, 4]),
    (7, 2, 3, 3, [3, 2, 2]),
    (3, 2, 5, 2, [2, 1]),  # never more lanes than the trainings fill at the start: ceil(3 / 2)
    (1, 4, 8, 1, [1]),  # and no more slots than trainings: one slot
])
def test_lanes_deal_the_queue_out(n, factor, jobs, lanes, shares):
    trainings = trainings_for(FAKE, [{"tag": f"t{i}"} for i in range(n)], {}, n)
    packs = stream_lanes("local", "process", factor, trainings, jobs)
    slots = min(factor, n)
    assert [len(p.trainings) for p in packs] == shares and len(packs) == lanes
    assert {p.stream for p in packs} == {f"local-process-n{slots:02d}-queue"} and {p.factor for p in packs} == {slots}
    assert [p.pack_id for p in packs] == [f"local-process-n{slots:02d}-s{j:03d}" for j in range(lanes)]
    plan = Plan(sweep="s", workload=FAKE, grid_size=n, packs=tuple(packs))
    assert [t for _, t in plan.queue(packs[0].stream or "")] == trainings  # claimed in the grid's order
    assert plan.n_trainings == n  # each training once in the plan
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_a_streaming_plan_has_no_filler_and_keeps_probes_apart():
    plan = make_plan(sweep="s", workload=FAKE, grid={"tag": ["a", "b", "c"]}, fixed={}, factors=[2],
                     modes=["process"], partitions=["local"], repeats=3, stream_jobs=1)
    assert [len(p.trainings) for p in plan.packs] == [3]  # the grid once: no repeats, no reseeded filler
    assert any("streaming" in n for n in plan.notes)
    fixed = make_plan(sweep="s", workload=FAKE, grid={"tag": ["a", "b", "c"]}, fixed={}, factors=[2],
                      modes=["process"], partitions=["local"], repeats=3)
    assert all(p.stream is None for p in fixed.packs) and "stream" not in fixed.to_json()["packs"][0]


@pytest.mark.parametrize("costs, order", [
    ([1, 4, 1, 4], [1, 3, 0, 2]),  # longest first, stable among equals
    ([3, 2, 1, 0], [0, 1, 2, 3]),
    ([1, None, 4, 2], [0, 1, 2, 3]),  # one unknown: the grid's order
    (None, [0, 1, 2, 3]),  # no estimate at all
])
def test_a_stream_claims_the_longest_first_where_the_workload_can_tell(costs, order):
    points = [{"tag": f"t{i}", "lr": float(i)} for i in range(4)]
    cost = (lambda p: costs[int(p["lr"])]) if costs is not None else None
    plan = make_plan(sweep="s", workload=FAKE, grid={}, fixed={}, factors=[2], modes=["process"],
                     partitions=["local"], repeats=1, stream_jobs=1, points=points, cost=cost)
    (lane,) = plan.packs
    assert [t.params["tag"] for t in lane.trainings] == [f"t{i}" for i in order]
    assert ("longest first" in plan.notes[0]) == (order != [0, 1, 2, 3] or costs == [3, 2, 1, 0])


def test_mnist_tells_a_training_s_length_by_the_samples_it_sees():
    from gpupack.job.workloads import load_workload

    mnist = load_workload("mnist_torch")
    assert mnist.cost({"epochs": 4, "train_samples": 1000}) == 4 * mnist.cost({"epochs": 1, "train_samples": 1000})
    assert load_workload("command").cost({"argv": ["x"]}) is None


def test_a_hydra_batch_streams_in_sweep_order():
    plan = plan_in_order(sweep="app", workload="w", params=[{"job_num": i} for i in range(5)], factor=2,
                         partition="local", mode="process", stream_jobs=1)
    (lane,) = plan.packs
    assert [t.params["job_num"] for _, t in plan.queue(lane.stream or "")] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("overrides, key", [
    (["packing.stream=sometimes"], "packing.stream"),
    (["packing.jobs=0"], "packing.jobs"),
    (["packing.stream=on", "packing.modes=[fused]"], "packing.modes[0]"),
])
def test_bad_streaming_options_are_refused_in_one_line(overrides, key):
    cfg = compose_config(["+sweep=mnist_pack", *overrides])
    with pytest.raises(ConfigError) as err:
        check_packing(cfg)
    assert err.value.key == key and "HINT" in str(err.value)


# ---------------- claims ----------------

def _claim_all(folder: str, ids: list[str], name: str, out) -> None:
    holder = Claimant.here(name, None)
    out.put((name, [i for i in ids if claim(Path(folder), i, holder)]))


def test_racing_claimers_claim_each_training_exactly_once(tmp_path):
    ids = [f"t{i:03d}" for i in range(300)]
    out: multiprocessing.Queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_claim_all, args=(str(tmp_path), ids, f"lane{k}", out)) for k in range(4)]
    for p in procs:
        p.start()
    won = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join()
    every = [i for got in won.values() for i in got]
    assert sorted(every) == ids  # each id won once, none lost
    assert {i: rec["lane"] for i, rec in claims(tmp_path).items()} == {i: k for k, got in won.items() for i in got}


def test_only_a_later_run_of_the_same_lane_releases_its_claims(tmp_path):
    first, other = Claimant.here("lane0", "1_0"), Claimant.here("lane1", "1_1")
    assert claim(tmp_path, "a", first) and claim(tmp_path, "b", first) and claim(tmp_path, "c", other)
    assert not claim(tmp_path, "a", other)  # held
    assert release_stale(tmp_path, first) == {}  # its own live claims are not stale to itself
    again = Claimant.here("lane0", "1_0")  # the lane requeued: a new incarnation
    assert sorted(release_stale(tmp_path, again, keep={"b"})) == ["a"]  # b completed: its claim stays
    assert sorted(claims(tmp_path)) == ["b", "c"]
    assert claim(tmp_path, "a", other)


WHOLE = b'{"lane": "L0", "incarnation": "h:1:aa", "job_id": null, "host": "h", "pid": 1, "claimed_at": 1.0}'


@pytest.mark.parametrize("raw, rec, lane", [
    (WHOLE, True, "L0"),
    (WHOLE[:40], False, "L0"),  # cut after the lane's name: it names its lane
    (b'{"lane": "L0', False, None),  # cut inside the name: "L" or "L0" would be a guess
    (b"", False, None),  # empty: the link made, its bytes lost
    (b'{"lane": "L0"}', False, "L0"),  # a JSON object with no run of the lane: not a claim gpupack wrote whole
    (b"[1, 2]", False, None),
    (b"\xff\xfe", False, None),
    (b'{"lane": "L0", "incarnation": 7}', False, "L0"),  # a run of it that is no name: not what claim() wrote
    (b'{"lane": 3, "incarnation": "h:1:aa"}', False, None),
])
def test_a_claim_is_read_whole_or_as_torn_with_the_lane_its_start_names(raw, rec, lane):
    seen = read_claim(raw)
    assert (seen.rec is not None) == rec and seen.lane == lane


def test_a_whole_claim_keeps_each_field_of_its_type_and_drops_one_that_is_not():
    assert read_claim(WHOLE).rec == {"lane": "L0", "incarnation": "h:1:aa", "job_id": None, "host": "h", "pid": 1,
                                     "claimed_at": 1.0}
    odd = read_claim(b'{"lane": "L0", "incarnation": "h:1:aa", "job_id": 5, "host": null, "pid": "1",'
                     b' "claimed_at": true}').rec
    assert odd == {"lane": "L0", "incarnation": "h:1:aa"}  # each wrong field left out, none taken as its type


ME = Claimant("L0", "h:2:bb", None, "h", 2)


@pytest.mark.parametrize("seen, home, why", [
    (Seen({"lane": "L0", "incarnation": "h:1:aa"}, "L0"), "L1", STALE),  # an earlier run of this lane: dead
    (Seen({"lane": "L0", "incarnation": "h:2:bb"}, "L0"), "L0", None),  # this run's own claim
    (Seen({"lane": "L1", "incarnation": "h:1:aa"}, "L1"), "L0", None),  # another lane's: only its own runs release it
    (Seen(None, "L0"), "L1", "torn, made by an earlier run of this lane (its start names it)"),
    (Seen(None, "L1"), "L0", None),  # torn, naming another lane: that lane's next run releases it
    (Seen(None, "Lx"), "L0", "torn, its holder unreadable: released by the training's home lane"),  # no lane's name
    (Seen(None, None), "L0", "torn, its holder unreadable: released by the training's home lane"),
    (Seen(None, None), "L1", None),  # torn, no holder read: the home lane alone decides
    (Seen(None, None), None, None),
])
def test_which_claims_a_starting_lane_releases(seen, home, why):
    assert stale_why(seen, ME, home, lanes=("L0", "L1")) == why


def test_a_torn_claim_is_released_by_the_lane_it_names_else_by_the_training_s_home(tmp_path):
    holder = Claimant.here("L0", None)
    for tid in ("a", "b", "c", "d"):
        assert claim(tmp_path, tid, holder)
    claim_path(tmp_path, "a").write_bytes(b"")  # no holder left: "a"'s home is L0
    claim_path(tmp_path, "b").write_bytes(b"")  # no holder left: "b"'s home is L1
    claim_path(tmp_path, "c").write_bytes(claim_path(tmp_path, "c").read_bytes()[:20])  # names L0
    homes = {"a": "L0", "b": "L1", "c": "L1", "d": "L1"}
    assert release_stale(tmp_path, Claimant.here("L1", None), homes=homes) == {
        "b": "torn, its holder unreadable: released by the training's home lane"}
    assert set(release_stale(tmp_path, Claimant.here("L0", None), homes=homes)) == {"a", "c", "d"}
    assert claims(tmp_path) == {}


# ---------------- lanes ----------------

def _lane_cmd(run: RunDir, pack_id: str, fold: bool = False) -> list[str]:
    return [sys.executable, "-c", "import sys; from gpupack.job.lanes import run_lane; from gpupack.core.types "
            "import PackSettings; run_lane(sys.argv[1], sys.argv[2], PackSettings(device='cpu', fold=sys.argv[3] "
            "== 'fold'))", str(run.root), pack_id, "fold" if fold else "keep"]


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.slow
def test_two_lanes_racing_for_the_last_claims_never_run_a_training_twice(tmp_path, subprocess_env, fold):
    run, plan = _plan(tmp_path, n_trainings=40, factor=2, jobs=2)
    procs = [subprocess.Popen(_lane_cmd(run, p.pack_id, fold), env=subprocess_env, cwd=REPO) for p in plan.packs]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    recs = _records(run)
    assert len(recs) == 40 and all(r["status"] == "completed" for r in recs.values())
    lanes = RunRecords(run)
    ran = [(lanes.pack(p.pack_id) or {})["training_ids"] for p in plan.packs]
    assert sorted(ran[0] + ran[1]) == sorted(recs)  # every training ran, and by one lane only
    assert not _ran_twice(run)  # nothing was run a second time
    assert {r["lane"] for r in recs.values()} <= {0, 1}
    for p in plan.packs:
        lane = lanes.pack(p.pack_id) or {}
        assert lane["stream"] == p.stream and lane["unclaimed"] == 0 and lane["complete"] is False
        if lane["training_ids"]:
            assert 0 < lane["slot_occupancy"] <= 1
        else:  # on a loaded machine one lane may start after the other claimed everything: it ran nothing
            assert not lane["slot_occupancy"]
    if fold:  # a few files a lane, none a training: its journal (its log, its columnar file), no claim, record or
        # folder left
        kept = {f"{p.pack_id}.{x}" for p in plan.packs for x in ("jsonl", "log", "arrows")}
        assert {p.name for p in run.lanes.iterdir()} <= kept
        assert claims(run.claims(plan.packs[0].stream or "")) == {} and list(run.packs.iterdir()) == []
        assert {r["home"] for r in recs.values()} == {p.pack_id for p in plan.packs}  # keyed by home, as planned
        loaded = load_records([run.root]).trainings  # collect reads each once, as the current record
        assert len(loaded) == 40 and set(loaded["attempt"]) == {0} and set(loaded["status"]) == {"completed"}
    else:
        assert len(list(run.packs.glob("*/trainings/*.json"))) == 40


def test_a_claim_won_of_a_training_another_lane_folded_as_completed_is_let_go(tmp_path):
    # Lane A runs t0 to its end and folds it: its claim goes. Lane B, which read the journals before that, then wins
    # the claim of t0 (no file holds it now): it must find t0 in A's journal, let the claim go, and take t1.
    run, plan = _plan(tmp_path, n_trainings=4, factor=1, jobs=2)
    a_pack, b_pack = plan.packs
    settings = PackSettings(device="cpu", fold=True)
    a = Lane(run, plan, a_pack, Claimant.here(a_pack.pack_id, "1_0"), settings)
    b = Lane(run, plan, b_pack, Claimant.here(b_pack.pack_id, "1_1"), settings)
    assert b.completed() == set()  # B has read the (empty) journals
    t0 = a.next()
    assert t0 is not None and t0.training_id in claims(a.folder)
    write_json_atomic(a.record(t0.training_id), {"kind": "training", "schema": SCHEMA_VERSION,
                                                 "training_id": t0.training_id,
                                                 "pack_id": a_pack.pack_id, "home": a.home(t0.training_id),
                                                 "status": "completed", "started_at": 1.0, "ended_at": 2.0})
    a.recorded(t0.training_id)
    assert claims(a.folder) == {} and not a.record(t0.training_id).exists()  # folded: no claim, no record file
    taken = b.next()
    assert taken is not None and taken.training_id != t0.training_id  # B let t0 go
    assert set(claims(b.folder)) == {taken.training_id}
    assert RunRecords(run).completed(a.home(t0.training_id), t0.training_id)
    rows = load_records([run.root]).trainings  # while A's folder is there (A runs on): folded is current
    assert list(rows["training_id"]) == [t0.training_id] and list(rows["attempt"]) == [0]


def test_a_folding_lane_folds_what_its_killed_run_left_and_runs_none_of_it_again(tmp_path):
    # The lane's earlier run recorded t0 (completed) and t1 (failed), then was killed before folding them: its next
    # run folds both, lets go of t0's claim and releases t1's, runs t1 again and the rest; t0 runs once.
    run, plan = _plan(tmp_path, n_trainings=4, factor=1, jobs=1)
    (pack,) = plan.packs
    queue = [t.training_id for _, t in plan.queue(pack.stream or "")]
    earlier = Claimant.here(pack.pack_id, "1_0")
    for tid, status in zip(queue, ("completed", "failed")):
        assert claim(run.claims(pack.stream or ""), tid, earlier)
        write_json_atomic(run.training_record(pack.pack_id, tid),
                          {"kind": "training", "training_id": tid, "pack_id": pack.pack_id, "home": pack.pack_id,
                           "status": status, "started_at": 1.0, "ended_at": 2.0})
    rec = run_lane(str(run.root), pack.pack_id, PackSettings(device="cpu", fold=True))
    assert sorted(rec["training_ids"]) == sorted(queue[1:]) and rec["released"] == [queue[1]]
    history = read_folded(run).trainings
    assert [r["status"] for r in history[(pack.pack_id, queue[0])]] == ["completed"]  # folded once, never rerun
    assert [r["status"] for r in history[(pack.pack_id, queue[1])]] == ["failed", "completed"]
    assert claims(run.claims(pack.stream or "")) == {} and not run.pack_dir(pack.pack_id).exists()
    assert run_lane(str(run.root), pack.pack_id, PackSettings(device="cpu", fold=True)) == RunRecords(run).pack(
        pack.pack_id)  # drained: the lane's folded record, nothing run


@pytest.mark.slow
def test_a_sigkilled_lane_s_trainings_run_again_on_resume_and_no_other_does(tmp_path, subprocess_env):
    # t0 and t1 hang on their first attempt (until the marker exists), the rest are quick.
    markers = tmp_path / "markers"
    markers.mkdir()
    plan = make_plan(sweep="s", workload=FAKE, grid={"tag": [f"t{i}" for i in range(8)]},
                     fixed={"steps": 1, "sleep_s": 0.0, "first_attempt_sleep_s": 600.0}, factors=[2],
                     modes=["process"], partitions=["local"], repeats=1, stream_jobs=2,
                     points=[{"tag": f"t{i}", "marker": str(markers / f"t{i}") if i < 2 else ""} for i in range(8)])
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.plan, plan.to_json())
    lane_a, lane_b = plan.packs
    held = [t.training_id for _, t in plan.queue(lane_a.stream or "")][:2]
    a = subprocess.Popen(_lane_cmd(run, lane_a.pack_id), env=subprocess_env, cwd=REPO, start_new_session=True)
    try:
        folder = run.claims(lane_a.stream or "")
        assert wait_for(lambda: (markers / "t0").exists() and (markers / "t1").exists(), timeout_s=120)
        assert {i for i, r in claims(folder).items() if r["lane"] == lane_a.pack_id} == set(held)
        # lane B drains the rest while A holds t0 and t1: it never takes them
        run_lane(str(run.root), lane_b.pack_id, PackSettings(device="cpu"))
        b_ran = read_json(run.pack_record(lane_b.pack_id))["training_ids"]
        assert sorted(b_ran) == sorted(set(_records(run)))  # B ran everything recorded so far
        assert set(b_ran).isdisjoint(held) and len(b_ran) == 6
    finally:
        os.killpg(a.pid, signal.SIGKILL)  # the job dies: scancel, a node failure, the OOM killer
        a.wait(timeout=60)
    assert sorted(p.pack_id for p in packs_to_run(run, plan)) == [lane_a.pack_id, lane_b.pack_id]
    rec = run_lane(str(run.root), lane_a.pack_id, PackSettings(device="cpu"))  # the resume's lane A
    assert sorted(rec["released"]) == sorted(held) and sorted(rec["training_ids"]) == sorted(held)
    recs = _records(run)
    assert len(recs) == 8 and all(r["status"] == "completed" for r in recs.values())
    assert not list(run.packs.glob("*/attempts/*/*.json"))  # the killed attempt left no record; none ran twice
    assert packs_to_run(run, plan) == []
    run_lane(str(run.root), lane_b.pack_id, PackSettings(device="cpu"))  # a lane of a drained queue runs nothing
    assert len(_records(run)) == 8 and not list(run.packs.glob("*/attempts/*/*.json"))


def test_slurm_out_of_memory_marks_only_what_that_lane_ran(tmp_path):
    from gpupack.job.oom import record_job_oom

    run, plan = _plan(tmp_path, n_trainings=6, factor=2, jobs=2)
    queue = plan.queue(plan.packs[0].stream or "")
    since = 1000.0

    def write(i: int, ran_in: str, started: float, status: str = "killed") -> None:
        home, t = queue[i]
        write_json_atomic(run.training_record(home.pack_id, t.training_id),
                          {"kind": "training", "training_id": t.training_id, "pack_id": ran_in, "status": status,
                           "signal": 9 if status == "killed" else None, "started_at": started, "error": None})

    lane = plan.packs[0].pack_id
    write(1, lane, since + 1)  # lives in lane 1's folder, ran in lane 0: its OOM
    write(2, lane, since - 50)  # an earlier attempt of lane 0
    write(3, plan.packs[1].pack_id, since + 1)  # killed in the other lane: not this job's OOM
    write(4, lane, since + 1, "completed")
    assert record_job_oom(run, lane, since, "SLURM: job 5 ran out of memory") == []
    recs = _records(run)
    status = {t.training_id: recs.get(t.training_id, {}).get("status") for _, t in queue}
    assert [status[t.training_id] for _, t in queue] == [None, "oom", "killed", "killed", "completed", None]


def test_slurm_out_of_memory_amends_a_folded_lane_s_journal(tmp_path):
    from gpupack.core.store.journal import fold_trainings
    from gpupack.job.oom import record_job_oom

    run, plan = _plan(tmp_path, n_trainings=4, factor=2, jobs=1)
    (pack,) = plan.packs
    queue = [t.training_id for _, t in plan.queue(pack.stream or "")]
    since = 1000.0
    for tid, started, status in zip(queue, (since + 1, since - 50, since + 1), ("killed", "killed", "completed")):
        write_json_atomic(run.training_record(pack.pack_id, tid),
                          {"kind": "training", "training_id": tid, "pack_id": pack.pack_id, "home": pack.pack_id,
                           "status": status, "signal": 9 if status == "killed" else None, "started_at": started,
                           "error": None})
    fold_trainings(run, pack.pack_id, queue[:3], pack.pack_id)  # the lane folded each as it ended
    assert record_job_oom(run, pack.pack_id, since, "SLURM: job 5 ran out of memory") == []
    history = read_folded(run).trainings
    assert [r["status"] for r in history[(pack.pack_id, queue[0])]] == ["killed", "oom"]  # amended by a later line
    assert [r["status"] for r in history[(pack.pack_id, queue[1])]] == ["killed"]  # an earlier attempt's: as it was
    assert [r["status"] for r in history[(pack.pack_id, queue[2])]] == ["completed"]
    assert RunRecords(run).training(pack.pack_id, queue[0])["oom_killed_by"] == "SLURM: job 5 ran out of memory"


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_lane_claims_nothing_it_could_not_finish_before_its_time_limit(tmp_path):
    run, plan = _plan(tmp_path, n_trainings=4, factor=1, jobs=1)
    (pack,) = plan.packs
    clock = _Clock()
    lane = Lane(run, plan, pack, Claimant.here(pack.pack_id, "7"),
                PackSettings(claim_until_s=100.0, training_estimate_s=30.0), clock=clock)
    first = lane.next()
    assert first is not None and lane.stopped is None
    clock.now = 60.0  # 40 s left, a training may take 30 s
    lane.ended(first.training_id, 50.0)  # ... but the one it ran took 50 s: that is the estimate now
    assert lane.next() is None and "50 s" in (lane.stopped or "")
    assert len(claims(lane.folder)) == 1  # nothing else was claimed


def test_no_time_limit_or_nothing_to_estimate_by_claims_on(tmp_path):
    run, plan = _plan(tmp_path, n_trainings=3, factor=1, jobs=1)
    (pack,) = plan.packs
    clock = _Clock()
    clock.now = 1e6
    for settings in (PackSettings(), PackSettings(claim_until_s=10.0)):
        lane = Lane(run, plan, pack, Claimant.here(pack.pack_id, "7"), settings, clock=clock)
        assert lane.out_of_time() is None


class _Requeueing:
    """A backend's side of PackJob: its job environment, and whether and how its jobs requeue."""

    requeues = True
    signals: list[int] = []

    @classmethod
    def job_environment(cls) -> JobEnvironment:
        return JobEnvironment(job_id="9_0")

    @classmethod
    def requeue_signal(cls) -> int:
        return signal.SIGUSR1


@pytest.mark.parametrize("requeues", [True, False])
def test_a_lane_out_of_time_with_trainings_left_asks_its_backend_to_requeue(tmp_path, monkeypatch, requeues):
    run, plan = _plan(tmp_path, n_trainings=3, factor=1, jobs=1)
    seen: list[int] = []
    monkeypatch.setattr(_Requeueing, "requeues", requeues)
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        rec = PackJob(_Requeueing)(str(run.root), plan.packs[0].pack_id,  # type: ignore[arg-type]
                                   PackSettings(device="cpu", claim_until_s=0.0, training_estimate_s=10.0))
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert rec["unclaimed"] == 3 and rec["stopped_claiming"] and rec["training_ids"] == []
    assert seen == ([signal.SIGUSR1] if requeues else [])


def test_a_drained_lane_whose_last_record_stopped_claiming_does_not_requeue_itself(tmp_path, monkeypatch):
    """A lane stopped claiming near its time limit (its record: 3 unclaimed), its requeued run ran those 3 and was
    signalled before it wrote its own record. The next run finds the queue drained: it runs nothing and does not ask
    to be requeued again on that stale record (on SLURM each ask spent one of max_num_timeout, until none was left)."""
    run, plan = _plan(tmp_path, n_trainings=3, factor=1, jobs=1)
    (pack,) = plan.packs
    stopped = run_lane(str(run.root), pack.pack_id, PackSettings(device="cpu", fold=True, claim_until_s=0.0,
                                                                 training_estimate_s=10.0))
    assert stopped["unclaimed"] == 3 and stopped["stopped_claiming"]
    for _, t in plan.queue(pack.stream or ""):  # what the killed run recorded, not folded before it was killed
        write_json_atomic(run.training_record(pack.pack_id, t.training_id),
                          {"kind": "training", "training_id": t.training_id, "pack_id": pack.pack_id,
                           "home": pack.pack_id, "status": "completed", "started_at": 1.0, "ended_at": 2.0})
    seen: list[int] = []
    monkeypatch.setattr(_Requeueing, "requeues", True)
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        rec = PackJob(_Requeueing)(str(run.root), pack.pack_id,  # type: ignore[arg-type]
                                   PackSettings(device="cpu", fold=True, claim_until_s=100.0, training_estimate_s=10.0))
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert rec["unclaimed"] == 0 and seen == []


# ---------------- end to end ----------------

@pytest.mark.slow
def test_the_cli_streams_a_sweep_and_collect_shows_occupancy(tmp_path, subprocess_env):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "gpupack", f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]",
                           "+sweep=probe_pack", "packing.factors=[2]", "packing.stream=on",
                           "sweep.grid.lr=[0.1,0.2,0.3,0.4,0.5]", "cluster.max_parallel_packs=2", "collect.plots=true",
                           f"run_dir={run_dir}"], capture_output=True, text=True, env=subprocess_env, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = _records(RunDir(run_dir))
    assert len(recs) == 5 and all(r["status"] == "completed" for r in recs.values())
    assert "Slot occupancy" in proc.stdout and "streaming" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    (row,) = summary["occupancy"]
    assert row["how"] == "streaming" and row["trainings"] == 5 and row["jobs"] == 2
    assert (run_dir / "plots" / "timeline.png").exists()
    # the main table leads with what the stream measured: its lanes and their device-seconds per training
    (group,) = summary["groups"]
    assert group["lanes"] == 2 and group["stream_s_per_training"] == pytest.approx(row["device_s_per_training"])
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("local"))
    assert "2 lanes" in line and f"{row['device_s_per_training']:.2f} stream" in line, proc.stdout
    assert "lanes, stream: a streaming run" in proc.stdout


def _cli_stream(run_dir: Path, env: dict, n: int = 8) -> subprocess.CompletedProcess:
    lrs = ",".join(f"0.{i}" for i in range(1, n + 1))
    return subprocess.run([sys.executable, "-m", "gpupack", f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]",
                           "+sweep=probe_pack", "packing.factors=[2]", "packing.stream=on", f"sweep.grid.lr=[{lrs}]",
                           "packing.jobs=2", "cluster.max_parallel_packs=2", f"run_dir={run_dir}"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


@pytest.mark.parametrize("keep", [0, 40])  # empty: no holder to read (its home releases it); cut after the lane's name
@pytest.mark.slow
def test_a_torn_claim_of_an_unfinished_training_is_released_and_the_rerun_runs_each_training_once(
        tmp_path, subprocess_env, keep):
    run_dir = tmp_path / "run"
    first = _cli_stream(run_dir, subprocess_env)
    assert first.returncode == 0, first.stdout + first.stderr
    run = RunDir(run_dir)
    # As a run killed mid-training leaves it: the lane that ran t has no record of it nor of itself, and t's claim
    # file was cut (the crash lost its bytes)
    tid, rec = sorted(_records(run).items())[-1]
    run.training_record(rec["home"], tid).unlink()
    run.pack_record(rec["pack_id"]).unlink()
    torn = claim_path(run.claims(rec["stream"]), tid)
    torn.write_bytes(torn.read_bytes()[:keep])
    again = _cli_stream(run_dir, subprocess_env)
    assert again.returncode == 0, again.stdout + again.stderr
    recs = _records(run)
    assert len(recs) == 8 and all(r["status"] == "completed" for r in recs.values())  # the eighth too
    assert not _ran_twice(run)  # and each training once
    logs = "".join(p.read_text(errors="replace") for p in run.submitit_folder.glob("*_log.err"))
    assert f"the claim {torn} could not be read" in logs, logs[-2000:]
    said = [(RunRecords(run).pack(p.pack_id) or {}).get("torn_claims", {}) for p in
            Plan.from_json(read_json(run.plan)).packs]
    assert [tid] == [t for s in said for t in s]  # one lane released it, and says so in its record
    assert again.stdout.strip().splitlines()[-1] == "done: 8 of 8 trainings of the plan have a record: 8 completed, " \
                                                    "0 failed"


@pytest.mark.slow
def test_a_training_no_lane_runs_is_never_said_done_and_status_last_line_and_collect_agree(tmp_path, subprocess_env):
    run_dir = tmp_path / "run"
    first = _cli_stream(run_dir, subprocess_env)
    assert first.returncode == 0, first.stdout + first.stderr
    run = RunDir(run_dir)
    tid, rec = sorted(_records(run).items())[-1]  # held by a whole claim of a lane this plan has not: none runs it
    run.training_record(rec["home"], tid).unlink()
    claim_path(run.claims(rec["stream"]), tid).write_text('{"lane": "elsewhere", "incarnation": "h:1:aa"}')
    again = _cli_stream(run_dir, subprocess_env)
    assert again.returncode == 1, again.stdout + again.stderr  # not done: exit 1
    last = again.stdout.strip().splitlines()[-1]
    assert last.startswith("not done: 7 of 8 trainings of the plan have a record: 7 completed, 0 failed; 1 without")
    collected = subprocess.run([sys.executable, "-m", "gpupack", "collect", str(run_dir)], capture_output=True,
                               text=True, env=subprocess_env, cwd=REPO, timeout=120)
    assert last in collected.stdout.splitlines(), collected.stdout  # the same counts, in the same words
    status = subprocess.run([sys.executable, "-m", "gpupack", "status", str(run_dir)], capture_output=True, text=True,
                            env=subprocess_env, cwd=REPO, timeout=120)
    assert "trainings completed 7, failed 0, running 0, waiting 1" in status.stdout, status.stdout


# ---------------- the local slurmctld ----------------

def _slurm_sweep(run_dir: Path, *extra: str) -> list[str]:
    return [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack", "cluster=slurm",
            "cluster.poll_s=0.5", "partitions=[v100]", "packing.factors=[2]", "packing.stream=on",
            f"run_dir={run_dir}", *extra]


def _sacct_jobs(env: dict, job_ids: list[str]) -> list[list[str]]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
                         capture_output=True, text=True, env=env, check=True).stdout
    return [line.split("|") for line in out.splitlines()]


@pytest.mark.slurm
@pytest.mark.slow
def test_two_streaming_jobs_drain_32_trainings_on_slurm(tmp_path, slurm_env):
    run_dir = tmp_path / "run"
    lrs = ",".join(f"0.{i:02d}" for i in range(1, 33))
    proc = subprocess.run([sys.executable, "-m", "gpupack", *_slurm_sweep(run_dir, f"sweep.grid.lr=[{lrs}]",
                                                                          "packing.jobs=2")],
                          capture_output=True, text=True, env=slurm_env, cwd=REPO, timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = RunDir(run_dir)
    recs = _records(run)
    assert len(recs) == 32 and all(r["status"] == "completed" for r in recs.values())
    assert not _ran_twice(run)  # every training ran exactly once
    jobs = json.loads(run.jobs.read_text())
    assert len(jobs) == 2
    ids = [j["job_id"] for j in jobs.values()]
    assert wait_for(lambda: len(_sacct_jobs(slurm_env, ids)) == 2, timeout_s=60)
    assert all(state == "COMPLETED" for _, state in _sacct_jobs(slurm_env, ids))
    assert {r["job_id"] for r in recs.values()} == set(ids)  # both lanes ran trainings, in those two jobs
    # Folded: the lanes' journals hold every record, no file a training is left (claims, records, logs, folders)
    assert sorted(p.name for p in run.lanes.glob("*.jsonl")) == sorted(f"{pack_id}.jsonl" for pack_id in jobs)
    assert claims(run.claims(next(iter(Plan.from_json(read_json(run.plan)).packs)).stream or "")) == {}
    assert not list(run.packs.iterdir()) if run.packs.is_dir() else True
    assert all(RunRecords(run).pack(pack_id) is not None for pack_id in jobs)


@pytest.mark.slurm
@pytest.mark.slow
def test_a_time_limit_reached_mid_queue_requeues_and_finishes_the_rest(tmp_path, slurm_env):
    # One lane of one slot, a 2-minute limit signalled 60 s before it: counting from the job's start, the lane claims
    # nothing it could not finish in those 60 s (10 s a training, and a margin), so after four or five of its six
    # trainings it requeues itself, and its next run drains the rest. None runs twice. (max_num_timeout=6: a loaded
    # machine's slow starts may take a requeue more.)
    run_dir = tmp_path / "run"
    lrs = ",".join(f"0.{i}" for i in range(1, 7))
    proc = subprocess.run([sys.executable, "-m", "gpupack", *_slurm_sweep(
        run_dir, "packing.factors=[1]", f"sweep.grid.lr=[{lrs}]", "sweep.fixed.steps=1", "sweep.fixed.sleep_s=10",
        "sweep.training_estimate_s=10", "packing.jobs=1", "cluster.timeout_min=2", "cluster.signal_delay_s=60",
        "cluster.max_num_timeout=6")], capture_output=True, text=True, env=slurm_env, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = RunDir(run_dir)
    recs = _records(run)
    assert len(recs) == 6 and all(r["status"] == "completed" for r in recs.values())
    assert not _ran_twice(run)
    (pack_id,) = json.loads(run.jobs.read_text())
    *earlier, lane = read_folded(run).packs[pack_id]  # the lane's record of each of its runs, folded as each ended
    assert lane["unclaimed"] == 0 and len(lane["training_ids"]) < 6  # its last run ran what the earlier left
    # Requeued through submitit's checkpoint: by the lane itself when it stopped claiming (an earlier run's record says
    # so), or by SLURM's own signal, which Slurm may send up to a minute early (its event resolution).
    log = "".join(p.read_text() for p in run.submitit_folder.glob("*_log*"))
    assert "caught signal" in log.lower() and "job requeue" in log.lower(), log[-2000:]
    assert all(e["stopped_claiming"] for e in earlier)  # a run that ended on its own ended out of time


@pytest.mark.parametrize("stream, lanes", [("auto", True), ("on", True), ("off", False)])
def test_auto_measures_with_whole_packs_and_streams_its_production_run(tmp_path, stream, lanes):
    from gpupack import sweep
    from gpupack.sweep.flow.auto import production_plan, step_plan

    prepared = sweep.prepare([f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack",
                              "packing.factors=auto", f"packing.stream={stream}", "sweep.grid.lr=[0.1,0.2,0.3]",
                              f"run_dir={tmp_path / 'run'}"])
    spec = prepared.spec
    assert spec is not None
    probe = step_plan(spec, ["local"], 2, {"local": 1}, 3)
    assert all(p.stream is None for p in probe.packs)  # the probe measures N: whole packs, always
    production = production_plan(spec, {"local": 2}, {})
    assert production is not None
    assert all((p.stream is not None) == lanes for p in production.packs)
    assert production.n_trainings == 3 if lanes else production.n_trainings >= 3


@pytest.mark.parametrize("options, jobs", [
    ({"stream": "auto", "mode": "process"}, 4),
    ({"stream": "on", "mode": "process", "jobs": 2}, 2),
    ({"stream": "off", "mode": "process"}, None),
    ({"stream": "auto", "mode": "fused"}, None),  # a mode that cannot stream runs whole packs under auto
])
def test_the_launcher_streams_its_batches_unless_told_not_to(options, jobs):
    from gpupack.hydra_launch import launcher_stream_jobs

    assert launcher_stream_jobs(options, at_once=4) == jobs


@pytest.mark.parametrize("options, key", [
    ({"stream": "maybe"}, "hydra.launcher.stream"),
    ({"jobs": 0}, "hydra.launcher.jobs"),
])
def test_bad_launcher_streaming_options_are_refused(options, key):
    from gpupack.hydra_launch import check_options, launcher_stream_jobs

    with pytest.raises(ConfigError) as err:
        check_options({"pack": 2, "device": "auto", **options})
    assert err.value.key == key
    with pytest.raises(ConfigError) as err:
        launcher_stream_jobs({"stream": "on", "mode": "fused"}, at_once=1)
    assert err.value.key == "hydra.launcher.stream" and "HINT" in str(err.value)


# ---------------- the main table's row of a stream ----------------

def _summary_row(factor: int, packs: float) -> dict:
    return {"workload": "w", "partition": "local", "gpu_type": "cpu", "mode": "process", "factor": factor,
            "packs": packs}


@pytest.mark.parametrize("rows, occ, expected", [
    # streamed only: its lanes and their device-s per training
    ([_summary_row(2, float("nan"))], [(2, "streaming", 3, 1.5)], [(3, 1.5)]),
    # whole packs timed it: the packs' figures stand, the stream adds nothing to the row
    ([_summary_row(2, 4.0)], [(2, "whole packs", 4, 0.9), (2, "streaming", 1, 0.7)], [(0, None)]),
    # another N streamed: this row keeps its dashes' meaning (nothing ran it)
    ([_summary_row(4, float("nan"))], [(2, "streaming", 1, 0.7)], [(0, None)]),
    ([], [(2, "streaming", 1, 0.7)], []),
])
def test_with_lanes(rows, occ, expected):
    import pandas as pd

    from gpupack.results.analysis.occupancy import with_lanes

    occupancy = pd.DataFrame([{"workload": "w", "partition": "local", "gpu_type": "cpu", "mode": "process",
                               "factor": n, "how": how, "packs": jobs, "device_s_per_training": s}
                              for n, how, jobs, s in occ])
    out = with_lanes(pd.DataFrame(rows, columns=list(_summary_row(1, 0))), occupancy)
    got = [(int(r["lanes"]), None if pd.isna(r["stream_s_per_training"]) else r["stream_s_per_training"])
           for _, r in out.iterrows()]
    assert got == expected


def test_collect_counts_a_training_another_lane_runs_again_once(tmp_path):
    """t failed in lane A and was folded there; lane B runs it again and its record sits in B's folder, not yet
    folded (B runs on, or was killed before its fold): collect's current record of t is B's, A's an earlier attempt."""
    from gpupack.core.store.journal import fold_trainings

    run, plan = _plan(tmp_path, n_trainings=2, factor=1, jobs=2)
    a, b = plan.packs
    home, t = plan.queue(a.stream or "")[0]

    def rec(ran_in: str, status: str, started: float) -> dict:
        return {"kind": "training", "schema": SCHEMA_VERSION, "training_id": t.training_id, "pack_id": ran_in,
                "home": home.pack_id, "status": status, "started_at": started, "ended_at": started + 1}

    write_json_atomic(run.training_record(a.pack_id, t.training_id), rec(a.pack_id, "failed", 1.0))
    fold_trainings(run, a.pack_id, [t.training_id], a.pack_id)
    write_json_atomic(run.training_record(b.pack_id, t.training_id), rec(b.pack_id, "completed", 5.0))
    rows = load_records([run.root]).trainings
    got = sorted(zip(rows["attempt"], rows["status"], rows["pack_id"]))
    assert got == [(0, "completed", b.pack_id), (1, "failed", a.pack_id)]
