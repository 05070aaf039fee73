"""The search's space and study (issue 46): Hydra's grammar read into dimensions, and the journal-backed study: one
number per ask across threads, the budget, pruning, the dead told failed, a torn last line cut back."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
from optuna.trial import FrozenTrial, TrialState

from gpupack.core.store.claims import Claimant
from gpupack.core.store.records import training_record, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.errors import ConfigError
from gpupack.search.lane import recorded_outcome
from gpupack.search.options import read_search
from gpupack.search.space import Dimension, parse_dimension
from gpupack.search.study import COMPLETE, CUT, DIED, FAILED, PRUNED, Study, TrialRow, read_journal, trial_training

SPACE = [
    ("interval(0.5, 2)", Dimension("float", 0.5, 2.0)),
    ("int(interval(1, 8))", Dimension("int", 1.0, 8.0)),
    ("tag(log, interval(1e-4, 1e-1))", Dimension("float", 1e-4, 1e-1, log=True)),
    ("choice(a, 3, 2.5)", Dimension("categorical", choices=("a", 3, 2.5))),
    ("range(0, 10, 3)", Dimension("int", 0.0, 9.0, step=3)),
]


@pytest.mark.parametrize("text, dim", SPACE, ids=[s[0] for s in SPACE])
def test_hydra_grammar_reads_as_a_dimension(text: str, dim: Dimension) -> None:
    assert parse_dimension("x", text, "search.space.x") == dim


@pytest.mark.parametrize("text, why", [("3", "one value"), ("interval(2, 1)", "below"), ("interval(0", "grammar"),
                                       ("tag(log, interval(0, 1))", "positive"), ("range(5, 1)", "empty")])
def test_a_bad_dimension_names_its_key_and_hints(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as err:
        parse_dimension("x", text, "search.space.x")
    assert err.value.key == "search.space.x" and "HINT" in str(err.value)


@pytest.mark.parametrize("section, key", [({"sampler": "TPESamplr"}, "search.sampler"),
                                          ({"pruner": "Median"}, "search.pruner"),
                                          ({"n_trials": 0}, "search.n_trials"),
                                          ({"sampler_kwargs": {"n_startup": 3}}, "search.sampler_kwargs.n_startup")])
def test_bad_search_options_are_refused_with_a_fix(section: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        read_search({"space": {"lr": "interval(0.1, 1)"}, **section}, None, "max", None)
    assert err.value.key == key
    if key == "search.sampler":
        assert "HINT: search.sampler=TPESampler" in str(err.value)


def study(tmp_path: Path, n_trials: int = 8, pruner: str = "none") -> Study:
    search = read_search({"space": {"lr": "tag(log, interval(1e-3, 1))"}, "n_trials": n_trials, "pruner": pruner,
                          **({"pruner_kwargs": {"n_startup_trials": 2, "n_warmup_steps": 0}}
                             if pruner == "MedianPruner" else {})}, None, "max", None)
    s = Study(tmp_path / "search" / "study.log")
    s.create(search, "probe", {"steps": 3})
    return s


def test_lanes_asking_at_once_get_distinct_numbers_and_the_budget_holds(tmp_path: Path) -> None:
    s = study(tmp_path, n_trials=20)
    got: list[TrialRow | str] = []
    lock = threading.Lock()

    def lane(i: int) -> None:
        who = Claimant.here(f"lane{i}", None)
        for _ in range(8):
            row = s.ask(who)
            with lock:
                got.append(row)

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = [r for r in got if isinstance(r, TrialRow)]
    assert sorted(r.number for r in rows) == list(range(20))
    assert len({r.params["lr"] for r in rows}) == 20  # seeded by (seed, number): no suggestion twice
    assert all("budget" in r for r in got if isinstance(r, str)) and len(got) == 32


def test_the_dead_are_told_failed_and_do_not_count(tmp_path: Path) -> None:
    s = study(tmp_path, n_trials=3)
    first, again, other = (Claimant.here("lane0", None), Claimant.here("lane0", None),
                           Claimant.here("lane1", None))
    asked = [s.ask(first), s.ask(first), s.ask(other)]
    assert isinstance(s.ask(first), str)  # 3 running: the budget is taken
    assert s.fail_dead(again) == [(0, FAILED), (1, FAILED)]  # lane1's trial is another lane's, alive
    journal = s.read()
    assert [(t.state, t.why) for t in journal.trials.values()] == [(FAILED, DIED), (FAILED, DIED), ("running", None)]
    row = s.ask(again)  # failures do not count: it asks again
    assert isinstance(row, TrialRow) and row.number == len(asked)


def test_failures_as_many_as_the_budget_stop_the_search(tmp_path: Path) -> None:
    s = study(tmp_path, n_trials=2)
    who = Claimant.here("lane0", None)
    for _ in range(2):
        row = s.ask(who)
        assert isinstance(row, TrialRow)
        s.tell(row.number, FAILED, None, "boom")
    why = s.ask(who)
    assert isinstance(why, str) and "2 trials failed" in why


def test_the_pruner_prunes_a_curve_below_the_median(tmp_path: Path) -> None:
    s = study(tmp_path, n_trials=6, pruner="MedianPruner")
    who = Claimant.here("lane0", None)
    for value in (0.9, 0.8):
        row = s.ask(who)
        assert isinstance(row, TrialRow)
        assert not s.report(row.number, 1, value)
        s.tell(row.number, COMPLETE, value)
    low, high = s.ask(who), s.ask(who)
    assert isinstance(low, TrialRow) and isinstance(high, TrialRow)
    assert s.report(low.number, 1, 0.1) and not s.report(high.number, 1, 0.95)
    s.tell(low.number, PRUNED, 0.1)
    assert s.read().trials[low.number].state == PRUNED


def test_a_torn_last_line_is_cut_back(tmp_path: Path) -> None:
    s = study(tmp_path)
    who = Claimant.here("lane0", None)
    s.ask(who)
    with open(s.path, "ab") as f:
        f.write(b'{"op_code": 4, "worker_id": "x", "tri')  # a writer killed mid-append
    assert sorted(read_journal(s.path).trials) == [0]  # read meanwhile, without the lock: the torn line left out
    row = s.ask(who)
    assert isinstance(row, TrialRow) and row.number == 1
    assert sorted(s.read().trials) == [0, 1] and sorted(read_journal(s.path).trials) == [0, 1]
    assert s.path.with_suffix(".torn").read_bytes() == b'{"op_code": 4, "worker_id": "x", "tri\n'  # cut, kept aside


# ---------------- the command plans each lane's first trials (the lanes start them without Optuna) ----------------

def test_a_fresh_studys_first_trials_are_planned_per_lane_and_each_lane_takes_its_own(tmp_path: Path) -> None:
    s = study(tmp_path, n_trials=5)
    assert s.plan_first({"lane0": 2, "lane1": 4}) == [0, 1, 2, 3, 4]  # the budget bounds them: lane1 gets 3
    assert s.plan_first({"lane0": 2}) == []  # a study with trials: the lanes ask for themselves
    assert s.read().waiting == 5 and isinstance(s.ask(Claimant.here("lane0", None)), str)  # they hold the budget
    who = Claimant.here("lane1", None)
    assert [r.number for r in s.take_planned(who)] == [2, 3, 4]
    assert s.take_planned(Claimant.here("lane1", None)) == []  # taken once
    journal = s.read()
    assert [(t.lane, t.incarnation, t.waiting) for t in journal.trials.values()][1:] == [
        ("lane0", "planned", True), ("lane1", who.incarnation, False), ("lane1", who.incarnation, False),
        ("lane1", who.incarnation, False)]


def test_planned_trials_have_the_params_the_lanes_would_have_asked(tmp_path: Path) -> None:
    """Each ask's sampler is seeded by (seed, number): who asks a trial changes nothing of the search."""
    planned, asked = study(tmp_path / "a"), study(tmp_path / "b")
    planned.plan_first({"lane0": 3})
    who = Claimant.here("lane0", None)
    rows = [asked.ask(who) for _ in range(3)]
    assert [t.params for t in planned.read().trials.values()] == [r.params for r in rows if isinstance(r, TrialRow)]


