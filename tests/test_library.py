"""gpupack as a library (gpupack.sweep: prepare → run → status → collect, printing nothing) and the CLI's Hydra
habits (--cfg, --resolve, -p, --info, --help, and -m refused)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpupack import sweep
from gpupack.core.plan import make_plan
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import DONE, FAILED, PENDING, RUNNING
from gpupack.errors import ConfigError, RunDirError

REPO = Path(__file__).resolve().parent.parent
# packing.remeasure=0: what these tests count (packs run, results, progress) is the library's, not how a busy machine
# measured; under load from outside, a run that names no N would measure its rounds again
PROBE = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack", "sweep.grid.lr=[0.1]",
         "packing.remeasure=0"]


@pytest.mark.slow
def test_prepare_writes_nothing_and_run_returns_typed_results(tmp_path, capsys):
    run_dir = tmp_path / "run"
    prepared = sweep.prepare(PROBE + ["packing.factors=[1,2]", "packing.repeats=1", f"run_dir={run_dir}"])
    assert not run_dir.exists() and not prepared.resumes()
    assert sorted(p.factor for p in prepared.plan.packs) == [1, 1, 2]  # N=1 at its 1-thread set-up too (2 cores)
    seen: list[sweep.Opened] = []
    states: list[tuple[str, str]] = []
    outcome = sweep.run(prepared, on_open=seen.append, progress=lambda p, s: states.append((p.pack_id, s)),
                        plots=False)
    assert capsys.readouterr().out == ""  # the library prints nothing; the CLI does
    assert outcome.ok and [r.ok for r in outcome.results] == [True, True, True]
    assert seen[0].resumed is False and len(seen[0].todo) == 3
    assert {s for _, s in states} == {"pending", "running", "done"}
    assert set(outcome.collected.summary["factor"]) == {1, 2}
    assert (run_dir / "summary.json") in outcome.written

    st = sweep.status(run_dir)
    assert [p.state for p in st.packs] == [DONE, DONE, DONE] and st.counts()["local"][DONE] == 3

    again = sweep.run(sweep.prepare(PROBE + ["packing.factors=[1,2]", "packing.repeats=1", f"run_dir={run_dir}"]),
                      collect_outputs=False)
    assert again.opened.resumed and again.opened.complete == 3 and again.opened.todo == []


@pytest.mark.slow
def test_a_local_sweep_runs_as_one_lane_and_shows_each_pack_as_it_ends(tmp_path):
    """The local backend's whole packs run in one job on this CPU machine's one slot (one job start for the sweep, not
    one a pack: issues 30 and 31), in the plan's order; progress shows each pack running, then done, in turn, as its
    record appears, not all at the lane's end."""
    from gpupack.core.store.records import read_json

    run_dir = tmp_path / "run"
    prepared = sweep.prepare(PROBE + ["sweep.grid.lr=[0.1,0.2]", "packing.factors=[1,2]", f"run_dir={run_dir}"])
    states: list[tuple[str, str]] = []
    outcome = sweep.run(prepared, progress=lambda p, s: states.append((p.pack_id, s)), plots=False)
    ids = [p.pack_id for p in prepared.plan.packs]
    # N=1 twice (and twice at its 1-thread set-up), N=2, and the drift check at the end
    assert outcome.ok and len(ids) == 3 + 2 + 1
    assert states == [(i, PENDING) for i in ids] + [(i, s) for i in ids for s in (RUNNING, DONE)]
    assert len({read_json(run_dir / "packs" / i / "pack.json")["job_id"] for i in ids}) == 1
    assert len(list((run_dir / "submitit").glob("*_submitted.pkl"))) == 1  # one job


@pytest.mark.slow
def test_a_sweep_through_a_backend_that_runs_packs_in_this_process(tmp_path, monkeypatch):
    """The whole flow over tests/fakes.py's FakeSubmitter: asked its capacities once, each pack run through the real
    job body (run_pack) in this process, collected; then status and resume through the same backend."""
    from gpupack.core.store.records import read_json
    from tests.fakes import FakeConfig, use_fake_submitter

    made = use_fake_submitter(monkeypatch, config=FakeConfig(default_partitions=["cpu"]))
    run_dir = tmp_path / "run"
    overrides = PROBE + ["sweep.grid.lr=[0.1,0.2]", "packing.factors=[1,2]", "packing.device=cpu",
                         f"run_dir={run_dir}"]
    prepared = sweep.prepare(overrides)
    states: list[tuple[str, str]] = []
    outcome = sweep.run(prepared, progress=lambda p, s: states.append((p.pack_id, s)), plots=False)
    backend = made[0]
    assert backend.asked == [("cpu",)] and [p for p, _ in backend.ran] == [p.pack_id for p in prepared.plan.packs]
    # N=1 (at both set-ups: the fake cpu partition has 16 cores), N=2 and the drift check
    assert outcome.ok and [r.ok for r in outcome.results] == [True] * (3 + 2 + 1)
    assert states == [(p.pack_id, s) for p in prepared.plan.packs for s in ("pending", "running", "done")]
    for i, pack in enumerate(prepared.plan.packs, start=1):
        record = read_json(run_dir / "packs" / pack.pack_id / "pack.json")
        assert record["job_id"] == f"fake-{i}" and record["partition"] == "cpu"
        assert record["n_completed"] == pack.factor
    assert sorted(outcome.collected.summary["factor"]) == [1, 2]
    assert [p.state for p in sweep.status(run_dir).packs] == [DONE] * (3 + 2 + 1)
    again = sweep.run(sweep.prepare(overrides), collect_outputs=False)
    assert again.opened.resumed and again.opened.todo == [] and made[-1].ran == []


