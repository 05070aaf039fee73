"""Issue 43, item 5: the unfinished run is named. The same command run again without run_dir= starts a new run
directory: it says first, in one line, where an unfinished run of the same sweep is and how to resume it (or that it
is running), and goes on. ``status`` of a stopped run gives no time left: it says it is stopped and how to resume it;
a running one keeps its estimate."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest
from rich.console import Console

from gpupack import sweep
from gpupack.cli import main
from gpupack.cli.show import StatusView, resume_command
from gpupack.core.store.records import read_json
from gpupack.core.store.rundir import RunDir, RunLock
from gpupack.sweep.flow.status import PackStatus, RunStatus

REPO = Path(__file__).resolve().parent.parent
ARGS = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack", "sweep.grid.lr=[0.1,0.2]",
        "packing.factors=[1]", "packing.repeats=1", "sweep.fixed.steps=3"]
STAMP = "2026-01-01_00-00-00"  # the earlier run's directory, as a command without run_dir= names it
EARLIER = Path("runs") / "probe_pack" / STAMP
HOLD = ("import sys\nfrom pathlib import Path\nfrom gpupack.core.store.rundir import RunDir, RunLock\n"
        "with RunLock(RunDir(Path(sys.argv[1]))):\n    print('held', flush=True)\n    sys.stdin.read()\n")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of ARGS stopped midway: it ran whole, then its first pack's folder was taken away, as a Ctrl-C before
    that pack's job began leaves it. Made once; each test works on its own copy."""
    run_dir = tmp_path_factory.mktemp("template") / "run"
    with pytest.MonkeyPatch.context() as mp:  # the trainings' processes import tests.fake_workloads
        mp.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        sweep.run(sweep.prepare([*ARGS, f"run_dir={run_dir}"]), collect_outputs=False, plots=False)
    run = RunDir(run_dir)
    first = read_json(run.plan)["packs"][0]
    assert run.pack_record(first["pack_id"]).exists()  # its records are in its folder, not in a lane's journal
    shutil.rmtree(run.pack_dir(first["pack_id"]))
    return run_dir


@pytest.fixture
def earlier(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The stopped run at runs/probe_pack/<STAMP> under a fresh working folder, which the test runs in."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(template, EARLIER)
    yield EARLIER


def packs_done(run_dir: Path) -> tuple[int, int]:
    packs = read_json(RunDir(run_dir).plan)["packs"]
    return len(packs) - 1, len(packs)  # every pack but the first


def resume_line(run_dir: Path) -> str:
    return "to resume it: " + shlex.join(["python", "-m", "gpupack", *ARGS, f"run_dir={run_dir}"])


@pytest.mark.slow
def test_the_same_command_names_the_stopped_run_and_how_to_resume_it_and_that_command_resumes_it(earlier, capsys):
    done, total = packs_done(earlier)
    assert main([*ARGS, "dry_run=true"]) == 0
    out = capsys.readouterr().out
    note = [line for line in out.splitlines() if line.startswith("note:")]
    assert note == [f"note: {earlier} holds an unfinished run of this sweep ({done} of {total} packs done); "
                    + resume_line(earlier)], out
    assert out.startswith("note:")  # said first, before the plan
    # the command it gives resumes that run, and once it has ended it is no longer named
    assert main([*ARGS, f"run_dir={earlier}"]) == 0
    out = capsys.readouterr().out
    assert f"resuming: {done} pack(s) already complete, 1 to run" in out and "note:" not in out
    assert main([*ARGS, "dry_run=true"]) == 0
    assert "note:" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_run_of_the_same_command_goes_on_in_a_new_directory_and_leaves_the_stopped_one_as_it_is(earlier, capsys):
    before = sorted(str(p.relative_to(earlier)) for p in earlier.rglob("*"))
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"note: {earlier} holds an unfinished run of this sweep (") and resume_line(earlier) in out
    new = [p for p in earlier.parent.iterdir() if p.name != STAMP]
    assert len(new) == 1 and f"Records and summary: {new[0]}" in out
    assert sorted(str(p.relative_to(earlier)) for p in earlier.rglob("*")) == before  # nothing of it touched


