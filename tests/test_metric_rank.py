"""Your metric decides: best hyperparameters ranked by any metric a training reported (collect.metric), towards the
goal the user gives (collect.goal) or the Optuna sweeper's direction; where none is known, it says so and how to give
one."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from gpupack import sweep
from gpupack.cli import main
from gpupack.core.goal import check_metric, goal_hint, suggested_goal
from gpupack.errors import ConfigError
from gpupack.hydra_launch import sweeper_goal
from gpupack.results.analysis.tables import best_hyperparameters

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "tests" / "hydra_app" / "app.py"


def frame(rows: list[tuple[dict, dict]], status: str = "completed") -> pd.DataFrame:
    """Trainings of one workload: (params, metrics) a row, as collect's frame holds them (JSON text)."""
    return pd.DataFrame({"workload": "command", "training_id": [f"t{i}" for i in range(len(rows))], "status": status,
                         "loader_alone": False, "params": [json.dumps(p) for p, _ in rows],
                         "metrics": [json.dumps(m) for _, m in rows]})


LOSSES = [({"lr": 0.1}, {"loss": 0.5}), ({"lr": 0.01}, {"loss": 0.2}), ({"lr": 0.001}, {"loss": 0.9})]


@pytest.mark.parametrize("goal, order", [("min", ["0.01", "0.1", "0.001"]), ("max", ["0.001", "0.1", "0.01"])])
def test_ranked_by_the_metric_named_towards_its_goal(goal, order):
    r = best_hyperparameters(frame(LOSSES), metric="loss", goal=goal)
    assert (r.metric, r.goal, r.note) == ("loss", goal, "")
    assert list(r.table["lr"]) == order and "loss" in r.table
    # A goal against the name ranks as given, and says so with the other goal as its fix
    assert r.caution == ("" if goal == "min" else
                         "The goal max ranks highest loss first, though its name reads as lower is better. "
                         "HINT: if so, --goal min (collect.goal=min in a sweep)")


SUGGESTED = [  # metric name -> the goal its name suggests (None: neither, or both)
    ("val_acc", "max"), ("val_accuracy", "max"), ("top1accuracy", "max"), ("valAcc", "max"), ("f1", "max"),
    ("macro-F1", "max"), ("roc_auc", "max"), ("precision@5", "max"), ("recall", "max"), ("mean_iou", "max"),
    ("bleu4", "max"), ("loss", "min"), ("val_loss", "min"), ("valloss", "min"), ("test_error", "min"),
    ("err", "min"), ("perplexity", "min"), ("mse", "min"), ("val_mae", "min"), ("rmse", "min"),
    ("score", None), ("return_value", None), ("accumulated", None), ("interval", None), ("terrain_height", None),
    ("acc_loss", None), ("reward", None),
]


@pytest.mark.parametrize("metric, goal", SUGGESTED)
def test_a_metrics_name_suggests_its_goal(metric, goal):
    assert suggested_goal(metric) == goal


HINTS = [  # metric -> the HINT for a missing goal: the suggested goal first, else both
    ("val_acc", "collect.goal=max ('val_acc' reads as higher is better; collect.goal=min if not)"),
    ("val_loss", "collect.goal=min ('val_loss' reads as lower is better; collect.goal=max if not)"),
    ("score", "collect.goal=max if higher score is better, collect.goal=min if lower is"),
]


@pytest.mark.parametrize("metric, hint", HINTS)
def test_the_hint_for_a_missing_goal_follows_the_name(metric, hint):
    assert goal_hint(metric) == hint
    rows = [({"lr": 0.1}, {metric: 0.5}), ({"lr": 0.2}, {metric: 0.7})]
    note = best_hyperparameters(frame(rows)).note
    assert f"HINT: {hint}; python -m gpupack collect RUN_DIR --metric {metric} --goal " \
           f"{suggested_goal(metric) or 'max|min'}" in note, note


def test_the_one_metric_reported_is_ranked_once_its_goal_is_known():
    r = best_hyperparameters(frame(LOSSES), goal="min")
    assert r.metric == "loss" and list(r.table["lr"])[0] == "0.01"


NOT_RANKED = [  # (rows, metric, goal) -> words the note must hold
    (LOSSES, None, None, ["which way is better for 'loss'", "collect.goal=min"]),
    ([({"lr": 0.1}, {}), ({"lr": 0.2}, {})], None, None, ["reported no metric", "sweep.fixed.metrics",
                                                          "collect.metric=NAME"]),
    (LOSSES, "accuracy", "max", ["collect.metric='accuracy' is no metric the trainings reported (loss)"]),
    ([({"lr": 0.1}, {"a": 1, "b": 2}), ({"lr": 0.2}, {"a": 2, "b": 1})], None, None, ["several (a, b)"]),
    ([({"seed": 0}, {"loss": 1}), ({"seed": 1}, {"loss": 2})], "loss", "min", ["only the seed varies"]),
]


@pytest.mark.parametrize("rows, metric, goal, words", NOT_RANKED)
def test_what_is_not_ranked_says_why_and_how_to_fix_it(rows, metric, goal, words):
    r = best_hyperparameters(frame(rows), metric=metric, goal=goal)
    assert r.table.empty
    for w in words:
        assert w in r.note, r.note


def test_val_accuracy_is_ranked_highest_first_by_default():
    rows = [({"lr": 0.1}, {"val_accuracy": 0.8, "train_loss": 0.3}), ({"lr": 0.2}, {"val_accuracy": 0.9,
                                                                                   "train_loss": 0.4})]
    r = best_hyperparameters(frame(rows))
    assert (r.metric, r.goal) == ("val_accuracy", "max") and list(r.table["lr"]) == ["0.2", "0.1"]


