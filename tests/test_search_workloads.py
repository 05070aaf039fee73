"""The built-in workloads in a search (issue 46): torch's and Keras' trainings report each epoch's validation
accuracy to the study (``TrainingContext.report``), the curve a pruner judges, and the last reported value is the
trial's own. Real trainings at tiny sizes, one search each, from outside as a user runs it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpupack.core.store.rundir import RunDir
from gpupack.search.study import COMPLETE, Study

REPO = Path(__file__).resolve().parent.parent
EPOCHS = 3


@pytest.mark.slow
@pytest.mark.parametrize("sweep, framework", [("mnist_pack", "torch"), ("mnist_tf_pack", "tensorflow")])
def test_a_built_in_workloads_trials_report_every_epoch_to_the_study(
        tmp_path: Path, subprocess_env: dict[str, str], sweep: str, framework: str) -> None:
    pytest.importorskip(framework)
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "gpupack", f"+sweep={sweep}", "search=optuna", "search.n_trials=2",
         "packing.factors=[2]", "packing.modes=[process]", "packing.jobs=1", f"sweep.fixed.epochs={EPOCHS}",
         "sweep.fixed.train_samples=256", "sweep.fixed.val_samples=64", "+search.space.lr=interval(0.01, 0.1)",
         "search.pruner=none", f"run_dir={run}"],
        env=subprocess_env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    journal = Study(RunDir(run).study).read()
    assert sorted(journal.trials) == [0, 1]
    for trial in journal.trials.values():
        assert trial.state == COMPLETE and trial.value is not None
        assert sorted(trial.intermediate) == list(range(EPOCHS)), trial.intermediate  # one value an epoch
        assert all(0.0 <= v <= 1.0 for v in trial.intermediate.values())
        assert trial.intermediate[EPOCHS - 1] == pytest.approx(trial.value)  # the last epoch's is the trial's value