@pytest.mark.parametrize("other", [
    ["sweep.grid.lr=[0.3]"],  # another plan of the same sweep's name: not this sweep's run
    [f"run_dir=runs/probe_pack/{STAMP}-new"],  # the user chose where it runs: a new run, on purpose
])
def test_no_note_for_another_plan_or_a_chosen_run_dir(earlier, capsys, other):
    assert main([*ARGS, *other, "dry_run=true"]) == 0
    assert "note:" not in capsys.readouterr().out


def test_a_run_of_the_same_sweep_that_runs_is_named_running(earlier, capsys, subprocess_env):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(earlier)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=subprocess_env)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert main([*ARGS, "dry_run=true"]) == 0
        out = capsys.readouterr().out
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    done, total = packs_done(earlier)
    assert f"note: {earlier} holds a run of this sweep, running now (pid {holder.pid} on " in out, out
    assert f"; {done} of {total} packs done); follow it: python -m gpupack watch {earlier}" in out
    assert "unfinished" not in out and "to resume" not in out


def test_status_of_a_stopped_run_gives_no_time_left_and_says_how_to_resume(earlier, capsys):
    st = sweep.status(earlier)
    assert st.stopped and st.left_s(now=st.started_at + 999) is None  # type: ignore[operator]
    assert main(["status", str(earlier)]) == 0
    out = capsys.readouterr().out
    assert "left at this rate" not in out and "elapsed" not in out, out
    assert "  stopped: nothing of it runs or is queued now; its trainings ran " in out
    assert (f"  to resume it ({st.trainings_left} training(s) left): run the same command again with "
            f"run_dir={earlier} (without it, a new run starts)") in out
    assert st.trainings_left == len(read_json(RunDir(earlier).plan)["packs"][0]["trainings"]) > 0


def test_status_of_a_running_run_keeps_its_estimate(earlier, capsys):
    with RunLock(RunDir(earlier)):  # a sweep of this host holds the run: its packs not done are pending
        st = sweep.status(earlier)
        assert not st.stopped and {p.state for p in st.packs} == {"done", "pending"}
        assert main(["status", str(earlier)]) == 0
    out = capsys.readouterr().out
    assert "left at this rate" in out and "stopped" not in out and "to resume" not in out, out


def _st(state: str) -> RunStatus:
    return RunStatus(Path("r"), "s", [PackStatus("p0", "v100", "done", 1, 1), PackStatus("p1", "v100", state, 0, 1)],
                     trainings={"v100": Counter(completed=1, waiting=1)}, started_at=1000.0, last_end_at=1010.0)


@pytest.mark.parametrize("state, stopped", [
    ("not submitted", True), ("stopped", True), ("failed", True),  # nothing of it runs or is queued
    ("pending", False), ("running", False), ("submitted", False),
    ("unknown", False),  # the queue did not answer: it may run, so it is not called stopped
])
def test_a_run_is_stopped_where_trainings_are_left_and_none_of_its_packs_may_run(state, stopped):
    st = _st(state)
    assert st.stopped is stopped
    assert (st.left_s(now=1020.0) is None) is stopped  # an estimate only while something may run
    line = StatusView(Console(record=True)).line(st, now=1020.0)
    assert line.endswith("; stopped") is stopped and ("left" in line) is not stopped, line


@pytest.mark.parametrize("command, expected", [
    (["python", "-m", "gpupack", "+sweep=s", "a.b=[1,2]"], "python -m gpupack +sweep=s 'a.b=[1,2]' run_dir=r/x"),
    (["python", "-m", "gpupack", "+sweep=s", "dry_run=true"], "python -m gpupack +sweep=s run_dir=r/x"),
    (["python", "-m", "gpupack", "++run_dir=old", "+sweep=s"], "python -m gpupack +sweep=s run_dir=r/x"),
])
def test_the_resume_command_is_this_one_in_the_run_dir(command, expected):
    assert resume_command(command, Path("r/x")) == expected


def test_the_run_dirs_beside_are_the_ones_with_a_plan_newest_first(tmp_path):
    for i, name in enumerate(["b", "a", "c"]):
        (tmp_path / name).mkdir()
        (tmp_path / name / "plan.json").write_text("{}")
        os.utime(tmp_path / name / "plan.json", (1000 + i, 1000 + i))
    (tmp_path / "no-plan").mkdir()
    assert [r.root.name for r in RunDir(tmp_path / "new").siblings()] == ["c", "a", "b"]
    assert [r.root.name for r in RunDir(tmp_path / "a").siblings()] == ["c", "b"]  # never itself
