"""A lane's journal (gpupack/core/store/journal.py, issue 30 item 3): a lane of packs folds each pack it ends into a few
files, and every reader (resume, status, collect, logs) sees the same records as from the packs' folders. A job killed
mid-fold loses no finished training and runs none twice."""
from __future__ import annotations

import json
import shutil
import threading

import pytest

from gpupack import sweep
from gpupack.core.plan import Plan, make_plan
from gpupack.core.store import journal, lane_columnar, locks
from gpupack.core.store import records as records_module
from gpupack.core.store.columnar import ColumnarReader
from gpupack.core.store.journal import RunRecords, append_records, fold_pack, kept_log, read_folded
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.turns import run_in_turn
from gpupack.results.analysis.load import load_records, with_stdout_metric

FOLD = PackSettings(device="cpu", fold=True)


def _run(tmp_path, packs=3, n=2, **fixed):
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload="tests.fake_workloads",
                     grid={"lr": [0.1 * (i + 1) for i in range(packs * n)]},
                     fixed={"steps": 2, "say": "score: {lr}", **fixed}, factors=[n], modes=["process"],
                     partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    (run.root / "config.yaml").write_text("cluster: {backend: local, name: local}\n")
    return run, plan


def _files(run):
    return sorted(str(p.relative_to(run.root)) for p in run.root.rglob("*"))


@pytest.mark.slow
def test_a_lane_folds_its_packs_into_a_journal_and_a_log_and_readers_see_the_same_records(tmp_path):
    run, plan = _run(tmp_path)
    ids = [p.pack_id for p in plan.packs]
    unfolded = RunDir(tmp_path / "copy")
    run_in_turn(str(run.root), ids, PackSettings(device="cpu"))  # the same lane, packs kept in their folders
    shutil.copytree(run.root, unfolded.root)
    for pack_id in ids:
        fold_pack(run, pack_id, lane=ids[0])
    assert _files(run) == ["config.yaml", "lanes", f"lanes/{ids[0]}.jsonl", f"lanes/{ids[0]}.log", "packs",
                           "plan.json"]  # packs/ left empty: other lanes may be making their packs' folders in it
    records = RunRecords(run)
    for p in plan.packs:  # resume and status read the same records from the journal
        assert records.pack(p.pack_id) is not None and records.started(p.pack_id)
        for t in p.trainings:
            rec = records.training(p.pack_id, t.training_id)
            assert records.completed(p.pack_id, t.training_id)
            before = read_json(unfolded.training_record(p.pack_id, t.training_id))
            assert {k: v for k, v in rec.items() if k != "logs"} == before
            assert kept_log(run.root, rec, "out").read() == unfolded.log(p.pack_id, t.training_id, "out").read_text()
    # collect: the same rows, column for column, whichever way the records are kept
    a, b = load_records([run.root]), load_records([unfolded.root])
    key = ["pack_id", "training_id"]
    cols = ["status", "wall_s", "started_at", "factor", "attempt", "val_accuracy"]
    assert a.trainings.sort_values(key)[key + cols].reset_index(drop=True).equals(
        b.trainings.sort_values(key)[key + cols].reset_index(drop=True))
    assert sorted(a.packs["pack_id"]) == sorted(b.packs["pack_id"]) and a.pending == b.pending == []
    # a metric read back from the kept stdout (collect --pattern) is the same from the lane's log
    m = with_stdout_metric(a, "score", r"score: ([0-9.]+)").trainings
    assert sorted(json.loads(x)["score"] for x in m["metrics"]) == sorted(r["lr"] for r in
                                                                          (t.params for p in plan.packs
                                                                           for t in p.trainings))


@pytest.mark.slow
def test_status_of_a_folded_run(tmp_path):
    run, plan = _run(tmp_path)
    run_in_turn(str(run.root), [p.pack_id for p in plan.packs], FOLD)
    assert not run.packs.exists() or not any(run.packs.iterdir())
    st = sweep.status(run.root)
    assert [p.state for p in st.packs] == ["done"] * 3 and st.trainings["local"]["completed"] == 6


@pytest.mark.slow
def test_a_failed_trainings_logs_are_kept_whole_in_a_file_of_their_own(tmp_path):
    run, plan = _run(tmp_path, packs=1, fail=True)
    pack = plan.packs[0]
    run_in_turn(str(run.root), [pack.pack_id], FOLD)
    rec = RunRecords(run).training(pack.pack_id, pack.trainings[0].training_id)
    assert rec["status"] == "failed" and rec["logs"]["err"]["file"].startswith(f"lanes/{pack.pack_id}.failed/")
    assert "probe failure on purpose" in kept_log(run.root, rec, "err").read()
    failed = run.root / rec["logs"]["err"]["file"]
    assert failed.is_file() and failed.stat().st_size == rec["logs"]["err"]["length"]


