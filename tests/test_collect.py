"""Aggregation: known records → known time per training and best N."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from gpupack.collect import best_factors, best_hyperparameters, collect, load_records, summarize
from gpupack.records import pack_record, read_json, training_record, write_json_atomic
from gpupack.rundir import RunDir


def _write_pack(run: RunDir, factor: int, index: int, wall: float, statuses: list[str], mode: str = "process",
                partition: str = "local", lrs: list[float] | None = None, complete: bool = True) -> None:
    pack_id = f"{partition}-{mode}-n{factor:02d}-{index:03d}"
    for i, status in enumerate(statuses):
        lr = (lrs or [0.1] * factor)[i]
        tid = f"w-{factor}-{index}-{i}"
        write_json_atomic(run.training_record(pack_id, tid), training_record(
            pack_id=pack_id, training_id=tid, workload="w", params={"lr": lr, "seed": i}, mode=mode,
            factor=factor, partition=partition, gpu_type="cpu", status=status, started_at=0.0, ended_at=wall,
            timings={"startup_s": 1.0, "loop_s": wall - 1.0}, throughput={"samples": 1000, "samples_per_s": 10.0},
            metrics={"val_accuracy": lr}))
    write_json_atomic(run.pack_record(pack_id), pack_record(
        pack_id=pack_id, mode=mode, factor=factor, partition=partition, gpu_type="cpu", wall_s=wall,
        complete=complete, concurrent=len(statuses)))


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    return RunDir(tmp_path / "run")


def _summary(run: RunDir) -> pd.DataFrame:
    rec = load_records([run.root])
    return summarize(rec.trainings, rec.packs)


# (N, pack walls) -> time per training median = median(wall / N)
CASES = [
    ({1: [10.0, 12.0], 2: [12.0, 14.0], 4: [30.0, 34.0]}, 2, {1: 11.0, 2: 6.5, 4: 8.0}),
    ({1: [10.0], 3: [27.0], 5: [40.0]}, 5, {1: 10.0, 3: 9.0, 5: 8.0}),
    ({1: [5.0, 5.0, 8.0], 2: [12.0, 12.0, 12.0]}, 1, {1: 5.0, 2: 6.0}),
]


@pytest.mark.parametrize("walls, best_n, tpt", CASES)
def test_time_per_training_and_best_n(run, walls, best_n, tpt):
    for n, ws in walls.items():
        for i, w in enumerate(ws):
            _write_pack(run, n, i, w, ["completed"] * n)
    summary = _summary(run)
    got = dict(zip(summary["factor"], summary["time_per_training_s"]))
    assert got == pytest.approx(tpt)
    best = best_factors(summary)
    assert list(best["factor"]) == [best_n]
    row1 = summary[summary["factor"] == 1].iloc[0]
    assert row1["speedup_vs_n1"] == pytest.approx(1.0)
    rowb = summary[summary["factor"] == best_n].iloc[0]
    assert rowb["speedup_vs_n1"] == pytest.approx(tpt[1] / tpt[best_n])
    assert rowb["trainings_per_hour"] == pytest.approx(3600 / tpt[best_n])


def test_a_failed_training_excludes_its_n(run):
    _write_pack(run, 1, 0, 10.0, ["completed"])
    _write_pack(run, 2, 0, 8.0, ["completed", "failed"])  # fastest, but one training failed
    _write_pack(run, 3, 0, 27.0, ["completed"] * 3)
    summary = _summary(run)
    assert int(summary.set_index("factor").loc[2, "failed"]) == 1
    assert list(best_factors(summary)["factor"]) == [3]


def test_an_oom_is_counted_apart_and_makes_its_n_infeasible(run):
    _write_pack(run, 1, 0, 10.0, ["completed"])
    _write_pack(run, 4, 0, 8.0, ["completed", "completed", "oom", "completed"])
    _write_pack(run, 2, 0, 12.0, ["completed", "failed"])
    summary = _summary(run).set_index("factor")
    assert summary.loc[4, "oom"] == 1 and summary.loc[4, "failed"] == 1
    assert summary.loc[2, "oom"] == 0 and summary.loc[2, "failed"] == 1
    assert list(best_factors(summary.reset_index())["factor"]) == [1]
    console = Console(record=True, width=250)
    collect([run.root], console=console)
    assert "1 (1 OOM: infeasible)" in console.export_text()


def test_incomplete_pack_gives_no_timing(run):
    _write_pack(run, 1, 0, 10.0, ["completed"])
    _write_pack(run, 2, 0, 4.0, ["completed"], complete=False)  # a resumed pack that ran 1 of 2
    summary = _summary(run).set_index("factor")
    assert math.isnan(summary.loc[2, "time_per_training_s"])
    assert list(best_factors(summary.reset_index())["factor"]) == [1]


def test_best_per_partition_and_mode(run):
    _write_pack(run, 1, 0, 10.0, ["completed"], partition="p100")
    _write_pack(run, 2, 0, 16.0, ["completed"] * 2, partition="p100")
    _write_pack(run, 1, 0, 10.0, ["completed"], partition="v100")
    _write_pack(run, 2, 0, 24.0, ["completed"] * 2, partition="v100")
    best = best_factors(_summary(run)).set_index("partition")["factor"].to_dict()
    assert best == {"p100": 2, "v100": 1}


def test_best_hyperparameters_rank_by_accuracy(run):
    _write_pack(run, 2, 0, 10.0, ["completed", "completed"], lrs=[0.3, 0.7])
    _write_pack(run, 2, 1, 10.0, ["completed", "failed"], lrs=[0.5, 0.9])  # the failed one is not ranked
    hyper = best_hyperparameters(load_records([run.root]).trainings)
    assert list(hyper["lr"]) == ["0.7", "0.5", "0.3"]


def test_torn_and_foreign_files_are_skipped_with_their_name(run):
    _write_pack(run, 1, 0, 10.0, ["completed"])
    torn = run.training_record("local-process-n01-000", "torn")
    torn.write_text('{"schema": 1, "kind": "trai')
    foreign = run.training_record("local-process-n01-000", "foreign")
    foreign.write_text('{"hello": "world"}')
    rec = load_records([run.root])
    assert len(rec.trainings) == 1
    assert any(str(torn) in w for w in rec.warnings)
    assert any(str(foreign) in w for w in rec.warnings)


def test_collect_prints_best_line_and_writes_summaries(run):
    _write_pack(run, 1, 0, 10.0, ["completed"])
    _write_pack(run, 2, 0, 12.0, ["completed"] * 2)
    console = Console(record=True, width=200)
    collect([run.root], console=console)
    text = console.export_text()
    assert "Best packing factor for w on local (cpu), mode process: N=2" in text
    assert "6.00 s per training" in text
    assert run.summary_csv.exists()
    data = read_json(run.summary_json)
    assert data["best"][0]["factor"] == 2
    assert pd.read_csv(run.summary_csv)["factor"].tolist() == [1, 2]


def test_only_incomplete_packs_gives_a_table_without_timing(run):
    _write_pack(run, 2, 0, 4.0, ["completed"], complete=False)  # a resumed pack that ran 1 of 2
    summary = _summary(run)
    assert len(summary) == 1 and math.isnan(summary.loc[0, "time_per_training_s"])
    assert best_factors(summary).empty
