"""`status` counts trainings as a progress bar would: completed, failed, running and waiting per partition, the time
so far and what is left at that rate (issue 28)."""
from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from gpupack import sweep
from gpupack.cli import main
from gpupack.core.store.records import read_json
from gpupack.core.store.rundir import RunDir, RunLock
from gpupack.core.types import PENDING, RUNNING
from gpupack.sweep.flow.status import RunStatus, eta_s, training_state

REPO = Path(__file__).resolve().parent.parent
PROBE = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack"]


@pytest.mark.parametrize("record, started, pack_state, expected", [
    ({"status": "completed"}, True, "done", "completed"),
    ({"status": "failed"}, True, RUNNING, "failed"),
    ({"status": "oom"}, True, "failed", "failed"),
    ({"status": "timeout"}, True, RUNNING, "failed"),
    (None, True, RUNNING, "running"),
    (None, False, RUNNING, "waiting"),  # a slot of the pack has not taken it yet
    (None, True, "stopped", "waiting"),  # a log of an earlier attempt: not running now
    (None, False, PENDING, "waiting"),
])
def test_training_state_table(record, started, pack_state, expected):
    assert training_state(record, started, pack_state) == expected


@pytest.mark.parametrize("elapsed, ended, left, expected", [
    (100.0, 4, 4, 100.0), (100.0, 1, 3, 300.0), (100.0, 0, 3, None), (None, 0, 3, None), (100.0, 4, 0, 0.0)])
def test_eta_is_elapsed_over_ended_times_left(elapsed, ended, left, expected):
    assert eta_s(elapsed, ended, left) == expected


def test_left_counts_every_partition():
    st = RunStatus(Path("."), "s", [], trainings={"a": Counter(completed=2, running=1), "b": Counter(failed=1,
                                                                                                      waiting=2)},
                   started_at=1000.0)
    assert st.elapsed_s(now=1030.0) == 30.0 and st.left_s(now=1030.0) == pytest.approx(30.0 / 3 * 3)