def test_prepare_refuses_bad_input_before_anything(tmp_path):
    with pytest.raises(ConfigError, match=r"packing.factors\[0\]=0"):
        sweep.prepare(PROBE + ["packing.factors=[0]", f"run_dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_dir_holding_another_plan_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    sweep.run(sweep.prepare(PROBE + ["packing.factors=[1]", "packing.repeats=1", f"run_dir={run_dir}"]),
              collect_outputs=False)
    other = sweep.prepare(PROBE + ["packing.factors=[2]", "packing.repeats=1", f"run_dir={run_dir}"])
    with pytest.raises(RunDirError, match="another sweep's plan"):
        sweep.run(other)


PLAN = make_plan(sweep="s", workload="w", grid={"lr": [0.1, 0.2]}, fixed={}, factors=[2], modes=["process"],
                 partitions=["p"], repeats=1)
PACK = PLAN.packs[0]


@pytest.mark.parametrize("done, has_record, job, states, expected", [
    (2, True, None, {}, DONE),  # records first: complete whatever the queue says
    (0, False, None, {}, "not submitted"),
    ((1, True), False, None, {}, "stopped"),  # began here (local), stopped mid-run before its pack record
    ((0, True), False, None, {}, "stopped"),
    ((1, True, True), False, None, {}, RUNNING),  # began here and a live packer holds its lock (local)
    ((0, False, False, True), False, None, {}, PENDING),  # not begun, while a live sweep holds the run (local)
    (0, True, None, {}, FAILED),  # ran here (local backend) and left trainings unfinished
    (0, False, "7", {"7": PENDING}, PENDING),
    ((1, True), False, "7", {"7": RUNNING}, RUNNING),
    (0, False, "7", {"7": RUNNING}, PENDING),  # its job is a lane of packs running another: its turn is to come
    ((1, True), True, "7", {"7": RUNNING}, FAILED),  # its lane went on to the next pack: this one ended failing
    (1, True, "7", {"7": DONE}, FAILED),  # the job ended, a training did not complete
    (0, False, "7", {"7": FAILED}, FAILED),
    (0, False, "7", {}, "submitted"),  # sacct does not know it yet
    (0, False, "7", None, "unknown"),  # the queue did not answer: say so, guess nothing
])
def test_pack_status_table(done, has_record, job, states, expected):
    done, started, held, sweep_held = (*done, False, False, False)[:4] if isinstance(done, tuple) else (
        done, False, False, False)
    assert sweep.pack_status(PACK, done, has_record, job, states, started=started, held=held,
                             sweep_held=sweep_held) == expected


def test_a_lock_is_held_here_while_a_process_of_this_host_holds_it(tmp_path):
    """status tells a running local pack from a stopped one by its lock, without taking it: held while a process holds
    the flock; not once it is released, nor by a holder that died and is not reaped yet (a zombie holds no lock: it
    read 'running' when the pid alone was asked)."""
    import subprocess
    import sys

    import psutil

    from gpupack.core.store.rundir import HeldLocks, RunLock
    from tests.conftest import wait_for

    run = RunDir(tmp_path)
    assert not HeldLocks().holds(run.lock)  # no lock file: nothing runs
    with RunLock(run):
        assert HeldLocks().holds(run.lock)
    assert not HeldLocks().holds(run.lock)  # released: its holder line stays, the lock does not
    hold = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('held', flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", hold, str(run.lock)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        assert HeldLocks().holds(run.lock)  # another live process of this host holds it (the line names this host)
        assert child.stdin is not None
        child.stdin.close()  # it ends, and stays a zombie until it is waited for
        assert wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, timeout_s=30)
        assert not HeldLocks().holds(run.lock)
    finally:
        child.wait()
    run.lock.write_text(run.lock.read_text().split()[0] + " another-host\n")
    with RunLock(run):  # held, but its line says another host: this host cannot tell, so not held here
        run.lock.write_text(f"{os.getpid()} another-host\n")
        assert not HeldLocks().holds(run.lock)
    # Without Linux's lock table: the pid the line names, alive or not
    no_table = tmp_path / "no-proc-locks"
    run.lock.write_text(f"{os.getpid()} {__import__('socket').gethostname()}\n")
    assert HeldLocks(no_table).holds(run.lock)
    run.lock.write_text(f"{child.pid} {__import__('socket').gethostname()}\n")
    assert not HeldLocks(no_table).holds(run.lock)


@pytest.mark.parametrize("holds, plan, expected", [
    ({}, None, False),  # new: an auto root is made
    ({"config.yaml": "packing:\n  factors: auto\n"}, None, True),  # an auto root resumed
    ({"config.yaml": "packing:\n  factors: [1, 2]\n"}, None, "holds another sweep"),
    ({"plan.json": "{}"}, None, "holds a sweep with fixed packing factors"),
    ({"notes.txt": "mine"}, None, "is not a gpupack run"),
    ({"notes.txt": "mine"}, PLAN, "is not a gpupack run"),
    ({}, PLAN, False),
])
def test_one_opener_of_a_run_directory_plain_or_auto(tmp_path, holds, plan, expected):
    """flow.run.open_run_dir opens a plain run's directory and a packing.factors=auto root alike (issue 29: two
    pieces of code did it)."""
    from gpupack.sweep.flow.run import open_run_dir

    run = RunDir(tmp_path / "run")
    for name, text in holds.items():
        (run.root / name).parent.mkdir(parents=True, exist_ok=True)
        (run.root / name).write_text(text)
    if isinstance(expected, str):
        with pytest.raises(RunDirError, match=expected):
            with open_run_dir(run, plan):
                pass
        assert not run.lock.exists()  # a folder of the user's own gets no lock file in it
    else:
        with open_run_dir(run, plan) as (resumed, _):
            assert resumed is expected and run.root.is_dir()


def test_a_local_lane_keeps_each_packs_time_limit_and_ignores_an_earlier_runs_pack_record(tmp_path):
    """A lane of k packs: each pack keeps cluster.timeout_min (its trainings are stopped past it where
    packing.training_timeout_s is unset; a user's own limit stands), so a hung pack ends alone; and a pack record
    left by an earlier run, even one naming the same job id (pids repeat), is not taken for this run's."""
    import time as clock
    from types import SimpleNamespace

    from gpupack.core.store.records import write_json_atomic
    from gpupack.core.types import PackSettings
    from gpupack.submit.local import LaneJob, LocalConfig, LocalSubmitter

    submitted: list[tuple] = []
    executor = SimpleNamespace(update_parameters=lambda **kw: submitted.append(("params", kw)),
                               submit=lambda *args: submitted.append(("submit", args)) or SimpleNamespace(job_id="77"))
    backend = LocalSubmitter(LocalConfig(timeout_min=5), RunDir(tmp_path / "run"))
    packs = [SimpleNamespace(pack_id=f"p{i}", devices=1, partition="local") for i in range(3)]
    for given, expected in ((None, 300.0), (42.0, 42.0)):
        submitted.clear()
        lane = backend._submit(executor, packs, [[]], PackSettings(device="cpu", training_timeout_s=given))
        settings = submitted[1][1][-1]
        assert settings.training_timeout_s == expected and settings.claim_until_s is None
        assert submitted[0][1]["timeout_min"] == 5 * 4 and lane.packs == packs
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.pack_record("p0"), {"job_id": "77", "started_at": clock.time() - 3600})  # an earlier run's
    seen: list[tuple[str, str]] = []
    lane = LaneJob(list(packs), [[]], SimpleNamespace(job_id="77"), submitted_at=clock.time())
    assert lane.look(run, lambda p, s: seen.append((p.pack_id, s))) == [] and seen == []
    write_json_atomic(run.pack_record("p0"), {"job_id": "77", "started_at": clock.time() + 1, "n_failed": 0})
    assert [r.pack_id for r in lane.look(run, lambda p, s: seen.append((p.pack_id, s)))] == ["p0"]
    assert seen == [("p0", DONE), ("p1", RUNNING)]


def test_a_local_jobs_end_is_seen_as_it_comes(tmp_path, monkeypatch):
    """The command waits on its jobs' controllers (their pidfds), not only on its looks: with a minute between two
    looks, a one-pack run ends in far less, its pack done."""
    import time

    from gpupack.core.waits import pidfd
    from gpupack.submit import local

    if pidfd(os.getpid()) is None:
        pytest.skip("no pidfd here (Linux 5.3 or later): a job's end is seen at the next look")
    monkeypatch.setattr(local, "POLL_S", 60.0)
    prepared = sweep.prepare(PROBE + ["packing.factors=[1]", "packing.repeats=1", f"run_dir={tmp_path / 'run'}"])
    began = time.monotonic()
    outcome = sweep.run(prepared, collect_outputs=False, plots=False)
    assert outcome.ok and [r.ok for r in outcome.results] == [True] * len(prepared.plan.packs)
    assert time.monotonic() - began < 45, "the command slept to its next look"
