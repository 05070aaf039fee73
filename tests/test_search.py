"""search=optuna run from outside as a user would (issue 46): 32 trials at N=4 on the local backend, every trial
once, slots kept busy; a run SIGKILLed mid-search and run again; a bad space refused before anything runs."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from gpupack.cli import main
from gpupack.core.store.rundir import RunDir
from gpupack.results.analysis.load import load_records
from gpupack.results.analysis.occupancy import occupancy
from gpupack.search.study import COMPLETE, CUT, DIED, FAILED, PRUNED, Study, read_journal, trial_number

REPO = Path(__file__).resolve().parent.parent


def search_cmd(run: Path, n_trials: int = 32, *more: str) -> list[str]:
    # trials of about a second (4 steps of 0.25-0.3 s): long beside the ask between two of a slot
    return [sys.executable, "-m", "gpupack", "+sweep=probe_pack", "hydra.searchpath=[file://tests/conf]",
            "search=optuna", f"search.n_trials={n_trials}", "packing.factors=[4]", "packing.jobs=1",
            "sweep.fixed.steps=4", "~sweep.fixed.sleep_s", "+search.space.sleep_s=interval(0.25, 0.3)",
            "+search.space.lr=tag(log, interval(0.01, 1))", "search.pruner=none", f"run_dir={run}", *more]


def training_records(run: Path) -> list[dict[str, object]]:
    """Every training record of the run: its lanes' folders (and journals, where they fold)."""
    out = [json.loads(p.read_text()) for p in run.glob("packs/*/trainings/*.json")]
    for journal in run.glob("lanes/*.jsonl"):
        out += [rec for line in journal.read_text().splitlines() if line.strip()
                and (rec := json.loads(line)).get("kind") == "training"]
    return out


