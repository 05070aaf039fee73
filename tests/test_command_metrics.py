"""An unmodified script's metrics, read from its stdout (sweep.fixed.metrics: name → regular expression, the last
match wins), are recorded and ranked like any reported metric; a pattern gpupack cannot use is refused before
anything runs."""
from __future__ import annotations

import json

import pytest

from gpupack.cli import main
from gpupack.sweep.flow.collect import collect

PRINTS = ("print('Test set: Average loss: 0.5000, Accuracy: 10/100'); "
          "print('Test set: Average loss: {loss}, Accuracy: 9897/10000')")


def _run(tmp_path, *more: str) -> int:
    return main(["+sweep=command", f"sweep.fixed.argv=['{{python}}',-c,\"{PRINTS}\"]",
                 '+sweep.fixed.metrics.loss="Average loss: ([0-9.]+)"',
                 '+sweep.fixed.metrics.correct="Accuracy: (?P<value>[0-9]+)/"', *more, "packing.factors=[1]",
                 "packing.repeats=1", f"run_dir={tmp_path / 'run'}"])


@pytest.mark.slow
def test_metrics_read_from_stdout_last_match_wins_and_rank(tmp_path, capsys):
    assert _run(tmp_path, "sweep.grid.loss=[0.0315,0.2]") == 0, capsys.readouterr()
    recs = {r["params"]["loss"]: r for r in (json.loads(p.read_text())
                                             for p in (tmp_path / "run").glob("packs/*/trainings/*.json"))}
    assert recs[0.0315]["metrics"] == {"loss": pytest.approx(0.0315), "correct": 9897.0}
    assert recs[0.2]["metrics"]["loss"] == pytest.approx(0.2)
    c, _ = collect([tmp_path / "run"], plots=False, metric="loss", goal="min")
    assert list(c.hyper.table["loss"]) == ["0.0315", "0.2"]  # the hyperparameter, as text
    assert list(c.hyper.table["loss (metric)"]) == [pytest.approx(0.0315), pytest.approx(0.2)]


BAD = [
    ('+sweep.fixed.metrics.loss="(unclosed"', "sweep.fixed.metrics.loss='(unclosed'", "not a regular expression"),
    ('+sweep.fixed.metrics.loss="loss: [0-9.]+"', "sweep.fixed.metrics.loss=", "has 0 groups"),
    ('+sweep.fixed.metrics.loss="(a)(b)"', "sweep.fixed.metrics.loss=", "has 2 groups"),
]


@pytest.mark.parametrize("override, key, why", BAD)
def test_a_pattern_gpupack_cannot_use_is_one_line_before_anything_runs(tmp_path, capsys, override, key, why):
    code = main(["+sweep=command", "sweep.fixed.argv=['{python}',-c,'print(1)']", override, "sweep.grid.lr=[0.1]",
                 f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and key in err and why in err and "HINT" in err, err
    assert not (tmp_path / "run").exists()
