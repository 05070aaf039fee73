"""Pruning end to end (issue 46): a search's trials report their curve (``TrainingContext.report``, or a ``command``
program's stdout through search.intermediate), the pruner stops the low ones, which are recorded pruned (neither
failed nor unfinished: the run exits 0) and end before their last step, and the slot a pruned trial frees takes the
next trial at once. Every claim is on the order of events in the records and the study, never on how long they took.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpupack.search.study import COMPLETE, PRUNED, Journal, Study
from tests.test_search import training_records

REPO = Path(__file__).resolve().parent.parent
STEPS, STARTUP = 10, 4


def judged_from(n: int) -> int:
    """A lane of N slots asks trial k (k >= N) as its (k - N + 1)-th trial ends, and the first prune waits for STARTUP
    completed trials: from this number on, STARTUP trials completed before the trial was asked (all that ended, or
    some pruned, which needs as many completed), so the pruner judges its first report."""
    return STARTUP + n - 1


def run_search(cmd: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]  # pruned trials are no failure


def surely_pruned(journal: Journal, key: str, first: int) -> list[int]:
    """The trials the pruner must prune whatever the order the others ended in: judged at their first report (number
    >= ``first``) with a curve (value = slope x step) below every other trial's but one's. The median of the STARTUP
    or more completed curves it is judged against then lies above its own."""
    slopes = {n: float(str(t.params[key])) for n, t in journal.trials.items()}
    return [n for n, s in slopes.items() if n >= first and sum(o < s for o in slopes.values()) <= 1]


def check_budget(journal: Journal, n_trials: int) -> list[int]:
    """The study holds the budget's finished trials, each number once; the pruned ones."""
    assert sorted(journal.trials) == list(range(n_trials))
    assert journal.count(COMPLETE, PRUNED) == n_trials, [(t.number, t.state, t.why) for t in journal.trials.values()]
    return [n for n, t in journal.trials.items() if t.state == PRUNED]


