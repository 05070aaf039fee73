"""packing.remeasure: where no best N can be named, the rounds measured under foreign load are measured again (in
RUN_DIR/again/NN/, new seeds) and the run answers from the quiet ones, within a budget, said, never past it.
Through a programmed device at the submitter seam (tests/test_auto_paired.py): its records are written as a job's."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpupack import sweep
from gpupack.results.analysis.load import load_records
from gpupack.sweep.flow.run import Outcome
from tests.fakes import FakeConfig
from tests.test_auto_paired import PROBE, ProgrammedSubmitter, SlowingDevice

LOADED = (14.0, 1.8)  # N=1 14x slower (N=2 5.3x) beside a neighbour taking 1.8 of the 2 cores


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loaded: int | None, *extra: str) -> tuple[Path, Outcome]:
    """The sweep at N = 1, 2 (3 rounds) on a device loaded for its first ``loaded`` packs (None: the main run's)."""
    import gpupack.sweep.flow.run

    run_dir = tmp_path / "run"
    command = PROBE + ["sweep.grid.lr=[0.1,0.2,0.3]", "packing.factors=[1,2]", "packing.repeats=3",
                       f"run_dir={run_dir}", *extra]
    monkeypatch.setattr(gpupack.sweep.flow.run, "load_submitter",
                        ProgrammedSubmitter.loader(config=FakeConfig(default_partitions=["cpu"])))
    prepared = sweep.prepare(command)
    loaded = len(prepared.plan.packs) if loaded is None else loaded
    monkeypatch.setattr(ProgrammedSubmitter, "device",
                        SlowingDevice({1: 10.0, 2: 6.0}, 0.0, hog={i: LOADED for i in range(loaded)}))
    return run_dir, sweep.run(prepared, plots=False)


def _again(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "again").glob("*") if p.is_dir())


def _said(outcome: Outcome) -> str:
    assert outcome.collected is not None
    return "\n".join(outcome.collected.again_lines)


def test_a_run_all_under_load_measures_its_rounds_again_and_names_the_answer_of_the_quiet_ones(tmp_path, monkeypatch):
    """Every pack of the run ran beside a neighbour: no N can be named from them. Its 3 rounds are measured again once
    (the neighbour gone), on trainings of their own; the answer is N=2 at 1.67x, from the quiet rounds, and the run
    says what it measured again. The same command again submits nothing and answers the same."""
    run_dir, outcome = _run(tmp_path, monkeypatch, None)
    assert outcome.collected is not None and list(outcome.collected.best["factor"]) == [2]
    row = outcome.collected.summary.set_index("factor").loc[2]
    assert row["gain"] == pytest.approx(10 / 6) and not row["beyond_bound"]
    assert _again(run_dir) == ["01"]
    main, again = load_records([run_dir]), load_records([run_dir / "again" / "01"])
    assert {r for r in again.packs["round"]} == {0, 1, 2} and len(again.packs) == len(main.packs) - 1  # no check
    assert not set(again.trainings["training_id"]) & set(main.trainings["training_id"])
    assert "the 3 round(s) measured under foreign load run again on new seeds" in _said(outcome)
    assert "measured again (1 of packing.remeasure=1)" in _said(outcome)
    assert outcome.ok
    again_outcome = sweep.run(sweep.prepare(PROBE + ["sweep.grid.lr=[0.1,0.2,0.3]", "packing.factors=[1,2]",
                                                    "packing.repeats=3", f"run_dir={run_dir}"]), plots=False)
    assert again_outcome.results == [] and _again(run_dir) == ["01"]
    assert again_outcome.collected is not None and list(again_outcome.collected.best["factor"]) == [2]


@pytest.mark.parametrize("remeasure, loaded, measured_again", [
    (0, None, []),  # never: no answer, said as such
    (1, 1000, ["01"]),  # the neighbour stays: measured again once, still no answer
    (2, 1000, ["01", "02"]),  # twice, each time the rounds the last left disturbed
])
@pytest.mark.slow
def test_measuring_again_stops_at_its_budget_and_then_names_no_n(tmp_path, monkeypatch, remeasure, loaded,
                                                                 measured_again):
    run_dir, outcome = _run(tmp_path, monkeypatch, loaded, f"packing.remeasure={remeasure}")
    assert outcome.collected is not None and outcome.collected.best.empty
    assert list(outcome.collected.withheld["factor"]) == [2]
    assert _again(run_dir) == measured_again
    assert ("Measured again" in _said(outcome)) == bool(measured_again)
