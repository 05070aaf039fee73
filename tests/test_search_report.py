"""A search's trials in collect and report.html (issue 46, item 5): the trials ranked by their value, the best params up
front, the study's history against trials and device-hours; pure builders (gpupack.results.analysis.search) tested with
tables, then collect of a run whose study and records are written by hand, beside the same run without a study."""
from __future__ import annotations

import math
import re
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.distributions import FloatDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState, create_trial
from rich.console import Console

from gpupack.core.store.records import pack_record, training_record, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.results.analysis.search import history, trial_walls, trials_frame
from gpupack.search.options import OptunaSearch
from gpupack.search.space import Dimension
from gpupack.search.study import Journal, Study, TrialRow, read_journal, trial_training_id
from gpupack.sweep.flow.collect import collect

SEARCH = OptunaSearch(space={"lr": Dimension("float", 0.01, 1.0, log=True)}, metric="val_accuracy",
                      direction="maximize", n_trials=6)
# number → (state, value, device-s the journal was told); the lr of trial k is 0.01 * (k + 1)
TRIALS: dict[int, tuple[str, float | None, float]] = {
    0: ("complete", 0.5, 2.0), 1: ("pruned", 0.2, 0.0), 2: ("complete", 0.9, 3.0), 3: ("failed", None, 0.0),
    4: ("running", None, 0.0), 5: ("complete", 0.7, 1.0)}
STATES = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL,
          "running": TrialState.RUNNING}


def journal(direction: str = "maximize") -> Journal:
    search = OptunaSearch(**{**SEARCH.__dict__, "direction": direction})
    rows = {n: TrialRow(n, {"lr": 0.01 * (n + 1)}, "lane-0", "inc", 0.0, state, value,  # type: ignore[arg-type]
                        device_s=spent) for n, (state, value, spent) in TRIALS.items()}
    return Journal(search, "w", {}, rows)


def test_trial_walls_take_the_latest_attempts_wall_and_every_attempts_device_seconds() -> None:
    trainings = pd.DataFrame({"training_id": ["trial0000-w-a", "trial0000-w-a", "trial0002-w-b", "not-a-trial"],
                              "wall_s": [4.0, 1.5, 3.0, 9.0], "attempt": [0, 1, 0, 0]})
    walls = trial_walls(trainings)
    assert walls.to_dict("index") == {0: {"wall_s": 4.0, "device_s": 5.5}, 2: {"wall_s": 3.0, "device_s": 3.0}}


@pytest.mark.parametrize("direction, ranked", [
    ("maximize", [(1, 2, "complete"), (2, 5, "complete"), (3, 0, "complete"), (None, 1, "pruned"),
                  (None, 3, "failed"), (None, 4, "running")]),
    ("minimize", [(1, 0, "complete"), (2, 5, "complete"), (3, 2, "complete"), (None, 1, "pruned"),
                  (None, 3, "failed"), (None, 4, "running")]),
])
def test_trials_are_ranked_best_first_then_pruned_failed_running(direction: str, ranked: list[tuple[int | None, int,
                                                                                                      str]]) -> None:
    walls = pd.DataFrame({"wall_s": [2.5, 1.2], "device_s": [2.5, 1.2]}, index=pd.Index([0, 1], name="number"))
    t = trials_frame(journal(direction), walls)
    got = [(None if pd.isna(r["rank"]) else int(r["rank"]), int(r["number"]), r["state"]) for _, r in t.iterrows()]
    assert got == ranked
    by = t.set_index("number")
    # the records' walls where a trial has them (the pruned one's too: the journal was told 0), else the journal's
    assert by["wall_s"].to_dict() == pytest.approx({0: 2.5, 1: 1.2, 2: 3.0, 3: math.nan, 4: math.nan, 5: 1.0},
                                                   nan_ok=True)
    assert by.loc[2, "params"] == {"lr": 0.03}


@pytest.mark.parametrize("direction, best", [
    ("maximize", [0.5, 0.5, 0.9, 0.9, 0.9, 0.9]),
    ("minimize", [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]),
])
def test_history_is_the_best_completed_value_so_far_and_the_device_hours_spent(direction: str,
                                                                               best: list[float]) -> None:
    trials = trials_frame(journal(direction), trial_walls(pd.DataFrame()))
    h = history(trials, direction)
    assert h["number"].tolist() == [0, 1, 2, 3, 4, 5]
    assert h["best_so_far"].tolist() == best  # the pruned trial's 0.2 never counts, nor does its step value lead
    assert (h["device_hours"] * 3600).tolist() == pytest.approx([2.0, 2.0, 5.0, 5.0, 5.0, 6.0])


def test_history_starts_empty_until_a_trial_completes() -> None:
    trials = pd.DataFrame({"number": [0, 1], "state": ["failed", "complete"], "value": [math.nan, 0.3],
                           "device_s": [1.0, 1.0]})
    h = history(trials, "maximize")
    assert math.isnan(h["best_so_far"].iloc[0]) and h["best_so_far"].iloc[1] == 0.3


# ---------------- collect of a run: its records and (or not) its study, written by hand ----------------

