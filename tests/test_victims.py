"""Victims of a neighbour's fault (issue 32, item 2): the pure rule, and a pack where one training faults and two die
after it, run for real on the CPU (the fake workload's fault and its victims' deaths, a signal and an MPS client's
CUDA error)."""
from __future__ import annotations

import pytest

from gpupack.core.memory.victims import victims
from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.body import run_pack
from gpupack.results.analysis.aggregate import aggregate


def _rec(tid, status, ended, signal=None, error=None):
    return {"training_id": tid, "status": status, "ended_at": ended, "signal": signal, "error": error}


@pytest.mark.parametrize("records, expected", [
    # the first to fail faulted; a SIGKILL and an MPS client's CUDA error after it are its victims
    ([_rec("a", "failed", 10.0, error="ValueError: nan"), _rec("b", "killed", 10.5, signal=6),
      _rec("c", "failed", 11.0, error="RuntimeError: CUDA error: an illegal memory access was encountered"),
      _rec("d", "completed", 30.0)], {"b": "a", "c": "a"}),
    # a failure of its own (a Python error, no signal) at the same time is its own, not a victim
    ([_rec("a", "failed", 10.0, error="boom"), _rec("b", "failed", 10.2, error="ValueError: bad lr")], {}),
    # too long after the fault: a death of its own
    ([_rec("a", "failed", 10.0), _rec("b", "killed", 25.0, signal=6)], {}),
    # gpupack's own time limit is no neighbour's fault, and no fault either
    ([_rec("a", "failed", 10.0), _rec("b", "timeout", 10.1, signal=9)], {}),
    ([_rec("a", "timeout", 10.0, signal=9), _rec("b", "killed", 10.1, signal=6)], {}),
    # the scheduler ending the job (SIGTERM, SIGKILL) is no neighbour's fault
    ([_rec("a", "killed", 10.0, signal=15), _rec("b", "killed", 10.0, signal=15), _rec("c", "killed", 10.1,
                                                                                      signal=9)], {}),
    # an OOM is never a victim (the kernel's choice, or its own memory): it counts against N
    ([_rec("a", "failed", 10.0), _rec("b", "oom", 10.2, signal=9, error="killed by the out-of-memory killer"),
      _rec("c", "oom", 10.3, error="CUDA error: out of memory")], {}),
    # one failure alone takes nobody down
    ([_rec("a", "killed", 10.0, signal=6), _rec("b", "completed", 12.0)], {}),
    # the order is by the end: the one that died first faulted
    ([_rec("b", "killed", 10.4, signal=11), _rec("a", "oom", 10.0, error="CUDA out of memory")], {"b": "a"}),
])
def test_victims_table(records, expected):
    assert victims(records) == expected