@pytest.mark.slow
@pytest.mark.quiet
def test_a_search_of_32_trials_at_n4_runs_each_once_and_keeps_its_slots_busy(tmp_path: Path,
                                                                            subprocess_env: dict[str, str]) -> None:
    run = tmp_path / "run"
    done = subprocess.run(search_cmd(run), env=subprocess_env, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    journal = Study(RunDir(run).study).read()
    states = [t.state for t in journal.trials.values()]
    assert len(journal.trials) == 32 and sorted(journal.trials) == list(range(32))  # every number once
    assert states.count(COMPLETE) + states.count(PRUNED) == 32
    recs = training_records(run)
    ids = [str(r["training_id"]) for r in recs]
    assert len(ids) == 32 and len(set(ids)) == 32  # no training id twice
    occ = occupancy(load_records([run]).packs)
    assert len(occ) == 1 and occ["trainings"].iloc[0] == 32
    assert occ["slot_occupancy"].iloc[0] >= 0.95, occ.to_dict("records")


@pytest.mark.slow
def test_a_search_killed_mid_run_and_run_again_ends_with_its_budget_none_repeated(
        tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    run = tmp_path / "run"
    study = RunDir(run).study
    first = subprocess.Popen(search_cmd(run, 16), env=subprocess_env, cwd=REPO, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 200
        while time.time() < deadline and ((j := read_journal(study)) is None or j.count(COMPLETE) < 5):
            time.sleep(0.2)
    finally:  # the run dies mid-search, its lanes' jobs with it (a node failure, scancel): trials running
        trials = optuna.load_study(study_name=None, storage=JournalStorage(JournalFileBackend(str(study)))).trials \
            if study.exists() else []
        # a trial planned for a lane but not yet claimed by it has no lane's pid yet
        lanes = {int(t.user_attrs["gpupack"]["pid"]) for t in trials if "pid" in t.user_attrs.get("gpupack", {})}
        # and every process under the command: a lane that had claimed no trial yet would live on into the run again
        # below, telling the study beside it (seen in CI under load)
        jobs = {p.pid for p in psutil.Process(first.pid).children(recursive=True)} if first.poll() is None else set()
        for pid in [first.pid, *lanes, *jobs]:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        first.wait(timeout=60)
    before = Study(study).read()
    running = [t.number for t in before.trials.values() if t.state == "running"]
    assert before.count(COMPLETE) >= 5 and running  # killed with trials asked and never told
    said = subprocess.run([sys.executable, "-m", "gpupack", "status", str(run)], env=subprocess_env, cwd=REPO,
                          capture_output=True, text=True, timeout=120).stdout
    said = " ".join(said.split())
    assert f"{len(running)} asked by a lane that no longer runs" in said and "nothing of it runs" in said, said
    assert " running" not in said.split("search:")[1].split("stopped:")[0], said  # no trial said running
    again = subprocess.run(search_cmd(run, 16), env=subprocess_env, cwd=REPO, capture_output=True, text=True,
                           timeout=400)
    assert again.returncode == 0, again.stderr[-3000:]
    journal = Study(study).read()
    assert journal.count(COMPLETE, PRUNED) == 16
    recorded = {trial_number(str(r["training_id"])): r["status"] for r in training_records(run)}
    for n in running:  # told from the record its training wrote before the kill, else failed: died with its lane, or
        told = journal.trials[n]  # cut: killed mid-ask, before its lane was written
        died = DIED if before.trials[n].lane else CUT
        assert (told.state, told.why) == (FAILED, died) if n not in recorded else \
            told.state == {"completed": COMPLETE, "pruned": PRUNED}.get(str(recorded[n]), FAILED), (n, told)
    assert sorted(journal.trials) == list(range(len(journal.trials)))  # every number once
    completed = [str(r["training_id"]) for r in training_records(run) if r["status"] == "completed"]
    assert len(completed) == 16 and len(set(completed)) == 16  # no finished trial run again


def test_a_bad_space_or_sampler_is_one_line_exit_2_and_nothing_written(tmp_path: Path, capsys: object) -> None:
    base = ["+sweep=probe_pack", "hydra.searchpath=[file://tests/conf]", "search=optuna", "packing.factors=[4]"]
    for more, needle in ((["+search.space.lr=interval(1, 0.1)"], "search.space.lr="),
                         (["+search.space.lr=interval(0.1, 1)", "search.sampler=TPESamplr"],
                          "HINT: search.sampler=TPESampler"),
                         (["+search.space.lrr=interval(0.1, 1)"], "search.space.lrr=")):
        run = tmp_path / "run"
        code = main(base + more + [f"run_dir={run}"])
        err = capsys.readouterr().err.strip()  # type: ignore[attr-defined]
        assert code == 2 and len(err.splitlines()) == 1 and needle in err and "HINT: " in err, err
        assert not run.exists()


@pytest.mark.slow
def test_a_search_where_optuna_is_not_installed_is_one_line_saying_how_to_install_it(
        tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """Optuna is gpupack's ``search`` extra, not a dependency: without it, search=optuna says so and how to install
    it, exit 2, nothing written; a grid runs as ever (here, its dry run)."""
    hidden = tmp_path / "no_optuna" / "optuna"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'optuna'\")\n")
    env = {**subprocess_env, "PYTHONPATH": os.pathsep.join([str(hidden.parent), subprocess_env["PYTHONPATH"]])}
    run = tmp_path / "run"
    done = subprocess.run(search_cmd(run, 4), env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("gpupack: error: search='optuna': Optuna cannot be imported here (No module named 'optuna')")
    assert "HINT: pip install 'gpupack[search]'" in err and not run.exists()
    grid = subprocess.run([*search_cmd(run, 4)[:5], "dry_run=true"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert grid.returncode == 0 and "dry run: nothing was written" in grid.stdout, grid.stderr


@pytest.mark.slow
@pytest.mark.quiet
def test_a_search_after_packing_factors_auto_streams_its_trials_at_the_chosen_n(
        tmp_path: Path, subprocess_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 46 item 3. A programmed device (1 s a training alone or two at a time, 2.7 s three at a time, and one
    step of 0.25-0.3 s): the probe trains the space's midpoint (lr=0.1, the log middle of 0.01-1), stops at N=3 and
    picks N=2; the search then runs its 6 trials at N=2 in RUN_DIR/run, every trial once."""
    run = tmp_path / "run"
    command = [*search_cmd(run, 6), "sweep.fixed.steps=1", "packing.factors=auto", "packing.auto.ladder=[1,2,3]",
               "packing.auto.repeats=2", "+sweep.fixed.sleep_by_n='1:1.0,2:1.0,3:2.7'"]
    done = subprocess.run(command, env=subprocess_env, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    auto = json.loads((run / "auto.json").read_text())
    assert auto["best"] == {"local": 2} and [s["factor"] for s in auto["steps"]] == [1, 2, 3]
    assert f"The search (6 trials) streamed at the best N: {run / 'run'}" in done.stdout
    probed = training_records(run / "probe" / "n01") + training_records(run / "probe" / "n02")
    assert probed and {r["params"]["lr"] for r in probed} == {0.1}  # type: ignore[index]
    assert not list((run / "probe").glob("*/search"))  # the probe asked the study for no trial
    journal = Study(RunDir(run / "run").study).read()
    assert sorted(journal.trials) == list(range(6)) and journal.count(COMPLETE, PRUNED) == 6
    searched = training_records(run / "run")
    assert len(searched) == 6 and {r["factor"] for r in searched} == {2}
    assert sorted(str(r["training_id"])[:9] for r in searched) == [f"trial{n:04d}" for n in range(6)]
    from gpupack import sweep
    from gpupack.results.analysis import aggregate

    ranked: list[Any] = []  # what collect ranks as the best hyperparameters: the trials, not the probe's trainings
    real = aggregate.best_hyperparameters
    monkeypatch.setattr(aggregate, "best_hyperparameters", lambda t, **kw: ranked.append(t) or real(t, **kw))
    sweep.collect([run], plots=False)
    assert len(ranked) == 1 and sorted(ranked[0]["training_id"].str[:9]) == [f"trial{n:04d}" for n in range(6)]


@pytest.mark.slow
@pytest.mark.quiet
def test_a_search_after_an_untrusted_probe_streams_at_the_reference_says_why_and_counts_apart(
        tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """Issue 51 item 5. A programmed device whose N=2 is 9x N=1 (1.5 s a training alone, 0.1 s two at a time, and a
    step of 0.25-0.3 s): beyond what 2 cores can give, so the probe names no N. The search then streams its 4 trials
    at the ladder's reference N=1 and says so and why; the probe's trainings are neither ranked with the trials nor
    counted as the search's. Quiet: whether an N is named is what the run measured; beside other tests, packs under
    foreign load left out left N=2 one quiet pack, which cannot be told from noise, and the choice named N=1 (twice
    in CI)."""
    run = tmp_path / "run"
    command = [*search_cmd(run, 4), "sweep.fixed.steps=1", "packing.factors=auto", "packing.auto.ladder=[1,2]",
               "packing.auto.repeats=2", "+sweep.fixed.sleep_by_n='1:1.5,2:0.1'"]
    done = subprocess.run(command, env=subprocess_env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    auto = json.loads((run / "auto.json").read_text())
    out = " ".join(done.stdout.split())
    assert auto["best"] == {"local": None} and auto["runs_at"] == {"local": 1}, json.dumps(auto) + "\n" + out[-4000:]
    # which N, and why: the device's bound, or (a busy machine) every pack under foreign load
    assert re.search(r"No N was named \(local: (beyond the device|under foreign load)\): the search streamed at the "
                     r"ladder's reference \(N=1 on local\)", out), out[-4000:]
    assert "The search (4 trials) at N=1 on local, the ladder's reference (no N was named)" in out
    searched = training_records(run / "run")
    assert len(searched) == 4 and {r["factor"] for r in searched} == {1}
    # the lane's pack record names the workload its trials ran (it planned none: they were asked as it went)
    assert list(load_records([run / "run"]).packs["workload"]) == ["tests.fake_workloads"]
    probed = [r for step in (run / "probe").glob("n*") for r in training_records(step)]
    # counted apart: the probe's trainings as the probe's, the trials as the search's budget
    assert f"done: {len(probed)} of {len(probed)} trainings of the probe have a record" in out, out[-4000:]
    assert "search: 4 of 4 trials finished" in out
    ranked = out.partition("Best hyperparameters by val_accuracy")[2].partition("Data:")[0]
    trials = {f"lr={r['params']['lr']:.4g}" for r in searched}  # type: ignore[index]  # 4 significant digits
    assert ranked.count("tests.fake_workloads:") == 4 and all(t in ranked for t in trials), ranked


def test_a_grid_given_with_a_search_is_said_unused_in_one_line_and_its_axes_keep_their_defaults(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """mnist_pack brings a grid (lr, batch_size, seed): a search does not run it. One note says so before anything
    runs, and the search's fixed values hold the workload's default for the axes outside the space (batch_size), not
    nothing."""
    from gpupack import sweep

    command = ["+sweep=mnist_pack", "search=optuna", "packing.factors=[2]", "+search.space.lr=interval(0.01, 0.1)",
               f"run_dir={tmp_path / 'run'}"]
    assert main([*command, "dry_run=true"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "sweep.grid" in line]
    assert len(said) == 1 and "sweep.grid (lr, batch_size, seed) is not used by search=optuna" in said[0], said
    assert said[0].startswith("note: "), said  # nothing is amiss: the preset brings its grid
    spec = sweep.prepare(command).spec
    assert spec is not None and spec.fixed["batch_size"] == 64 and "lr" not in spec.fixed


@pytest.mark.slow
def test_the_first_trials_planned_by_the_command_wait_for_their_lanes_and_each_runs_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The command asks each lane's first trials before its job starts (the lane starts them without importing
    Optuna). Submitted and still queued (wait=false), they are said waiting, not running; a lane's run with no time left
    to start one leaves them waiting; once the jobs run, each lane runs its own, and the study ends with its budget,
    every trial once."""
    from tests.fakes import FakeConfig, FakeQueue, use_fake_submitter

    queue = FakeQueue()
    use_fake_submitter(monkeypatch, config=FakeConfig(default_partitions=["cpu"]), queue=queue)
    run = tmp_path / "run"
    command = ["+sweep=probe_pack", "hydra.searchpath=[file://tests/conf]", "search=optuna", "search.n_trials=6",
               "packing.factors=[2]", "packing.jobs=2", "packing.device=cpu", "sweep.fixed.steps=1",
               "search.pruner=none", "+search.space.lr=interval(0.1, 1)", "wait=false", f"run_dir={run}"]
    assert main(command) == 0 and len(queue.waiting) == 2
    journal = Study(RunDir(run).study).read()
    planned = {t.number: t.lane for t in journal.trials.values()}
    assert sorted(planned) == [0, 1, 2, 3] and journal.waiting == 4 and len(set(planned.values())) == 2
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    assert "0 running, 4 waiting for their lane's job" in " ".join(capsys.readouterr().out.split())
    # a run of a lane with no time left to start one (near its job's limit) leaves them waiting for the next run
    from gpupack.core.types import PackSettings
    from gpupack.job.lanes import run_lane
    from gpupack.search.lane import lane_kind

    late = PackSettings(device="cpu", claim_until_s=5.0, training_estimate_s=100.0)
    assert run_lane(str(run), min(planned.values()), late, kind=lane_kind)["stopped_claiming"]
    assert Study(RunDir(run).study).read().waiting == 4
    queue.drain()
    journal = Study(RunDir(run).study).read()
    assert sorted(journal.trials) == list(range(6)) and journal.count(COMPLETE) == 6 and journal.waiting == 0
    assert all(journal.trials[n].lane == lane for n, lane in planned.items())  # each ran in the lane it was asked for
    ids = [str(r["training_id"]) for r in training_records(run)]
    assert len(ids) == len(set(ids)) == 6


def test_a_searchs_plan_says_its_trials_not_grid_points_nor_trainings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A search plans no training: its header says the search (budget, sampler, pruner, metric), its lanes asking the
    study, and the files its trials will make, not "0 trainings in all" nor files per training of none."""
    command = ["+sweep=probe_pack", "hydra.searchpath=[file://tests/conf]", "search=optuna", "search.n_trials=12",
               "packing.factors=[4]", "+search.space.lr=interval(0.1, 1)", "dry_run=true", f"run_dir={tmp_path / 'r'}"]
    assert main(command) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("workload tests.fake_workloads, a search of 12 trial(s) (TPESampler, MedianPruner; val_accuracy, "
            "maximize), N in [4]" in out), out
    assert "streaming job(s), each slot asking the study for its next trial;" in out
    assert "grid point" not in out and "trainings in all" not in out and "per training" not in out
    files = int(out.split("files: about ")[1].split()[0])
    assert files > 12 and "per trial" in out  # a record or more per trial, and the study
    assert main([*command, "packing.factors=auto"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "a search of 12 trial(s)" in out and "on the space's midpoint), then streams the search's trials at the " \
                                                "best N" in out, out


def test_a_dry_run_of_a_search_to_resume_writes_nothing_to_its_study(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The dry run of a run to resume reads what its search has left as status and collect do: without the study's
    lock, writing nothing, not even the cut of a torn last line (a lane killed mid-append), which is its writers'."""
    from tests.fakes import FakeConfig, FakeQueue, use_fake_submitter

    use_fake_submitter(monkeypatch, config=FakeConfig(default_partitions=["cpu"]), queue=FakeQueue())
    run = tmp_path / "run"
    command = ["+sweep=probe_pack", "hydra.searchpath=[file://tests/conf]", "search=optuna", "search.n_trials=4",
               "packing.factors=[2]", "packing.jobs=1", "packing.device=cpu", "search.pruner=none",
               "+search.space.lr=interval(0.1, 1)", "wait=false", f"run_dir={run}"]
    assert main(command) == 0  # submitted, still queued: its study holds the planned trials
    study = RunDir(run).study
    with open(study, "ab") as f:
        f.write(b'{"op_code": 6, "worker_id": "torn", "tri')
    before = study.read_bytes()
    capsys.readouterr()
    assert main([*command, "dry_run=true"]) == 0
    assert "resuming: the run directory holds this plan; 1 pack(s) to run" in " ".join(capsys.readouterr().out.split())
    assert study.read_bytes() == before and not study.with_suffix(".torn").exists()


@pytest.mark.slow
def test_a_changed_search_is_refused_and_a_grown_budget_runs_only_the_new_trials(
        tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    run = tmp_path / "run"
    first = subprocess.run(search_cmd(run, 4), env=subprocess_env, cwd=REPO, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    study = RunDir(run).study
    before, records = study.read_bytes(), {p.name: p.read_bytes() for p in run.glob("packs/*/trainings/*.json")}
    assert len(records) == 4
    for more, said in ((["search.seed=3"], "search.seed: 0 -> 3"),
                       (["sweep.fixed.steps=5"], "sweep.fixed.steps: 4 -> 5"),
                       (["search.sampler=RandomSampler", "search.n_trials=6"],
                        "search.sampler: 'TPESampler' -> 'RandomSampler'")):
        changed = subprocess.run([*search_cmd(run, 4), *more], env=subprocess_env, cwd=REPO, capture_output=True,
                                 text=True, timeout=300)
        err = changed.stderr.strip().splitlines()
        assert changed.returncode == 2 and len(err) == 1 and said in err[0] and "HINT: " in err[0], changed.stderr
        assert study.read_bytes() == before  # refused before the study was told anything
    grown = subprocess.run(search_cmd(run, 6), env=subprocess_env, cwd=REPO, capture_output=True, text=True,
                           timeout=300)
    assert grown.returncode == 0, grown.stderr[-3000:]
    assert "the search is extended (search.n_trials: 4 -> 6)" in grown.stderr
    journal = Study(study).read()
    assert sorted(journal.trials) == list(range(6)) and journal.count(COMPLETE, PRUNED) == 6
    after = {p.name: p.read_bytes() for p in run.glob("packs/*/trainings/*.json")}
    assert len(after) == 6 and all(after[name] == rec for name, rec in records.items())  # the first 4 not run again


@pytest.mark.slow
def test_a_search_lanes_lost_record_is_rebuilt_from_its_trials_and_none_runs_again(
        tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """A lane killed after telling its last trial but before writing its own record: the study is finished, so the
    next run of the command runs no trial and rebuilds the lane's record from the trials it ran (as a queue's lane's
    is rebuilt), rather than a record of a lane that ran nothing."""
    from gpupack.core.plan import Plan
    from gpupack.core.store.journal import RunRecords
    from gpupack.core.store.records import read_json
    from gpupack.sweep.flow.run import packs_to_run

    run = tmp_path / "run"
    first = subprocess.run(search_cmd(run, 4), env=subprocess_env, cwd=REPO, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    rundir = RunDir(run)
    plan = Plan.from_json(read_json(rundir.plan))
    (lane,) = plan.packs
    kept = RunRecords(rundir).pack(lane.pack_id)
    assert kept is not None and len(kept["training_ids"]) == 4
    study, records = rundir.study.read_bytes(), {p.name: p.read_bytes() for p in run.glob("packs/*/trainings/*.json")}
    rundir.pack_record(lane.pack_id).unlink()  # its record lost: the lane died before writing it
    assert packs_to_run(rundir, plan) == [lane]
    again = subprocess.run(search_cmd(run, 4), env=subprocess_env, cwd=REPO, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    rebuilt = RunRecords(rundir).pack(lane.pack_id)
    assert rebuilt is not None and "rebuilt" in rebuilt, rebuilt
    assert sorted(rebuilt["training_ids"]) == sorted(kept["training_ids"])
    assert {p.name: p.read_bytes() for p in run.glob("packs/*/trainings/*.json")} == records  # none ran again
    assert rundir.study.read_bytes() == study and packs_to_run(rundir, plan) == []