def test_a_planned_trial_waits_for_its_lane_and_dies_only_with_the_run_that_took_it(tmp_path: Path) -> None:
    """A lane's run that never started (the command killed before the job, a job that failed to start) loses none of
    its planned trials: its next run takes them. A run that took them and died: its next run tells them failed."""
    s = study(tmp_path, n_trials=3)
    s.plan_first({"lane0": 2})
    first = Claimant.here("lane0", None)
    assert s.fail_dead(first) == []  # planned, not taken: no run of the lane ran them
    assert [r.number for r in s.take_planned(first)] == [0, 1]
    again = Claimant.here("lane0", None)
    assert s.fail_dead(again) == [(0, FAILED), (1, FAILED)] and s.take_planned(again) == []  # died with it
    assert [(t.state, t.why) for t in s.read().trials.values()] == [(FAILED, DIED), (FAILED, DIED)]
    row = s.ask(again)
    assert isinstance(row, TrialRow) and row.number == 2


# ---------------- Optuna's own storage: open in Optuna's tools, true after a fault (issue 52) ----------------

def _optuna_trials(s: Study) -> list[FrozenTrial]:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return optuna.load_study(study_name=None, storage=JournalStorage(JournalFileBackend(str(s.path)))).trials


def test_optuna_opens_the_study_with_its_trials_their_lanes_and_the_running_ones(tmp_path: Path) -> None:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from optuna.trial import TrialState

    s = study(tmp_path, n_trials=4)
    who = Claimant.here("lane0", None)
    done, running = s.ask(who), s.ask(who)
    assert isinstance(done, TrialRow) and isinstance(running, TrialRow)
    s.tell(done.number, COMPLETE, 0.75, device_s=3.0)
    loaded = optuna.load_study(study_name=None, storage=JournalStorage(JournalFileBackend(str(s.path))))
    assert [(t.number, t.state, t.value) for t in loaded.trials] == [(0, TrialState.COMPLETE, 0.75),
                                                                     (1, TrialState.RUNNING, None)]
    assert loaded.trials[0].params == done.params and loaded.trials[0].user_attrs["device_s"] == 3.0
    assert loaded.trials[1].user_attrs["gpupack"]["lane"] == "lane0"
    assert loaded.direction == optuna.study.StudyDirection.MAXIMIZE


