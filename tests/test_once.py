"""Checks once per value (issue 53 item 1): a check of a training's hyperparameters runs once per distinct reading of
the grid (gpupack.sweep.setup.once), never over the product of axes it does not read; every training is still
checked."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import pytest

from gpupack import sweep
from gpupack.cli import main
from gpupack.errors import ConfigError
from gpupack.job.workloads import _mnist_data
from gpupack.sweep.setup.once import each_reading

GRID: dict[str, list[object]] = {"model": ["mlp", "cnn", "big"], "lr": [0.1, 0.2, 0.3, 0.4], "seed": list(range(50))}
FIXED = {"data_dir": "/data", "batch_size": 64}


@dataclass(frozen=True)
class Params:
    model: str = "mlp"
    lr: float = 0.1
    seed: int = 0
    data_dir: str = ""
    batch_size: int = 64


def _model_only(p: Mapping[str, Any]) -> object:
    return p["model"]


def _lr_for_big(p: Mapping[str, Any]) -> object:  # reads lr only where the model is big
    return (p["model"], p["lr"]) if p["model"] == "big" else p["model"]


def _all_at_once(p: Mapping[str, Any]) -> object:  # a copy of the whole mapping: every axis read
    return json.dumps({**p}, sort_keys=True)


def _fails_big_high_lr(p: Mapping[str, Any]) -> object:  # a combination refused: only big with lr > 0.25
    if p["model"] == "big" and p["lr"] > 0.25:
        raise ConfigError("lr", p["lr"], "too high for the big model", "lr=0.2")
    return None


def _dumps_plain(p: Mapping[str, Any]) -> object:  # json.dumps takes a dict only: the recording cannot be dumped
    return json.dumps(p, sort_keys=True)  # type: ignore[arg-type]


def _field(p: Params) -> object:  # attribute reads of a frozen dataclass
    return (p.model, p.lr) if p.model == "cnn" else p.data_dir


def _every_point(fn: Callable[[Any], object], build: Callable[[dict[str, object]], object] = dict) -> set[str]:
    """What ``fn`` says of every training of the grid, walked whole."""
    return {repr(fn(build({**FIXED, **dict(zip(GRID, combo))}))) for combo in itertools.product(*GRID.values())}


@pytest.mark.parametrize("fn, build, points, fallback", [
    (_model_only, dict, 3, False),  # 600 trainings, 3 models: 3 calls
    (_lr_for_big, dict, 12, False),  # the big model reads lr: model x lr is walked, the seeds never
    (_all_at_once, dict, 600, False),  # it reads every axis: the whole product, as before
    (_dumps_plain, dict, 600, True),  # the recording cannot follow it: the whole product with plain values
    (_field, lambda v: Params(**v), 12, False),  # a frozen dataclass's fields, read as attributes
], ids=["one axis read", "an axis read for one value", "everything read", "not recordable", "dataclass"])
def test_each_reading_is_checked_once_and_every_trainings_result_is_among_them(fn, build, points, fallback):
    counted: list[object] = []

    def counting(arg: Any) -> object:
        counted.append(arg)
        return fn(arg)

    results = each_reading(counting, GRID, FIXED, build)
    assert {repr(r) for _, r in results} == _every_point(fn, build)  # every training's result, no other
    assert len({json.dumps(p, sort_keys=True) for p, _ in results}) == len(results) == points  # each point once
    # each point called once; where the recording could not follow: its first call, that call plain, then the walk
    assert len(counted) == points + (2 if fallback else 0)


def test_a_combination_refused_is_found_though_neither_value_is_refused_alone():
    with pytest.raises(ConfigError) as refused:
        each_reading(_fails_big_high_lr, GRID, FIXED)
    assert refused.value.key == "lr" and refused.value.value in (0.3, 0.4)


def test_an_empty_grid_checks_nothing():
    assert each_reading(_model_only, {}, FIXED) == [] and each_reading(_model_only, {"lr": []}, FIXED) == []


def test_a_sweep_of_20000_trainings_looks_for_its_data_once(monkeypatch, capsys):
    """mnist_pack with 200 learning rates x 100 seeds: the data folder is looked at once, not once a training."""
    looked: list[object] = []
    real = _mnist_data.find_files
    monkeypatch.setattr(_mnist_data, "find_files", lambda d: looked.append(d) or real(d))
    lrs = ",".join(f"{0.0001 * (i + 1):.4f}" for i in range(200))
    prepared = sweep.prepare(["+sweep=mnist_pack", f"sweep.grid.lr=[{lrs}]", "sweep.grid.seed=range(0,100)",
                              "sweep.grid.batch_size=[64]", "packing.factors=[4]", "dry_run=true"])
    assert prepared.spec is not None and len(prepared.spec.grid["lr"]) == 200
    assert len(looked) == 1


@pytest.mark.parametrize("override, needle", [
    ("sweep.grid.lr=[0.1,nan]", "sweep.grid.lr=nan: is not a finite number. HINT: give lr a number"),
    ("sweep.grid.lr=[0.1,inf]", "sweep.grid.lr=inf: is not a finite number"),
    ("sweep.fixed.momentum=-inf", "sweep.fixed.momentum=-inf: is not a finite number"),
    ("sweep.grid.lr=[0.1,-0.5]", "sweep.grid.lr=-0.5: mnist_torch's lr must be"),  # a range, checked as a value
    ("~sweep.fixed.model +sweep.grid.model=[mlp,nope]", "sweep.grid.model='nope': unknown model"),  # its own check
])
def test_a_bad_value_of_a_large_grid_is_one_line_and_nothing_runs(override, needle, capsys, tmp_path):
    run = tmp_path / "run"  # a dry run: a value let through would be planned, said and written nowhere, never run
    code = main(["+sweep=mnist_pack", "sweep.grid.seed=range(0,500)", *override.split(), "dry_run=true",
                 f"run_dir={run}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and needle in err, err
    assert not run.exists()


@pytest.mark.parametrize("values, twice", [
    (["a", "b", "c"], None),
    ([0.1, 0.2, 0.1], "0.1"),
    ([1, 2, 1.0], "1.0"),  # equal numbers are one value, as == has them
    ([["python", "a.py"], ["python", "b.py"], ["python", "a.py"]], "['python', 'a.py']"),  # unhashable: by value
    ([{"A": "1"}, {"A": "2"}], None),
    (list(range(100_000)) + [99_999], "99999"),  # an axis of 100,000 values, checked in one pass
])
def test_a_value_listed_twice_is_named(values, twice):
    from gpupack.errors import require_unique

    if twice is None:
        require_unique(values, "sweep.grid.x", "a grid value", "value")
        return
    with pytest.raises(ConfigError) as refused:
        require_unique(values, "sweep.grid.x", "a grid value", "value")
    assert refused.value.key == "sweep.grid.x" and f"a grid value is listed twice ({twice})" in refused.value.why