def test_a_hydra_jobs_hyperparameters_are_its_overrides_not_its_job_number():
    rows = [({"overrides": [f"lr={lr}", "epochs=1"], "job_num": i, "launch_dir": "/x", "cwd": "/y", "app_dir": "/z"},
             {"return_value": lr * 10}) for i, lr in enumerate([0.3, 0.1, 0.2])]
    r = best_hyperparameters(frame(rows), goal="min")
    assert r.metric == "return_value" and list(r.table["lr"]) == ["0.1", "0.2", "0.3"]
    assert "job_num" not in r.table and "epochs" not in r.table  # epochs never varied


class Direction:  # the Optuna sweeper's enum, as its config holds it
    def __init__(self, name: str) -> None:
        self.name = name


@pytest.mark.parametrize("sweeper, goal", [
    ({"direction": "minimize"}, "min"), ({"direction": "maximize"}, "max"),
    ({"direction": Direction("minimize")}, "min"),
    ({"direction": ["maximize", "minimize"]}, "max"), ({}, None), ({"direction": None}, None)])
def test_the_optuna_sweepers_direction_is_the_default_goal(sweeper, goal):
    assert sweeper_goal(sweeper) == goal
    assert sweeper_goal(SimpleNamespace()) is None


def test_a_bad_goal_is_one_line_before_anything_runs(tmp_path, capsys):
    code = main(["+sweep=mnist_pack", "collect.goal=sideways", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "collect.goal='sideways'" in err and "HINT" in err, err
    assert not (tmp_path / "run").exists()
    code = main(["collect", str(tmp_path), "--goal", "sideways"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--goal='sideways'" in err, err


# A real MNIST run in seconds (were the refusal gone, the run would start and its directory appear)
TINY_MNIST = ["sweep.fixed.train_samples=256", "sweep.fixed.val_samples=128", "sweep.fixed.epochs=1",
              "packing.repeats=1", "packing.factors=[1]", "sweep.grid.batch_size=[128]"]
CHECKED = [  # (metric, reported, key) -> the error's text, or None where it passes
    ("val_accuracy", ("train_loss", "val_accuracy"), "collect.metric", None),
    ("anything", (), "collect.metric", None),  # nothing known to check against: not refused
    ("val_acc", ("train_loss", "val_accuracy"), "collect.metric",
     "collect.metric='val_acc': w's trainings report no such metric (they report train_loss, val_accuracy). "
     "HINT: collect.metric=val_accuracy"),
    ("trian_loss", ("train_loss", "val_accuracy"), "--metric",
     "--metric='trian_loss': w's trainings report no such metric (they report train_loss, val_accuracy). "
     "HINT: --metric train_loss"),
    ("zzz", ("train_loss", "val_accuracy"), "--metric", "HINT: --metric val_accuracy"),  # none close: the default
    ("zzz", ("loss", "f1"), "--metric", "HINT: --metric loss"),  # none close, no val_accuracy: the first
]


@pytest.mark.parametrize("metric, reported, key, error", CHECKED)
def test_a_metric_is_checked_against_those_reported(metric, reported, key, error):
    if error is None:
        check_metric(metric, reported, key, "w's trainings")
        return
    with pytest.raises(ConfigError) as err:
        check_metric(metric, reported, key, "w's trainings")
    assert error in str(err.value) and len(str(err.value).splitlines()) == 1


def test_a_metric_the_workload_never_reports_is_refused_before_anything_runs(tmp_path, capsys):
    code = main(["+sweep=mnist_pack", *TINY_MNIST, "collect.metric=val_acc", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "collect.metric='val_acc': mnist_torch's trainings report no such metric" in err, err
    assert err.endswith("HINT: collect.metric=val_accuracy"), err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides", [
    # a program's metrics ($GPUPACK_RESULT, sweep.fixed.metrics) are known once it ran
    ["+sweep=command", "sweep.fixed.argv=[python,examples/train.py,--lr,'{lr}']", "+sweep.grid.lr=[0.1]"],
    [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack"],  # a user's workload declares none
], ids=["command", "user workload"])
def test_a_workload_that_cannot_know_its_metrics_refuses_none(overrides):
    assert sweep.prepare([*overrides, "collect.metric=my_score"]).spec is not None


@pytest.mark.slow
def test_a_hydra_multirun_is_ranked_by_its_return_value(tmp_path, subprocess_env):
    sweep_dir = tmp_path / "mr"
    proc = subprocess.run([sys.executable, str(APP), "-m", "hydra/launcher=gpupack_local", "hydra.launcher.pack=3",
                           "lr=0.3,0.1,0.2", "sleep_s=0", f"hydra.sweep.dir={sweep_dir}"], capture_output=True,
                          text=True, cwd=tmp_path, env=subprocess_env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    def collect(*more: str) -> str:
        out = subprocess.run([sys.executable, "-m", "gpupack", "collect", str(sweep_dir), "--no-plots", *more],
                             capture_output=True, text=True, env=subprocess_env, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    unsaid = collect()  # the basic sweeper has no direction: which way is better is not guessed
    assert "which way is better for 'return_value' is not known" in unsaid, unsaid
    ranked = collect("--goal", "min")
    assert "Best hyperparameters by return_value (lowest first" in ranked, ranked
    lines = [line for line in ranked.splitlines() if "return_value=" in line]
    assert [line.split("lr=")[1].split()[0] for line in lines] == ["0.1", "0.2", "0.3"], ranked