def test_a_trial_pruned_by_its_process_stays_pruned_when_its_lane_dies_before_telling(tmp_path: Path) -> None:
    s = study(tmp_path, n_trials=6, pruner="MedianPruner")
    lane = Claimant.here("lane0", None)
    for value in (0.9, 0.8):
        row = s.ask(lane)
        assert isinstance(row, TrialRow) and not s.report(row.number, 1, value)
        s.tell(row.number, COMPLETE, value)
    low = s.ask(lane)
    assert isinstance(low, TrialRow) and s.report(low.number, 1, 0.1)  # its process marks it; the lane dies
    assert read_journal(s.path).trials[low.number].state == PRUNED  # the lane's judge sees it pruned
    assert s.fail_dead(Claimant.here("lane0", None)) == [(low.number, PRUNED)]
    assert s.read().trials[low.number].value == 0.1 and s.read().untold == 0
    assert _optuna_trials(s)[low.number].state == TrialState.PRUNED  # so Optuna's tools say it too


def test_a_dead_lanes_trial_with_a_record_is_told_from_the_record(tmp_path: Path) -> None:
    s = study(tmp_path, n_trials=4)
    lane = Claimant.here("lane0", None)
    recorded, lost = s.ask(lane), s.ask(lane)
    assert isinstance(recorded, TrialRow) and isinstance(lost, TrialRow)
    records = {recorded.number: (COMPLETE, 0.8651, None)}  # the lane died after its record, before its tell
    told = s.fail_dead(Claimant.here("lane0", None), lambda row: records.get(row.number))
    assert told == [(recorded.number, COMPLETE), (lost.number, FAILED)]
    rows = s.read().trials
    assert (rows[recorded.number].state, rows[recorded.number].value) == (COMPLETE, 0.8651)
    assert (rows[lost.number].state, rows[lost.number].why) == (FAILED, DIED)