@pytest.mark.slow
def test_a_folded_pack_is_complete_and_a_requeued_lane_runs_nothing_twice(tmp_path):
    run, plan = _run(tmp_path)
    ids = [p.pack_id for p in plan.packs]
    run_in_turn(str(run.root), ids, FOLD)
    first = {(k, r[-1]["started_at"]) for k, r in read_folded(run).trainings.items()}
    again = run_in_turn(str(run.root), ids, FOLD)  # the lane requeued: every pack is complete in the journal
    assert sorted(again["records"]) == sorted(ids)
    folded = read_folded(run)
    assert {(k, r[-1]["started_at"]) for k, r in folded.trainings.items()} == first
    assert all(len(h) == 1 for h in folded.trainings.values())
    assert sweep.packs_to_run(run, Plan.from_json(read_json(run.plan))) == []


@pytest.mark.parametrize("output", [(False, False), (False, True)], ids=["neither has output", "the second has"])
@pytest.mark.slow
def test_two_gpus_folding_into_one_lane_at_once_lose_nothing(tmp_path, monkeypatch, output):
    """A job of 2 GPUs folds two packs into one lane at the same moment (the stop-36 CI failure): the first, with no
    output to keep, removes the empty log; the second must neither fail to remove it again nor write its output into
    the removed file. Both reach the lock before either holds it, and the first to ask holds it first."""
    run, plan = _run(tmp_path, packs=2, say="")
    ids = [p.pack_id for p in plan.packs]
    run_in_turn(str(run.root), ids, PackSettings(device="cpu"))  # run, not folded yet
    said = plan.packs[1].trainings[0].training_id
    if output[1]:
        run.log(ids[1], said, "out").write_text("score: 0.5\n")
    real_flock = locks.fcntl.flock
    both_waiting, first_done = threading.Barrier(2), threading.Event()

    def flock(fd, op):
        if op == locks.fcntl.LOCK_EX:
            both_waiting.wait(timeout=30)
            if threading.current_thread().name == "second":
                first_done.wait(timeout=30)
        real_flock(fd, op)
        if op == locks.fcntl.LOCK_UN and threading.current_thread().name == "first":
            first_done.set()
    monkeypatch.setattr(locks.fcntl, "flock", flock)
    errors = []

    def fold(pack_id):
        try:
            fold_pack(run, pack_id, lane=ids[0])
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)
    threads = [threading.Thread(target=fold, args=(i,), name=name) for i, name in zip(ids, ["first", "second"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and not any(run.pack_dir(i).exists() for i in ids)
    records = RunRecords(run)
    for p in plan.packs:
        for t in p.trainings:
            assert records.completed(p.pack_id, t.training_id)
    if output[1]:
        assert kept_log(run.root, records.training(ids[1], said), "out").read() == "score: 0.5\n"
    else:
        assert not run.lane_log(ids[0]).exists()  # nothing to keep: no empty file


class Killed(BaseException):
    """SIGKILL at a chosen point of a fold: nothing after it runs (not even a finally of gpupack's)."""


@pytest.mark.parametrize("where", ["mid-line", "before the folder is removed"])
@pytest.mark.slow
def test_a_lane_killed_mid_fold_loses_no_finished_training_and_runs_none_twice(tmp_path, monkeypatch, where):
    run, plan = _run(tmp_path)
    ids = [p.pack_id for p in plan.packs]
    run_in_turn(str(run.root), ids[:1], FOLD)  # the lane's first pack, folded
    real_rmtree = shutil.rmtree
    if where == "mid-line":
        real_open = open

        def torn_open(path, mode="r", *args, **kwargs):
            f = real_open(path, mode, *args, **kwargs)
            if str(path).endswith(".jsonl") and "a" in mode and run.pack_dir(ids[1]).joinpath("pack.json").exists():
                write = f.write

                def torn(text):
                    write(text[: len(text) // 2])
                    f.flush()
                    raise Killed
                f.write = torn
            return f
        monkeypatch.setattr("builtins.open", torn_open)
    else:
        def killed_rmtree(path, *a, **k):
            if str(path).endswith(ids[1]):  # the second pack's fold: its lines written and fsynced
                raise Killed
            real_rmtree(path, *a, **k)
        monkeypatch.setattr(journal.shutil, "rmtree", killed_rmtree)
    with pytest.raises(Killed):
        run_in_turn(str(run.root), ids, FOLD)  # requeued; killed while folding its second pack
    monkeypatch.undo()
    assert run.pack_dir(ids[1]).is_dir()  # the killed fold's pack keeps its folder: its records are there
    t = load_records([run.root]).trainings  # collect now, before any requeue: each finished training once
    assert len(t) == 4 and set(t["attempt"]) == {0}
    started = {t.training_id: read_json(run.training_record(ids[1], t.training_id))["started_at"]
               for t in plan.packs[1].trainings}
    run_in_turn(str(run.root), ids, FOLD)  # requeued again: ends the lane
    folded = read_folded(run)
    assert sorted(k for k in folded.trainings) == sorted((p.pack_id, t.training_id) for p in plan.packs
                                                          for t in p.trainings)
    assert all(len(h) == 1 and h[0]["status"] == "completed" for h in folded.trainings.values())  # each once
    assert {t: folded.trainings[(ids[1], t)][0]["started_at"] for t in started} == started  # not run again
    assert not run.pack_dir(ids[1]).exists() and real_rmtree is shutil.rmtree
    t = load_records([run.root]).trainings
    assert len(t) == 6 and set(t["attempt"]) == {0}


@pytest.mark.slow
def test_a_folded_pack_run_again_keeps_the_journals_records_as_earlier_attempts(tmp_path):
    """A resumed run runs a folded pack's failed trainings again, in a folder again: its new records are current,
    the journal's count as earlier attempts (nothing a user ran is lost)."""
    run, plan = _run(tmp_path, packs=1, fail=True)
    pack = plan.packs[0]
    run_in_turn(str(run.root), [pack.pack_id], FOLD)
    t = load_records([run.root]).trainings
    assert set(t["status"]) == {"failed"} and set(t["attempt"]) == {0} and len(t) == 2
    run_in_turn(str(run.root), [pack.pack_id], PackSettings(device="cpu"))  # not folded this time: a folder again
    t = load_records([run.root]).trainings
    assert len(t[t["attempt"] == 0]) == 2 and len(t[t["attempt"] > 0]) == 2
    current = RunRecords(run).training(pack.pack_id, pack.trainings[0].training_id)
    assert current == read_json(run.training_record(pack.pack_id, pack.trainings[0].training_id))


def test_specs_and_results_live_in_the_jobs_node_local_space_and_go_with_the_pack(tmp_path):
    """The shared filesystem holds no spec or result file per training: they are written in the job's own temporary
    space ($SLURM_TMPDIR on a cluster) and removed when the pack ends (issue 30, item 3)."""
    from gpupack.core.jobenv import JobEnvironment
    from gpupack.job.body import run_pack

    run, plan = _run(tmp_path, packs=1)
    node_local = tmp_path / "node-local"
    node_local.mkdir()
    pack = plan.packs[0]
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"),
                   job=JobEnvironment(job_id="3", tmp_dir=str(node_local)))
    assert rec["n_completed"] == 2
    assert not (run.pack_dir(pack.pack_id) / "work").exists()
    assert list(node_local.iterdir()) == []  # the pack's work folder went with it


@pytest.mark.slow
def test_the_memory_a_folded_run_measured_sizes_the_next_run(tmp_path):
    """Memory requests are sized from earlier records (core.memory.figures): those a lane folded count as those in
    folders, the sampler's per-training peaks from the folded pack records included."""
    from gpupack.core.memory.figures import find_measured, setting_key

    run, plan = _run(tmp_path)
    run_in_turn(str(run.root), [p.pack_id for p in plan.packs], FOLD)
    assert not any(run.packs.iterdir())  # every record is in the journal
    settings = {setting_key(t.params) for p in plan.packs for t in p.trainings}
    measured = find_measured([run.root], "tests.fake_workloads", settings, devices=["cpu"])  # run on this CPU
    assert measured.trainings == 6 and measured.host_mb is not None and measured.host_mb > 0


def test_a_folded_record_of_another_schema_is_skipped_with_a_warning_as_a_files_is(tmp_path):
    run, plan = _run(tmp_path, packs=1)
    run_in_turn(str(run.root), [plan.packs[0].pack_id], FOLD)
    journal_path = next(run.lanes.glob("*.jsonl"))
    lines = [json.loads(line) for line in journal_path.read_text().splitlines()]
    lines[0]["record"]["schema"] = 99  # a training record written by another gpupack
    journal_path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    records = load_records([run.root])
    assert len(records.trainings) == 1  # the other training, not the one of schema 99
    assert any("record schema 99" in w and str(run.lanes) in w for w in records.warnings), records.warnings


@pytest.mark.slow
def test_a_folded_packs_trainings_are_read_from_the_journal_without_an_open_each(tmp_path, monkeypatch):
    """status or resume of 100,000 folded trainings: one look at each pack's folder, not a failed open per training
    (a metadata request each on Lustre); a pack that has a folder again is read from it."""
    run, plan = _run(tmp_path)
    run_in_turn(str(run.root), [p.pack_id for p in plan.packs], FOLD)
    opened: list[str] = []
    real = records_module.read_json_or_none
    # every record the journal reads from a folder goes through read_training or read_pack
    monkeypatch.setattr(records_module, "read_json_or_none", lambda path: opened.append(str(path)) or real(path))
    records = RunRecords(run)
    assert all(records.completed(p.pack_id, t.training_id) for p in plan.packs for t in p.trainings)
    assert [o for o in opened if "/trainings/" in o] == []


def test_a_training_that_fails_twice_in_a_lane_keeps_each_failures_log(tmp_path):
    """A failed training's whole log is copied out when its record is folded; failing again in the same lane (a
    streaming lane's victim rerun, a resumed lane) copies the new log beside the first, and each record points at its
    own."""
    from gpupack.core.store.journal import fold_trainings
    from gpupack.core.store.records import SCHEMA_VERSION, write_json_atomic

    run = RunDir(tmp_path / "run")
    for attempt, text in enumerate(["first failure\n", "second failure\n"]):
        write_json_atomic(run.training_record("lane", "t"), {"kind": "training", "schema": SCHEMA_VERSION,
                                                            "training_id": "t", "pack_id": "lane", "status": "failed",
                                                            "started_at": float(attempt), "ended_at": attempt + 0.5})
        run.log("lane", "t", "err").parent.mkdir(parents=True, exist_ok=True)
        run.log("lane", "t", "err").write_text(text)
        fold_trainings(run, "lane", ["t"], "lane")
    first, second = read_folded(run).trainings[("lane", "t")]
    assert kept_log(run.root, first, "err").read() == "first failure\n"
    assert kept_log(run.root, second, "err").read() == "second failure\n"


def test_a_lane_reads_its_queues_journals_by_name_made_before_any_job(tmp_path):
    """The submitter makes each streaming lane's journal before any job starts; a lane then reads those by name (an
    open, which NFS's close-to-open keeps fresh), never another lane's journal it was not given, and a name with no
    journal yet is skipped."""
    from gpupack.core.store.journal import CompletedTail, append_records, make_journals

    run = RunDir(tmp_path / "run")
    make_journals(run, ["a", "b"])
    assert sorted(p.name for p in run.lanes.iterdir()) == ["a.jsonl", "b.jsonl"]
    tail = CompletedTail(run, ["a", "b", "c"])
    assert tail.refresh() == set()
    append_records(run, "a", [{"training_id": "t1", "pack_id": "a", "home": "h", "status": "completed"}])
    append_records(run, "x", [{"training_id": "t2", "pack_id": "x", "home": "h", "status": "completed"}])
    append_records(run, "b", [{"training_id": "t3", "pack_id": "b", "home": "h", "status": "failed"}])
    assert tail.refresh() == {("h", "t1")}  # x is not its queue's; t3 failed


@pytest.mark.slow
def test_a_lane_writes_its_journals_columnar_file_at_its_end_and_collect_reads_it_not_the_lines(tmp_path,
                                                                                                  monkeypatch):
    """A lane of packs that folds writes lanes/<lane>.arrows at its end (gpupack.core.store.lane_columnar): collect
    reads the records from it and parses only what its journal gained after it (here: an OOM amended after the job), and
    what it reads is what the journal says. A journal rewritten in place is read whole: the file is not used."""
    run, plan = _run(tmp_path)
    ids = [p.pack_id for p in plan.packs]
    run_in_turn(str(run.root), ids, FOLD)
    assert run.lane_columnar(ids[0]).is_file()
    covers = lane_columnar.read_lane_columnar(run, ids[0], ColumnarReader())
    assert covers is not None and covers.covers == run.journal(ids[0]).stat().st_size
    first = read_folded(run).trainings[(ids[0], plan.packs[0].trainings[0].training_id)][-1]
    append_records(run, ids[0], [{**first, "status": "oom", "error": "out of memory (SLURM)"}])
    starts: list[int] = []
    real = lane_columnar.journal_entries
    monkeypatch.setattr(lane_columnar, "journal_entries",
                        lambda path, start=0: starts.append(start) or real(path, start))
    from_file = load_records([run.root])
    assert starts == [covers.covers]  # the lines after what the file covers, alone
    from_json = load_records([run.root], columnar=False)
    for a, b, by in ((from_file.trainings, from_json.trainings, ["training_id", "attempt"]),
                     (from_file.packs, from_json.packs, ["pack_id", "attempt"])):
        assert a.sort_values(by).reset_index(drop=True).equals(b.sort_values(by).reset_index(drop=True)[a.columns])
    latest = from_file.latest().set_index("training_id")
    assert latest.loc[first["training_id"], "status"] == "oom" and len(from_file.trainings) == 7  # the first record
    path = run.journal(ids[0])  # of the amended one: an earlier attempt. Now rewritten in place, its length kept:
    path.write_text(path.read_text().replace('"status": "completed"', '"status": "COMPLETED"', 1))
    starts.clear()
    rewritten = load_records([run.root])
    assert starts == [0] and (rewritten.trainings["status"] == "COMPLETED").sum() == 1  # read whole, as it is now


def _tear_last_line(path) -> bytes:
    """Cut a journal's last line in the middle, as a writer killed mid-append leaves it; the torn bytes."""
    data = path.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    cut = start + (len(data) - start) // 2
    path.write_bytes(data[:cut])
    return data[start:cut]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.slow
def test_a_torn_last_line_is_cut_back_kept_aside_and_the_pack_s_record_rebuilt(tmp_path, stream):
    from gpupack.job.lanes import run_lane
    from gpupack.sweep.flow.collect import collect
    from gpupack.sweep.flow.run import packs_to_run

    if stream:  # one streaming lane of 2 slots, its trainings folded as each ends, its own record last
        run = RunDir(tmp_path / "run")
        plan = make_plan(sweep="t", workload="tests.fake_workloads", grid={"lr": [0.1 * (i + 1) for i in range(4)]},
                         fixed={"steps": 2}, factors=[2], modes=["process"], partitions=["local"], repeats=1,
                         stream_jobs=1)
        write_json_atomic(run.plan, plan.to_json())
        (run.root / "config.yaml").write_text("cluster: {backend: local, name: local}\n")
    else:  # one lane of one whole pack of 2
        run, plan = _run(tmp_path, packs=1)
    (pack,) = plan.packs

    def go():
        return run_lane(str(run.root), pack.pack_id, FOLD) if stream else run_in_turn(str(run.root), [pack.pack_id],
                                                                                      FOLD)

    go()
    ran = {k: h[0]["started_at"] for k, h in read_folded(run).trainings.items()}
    torn = _tear_last_line(run.journal(pack.pack_id))
    assert torn.startswith(b'{"kind": "pack"')  # the pack's own line
    # Readers skip the torn line and say nothing untrue: the pack has no record, so it is not complete
    assert RunRecords(run).pack(pack.pack_id) is None
    assert load_records([run.root]).pending == [f"{run.root}:{pack.pack_id}"]
    assert [p.state for p in sweep.status(run.root).packs] == ["stopped"]  # resume it (not done, not failed)
    assert packs_to_run(run, plan) == [pack]
    go()  # the resume: the lane's writer repairs its journal, the pack's record is rebuilt, nothing runs again
    data = run.journal(pack.pack_id).read_bytes()
    assert data.endswith(b"\n") and all(json.loads(line) for line in data.splitlines())  # whole lines only
    assert run.torn_lines(pack.pack_id).read_bytes() == torn + b"\n"  # the torn bytes, kept
    assert {k: h[0]["started_at"] for k, h in read_folded(run).trainings.items()} == ran  # none ran again
    assert all(len(h) == 1 for h in read_folded(run).trainings.values())
    rec = RunRecords(run).pack(pack.pack_id)
    assert rec is not None and "rebuilt" in rec and sorted(rec["training_ids"]) == sorted(tid for _, tid in ran)
    assert rec["complete"] is (not stream)  # N trainings that ran together: a timing again
    assert packs_to_run(run, plan) == [] and [p.state for p in sweep.status(run.root).packs] == ["done"]
    collected, _ = collect([run.root], plots=False)
    assert collected.records.pending == [] and list(collected.summary["factor"]) == [2]  # the per-N table is back
    if not stream:
        assert list(collected.summary["packs"]) == [1]
    else:
        assert int(collected.summary["lanes"].iloc[0]) == 1
