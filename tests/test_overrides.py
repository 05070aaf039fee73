"""Command-line overrides change what runs (checked on the plan, which is what gets submitted)."""
from __future__ import annotations

import pytest

from gpupack.sweep import prepare


def _plan(*overrides: str):
    return prepare(["+sweep=mnist_pack", *overrides]).plan


def test_default_sweep():
    plan = _plan()
    assert sorted({p.factor for p in plan.packs}) == [1, 2, 3, 4]
    assert plan.grid_size == 4
    assert {p.mode for p in plan.packs} == {"process"}


@pytest.mark.parametrize(
    "overrides, factors, grid_size, lrs",
    [
        (["packing.factors=[1,2,4]"], [1, 2, 4], 4, {0.05, 0.1}),
        (["sweep.grid.lr=[0.1,0.01]"], [1, 2, 3, 4], 4, {0.1, 0.01}),
        (["sweep.grid.lr=0.3,0.2,0.1"], [1, 2, 3, 4], 6, {0.3, 0.2, 0.1}),  # Hydra sweep syntax on a grid key
        (["sweep.grid.seed=range(0,3)"], [1, 2, 3, 4], 12, {0.05, 0.1}),
        (["packing.factors=[5]", "sweep.grid.batch_size=[32]"], [5], 2, {0.05, 0.1}),
    ],
)
def test_overrides_change_the_plan(overrides, factors, grid_size, lrs):
    plan = _plan(*overrides)
    assert sorted({p.factor for p in plan.packs}) == factors
    assert plan.grid_size == grid_size
    assert {t.params["lr"] for p in plan.packs for t in p.trainings} == lrs


def test_fixed_values_are_typed_and_defaults_filled():
    plan = _plan("sweep.fixed.epochs=3")
    params = plan.packs[0].trainings[0].params
    assert params["epochs"] == 3 and params["hidden"] == 128 and params["data_dir"] is None