@pytest.mark.slow
def test_status_of_a_finished_run_with_a_failure_and_of_one_resumed_halfway(tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = PROBE + ["sweep.grid.lr=[0.1,0.2]", "sweep.grid.fail=[false,true]", "packing.factors=[2]",
                         "packing.repeats=1", f"run_dir={run_dir}"]
    sweep.run(sweep.prepare(overrides), collect_outputs=False, plots=False)
    st = sweep.status(run_dir)
    assert st.trainings == {"local": Counter(completed=2, failed=2)}
    assert st.started_at is not None and st.ended_at is not None and st.ended_at > st.started_at
    assert st.left_s(now=st.ended_at + 999) == 0.0
    assert main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "4 trainings in 2 packs" in out and "local: trainings completed 2, failed 2, running 0, waiting 0" in out
    assert "took " in out and "left" not in out

    # One pack's folder gone, as if its job had not run yet while the sweep runs (it holds the run's lock): its
    # trainings wait, and time left is estimated (a stopped run's is not: tests/test_unfinished_run.py)
    run = RunDir(run_dir)
    plan = read_json(run.plan)
    shutil.rmtree(run.pack_dir(plan["packs"][0]["pack_id"]))
    with RunLock(run):
        st = sweep.status(run_dir)
        assert main(["status", str(run_dir)]) == 0
    counts = st.trainings["local"]
    assert counts["waiting"] == 2 and counts["completed"] + counts["failed"] == 2 and st.ended_at is None
    out = capsys.readouterr().out
    assert "waiting 2" in out and "elapsed " in out and "left at this rate" in out, out


@pytest.mark.slow
def test_status_of_a_local_sweep_mid_run_says_running_and_pending(tmp_path, subprocess_env):
    """The local backend keeps no job ids: a live packer's pack lock says its pack runs, a live sweep's run lock says
    its other packs wait their turn (it said 'stopped' and 'not submitted' mid-run). A barrier holds the first pack
    running while status looks (``meet`` of 3 with packs of 2: it waits until the test lets it go)."""
    import subprocess
    import sys

    from tests.conftest import wait_for

    run_dir, gate = tmp_path / "run", tmp_path / "gate"
    proc = subprocess.Popen([sys.executable, "-m", "gpupack", *PROBE, "sweep.grid.lr=[0.1,0.2,0.3,0.4]",
                             f"+sweep.fixed.meet={gate}:3", "+sweep.fixed.meet_timeout_s=60", "packing.factors=[2]",
                             "packing.repeats=1", "packing.order=by_factor", f"run_dir={run_dir}"],
                            env=subprocess_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: len(list(gate.glob("*"))) >= 2, timeout_s=120)  # both of the first pack arrived
        st = sweep.status(run_dir)
        states = sorted(p.state for p in st.packs)
        assert states == [PENDING, RUNNING], states
        assert st.trainings["local"]["running"] == 2 and st.trainings["local"]["waiting"] == 2
    finally:
        (gate / "arrived-release").write_text("")  # a third arrival: the barrier opens
        proc.wait(timeout=120)
    after = sweep.status(run_dir)
    assert sorted(p.state for p in after.packs) == ["done", "done"]


# ---------------- watch: follow a run from any shell (issue 30, item 5) ----------------

def _st(*states: str) -> RunStatus:
    from gpupack.sweep.flow.status import PackStatus

    return RunStatus(Path("r"), "s", [PackStatus(f"p{i}", "v100", s, 0, 1) for i, s in enumerate(states)],
                     trainings={"v100": Counter(waiting=len(states))})


@pytest.mark.parametrize("states, ended", [
    (("done", "failed"), True), (("done", "stopped", "not submitted"), True),
    (("done", "pending"), False), (("running",), False), (("submitted",), False),
    (("unknown", "done"), False),  # the queue did not answer: never ended on its silence
])
def test_a_run_has_ended_when_none_of_its_packs_may_still_run(states, ended):
    from gpupack.sweep.flow.status import has_ended

    assert has_ended(_st(*states)) is ended


def test_follow_looks_until_the_run_has_ended_and_sleeps_between_looks_only():
    from gpupack.sweep.flow.status import follow

    answers = iter([_st("submitted", "pending"), _st("running", "pending"), _st("done", "running"),
                    _st("done", "failed")])
    slept: list[float] = []
    seen = [[p.state for p in st.packs] for st in follow("r", 7.0, sleep=slept.append, look=lambda _: next(answers))]
    assert seen[-1] == ["done", "failed"] and len(seen) == 4 and slept == [7.0] * 3


@pytest.mark.slow
def test_watch_a_finished_run_prints_its_status_and_exits_by_its_outcome(tmp_path, capsys):
    run_dir = tmp_path / "run"
    sweep.run(sweep.prepare(PROBE + ["sweep.grid.lr=[0.1,0.2]", "sweep.grid.fail=[false,true]",
                                     "packing.factors=[2]", "packing.repeats=1", f"run_dir={run_dir}"]),
              collect_outputs=False, plots=False)
    assert main(["watch", str(run_dir), "--every", "0.1"]) == 1  # a training failed
    out = capsys.readouterr().out
    assert "local: trainings completed 2, failed 2, running 0, waiting 0" in out
    assert f"python -m gpupack collect {run_dir}" in out


@pytest.mark.parametrize("argv, needle", [([], "RUN_DIR=''"), (["a", "b"], "RUN_DIR='a b'"),
                                          (["r", "--every", "0"], "--every=0.0"), (["r", "--nope"], "--nope")])
def test_watch_bad_input_is_one_line(argv, needle, capsys):
    assert main(["watch", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "HINT:" in err, err


def test_leaving_watch_says_the_jobs_go_on_and_how_to_come_back(monkeypatch, capsys):
    def interrupted(run_dir, every_s):
        yield _st("running")
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "follow", interrupted)
    assert main(["watch", "runs/x"]) == 130
    out = capsys.readouterr().out
    assert "the run's jobs go on" in out and "python -m gpupack watch runs/x" in out


@pytest.mark.slow
def test_status_of_a_folding_streaming_lane_mid_run_counts_its_trainings_running(tmp_path, subprocess_env):
    """A lane that folds writes its trainings' logs in its own folder, not their homes': status finds who runs a
    training by its claim. Lane 0 holds two trainings at a barrier while status looks; lane 1 never started."""
    import subprocess

    from omegaconf import OmegaConf

    from gpupack.core.plan import make_plan
    from gpupack.core.store.records import write_json_atomic
    from gpupack.sweep.setup.compose import compose_config
    from tests.conftest import wait_for
    from tests.test_stream import _lane_cmd

    gate = tmp_path / "gate"
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="s", workload="tests.fake_workloads", grid={"tag": [f"t{i}" for i in range(4)]},
                     fixed={"steps": 1, "sleep_s": 0.0, "meet": f"{gate}:3", "meet_timeout_s": 60.0}, factors=[2],
                     modes=["process"], partitions=["local"], repeats=1, stream_jobs=2)
    write_json_atomic(run.plan, plan.to_json())
    OmegaConf.save(compose_config([*PROBE, f"run_dir={run.root}"]), run.config)
    lane = subprocess.Popen(_lane_cmd(run, plan.packs[0].pack_id, fold=True), env=subprocess_env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: len(list(gate.glob("*"))) >= 2, timeout_s=120)  # both of its slots arrived
        st = sweep.status(run.root)
        assert st.trainings["local"]["running"] == 2 and st.trainings["local"]["waiting"] == 2, st.trainings
        homes = {t.training_id: p.pack_id for p in plan.packs for t in p.trainings}
        assert any(homes[p.stem] != plan.packs[0].pack_id for p in run.packs.glob("*/logs/*.out"))  # not its own
    finally:
        (gate / "arrived-release").write_text("")
        lane.wait(timeout=120)
