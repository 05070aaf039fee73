"""Honest filler: a pack is filled with new seeds only where the seed reaches the training; a program that takes no
seed has its grid points repeated unchanged, labelled as repeats, and no record claims a seed it never saw."""
from __future__ import annotations

import json
import sys

import pytest

from gpupack.cli import main
from gpupack.core.plan import make_plan
from gpupack.job.workloads import load_workload

COMMAND = load_workload("command")


def _plan(seed_key):
    return make_plan(sweep="s", workload="command", grid={"lr": [0.1]}, fixed={"argv": ["prog"]}, factors=[3],
                     modes=["process"], partitions=["local"], repeats=1, seed_key=seed_key)


def test_without_a_seed_the_filler_repeats_the_point_unchanged_and_says_so():
    plan = _plan(None)
    trainings = plan.packs[0].trainings
    assert [t.params for t in trainings] == [{"argv": ["prog"], "lr": 0.1}] * 3  # no seed added to any
    assert [t.repeat for t in trainings] == [0, 1, 2] and {t.reseed for t in trainings} == {0}
    assert len({t.training_id for t in trainings}) == 3
    assert any("unchanged (labelled repeats" in note for note in plan.notes), plan.notes


def test_with_a_seed_the_filler_gets_new_seeds_as_before():
    plan = _plan("seed")
    trainings = plan.packs[0].trainings
    assert [t.params.get("seed") for t in trainings] == [None, 1000, 2000]
    assert [t.reseed for t in trainings] == [0, 1, 2] and {t.repeat for t in trainings} == {0}
    assert any("with new seeds (seed)" in note for note in plan.notes), plan.notes


@pytest.mark.parametrize("fixed, seed", [
    ({"argv": ["python", "t.py", "--seed", "{seed}"]}, "seed"),
    ({"argv": ["python", "t.py", "--seed={seed:03d}"]}, "seed"),
    ({"argv": ["python", "t.py"], "env": {"SEED": "{seed}"}}, "seed"),
    ({"argv": ["python", "t.py"], "cwd": "/runs/{seed}"}, "seed"),
    ({"argv": ["python", "t.py", "--lr", "{lr}"], "seed": 3}, None),  # a seed hyperparameter the program never sees
    ({"argv": ["python", "t.py", "{{seed}}"]}, None),  # literal braces
])
def test_a_command_takes_a_seed_only_through_a_placeholder(fixed, seed):
    assert COMMAND.filler_seed(fixed) == seed


def test_built_in_workloads_take_their_seed():
    assert load_workload("mnist_torch").filler_seed({}) == "seed"


@pytest.mark.slow
def test_a_command_run_never_records_a_seed_its_program_did_not_see(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["+sweep=command", f"sweep.fixed.argv=[{sys.executable},-c,'print(1)']", "sweep.grid.lr=[0.1]",
                 "packing.factors=[2]", "packing.repeats=1", f"run_dir={run_dir}"])
    assert code == 0, capsys.readouterr()
    recs = [json.loads(p.read_text()) for p in run_dir.glob("packs/*/trainings/*.json")]
    assert len(recs) == 2 and all(r["status"] == "completed" for r in recs)
    assert all("seed" not in r["params"] and r["reseed"] == 0 for r in recs)
    assert sorted(r["repeat"] for r in recs) == [0, 1]