KILLED_MID_ASK = """
import os, signal, sys
from pathlib import Path
import gpupack.search.study as study
from gpupack.core.store.claims import Claimant

def killed(*args, **kwargs):  # the asker dies once Optuna has written its trial, before its claimant
    os.kill(os.getpid(), signal.SIGKILL)

study.asdict = killed
study.Study(Path(sys.argv[1])).ask(Claimant.here("lane1", None))
"""


def test_a_trial_whose_asker_was_killed_mid_ask_is_told_failed_and_frees_its_place(tmp_path: Path) -> None:
    """Seen in CI: a lane SIGKILLed inside its ask left a trial running with no claimant; no lane's resume told it,
    so it held a place of the budget for ever and the search ended one trial short."""
    import subprocess
    import sys

    s = study(tmp_path, n_trials=2)
    who = Claimant.here("lane0", None)
    done = s.ask(who)
    assert isinstance(done, TrialRow)
    s.tell(done.number, COMPLETE, 0.5)
    child = subprocess.run([sys.executable, "-c", KILLED_MID_ASK, str(s.path)], capture_output=True, text=True)
    assert child.returncode == -9, child.stderr
    (cut,) = [t for t in _optuna_trials(s) if t.state == TrialState.RUNNING]
    assert "gpupack" not in cut.user_attrs  # asked, its claimant never written
    row = s.ask(who)  # the next ask, under the lock, tells it failed: the budget has its place again
    assert isinstance(row, TrialRow) and row.number == cut.number + 1
    rows = s.read().trials
    assert (rows[cut.number].state, rows[cut.number].why) == (FAILED, CUT)
    s.tell(row.number, COMPLETE, 0.7)
    assert s.read().count(COMPLETE) == 2 and isinstance(s.ask(who), str)  # the budget of 2 finished, no more


def _search(**over: object):  # type: ignore[no-untyped-def]
    section = {"space": {"lr": "tag(log, interval(1e-3, 1))"}, "n_trials": 8, "pruner": "none", **over}
    return read_search(section, None, "max", None)


@pytest.mark.parametrize("over, said", [
    ({"seed": 1}, "search.seed: 0 -> 1"),
    ({"sampler": "RandomSampler"}, "search.sampler: 'TPESampler' -> 'RandomSampler'"),
    ({"pruner": "MedianPruner"}, "search.pruner: 'none' -> 'MedianPruner'"),
    ({"space": {"lr": "interval(0.1, 1)"}}, "search.space: {lr: {kind: 'float', low: 0.001, high: 1.0, log: True"),
    ({"n_trials": 4}, "search.n_trials: 8 -> 4"),
    ({"device_hours": 1.0, "seed": 2}, "search.device_hours: None -> 1.0; search.seed: 0 -> 2"),
], ids=["seed", "sampler", "pruner", "space", "fewer trials", "two keys"])
def test_a_resume_with_a_changed_search_is_refused_naming_each_key(tmp_path: Path, over: dict[str, object],
                                                                     said: str) -> None:
    path = tmp_path / "search" / "study.log"
    Study(path).create(_search(), "probe", {})
    with pytest.raises(ConfigError) as err:
        Study(path).create(_search(**over), "probe", {})
    assert said in str(err.value) and "HINT" in str(err.value)
    assert read_journal(path).search == _search()  # the run's search is kept as it ran


def test_a_resume_may_grow_the_budget_to_extend_a_search(tmp_path: Path) -> None:
    path = tmp_path / "search" / "study.log"
    assert Study(path).create(_search(), "probe", {}) == []
    assert Study(path).create(_search(), "probe", {}) == []  # the same search: nothing said
    assert Study(path).create(_search(n_trials=12), "probe", {}) == ["search.n_trials: 8 -> 12"]
    assert read_journal(path).search.n_trials == 12