@pytest.mark.slow
def test_a_fault_that_takes_two_neighbours_down_reruns_them_and_counts_only_itself(tmp_path):
    """t0 faults (its own error, on its first attempt); t1 dies by SIGABRT and t2 by an MPS client's CUDA error right
    after: t0 is failed, t1 and t2 are victims of t0, run again once in a fresh start of the mode, and complete.
    collect counts one failure and two victims at N=3, no OOM, and t1 and t2 are finished: only t0's own failure
    holds N back, as any failed training does until it is run again. Resumed, t0 completes and N=3 is chosen: the
    victims never counted against it."""
    run = RunDir(tmp_path / "run")
    flag = tmp_path / "fault"
    plan = make_plan(sweep="v", workload="tests.fake_workloads", grid={"tag": ["t0", "t1", "t2"]},
                     fixed={"steps": 1}, factors=[3], modes=["process"], partitions=["local"], repeats=2,
                     order="by_factor")
    data = plan.to_json()
    for t in data["packs"][0]["trainings"]:  # the first pack's; the second runs as any
        tag = t["params"]["tag"]
        if tag == "t0":
            t["params"].update(fault=str(flag), marker=str(tmp_path / "t0.first"))
        else:
            t["params"].update(die_after=str(flag), die_as="signal" if tag == "t1" else "cuda",
                               marker=str(tmp_path / f"{tag}.first"))
    write_json_atomic(run.plan, data)
    pack = plan.packs[0]
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    ids = {t.params["tag"]: t.training_id for t in pack.trainings}
    latest = {tag: read_json(run.training_record(pack.pack_id, tid)) for tag, tid in ids.items()}
    assert [latest[t]["status"] for t in ("t0", "t1", "t2")] == ["failed", "completed", "completed"]
    assert rec["victims_rerun"] == {ids["t1"]: ids["t0"], ids["t2"]: ids["t0"]}
    earlier = {r["training_id"]: r for r in map(read_json, run.pack_dir(pack.pack_id).glob("attempts/*/*.json"))
               if r.get("kind") == "training"}
    assert {tid: (r["status"], r["victim_of"], r["died_as"]) for tid, r in earlier.items()} == {
        ids["t1"]: ("victim", ids["t0"], "killed"), ids["t2"]: ("victim", ids["t0"], "failed")}
    run_pack(str(run.root), plan.packs[1].pack_id, PackSettings(device="cpu"))  # N=3's other pack: a timing
    row = aggregate([run.root]).summary.set_index("factor").loc[3]
    assert (row["failed"], row["victims"], row["oom"], row["unfinished"]) == (1, 2, 0, 1)
    run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))  # a resume runs what is left: t0
    collected = aggregate([run.root])
    row = collected.summary.set_index("factor").loc[3]
    assert (row["failed"], row["victims"], row["oom"], row["unfinished"]) == (1, 2, 0, 0)
    assert not row["infeasible"] and collected.best["factor"].tolist() == [3]  # N is eligible, and chosen


@pytest.mark.parametrize("fold", [False, True])
def test_a_streaming_lanes_victims_run_again_in_its_slots(tmp_path, fold):
    """A streaming lane of 3 slots: t0 faults, t1 (SIGABRT) and t2 (an MPS client's CUDA error) die right after it;
    the lane records them as victims of t0 and its freed slots run them again, once; t3 runs as usual."""
    from gpupack.core.store.journal import RunRecords, read_folded
    from gpupack.job.lanes import run_lane

    run = RunDir(tmp_path / "run")
    flag = tmp_path / "fault"
    plan = make_plan(sweep="v", workload="tests.fake_workloads", grid={"tag": ["t0", "t1", "t2", "t3"]},
                     fixed={"steps": 1}, factors=[3], modes=["process"], partitions=["local"], repeats=1,
                     stream_jobs=1)
    data = plan.to_json()
    for t in data["packs"][0]["trainings"]:
        tag = t["params"]["tag"]
        if tag == "t0":
            t["params"]["fault"] = str(flag)
        elif tag in ("t1", "t2"):
            t["params"].update(die_after=str(flag), die_as="signal" if tag == "t1" else "cuda",
                               marker=str(tmp_path / f"{tag}.first"))
    write_json_atomic(run.plan, data)
    (lane,) = plan.packs
    rec = run_lane(str(run.root), lane.pack_id, PackSettings(device="cpu", fold=fold))
    ids = {t.params["tag"]: t.training_id for t in lane.trainings}
    records = RunRecords(run)
    latest = {tag: (records.training(lane.pack_id, tid) or {}).get("status") for tag, tid in ids.items()}
    assert latest == {"t0": "failed", "t1": "completed", "t2": "completed", "t3": "completed"}
    assert sorted(rec["training_ids"]) == sorted([ids["t0"], ids["t1"], ids["t1"], ids["t2"], ids["t2"], ids["t3"]])
    if fold:
        history = read_folded(run).trainings
        earlier = {tid: history[(lane.pack_id, tid)][0] for tid in (ids["t1"], ids["t2"])}
    else:
        earlier = {r["training_id"]: r for r in map(read_json, run.pack_dir(lane.pack_id).glob("attempts/*/*.json"))
                   if r.get("kind") == "training"}
    assert {tid: (r["status"], r["victim_of"]) for tid, r in earlier.items()} == {
        ids["t1"]: ("victim", ids["t0"]), ids["t2"]: ("victim", ids["t0"])}