def write_run(root: Path, study: bool) -> RunDir:
    """A streaming search's run: trials 0-5 as TRIALS say, each completed or pruned one with its training record."""
    run = RunDir(root)
    pack_id = "local-process-n04-s000"
    write_json_atomic(run.plan, {"sweep": "toy", "workload": "w", "grid_size": 6, "packs": [
        {"pack_id": pack_id, "partition": "local", "mode": "process", "factor": 4, "index": 0, "trainings": [],
         "stream": "local-process-n04-search", "search": True}]})
    start = 1_790_000_000.0
    trials = []
    for n, (state, value, _) in TRIALS.items():
        params = {"lr": 0.01 * (n + 1)}
        trials.append(create_trial(state=STATES[state], value=value if state != "failed" else None, params=params,
                                   distributions={"lr": FloatDistribution(0.01, 1.0, log=True)},
                                   user_attrs={"gpupack": {"lane": pack_id, "incarnation": "inc"}, "device_s": 2.0}))
        if state in ("complete", "pruned"):
            tid = trial_training_id("w", n, params)
            write_json_atomic(run.training_record(pack_id, tid), training_record(
                pack_id=pack_id, training_id=tid, workload="w", params=params, mode="process", factor=4,
                partition="local", gpu_type="cpu", status="completed" if state == "complete" else "pruned",
                started_at=start + n, ended_at=start + n + 2.0, metrics={"val_accuracy": value}))
    if study:
        Study(run.study).create(SEARCH, "w", {})
        storage = JournalStorage(JournalFileBackend(str(run.study)))
        optuna.load_study(study_name=None, storage=storage).add_trials(trials)
        with open(run.study, "ab") as f:
            f.write(b'{"op_code": 5, "worker_id": "torn", "tri')  # a writer killed mid-append
    write_json_atomic(run.pack_record(pack_id), pack_record(
        pack_id=pack_id, mode="process", factor=4, partition="local", gpu_type="cpu", wall_s=8.0, complete=True,
        concurrent=4, started_at=start, ended_at=start + 8.0, job_id="7", slots=4, n_completed=4,
        stream="local-process-n04-search"))
    return run


def collected_text(run: RunDir) -> str:
    console = Console(record=True, width=150)
    collect([run.root], console=console)
    return console.export_text()


def test_collect_prints_the_best_trial_first_then_the_trials_ranked(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", study=True)
    before = run.study.read_bytes()
    lines = collected_text(run).splitlines()
    assert lines[0] == "Best trial: lr=0.03 → val_accuracy 0.9 (maximize; trial 2 of 6)"
    assert lines[1].startswith("6 trial(s) asked (budget: 6 finished): 3 complete, 1 pruned, 1 failed, 1 running")
    rows = [re.split(r"\s*│\s*", line.strip()) for line in lines if re.match(r"^\s*\d+ │", line)][:6]
    assert [r[:3] for r in rows] == [["2", "0.9", "complete"], ["5", "0.7", "complete"], ["0", "0.5", "complete"],
                                     ["1", "0.2", "pruned"], ["3", "-", "failed"], ["4", "-", "running"]]
    assert rows[0][3] == "lr=0.03"
    assert run.study.read_bytes() == before  # collect reads the study: its torn line left as it was


def test_report_html_puts_the_search_first_with_its_history_plot(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", study=True)
    collected_text(run)
    page = (run.root / "report.html").read_text()
    search, answer = page.index("<section id='search'>"), page.index("<section id='answer'>")
    assert page.index("<section id='what-ran'>") < search < answer
    section = page[search:answer]
    assert "Best trial: lr=0.03 → val_accuracy 0.9" in section and "data:image/png;base64," in section
    assert (run.root / "plots" / "search_history.png").is_file()
    cells = re.findall(r"<tr><td class=num>(\d+)</td>", section)
    assert cells == ["2", "5", "0", "1", "3", "4"]


@pytest.mark.slow
def test_a_run_without_a_study_reports_as_before(tmp_path: Path) -> None:
    with_study = collected_text(write_run(tmp_path / "a", study=True))
    run = write_run(tmp_path / "b", study=False)
    without = collected_text(run)
    assert "Best trial" not in without and "Trials ranked" not in without
    assert with_study.endswith(without.replace(str(tmp_path / "b"), str(tmp_path / "a")))  # the rest unchanged
    page = (run.root / "report.html").read_text()
    assert "id='search'" not in page and not (run.root / "plots" / "search_history.png").exists()


def test_read_journal_leaves_a_torn_last_line_out_and_reads_no_study_as_none(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", study=True)
    read = read_journal(run.study)
    assert read is not None and sorted(read.trials) == [0, 1, 2, 3, 4, 5]
    assert read_journal(tmp_path / "nothing.log") is None


@pytest.mark.parametrize("params, said", [
    ({"lr": 0.012345678901234}, "lr=0.01235"),  # a sampled float: 4 significant digits, not 16
    ({"train_samples": 60000.0, "batch_size": 64}, "train_samples=60000, batch_size=64"),  # whole: as one, not 6e+04
    ({"model": "mlp", "amp": True, "lr": 1e-05}, "model=mlp, amp=True, lr=1e-05"),
    ({"seed": float("nan")}, "seed=nan"),  # a gap in a table column: said as such
])
def test_hyperparameters_are_said_to_four_significant_digits(params: dict[str, object], said: str) -> None:
    from gpupack.results.report.text import param_text

    assert param_text(params) == said