@pytest.mark.slow
def test_a_probe_with_a_low_curve_is_pruned_early_and_its_slot_takes_the_next_trial(
        tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    run = tmp_path / "run"
    run_search([sys.executable, "-m", "gpupack", "+sweep=probe_pack", "hydra.searchpath=[file://tests/conf]",
                "search=optuna", "search.n_trials=16", "packing.factors=[4]", "packing.jobs=1",
                f"sweep.fixed.steps={STEPS}", "sweep.fixed.sleep_s=0.2", "+search.space.curve_slope=interval(0.01, 1)",
                "search.sampler=RandomSampler", "search.pruner=MedianPruner",
                f"+search.pruner_kwargs.n_startup_trials={STARTUP}", f"run_dir={run}"], subprocess_env)
    journal = Study(run / "search" / "study.log").read()
    pruned = check_budget(journal, 16)
    must = surely_pruned(journal, "curve_slope", judged_from(4))
    assert must and set(must) <= set(pruned), (must, pruned)
    recs = {str(r["training_id"]): r for r in training_records(run)}
    assert len(recs) == 16  # each trial ran once
    by_number = {int(tid[5:9]): r for tid, r in recs.items()}
    for n in pruned:  # recorded pruned, ended at the step the study says, before its last
        rec, row = by_number[n], journal.trials[n]
        assert rec["status"] == "pruned" and rec["pruned"]["step"] == max(row.intermediate) < STEPS - 1, rec
        assert rec["throughput"]["steps"] < STEPS
    for n, t in journal.trials.items():  # a completed trial reported its whole curve
        assert t.state == PRUNED or (by_number[n]["status"] == "completed" and len(t.intermediate) == STEPS)
    took_next = [n for n in pruned if _next_in_its_slot(by_number[n], list(recs.values())) is not None]
    assert took_next, "no pruned trial's slot took a next trial"


@pytest.mark.slow
def test_a_trial_that_raises_once_pruned_is_recorded_pruned_not_failed(
        tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """A training that raises once its pruner said stop (as Optuna users raise TrialPruned) ends failed in its own
    process, but the study was told pruned first: the lane records it pruned, the run exits 0, the budget holds."""
    run = tmp_path / "run"
    run_search([sys.executable, "-m", "gpupack", "+sweep=probe_pack", "hydra.searchpath=[file://tests/conf]",
                "search=optuna", "search.n_trials=16", "packing.factors=[4]", "packing.jobs=1",
                f"sweep.fixed.steps={STEPS}", "sweep.fixed.sleep_s=0.1", "+sweep.fixed.raise_when_pruned=true",
                "+search.space.curve_slope=interval(0.01, 1)", "search.sampler=RandomSampler",
                "search.pruner=MedianPruner", f"+search.pruner_kwargs.n_startup_trials={STARTUP}", f"run_dir={run}"],
               subprocess_env)
    journal = Study(run / "search" / "study.log").read()
    pruned = check_budget(journal, 16)
    assert pruned
    by_number = {int(str(r["training_id"])[5:9]): r for r in training_records(run)}
    for n in pruned:
        rec = by_number[n]
        assert rec["status"] == "pruned" and rec["pruned"]["step"] == max(journal.trials[n].intermediate), rec


def _next_in_its_slot(pruned: dict[str, object], recs: list[dict[str, object]]) -> dict[str, object] | None:
    """The trial that took ``pruned``'s slot after it ended, where it started while a trial that ran beside the
    pruned one was still running (it did not wait for them)."""
    end = float(str(pruned["ended_at"]))
    beside = [r for r in recs if r is not pruned and float(str(r["started_at"])) < end < float(str(r["ended_at"]))]
    after = sorted((r for r in recs if r.get("slot") == pruned["slot"] and float(str(r["started_at"])) >= end),
                   key=lambda r: float(str(r["started_at"])))
    if not after or not beside:
        return None
    nxt = after[0]
    assert min(float(str(r["started_at"])) for r in recs if float(str(r["started_at"])) >= end) == \
        float(str(nxt["started_at"])), "the freed slot was not the one the next trial took"
    return nxt if float(str(nxt["started_at"])) < max(float(str(r["ended_at"])) for r in beside) else None


@pytest.mark.slow
def test_a_command_program_whose_printed_curve_is_low_is_stopped(tmp_path: Path,
                                                                subprocess_env: dict[str, str]) -> None:
    run = tmp_path / "run"
    program = REPO / "tests" / "programs" / "curve.py"
    run_search([sys.executable, "-m", "gpupack", "+sweep=command",
                f"sweep.fixed.argv=['{{python}}','{program}','{{slope}}','{STEPS}','0.2']",
                "+sweep.fixed.metrics.val_accuracy='val: ([0-9.]+)'", "search=optuna", "search.n_trials=8",
                "packing.factors=[2]", "packing.jobs=1", "+search.space.slope=interval(0.01, 1)",
                "+sweep.grid.slope=[0.5]",  # the argv's {slope} is checked against the grid (not the space)
                "search.sampler=RandomSampler", "search.pruner=MedianPruner", "collect.goal=max",
                f"+search.pruner_kwargs.n_startup_trials={STARTUP}", "search.intermediate='val: ([0-9.]+)'",
                f"run_dir={run}"], subprocess_env)
    journal = Study(run / "search" / "study.log").read()
    pruned = check_budget(journal, 8)
    must = surely_pruned(journal, "slope", judged_from(2))
    assert must and set(must) <= set(pruned), (must, pruned)
    recs = {int(str(r["training_id"])[5:9]): r for r in training_records(run)}
    for n in pruned:  # stopped by its packer (SIGTERM) before it printed its last line: recorded pruned, not killed
        rec = recs[n]
        assert rec["status"] == "pruned" and rec["signal"] == signal.SIGTERM, rec
        printed = _stdout(run, rec).count("val: ")
        assert rec["pruned"]["step"] == len(journal.trials[n].intermediate) <= printed < STEPS
    for n, t in journal.trials.items():  # the completed ones reported their whole printed curve
        assert t.state == PRUNED or len(t.intermediate) == STEPS


def _stdout(run: Path, rec: dict[str, object]) -> str:
    """A training's stdout log (the local backend keeps it in its lane's folder)."""
    found = list(run.glob(f"packs/*/logs/{rec['training_id']}.out"))
    assert len(found) == 1, found
    return found[0].read_text()
