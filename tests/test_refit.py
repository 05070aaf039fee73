"""A pack skipped for memory has its trainings run at the largest N that fits (issue 32, item 4): the pure rule that
picks that N, the refit packs' names, the plan's smaller N that makes a refit needless, and a production run (one N)
whose trainings all run, recorded at the N they ran at, resumed without running them again, and shown by status as
skipped for memory, not failed. No verdict depends on how fast anything ran."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gpupack import sweep
from gpupack.cli import main
from gpupack.core.memory.figures import Figure
from gpupack.core.memory.pack_fit import Budget, largest_fit
from gpupack.core.plan import Pack, Training, make_plan, refit_pack_id, refit_packs, refit_parent, run_at_smaller_n
from gpupack.core.store.records import SKIPPED_MEMORY
from gpupack.sweep.flow.status import SKIPPED, pack_status, training_state

REPO = Path(__file__).resolve().parent.parent
GB = 1024.0


def _mb(mb: float) -> Figure:
    return Figure(mb, "the peak of 1 training(s) of its setting in this run", measured=True)


# ---------------- the rule: the largest N that fits ----------------

@pytest.mark.parametrize("peaks, budget, n, words", [
    ([_mb(200)] * 5, Budget(500, "packing.host_memory_mb=500"), 2, "N=2 needs 2 x 200 MB = 400 MB <="),
    ([_mb(12.6 * GB)] * 4, Budget(0.8 * 24 * GB, "0.8 x 24.0 GB host memory"), 1, "no pack of 2 of them fits"),
    ([_mb(3 * GB)] * 8, Budget(0.8 * 24 * GB, "0.8 x 24.0 GB host memory"), 6, "N=6 needs 6 x 3.0 GB = 18.0 GB <="),
    # mixed settings: the N largest must fit, so any pack of N dealt from them does (here 5 + 4 > 8; 4 + 3 + 1 <= 8)
    ([_mb(5 * GB), _mb(4 * GB), _mb(1 * GB), _mb(3 * GB)], Budget(8 * GB, "8 GB"), 1, "no pack of 2"),
    ([_mb(4 * GB), _mb(1 * GB), _mb(1 * GB), _mb(3 * GB), _mb(1 * GB)], Budget(8 * GB, "8 GB"), 3,
     "N=3 needs 1 x 4.0 GB + 1 x 3.0 GB + 1 x 1.0 GB = 8.0 GB <="),
    # what is not known counts as nothing, as in pack_fit
    ([_mb(300), None, None, _mb(100)], Budget(500, "packing.host_memory_mb=500"), 3, "1 training(s) not known"),
    ([_mb(300), None, None, _mb(300)], Budget(500, "packing.host_memory_mb=500"), 1, "600 MB >"),  # both may meet
    # never the N that was skipped: below the number of trainings
    ([_mb(100)] * 3, Budget(1000, "1000 MB"), 2, "N=2 needs"),
    ([_mb(900)], Budget(500, "500 MB"), 1, "one training at a time"),
], ids=["equal", "none-of-2", "six", "largest-decide", "mixed-3", "unknown", "two-known", "below-skipped",
        "alone"])
def test_the_largest_n_that_fits(peaks, budget, n, words):
    refit = largest_fit(peaks, budget)
    assert refit.n == n and words in refit.why, refit


def test_the_largest_n_is_capped_below_the_skipped_packs_n_not_below_what_is_left():
    """What is left of a pack of 5 (2 trainings, the rest ran elsewhere) may run as a pack of 2: the job caps the refit
    at the skipped N less one (job.body passes most), not at what is left less one."""
    assert largest_fit([_mb(200)] * 2, Budget(500, "packing.host_memory_mb=500"), most=4).n == 2
    assert largest_fit([_mb(200)] * 4, Budget(1000, "1000 MB"), most=3).n == 3


def _trainings(k: int) -> tuple[Training, ...]:
    return tuple(Training(f"w-{i}", "w", {"i": i}, grid_index=i) for i in range(k))


@pytest.mark.parametrize("todo, n, expected", [
    (range(5), 2, [("p.n02-000", 2, [0, 1]), ("p.n02-002", 2, [2, 3]), ("p.n01-004", 1, [4])]),
    (range(8), 4, [("p.n04-000", 4, [0, 1, 2, 3]), ("p.n04-004", 4, [4, 5, 6, 7])]),
    # a resume: what is left, in the pack's order, named from the position of each refit pack's first training
    ([6, 1, 3], 2, [("p.n02-001", 2, [1, 3]), ("p.n01-006", 1, [6])]),
    (range(3), 1, [("p.n01-000", 1, [0]), ("p.n01-001", 1, [1]), ("p.n01-002", 1, [2])]),
])
def test_refit_packs_hold_what_they_run_and_their_n_is_what_ran_together(todo, n, expected):
    pack = Pack("p", "local", "process", 8, 0, _trainings(8))
    got = refit_packs(pack, [pack.trainings[i] for i in todo], n)
    assert [(p.pack_id, p.factor, [int(t.params["i"]) for t in p.trainings]) for p in got] == expected
    assert all(refit_parent(p.pack_id) == "p" and (p.partition, p.mode) == ("local", "process") for p in got)


@pytest.mark.parametrize("pack_id, parent", [
    (refit_pack_id("gpu-process-n08-003", 3, 6), "gpu-process-n08-003"),
    ("gpu-process-n08-003", None),  # a plan's packs are never refits, whatever their partition's name
    ("gpu.a100-process-n08-003", None),
    ("gpu.n02-process-n08-003", None),
    ("gpu-process-n08-s001", None),
    ("gpu-ddp-gloo-k02-000", None),
])
def test_a_refit_pack_is_known_by_its_name_alone(pack_id, parent):
    assert refit_parent(pack_id) == parent


@pytest.mark.parametrize("factors, skipped_n, covered", [
    ([1, 2, 4], 4, 4),  # a measurement sweep: every point of N=4 runs at N=1 and N=2 too
    ([2, 4], 4, 4),
    ([4], 4, 0),  # a production run at one N: nothing runs them elsewhere
    ([1, 4], 1, 0),  # nothing below N=1
])
def test_a_refit_is_needless_where_the_plan_runs_the_points_at_a_smaller_n(factors, skipped_n, covered):
    plan = make_plan(sweep="s", workload="w", grid={"lr": [0.1, 0.2]}, fixed={}, factors=factors,
                     modes=["process"], partitions=["local"], repeats=1)
    pack = next(p for p in plan.packs if p.factor == skipped_n)
    assert len(run_at_smaller_n(plan, pack)) == min(covered, len(pack.trainings))


# ---------------- status: skipped for memory is not failed ----------------

def test_a_skipped_training_is_counted_apart_from_failed():
    assert training_state({"status": SKIPPED_MEMORY}, False, "done") == "skipped for memory"
    pack = Pack("p", "local", "process", 4, 0, _trainings(4))
    assert pack_status(pack, 0, True, None, None, started=True, skipped=4) == SKIPPED
    assert pack_status(pack, 2, True, None, None, started=True, skipped=2) == SKIPPED
    assert pack_status(pack, 1, True, None, None, started=True, skipped=2) == "failed"  # one failed too


# ---------------- a production run at one N: every training runs ----------------

def _production(run_dir: Path, *extra: str) -> list[str]:
    """Five trainings that each hold 200 MB of host memory, planned at N=5 only, stated at 200 MB, under 500 MB."""
    return [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack", "sweep.grid.lr=[0.1]",
            "+sweep.grid.seed=[0,1,2,3,4]", "sweep.fixed.steps=1", "sweep.fixed.sleep_s=0", "+sweep.fixed.hold_mb=200",
            "packing.factors=[5]", "packing.repeats=1", "packing.host_memory_mb=500", "sweep.training_memory_mb=200",
            f"run_dir={run_dir}", *extra]


def _records(run_dir: Path, kind: str) -> dict[str, dict]:
    name = "pack.json" if kind == "pack" else "trainings/*.json"
    return {str(p.relative_to(run_dir)): json.loads(p.read_text()) for p in run_dir.glob(f"packs/*/{name}")}


@pytest.mark.slow
def test_a_skipped_packs_trainings_run_at_the_largest_n_that_fits_and_are_not_run_again(tmp_path, capsys):
    run_dir = tmp_path / "run"
    outcome = sweep.run(sweep.prepare(_production(run_dir)), plots=False)
    assert outcome.ok
    packs = _records(run_dir, "pack")
    parent = packs["packs/local-process-n05-000/pack.json"]
    assert parent["skipped_memory"].startswith("N=5 needs 5 x 200 MB") and parent["refit"]["n"] == 2
    refits = {p["pack_id"]: p for p in packs.values() if p.get("refit_of") == "local-process-n05-000"}
    assert sorted(refits) == sorted(parent["refit"]["packs"]) == [
        "local-process-n05-000.n01-004", "local-process-n05-000.n02-000", "local-process-n05-000.n02-002"]
    # each refit pack is a real pack at the N its trainings ran at together: its timing is that N's
    assert {pid: (p["factor"], len(p["training_ids"]), p["complete"]) for pid, p in refits.items()} == {
        "local-process-n05-000.n02-000": (2, 2, True), "local-process-n05-000.n02-002": (2, 2, True),
        "local-process-n05-000.n01-004": (1, 1, True)}
    trainings = _records(run_dir, "training")
    ran = Counter((r["factor"], r["status"]) for r in trainings.values())
    assert ran == Counter({(5, SKIPPED_MEMORY): 5, (2, "completed"): 4, (1, "completed"): 1})
    assert {r["training_id"] for r in trainings.values() if r["status"] == "completed"} == \
        {r["training_id"] for r in trainings.values() if r["status"] == SKIPPED_MEMORY}  # each ran once, none lost
    assert all(r["runs_in"] in refits for r in trainings.values() if r["status"] == SKIPPED_MEMORY)
    # collect: N=5 infeasible (skipped, with its reason), the refit N timed, nothing unfinished
    summary = outcome.collected.summary.set_index("factor")
    assert summary.loc[5, "skipped_memory"] == 5 and summary.loc[5, "infeasible"]
    assert summary.loc[5, "skipped_refit"] == 5  # ... and ran at N=2 and 1, counted in those rows too: said so
    from gpupack.results.report.terminal import skipped_lines

    (line,) = skipped_lines(outcome.collected.summary)
    assert line.endswith("; 5 of them went on at the largest N that fits instead (its row)"), line
    assert summary.loc[2, "trainings"] == 4 and summary.loc[2, "packs"] == 2 and summary["unfinished"].sum() == 0
    # status: every training completed, the pack done, saying where its trainings ran
    st = sweep.status(run_dir)
    assert st.trainings == {"local": Counter(completed=5)}
    (p,) = st.packs
    assert p.state == "done" and p.why == parent["skipped_memory"] and "run at N=2 in 3 pack(s)" in (p.refit or "")
    # a resume finds every training ran, runs none again and overwrites nothing
    before = {k: v["ended_at"] for k, v in trainings.items()}
    again = sweep.run(sweep.prepare(_production(run_dir)), plots=False)
    assert again.ok and again.opened.todo == []
    assert {k: v["ended_at"] for k, v in _records(run_dir, "training").items()} == before
    capsys.readouterr()
    assert main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "local: trainings completed 5, failed 0" in out and "skipped for memory: N=5 needs" in out


@pytest.mark.slow
def test_a_resume_runs_only_what_an_earlier_refit_left(tmp_path):
    """A refit cut off after its first pack: the resume runs the rest, not what completed."""
    run_dir = tmp_path / "run"
    assert sweep.run(sweep.prepare(_production(run_dir)), plots=False).ok
    cut = run_dir / "packs" / "local-process-n05-000.n02-002"
    for path in cut.rglob("*.json"):  # as if the job had been killed before this refit pack ran
        path.unlink()
    ran = {k: v["ended_at"] for k, v in _records(run_dir, "training").items() if v["status"] == "completed"}
    again = sweep.run(sweep.prepare(_production(run_dir)), plots=False)
    assert again.ok and [p.pack_id for p in again.opened.todo] == ["local-process-n05-000"]
    now = {k: v for k, v in _records(run_dir, "training").items() if v["status"] == "completed"}
    assert {k: now[k]["ended_at"] for k in ran} == ran  # what completed before is neither run again nor overwritten
    new = [v for k, v in now.items() if k not in ran]
    assert len(new) == 2 and {r["pack_id"] for r in new} == {"local-process-n05-000.n02-002"}
    assert {r["factor"] for r in new} == {2}
    # the two skipped records of the first attempt are kept as an earlier attempt, the others stay current
    assert len(list((run_dir / "packs" / "local-process-n05-000" / "attempts").rglob("tests.*.json"))) == 2


@pytest.mark.slow
def test_a_measurement_sweep_refits_nothing_its_smaller_n_runs(tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack", "sweep.grid.lr=[0.1]",
                 "+sweep.grid.seed=[0,1,2,3]", "sweep.fixed.steps=1", "sweep.fixed.sleep_s=0",
                 "+sweep.fixed.hold_mb=200", "packing.factors=[4,2,1]", "packing.repeats=1",
                 "packing.host_memory_mb=500", f"run_dir={run_dir}"]
    assert sweep.run(sweep.prepare(overrides), plots=False).ok
    packs = _records(run_dir, "pack")
    (skipped,) = [p for p in packs.values() if p.get("skipped_memory")]
    assert skipped["refit"] == {"n": None, "packs": [],
                                "why": "its 4 training(s)' grid points run at a smaller N in this plan"}
    assert not any(p.get("refit_of") for p in packs.values())
    from gpupack.results.report.terminal import skipped_lines
    from gpupack.sweep.flow.collect import collect

    (line,) = skipped_lines(collect([run_dir], plots=False)[0].summary)
    assert line.startswith("N=4 skipped for memory") and "instead" not in line  # its points ran at N=1 and 2 anyway
    st = sweep.status(run_dir)
    # N=1 (and its 1-thread set-up), N=2, the drift check at the end; N=4 skipped
    assert st.trainings == {"local": Counter({"completed": 4 + 4 + 4 + 1, "skipped for memory": 4})}
    assert [p.state for p in st.packs if p.why] == [SKIPPED]
    capsys.readouterr()
    assert main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "failed 0" in out and "skipped for memory 4" in out
    assert "skipped for memory (4/4 trainings not started, 0 done): N=4 needs 4 x 2" in out


@pytest.mark.slow
def test_an_oom_slurm_reports_after_the_job_reaches_the_refit_packs_it_ran(tmp_path):
    """SLURM tells of an out-of-memory kill after the job: the trainings the job ran in refit packs (their plan pack
    skipped for memory) are its too. One SIGKILLed in a refit pack becomes oom, one left with no record gets an oom
    record there, at the refit's N, and the skipped plan pack's records stay as they are."""
    from gpupack.core.plan import Plan
    from gpupack.core.store.journal import RunRecords
    from gpupack.core.store.records import read_json, write_json_atomic
    from gpupack.core.store.rundir import RunDir
    from gpupack.job.oom import record_job_oom, refits_of

    run_dir = tmp_path / "run"
    assert sweep.run(sweep.prepare(_production(run_dir)), plots=False).ok
    run = RunDir(run_dir)
    parent = Plan.from_json(read_json(run.plan)).pack("local-process-n05-000")
    refits = refits_of(parent, RunRecords(run))
    assert [(p.pack_id, p.factor, len(p.trainings)) for p in refits] == [
        ("local-process-n05-000.n02-000", 2, 2), ("local-process-n05-000.n02-002", 2, 2),
        ("local-process-n05-000.n01-004", 1, 1)]
    killed, lost = refits[1].trainings
    since = min(read_json(run.training_record(refits[1].pack_id, t.training_id))["started_at"]
                for t in refits[1].trainings)
    path = run.training_record(refits[1].pack_id, killed.training_id)
    write_json_atomic(path, {**read_json(path), "status": "killed", "signal": 9, "error": "killed by signal 9"})
    run.training_record(refits[1].pack_id, lost.training_id).unlink()
    skipped = {p: p.read_bytes() for p in (run_dir / "packs" / parent.pack_id).rglob("*.json")}
    assert record_job_oom(run, parent.pack_id, since, "SLURM: job 7 ran out of memory") == []
    got = read_json(path)
    assert got["status"] == "oom" and "SLURM: job 7 ran out of memory" in got["error"]
    made = read_json(run.training_record(refits[1].pack_id, lost.training_id))
    assert made["status"] == "oom" and made["factor"] == 2 and made["refit_of"] == parent.pack_id
    assert skipped == {p: p.read_bytes() for p in (run_dir / "packs" / parent.pack_id).rglob("*.json")}


@pytest.mark.slow
def test_a_training_two_refit_packs_ran_counts_its_latest_record_as_current(tmp_path):
    """A resume that refits what an earlier refit left at another N leaves the training's record in two refit packs
    (folded into a lane's journal, the earlier one is not moved aside): collect counts the latest as current and the
    other as an earlier attempt, so the N it failed at shows a failed attempt, not an unfinished training."""
    from gpupack.core.store.records import read_json, write_json_atomic
    from gpupack.core.store.rundir import RunDir
    from gpupack.results.analysis.load import load_records
    from gpupack.results.analysis.summary import summarize

    run_dir = tmp_path / "run"
    assert sweep.run(sweep.prepare(_production(run_dir)), plots=False).ok
    run = RunDir(run_dir)
    first, again = "local-process-n05-000.n02-002", "local-process-n05-000.n01-003"
    (tid,) = [p.stem for p in run.trainings(first).glob("*.json")][:1]
    old = read_json(run.training_record(first, tid))
    write_json_atomic(run.training_record(first, tid), {**old, "status": "failed", "error": "boom"})
    write_json_atomic(run.training_record(again, tid), {**old, "pack_id": again, "factor": 1, "concurrent": 1,
                                                        "started_at": old["started_at"] + 100.0,
                                                        "ended_at": old["ended_at"] + 100.0})
    records = load_records([run_dir])
    mine = records.trainings[(records.trainings["training_id"] == tid) & records.trainings["refit_of"].notna()]
    assert dict(zip(mine["pack_id"], mine["attempt"])) == {again: 0, first: 1}
    assert len(records.latest()[records.latest()["training_id"] == tid].query("status != 'skipped_memory'")) == 1
    summary = summarize(records.trainings, records.packs).set_index("factor")
    assert summary["unfinished"].sum() == 0 and summary.loc[2, "failed"] == 1  # failed once at N=2, then ran at N=1


@pytest.mark.slow
def test_while_its_job_runs_the_refits_a_skipped_pack_is_running_not_failed(tmp_path):
    """The skipped pack's record is written before its refit packs run: while the job (holding the pack's lock) runs
    them, status says running, its trainings running or waiting, and the run not ended; cut off (no lock), stopped, to
    resume."""
    import shutil

    from gpupack.core.store.rundir import RunDir
    from gpupack.job.body import pack_lock
    from gpupack.sweep.flow.status import RUNNING, STOPPED

    run_dir = tmp_path / "run"
    assert sweep.run(sweep.prepare(_production(run_dir)), plots=False).ok
    for name in ("local-process-n05-000.n02-002", "local-process-n05-000.n01-004"):  # not recorded yet
        shutil.rmtree(run_dir / "packs" / name)
    with pack_lock(RunDir(run_dir), "local-process-n05-000"):
        st = sweep.status(run_dir)
        assert [p.state for p in st.packs] == [RUNNING]
        assert st.trainings == {"local": Counter(completed=2, waiting=3)} and st.ended_at is None
    assert [p.state for p in sweep.status(run_dir).packs] == [STOPPED]


@pytest.mark.slow
def test_refits_of_finds_the_packs_a_resume_refit_at_another_n(tmp_path):
    """A refit cut off, resumed with a larger share: the rest runs at N=3 (.n03-002), and refits_of (what SLURM's late
    OOM is written onto) finds that pack by the name the skipped pack's record gives it, with the trainings whose
    records say it runs them, not by dealing them again."""
    import shutil

    from gpupack.core.plan import Plan
    from gpupack.core.store.journal import RunRecords
    from gpupack.core.store.records import read_json
    from gpupack.core.store.rundir import RunDir
    from gpupack.job.oom import refits_of

    run_dir = tmp_path / "run"
    assert sweep.run(sweep.prepare(_production(run_dir)), plots=False).ok
    for path in (run_dir / "packs" / "local-process-n05-000.n02-002").rglob("*.json"):
        path.unlink()
    shutil.rmtree(run_dir / "packs" / "local-process-n05-000.n01-004")
    assert sweep.run(sweep.prepare(_production(run_dir, "packing.host_memory_mb=700")), plots=False).ok
    run = RunDir(run_dir)
    said = read_json(run.pack_record("local-process-n05-000"))["refit"]
    assert said["n"] == 3 and said["packs"] == ["local-process-n05-000.n03-002"]
    (st,) = sweep.status(run_dir).packs  # where they run now, not the earlier attempt's refit folders too
    assert st.refit == "its trainings run at N=3 in 1 pack(s) (local-process-n05-000.n03-002)"
    parent = Plan.from_json(read_json(run.plan)).pack("local-process-n05-000")
    (refit,) = refits_of(parent, RunRecords(run))
    assert (refit.pack_id, refit.factor) == ("local-process-n05-000.n03-002", 3)
    assert [t.training_id for t in refit.trainings] == [t.training_id for t in parent.trainings[2:]]
    assert {r["training_id"] for r in _records(run_dir, "training").values()
            if r.get("pack_id") == refit.pack_id and r["status"] == "completed"} == \
        {t.training_id for t in refit.trainings}


@pytest.mark.slow
def test_a_probe_step_refits_nothing_its_climb_ends_at_the_skipped_n(tmp_path):
    """packing.factors=auto: a probe step whose pack does not fit is skipped and ends the climb there; its points are
    not run at another N inside the probe (the grid runs at the best N after it)."""
    run_dir = tmp_path / "run"
    overrides = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack",
                 "sweep.grid.lr=[0.1,0.2,0.3]", "+sweep.grid.seed=[0]", "sweep.fixed.steps=1", "sweep.fixed.sleep_s=0",
                 "+sweep.fixed.hold_mb=200", "packing.factors=auto", "packing.auto.ladder=[1,3]",
                 "packing.auto.repeats=2", "packing.host_memory_mb=500", "sweep.training_memory_mb=200",
                 "packing.then=stop", f"run_dir={run_dir}"]
    outcome = sweep.run(sweep.prepare(overrides), plots=False)
    assert "N=3 was skipped for memory" in outcome.auto.stopped["local"]
    step = run_dir / "probe" / "n03" / "packs"
    skipped = [json.loads(p.read_text()) for p in step.glob("*/pack.json") if "skipped_memory" in p.read_text()]
    assert len(skipped) == 2  # both packs of N=3 (packing.auto.repeats=2)
    assert all(s["refit"] == {"n": None, "packs": [], "why": "a probe step: its climb ends at the skipped N"}
               for s in skipped)
    assert not [p for p in step.iterdir() if ".n0" in p.name]  # no refit pack


@pytest.mark.slow
def test_only_a_training_skipped_for_memory_looks_for_a_refit_pack(tmp_path, monkeypatch):
    """Whether a training ran (resume) or where it stands (status) looks through the run's refit packs (every pack's
    folder listed) only for a training skipped for memory: a pack's job in a run of thousands of packs, which asks
    of each of its trainings, lists nothing."""
    from gpupack.core.plan import Plan
    from gpupack.core.store.journal import RunRecords
    from gpupack.core.store.records import read_json
    from gpupack.core.store.rundir import RunDir

    run_dir = tmp_path / "run"
    assert sweep.run(sweep.prepare(_production(run_dir)), plots=False).ok
    run = RunDir(run_dir)
    parent = Plan.from_json(read_json(run.plan)).pack("local-process-n05-000")
    listed = []
    real = RunDir.pack_dirs
    monkeypatch.setattr(RunDir, "pack_dirs", lambda self: listed.append(1) or real(self))
    records = RunRecords(run)
    assert not records.ran("local-process-n05-999", "w-0") and records.current("local-process-n05-999", "w-0") is None
    assert listed == []  # no record, not skipped: nothing listed
    assert all(records.ran(parent.pack_id, t.training_id) for t in parent.trainings) and listed == [1]  # once
