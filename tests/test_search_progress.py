"""What a run's end and ``status`` say of a search (issue 46): its study's trials against the budget, not the plan's
trainings (a search plans none). The builder, by a table of journals."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpupack.search.options import OptunaSearch
from gpupack.search.progress import progress_of
from gpupack.search.space import Dimension
from gpupack.search.study import COMPLETE, FAILED, PRUNED, RUNNING, Journal, State, TrialRow


def journal(states: list[State], n_trials: int = 4, device_s: float = 0.0,
            device_hours: float | None = None, planned: int = 0) -> Journal:
    """``planned``: the last trials are planned for their lane and not taken (Study.plan_first)."""
    search = OptunaSearch(space={"lr": Dimension("float", 0.1, 1.0)}, metric="val_accuracy", direction="maximize",
                          n_trials=n_trials, device_hours=device_hours)
    trials = {i: TrialRow(i, {"lr": 0.5}, "lane", "inc", 0.0, state=s, value=0.5 if s == COMPLETE else None,
                          device_s=device_s, planned=i >= len(states) - planned) for i, s in enumerate(states)}
    return Journal(search, "w", {}, trials)


@pytest.mark.parametrize("states, more, ok, line", [
    ([COMPLETE] * 3 + [PRUNED], {}, True,
     "search: 4 of 4 trials finished (3 completed, 1 pruned), 0 failed, 0 running: done, the budget of 4 trials is "
     "met"),
    ([COMPLETE, FAILED, COMPLETE, RUNNING, RUNNING], {}, False,
     "search: 2 of 4 trials finished (2 completed, 0 pruned), 1 failed, 2 running: 2 left to finish"),
    ([COMPLETE, COMPLETE, COMPLETE, RUNNING], {}, False,  # the budget is asked for, one trial still runs
     "search: 3 of 4 trials finished (3 completed, 0 pruned), 0 failed, 1 running: 1 left to finish"),
    ([FAILED] * 4, {}, False,
     "search: 0 of 4 trials finished (0 completed, 0 pruned), 4 failed, 0 running: stopped, 4 trials failed, as many "
     "as the budget of 4: the search stops (see their records' errors)"),
    ([COMPLETE], {"device_s": 7200.0, "device_hours": 1.0}, True,
     "search: 1 of 4 trials finished (1 completed, 0 pruned), 0 failed, 0 running: done, 2.000 device-hours spent, "
     "the budget's 1.0"),
    ([], {}, False, "search: 0 of 4 trials finished (0 completed, 0 pruned), 0 failed, 0 running: 4 left to finish"),
    ([COMPLETE] * 3 + [RUNNING], {"planned": 1}, False,  # the command planned it, its lane's job has not started it
     "search: 3 of 4 trials finished (3 completed, 0 pruned), 0 failed, 0 running, 1 waiting for their lane's job: "
     "1 left to finish"),
])
def test_a_searchs_progress_counts_its_trials_against_its_budget(states: list[State], more: dict[str, float],
                                                                 ok: bool, line: str) -> None:
    progress = progress_of(journal(states, **more))  # type: ignore[arg-type]
    assert progress.line() == line and progress.ok is ok


def test_a_stopped_runs_untold_trials_are_said_to_wait_for_its_resume_not_running() -> None:
    progress = progress_of(journal([COMPLETE, RUNNING, RUNNING]))
    assert progress.line(runs=False) == (
        "search: 1 of 4 trials finished (1 completed, 0 pruned), 0 failed, 2 asked by a lane that no longer runs (told "
        "when the run resumes: from their records where written, else failed): 3 left to finish")
    assert "2 running" in progress.line()


@pytest.mark.slow
def test_a_search_run_says_its_trials_at_its_end_and_in_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                ) -> None:
    """From the CLI: the run's last line counts the study's trials (not "0 of 0 trainings of the plan"), it exits 0,
    and status says the same and that nothing is left to resume."""
    from gpupack.cli import main

    run = tmp_path / "run"
    code = main(["+sweep=probe_pack", "hydra.searchpath=[file://tests/conf]", "search=optuna", "search.n_trials=3",
                 "packing.factors=[2]", "packing.jobs=1", "sweep.fixed.steps=2", "search.pruner=none",
                 "+search.space.lr=interval(0.1, 1)", f"run_dir={run}"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    assert out[-1] == "search: 3 of 3 trials finished (3 completed, 0 pruned), 0 failed, 0 running: done, the budget " \
                      "of 3 trials is met"
    assert main(["status", str(run)]) == 0
    said = capsys.readouterr().out
    assert "search: 3 of 3 trials finished (3 completed" in said
    assert "to resume it" not in said and "stopped" not in said
