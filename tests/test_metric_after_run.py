"""A metric the run did not ask for, read after the run from each training's kept stdout (issue 28):
`collect --metric NAME --pattern REGEX`, for whole packs and streamed lanes, records left as they were."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupack import sweep
from gpupack.cli import main
from gpupack.errors import ConfigError
from gpupack.results.analysis.load import load_records, with_stdout_metric

REPO = Path(__file__).resolve().parent.parent
PROBE = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack", "sweep.grid.lr=[0.1,0.2,0.4]",
         "++sweep.fixed.say='final score: {lr}'", "packing.repeats=1"]


@pytest.mark.parametrize("extra", [
    ["packing.factors=[1,2]"],
    ["packing.factors=[2]", "packing.stream=on", "packing.jobs=2"],  # lane 0 drains lane 1's share: logs at home
], ids=["whole packs", "streamed"])
@pytest.mark.slow
def test_a_metric_read_from_the_kept_stdout_after_the_run(tmp_path, capsys, extra):
    run_dir = tmp_path / "run"
    sweep.run(sweep.prepare([*PROBE, *extra, f"run_dir={run_dir}"]), collect_outputs=False, plots=False)
    before = {p: p.read_bytes() for p in run_dir.rglob("*.json") if p.name != "rank.json"}
    records = load_records([run_dir])
    assert not any("score" in json.loads(m) for m in records.trainings["metrics"])  # not asked for at run time
    read = with_stdout_metric(records, "score", r"score: ([0-9.]+)")
    got = [(json.loads(p)["lr"], json.loads(m)["score"]) for p, m in zip(read.trainings["params"],
                                                                          read.trainings["metrics"])]
    assert got and all(lr == score for lr, score in got)  # the last match wins: the final score, not epoch 1's
    assert main(["collect", str(run_dir), "--no-plots", "--metric", "score", "--goal", "max",
                 "--pattern", r"score: ([0-9.]+)", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "Best hyperparameters by score" in out and "lr=0.4  score=0.4" in out, out
    assert {p: p.read_bytes() for p in run_dir.rglob("*.json") if p.name != "rank.json"} == before  # records kept
    assert json.loads((run_dir / "rank.json").read_text())["pattern"] == r"score: ([0-9.]+)"  # remembered beside


@pytest.mark.slow
def test_what_a_training_reported_wins_and_a_pattern_needs_a_metric(tmp_path):
    run_dir = tmp_path / "run"
    sweep.run(sweep.prepare([*PROBE, "packing.factors=[1]", f"run_dir={run_dir}"]), collect_outputs=False,
              plots=False)
    records = load_records([run_dir])
    read = with_stdout_metric(records, "val_accuracy", r"score: ([0-9.]+)")  # reported by the probe: min(lr, 1)
    assert [json.loads(m)["val_accuracy"] for m in read.trainings["metrics"]] == \
        [json.loads(m)["val_accuracy"] for m in records.trainings["metrics"]]
    with pytest.raises(ConfigError, match="no --metric names it"):
        sweep.collect([run_dir], metric=None, pattern="score: (x)", plots=False, out=tmp_path / "o")
    with pytest.raises(ConfigError, match="has 2 groups"):
        with_stdout_metric(records, "score", "(a)(b)")


@pytest.mark.slow
def test_a_run_with_no_known_rgu_says_so_in_a_line_with_no_table_of_dashes(tmp_path, capsys):
    run_dir = tmp_path / "run"
    sweep.run(sweep.prepare([*PROBE, "packing.factors=[1]", f"run_dir={run_dir}"]), collect_outputs=False,
              plots=False)
    assert main(["collect", str(run_dir), "--no-plots", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "no RGU weight is known for cpu" in out and "finishes first on local" in out, out
    assert "Cost at the best N" not in out and "no bundle known" not in out, out