@pytest.mark.parametrize("status, metrics, told", [
    ("completed", {"val_accuracy": 0.8651}, (COMPLETE, 0.8651, None)),
    ("pruned", {}, (PRUNED, None, None)),
    ("failed", {}, (FAILED, None, "failed")),
    ("victim", {}, None),  # to run again: no end to tell from it
    (None, {}, None),  # no record written: the lane died before it
])
def test_a_lane_tells_a_dead_runs_trial_from_the_record_its_training_left(
        tmp_path: Path, status: str | None, metrics: dict[str, float], told: object) -> None:
    run = RunDir(tmp_path / "run")
    s = Study(run.study)
    s.create(_search(), "probe", {"steps": 3})
    row = s.ask(Claimant.here("lane0", None))
    assert isinstance(row, TrialRow)
    tid = trial_training(s.head(), row).training_id
    if status is not None:
        write_json_atomic(run.training_record("lane0", tid), training_record(training_id=tid, status=status,
                                                                            metrics=metrics))
    assert recorded_outcome(run, "lane0", s.head(), row) == told


# ---------------- a preset's search: its own space, its several N measured first (issue 52, item 7) ----------------

@pytest.mark.parametrize("overrides, factors, ladder", [
    (["search=optuna"], "auto", [1, 2, 3, 4]),  # the preset's list: measured first, then the search at the best
    (["search=optuna", "packing.factors=[2]"], [2], None),  # one N: the search streams at it
    (["search=optuna", "packing.factors=auto", "packing.auto.ladder=[1,3]"], "auto", [1, 3]),
    ([], [1, 2, 3, 4], None),  # no search: the grid at each N, as given
])
def test_a_search_given_several_n_measures_them_first(overrides: list[str], factors: object,
                                                      ladder: list[int] | None) -> None:
    from omegaconf import OmegaConf

    from gpupack.sweep.setup.compose import compose_config
    from gpupack.sweep.setup.validate import measured_first

    given = compose_config(["+sweep=mnist_pack", *overrides])
    cfg = measured_first(given)
    assert OmegaConf.to_container(cfg.packing)["factors"] == factors  # type: ignore[index]
    if ladder is not None:
        assert list(cfg.packing.auto.ladder) == ladder
    assert OmegaConf.to_container(given.packing)["factors"] == (  # type: ignore[index]
        OmegaConf.to_container(compose_config(["+sweep=mnist_pack", *overrides]).packing)["factors"])  # type: ignore[index]


def test_the_mnist_preset_searches_its_own_space_as_is(capsys: pytest.CaptureFixture[str]) -> None:
    from gpupack.cli import main

    assert main(["+sweep=mnist_pack", "search=optuna", "dry_run=true"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "a search of 32 trial(s)" in said and "probes N along [1, 2, 3, 4]" in said
    assert "the space (lr, batch_size) chooses each trial's values" in said


def test_a_search_lane_is_admitted_by_memory_as_a_queue_lane_is(tmp_path: Path) -> None:
    """The one lane runner's admission holds for a search's lane: a freed slot asks no trial the memory free would
    not fit while others run (so none is asked and left waiting); the first always goes."""
    from gpupack.core.types import PackSettings
    from gpupack.job.pack import WAIT
    from gpupack.job.stream import AdmissionInputs
    from gpupack.search.lane import SearchLane
    from gpupack.search.plan import search_plan

    run = RunDir(tmp_path / "run")
    Study(run.study).create(_search(), "tests.fake_workloads", {"steps": 1})
    plan = search_plan(sweep="s", workload="tests.fake_workloads", factor=2, partitions=["local"],
                       modes=["process"], jobs=1, n_trials=8)
    free = [300.0]
    lane = SearchLane(run, plan, plan.packs[0], Claimant.here(plan.packs[0].pack_id, None),
                      PackSettings(device="cpu", training_memory_mb=500.0),
                      inputs=AdmissionInputs(lambda: free[0], 10_000.0, False, {}))
    first = lane.next()
    assert first is not WAIT and first is not None  # nothing else runs: waiting would free nothing
    assert lane.next() is WAIT and len(Study(run.study).read().trials) == 1  # 500 MB do not fit 300: not asked
    free[0], lane._looked = 800.0, None  # a training ended: the next look measures again
    assert lane.next() not in (WAIT, None) and lane.admission() == {"budget_mb": 10_000.0, "passed_over": 0,
                                                                        "waits": 1}
