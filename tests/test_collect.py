"""Aggregation: known records → known time per training and best N."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from gpupack.core.store.records import pack_record, read_json, training_record, write_json_atomic
from gpupack.core.store.rundir import COLUMNAR, RunDir
from gpupack.results.analysis.load import load_records
from gpupack.results.analysis.summary import best_factors, summarize
from gpupack.results.analysis.tables import best_hyperparameters
from gpupack.sweep.flow.collect import collect


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
    ({1: [10.0, 10.2, 9.8], 3: [27.0, 27.3, 26.7], 5: [40.0, 40.4, 39.6]}, 5, {1: 10.0, 3: 9.0, 5: 8.0}),
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


def _packs(run: RunDir, factor: int, walls: list[float], **kw) -> None:
    """Packs of N completed trainings, one per wall time (several, so the choice has an interval)."""
    for i, wall in enumerate(walls):
        _write_pack(run, factor, i, wall, ["completed"] * factor, **kw)


def test_a_failed_training_excludes_its_n(run):
    _packs(run, 1, [10.0, 10.1, 9.9])
    _write_pack(run, 2, 0, 8.0, ["completed", "failed"])  # fastest, but one training failed
    _packs(run, 3, [27.0, 27.3, 26.7])
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
    assert "1/4 (1 OOM: infeasible)" in console.export_text()


def test_incomplete_pack_gives_no_timing(run):
    _write_pack(run, 1, 0, 10.0, ["completed"])
    _write_pack(run, 2, 0, 4.0, ["completed"], complete=False)  # a resumed pack that ran 1 of 2
    summary = _summary(run).set_index("factor")
    assert math.isnan(summary.loc[2, "time_per_training_s"])
    assert list(best_factors(summary.reset_index())["factor"]) == [1]


def test_best_per_partition_and_mode(run):
    _packs(run, 1, [10.0, 10.1, 9.9], partition="p100")
    _packs(run, 2, [16.0, 16.2, 15.8], partition="p100")
    _packs(run, 1, [10.0, 10.1, 9.9], partition="v100")
    _packs(run, 2, [24.0, 24.2, 23.8], partition="v100")
    best = best_factors(_summary(run)).set_index("partition")["factor"].to_dict()
    assert best == {"p100": 2, "v100": 1}


def test_best_hyperparameters_rank_by_accuracy(run):
    _write_pack(run, 2, 0, 10.0, ["completed", "completed"], lrs=[0.3, 0.7])
    _write_pack(run, 2, 1, 10.0, ["completed", "failed"], lrs=[0.5, 0.9])  # the failed one is not ranked
    hyper = best_hyperparameters(load_records([run.root]).trainings)
    assert (hyper.metric, hyper.goal) == ("val_accuracy", "max")
    assert list(hyper.table["lr"]) == ["0.7", "0.5", "0.3"]


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
    _packs(run, 1, [10.0, 10.1, 9.9, 10.0, 10.05])
    _packs(run, 2, [12.0, 12.1, 11.9, 12.0, 12.05])
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


# ---------------- RGU cost, outputs, many runs ----------------

from gpupack.core.cost.rgu import cost_table, model_from_device_name  # noqa: E402
from gpupack.results.analysis.aggregate import aggregate  # noqa: E402
from gpupack.results.report.files import write_outputs  # noqa: E402


@pytest.mark.parametrize("name, model", [
    ("Tesla P100-PCIE-12GB", "P100-12gb"), ("Tesla P100-PCIE-16GB", "P100-16gb"), ("Tesla T4", "T4-16gb"),
    ("Tesla V100-SXM2-16GB", "V100-16gb"), ("Tesla V100-SXM2-32GB", "V100-32gb"),
    ("NVIDIA A100-SXM4-40GB", "A100-40gb"), ("NVIDIA A100-SXM4-80GB", "A100-80gb"),
    ("NVIDIA H100 80GB HBM3", "H100-80gb"), ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "H100-3g.40gb"),
    ("NVIDIA A100-SXM4-40GB MIG 2g.10gb", "A100-2g.10gb"), ("Intel Xeon", None), (None, None)])
def test_model_from_device_name(name, model):
    assert model_from_device_name(name) == model


# (partition, model, best time per training s) -> RGU-hours per training = s / 3600 * weight
COST_CASES = [
    ([("p100", "P100-12gb", 36.0), ("v100", "V100-16gb", 18.0), ("a100", "A100-40gb", 9.0)], 100,
     {"p100": 0.01, "v100": 0.011, "a100": 0.01}, "a100", "p100"),
    ([("v100", "V100-32gb", 3600.0), ("h100", "H100-80gb", 360.0)], 10, {"v100": 2.6, "h100": 1.22}, "h100", "h100"),
]


@pytest.mark.parametrize("rows, n, rgu_hours, fastest, cheapest", COST_CASES)
def test_cost_table(rows, n, rgu_hours, fastest, cheapest):
    weights = {"P100-12gb": 1.0, "V100-16gb": 2.2, "V100-32gb": 2.6, "A100-40gb": 4.0, "H100-80gb": 12.2}
    best = pd.DataFrame([{"workload": "w", "partition": p, "gpu_type": "g", "gpu_model": m, "mode": "process",
                          "factor": 4, "time_per_training_s": s} for p, m, s in rows])
    cost = cost_table(best, weights, n).set_index("partition")
    for partition, expected in rgu_hours.items():
        assert cost.loc[partition, "rgu_hours_per_training"] == pytest.approx(expected)
        assert cost.loc[partition, "sweep_rgu_hours"] == pytest.approx(expected * n)
    assert cost[cost["fastest"]].index.tolist() == [fastest]
    assert cost[cost["cheapest"]].index.tolist() == [cheapest]


def test_unknown_model_has_no_cost_but_still_a_time():
    best = pd.DataFrame([{"workload": "w", "partition": "x", "gpu_type": "g", "gpu_model": None, "mode": "process",
                          "factor": 2, "time_per_training_s": 7.2}])
    cost = cost_table(best, {"P100-12gb": 1.0}, 50)
    assert math.isnan(cost.loc[0, "rgu_hours_per_training"]) and cost.loc[0, "sweep_hours"] == pytest.approx(0.1)
    assert not cost.loc[0, "cheapest"] and cost.loc[0, "fastest"]


def _write_pack_model(run, partition, model, factor, wall):
    _packs(run, factor, [wall, wall * 1.01, wall * 0.99], partition=partition)  # median: wall
    for p in run.root.glob(f"packs/{partition}-*/trainings/*.json"):
        rec = read_json(p)
        rec["gpu_model"] = model
        rec["throughput"]["curve"] = [[0.5, 100.0], [1.0, 120.0]]
        write_json_atomic(p, rec)


def test_collect_over_two_runs_writes_everything(tmp_path):
    runs = [RunDir(tmp_path / "p100run"), RunDir(tmp_path / "a100run")]
    for n, wall in ((1, 20.0), (2, 30.0)):
        _write_pack_model(runs[0], "p100", "P100-12gb", n, wall)
    for n, wall in ((1, 10.0), (2, 12.0)):
        _write_pack_model(runs[1], "a100", "A100-40gb", n, wall)
    console = Console(record=True, width=250)
    out = tmp_path / "both"
    collect([r.root for r in runs], console=console, weights={"P100-12gb": 1.0, "A100-40gb": 4.0},
            sweep_trainings=100, out=out)
    text = console.export_text()
    assert "Best packing factor for w on p100 (cpu), mode process: N=2 — 15.00 s per training" in text
    assert "Best packing factor for w on a100 (cpu), mode process: N=2 — 6.00 s per training" in text
    assert "about 5 packs per N would settle it (packing.repeats=5)" in text
    assert "finishes first on a100" in text and "costs least on p100 (P100-12gb)" in text
    for name in ("summary.csv", "summary.json", "trainings.parquet", "report.html", "plots/time_per_training.png",
                 "plots/cost.png", "plots/throughput_curves.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert len(pd.read_parquet(out / "trainings.parquet")) == 18
    data = read_json(out / "summary.json")
    cost = {c["partition"]: c for c in data["cost"]}
    assert cost["p100"]["sweep_rgu_hours"] == pytest.approx(100 * 15.0 / 3600 * 1.0)
    assert cost["a100"]["sweep_rgu_hours"] == pytest.approx(100 * 6.0 / 3600 * 4.0)
    html_text = (out / "report.html").read_text()
    assert html_text.count("data:image/png;base64,") == 3 and "Best packing factor for w on a100" in html_text


def test_older_schema_is_refused_with_its_name_and_in_progress_runs_say_what_is_pending(run):
    _write_pack(run, 1, 0, 10.0, ["completed"])
    old = run.training_record("local-process-n01-000", "old")
    write_json_atomic(old, {"schema": 0, "kind": "training", "status": "completed"})
    write_json_atomic(run.plan, {"grid_size": 3, "packs": [{"pack_id": "local-process-n01-000"},
                                                           {"pack_id": "local-process-n02-000"}]})
    c = aggregate([run.root])
    assert any(str(old) in w and "schema 0" in w for w in c.records.warnings)
    assert c.records.pending == [f"{run.root}:local-process-n02-000"] and c.sweep_trainings == 3
    written = write_outputs(c, run.root, plots=False)
    assert read_json(run.summary_json)["pending_packs"] == [f"{run.root}:local-process-n02-000"]
    assert run.summary_csv in written


@pytest.mark.parametrize("field", ["loader_alone", "probe"])  # probe: the field's name in an earlier gpupack's records
def test_loader_bound_and_knob_table(run, field):
    from gpupack.results.analysis.tables import knob_table

    def write(pack_id, factor, rate, knobs, setting, alone=False, wall=10.0):
        for i in range(factor):
            write_json_atomic(run.training_record(pack_id, f"t{i}"), training_record(
                pack_id=pack_id, training_id=f"{pack_id}-{i}", workload="w", params={"lr": 0.1, **knobs},
                mode="process", factor=factor, partition="local", gpu_type="cpu", status="completed",
                **{field: alone}, knobs=knobs, loader_setting=setting, timings={"startup_s": 1, "loop_s": 2},
                throughput={"samples": 1000, "samples_per_s": rate}, metrics={"val_accuracy": 0.9}))
        write_json_atomic(run.pack_record(pack_id), pack_record(
            pack_id=pack_id, mode="process", factor=factor, partition="local", gpu_type="cpu", wall_s=wall,
            complete=True, **{field: alone}, sampler={"source": "cpu", "cpu_percent_mean": 150.0}))

    write("local-loader-n01-000", 1, 1000.0, {"batch_size": 64}, "bs64", alone=True, wall=1.0)
    write("local-loader-n01-001", 1, 4000.0, {"batch_size": 256}, "bs256", alone=True, wall=1.0)
    write("local-process-n01-000", 1, 950.0, {"batch_size": 64}, "bs64")
    write("local-process-n01-001", 1, 2000.0, {"batch_size": 256}, "bs256")
    write("local-process-n02-000", 2, 500.0, {"batch_size": 64}, "bs64", wall=12.0)
    rec = load_records([run.root])
    summary = summarize(rec.trainings, rec.packs).set_index("factor")
    assert list(summary.index) == [1, 2]  # the loader alone is not in the packing table
    assert summary.loc[1, "cpu_percent_mean"] == 150.0
    assert summary.loc[1, "loader_bound_samples_per_s"] == pytest.approx(2500.0)  # median of the loader's runs alone
    knobs = knob_table(rec.trainings).set_index(["batch_size", "factor"])
    assert knobs.loc[("64", 1), "loader_bound_samples_per_s"] == 1000.0
    assert bool(knobs.loc[("64", 1), "loader_bound"]) is True  # 950 >= 0.9 x 1000: the loader is the limit
    assert bool(knobs.loc[("256", 1), "loader_bound"]) is False  # 2000 < 0.9 x 4000
    assert bool(knobs.loc[("64", 2), "loader_bound"]) is False


def test_sweep_size_of_a_multirun_adds_up_its_launches(tmp_path):
    """Optuna launches a multirun in batches (one gpupack run each): the sweep costed is all of them."""
    from gpupack.core.plan import plan_in_order
    from gpupack.results.analysis.load import load_records

    for first, n in ((0, 2), (2, 2), (4, 1)):
        run = RunDir(tmp_path / "mr" / ".gpupack" / f"launch_{first:06d}")
        plan = plan_in_order(sweep="app", workload="w", params=[{"job_num": first + i} for i in range(n)], factor=2,
                             partition="local", mode="process")
        write_json_atomic(run.plan, plan.to_json())
    other = RunDir(tmp_path / "other")
    write_json_atomic(other.plan, plan_in_order(sweep="s", workload="w", params=[{"k": 1}], factor=1,
                                                partition="local", mode="process").to_json())
    records = load_records([tmp_path / "mr" / ".gpupack" / f"launch_{k:06d}" for k in (0, 2, 4)] + [other.root])
    assert records.grid_sizes == {str(tmp_path / "mr" / ".gpupack"): 5, str(other.root): 1}


# ---------------- the columnar file of each pack (issue 14, item 10) ----------------

import os  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pyarrow as pa  # noqa: E402

from gpupack.core.store.columnar import ColumnarReader, Rows, write_columnar  # noqa: E402
from gpupack.results.analysis.load import Records  # noqa: E402


def read_columnar(pack_dir: Path) -> tuple[Rows, dict] | None:
    return ColumnarReader().read(str(pack_dir))


def _varied_run(run: RunDir) -> list[str]:
    """Packs whose records differ in every way a column can: statuses, OOMs, failures with errors, lists and dicts,
    ints in one pack and floats in another, a field only some records have, an earlier attempt. Returns pack ids."""
    _packs(run, 1, [10.0, 10.1, 9.9])
    _write_pack(run, 2, 0, 12.0, ["completed", "oom"])
    _write_pack(run, 2, 1, 11.0, ["completed", "failed"], lrs=[0.3, 0.7])
    _write_pack_model(run, "p100", "P100-12gb", 2, 20.0)
    for i, path in enumerate(sorted(run.root.glob("packs/*/trainings/*.json"))):
        rec = read_json(path)
        rec["cpus"] = [i % 2, 1]  # a list (process mode's CPU affinity)
        rec["knobs"] = {"batch_size": 64 if i % 3 else 128}
        rec["exit_code"] = 0 if rec["status"] == "completed" else 1
        rec["error"] = None if rec["status"] == "completed" else f"RuntimeError: boom {i}\nlast line {i}"
        rec["metrics"]["train_loss"] = 1 if i % 2 else 0.5  # an int in some packs, a float in others
        if i % 4 == 0:
            rec["phase"] = "run"
        rec["marker"] = i if "-n01-" in path.parent.parent.name else f"m{i}"  # an int in some packs, text in others
        write_json_atomic(path, rec)
    resumed = "local-process-n02-001"  # its failed training ran again: the first attempt moves under attempts/1/
    first = run.training_record(resumed, "w-2-1-1")
    (run.pack_dir(resumed) / "attempts" / "1").mkdir(parents=True)
    os.replace(first, run.pack_dir(resumed) / "attempts" / "1" / first.name)
    os.replace(run.pack_record(resumed), run.pack_dir(resumed) / "attempts" / "1" / "pack.json")
    _write_pack(run, 2, 1, 10.5, ["completed", "completed"], lrs=[0.3, 0.7])
    return sorted(p.name for p in run.root.glob("packs/*"))


def _same(a: Records, b: Records) -> None:
    pd.testing.assert_frame_equal(a.with_detached(a.trainings), b.with_detached(b.trainings))  # the curves and logs too
    pd.testing.assert_frame_equal(a.packs, b.packs)
    assert a.warnings == b.warnings


def test_columnar_files_give_the_same_records_and_summary_as_the_json(run):
    pack_ids = _varied_run(run)
    from_json = load_records([run.root], columnar=False)
    for pack_id in pack_ids:
        assert write_columnar(run, pack_id) == run.pack_dir(pack_id) / COLUMNAR
        assert read_columnar(run.pack_dir(pack_id)) is not None  # current: collect reads it, not the JSON
    from_columnar = load_records([run.root])
    _same(from_json, from_columnar)
    in_path_order = [read_json(p)["training_id"] for p in sorted(run.root.glob("packs/*/trainings/*.json"))]
    assert list(from_columnar.latest()["training_id"]) == in_path_order  # as the JSON records were always read
    assert set(from_columnar.trainings["attempt"]) == {0, 1}  # the earlier attempt is still read, from its JSON
    assert from_columnar.with_detached(from_columnar.trainings)["curve"].notna().any()
    pd.testing.assert_frame_equal(summarize(from_json.trainings, from_json.packs),
                                  summarize(from_columnar.trainings, from_columnar.packs))
    assert best_hyperparameters(from_json.trainings).table.equals(best_hyperparameters(from_columnar.trainings).table)


def test_columnar_files_are_what_collect_reads(run, monkeypatch):
    pack_ids = _varied_run(run)
    for pack_id in pack_ids:
        write_columnar(run, pack_id)
    import gpupack.core.store.columnar as collect_mod

    read = []
    real = collect_mod.read_json
    monkeypatch.setattr(collect_mod, "read_json", lambda path: read.append(path) or real(path))
    load_records([run.root])
    assert all("attempts" in str(path) for path in read), read  # only the earlier attempt's JSON records


def test_a_pack_with_records_newer_than_its_columnar_file_is_read_from_its_json(run):
    """A resumed pack: its training records changed after its columnar file was written."""
    _packs(run, 1, [10.0, 10.1, 9.9])
    pack_id = "local-process-n01-001"
    write_columnar(run, pack_id)
    record = run.training_record(pack_id, "w-1-1-0")
    rec = read_json(record)
    rec["status"] = "failed"
    write_json_atomic(record, rec)
    stamp = os.stat(run.pack_dir(pack_id) / COLUMNAR).st_mtime_ns
    os.utime(record.parent, ns=(stamp + 10**6, stamp + 10**6))  # a later clock tick than the columnar file's
    assert read_columnar(run.pack_dir(pack_id)) is None
    loaded = load_records([run.root])
    assert loaded.trainings.set_index("training_id").loc["w-1-1-0", "status"] == "failed"
    _same(loaded, load_records([run.root], columnar=False))
    os.replace(run.pack_record(pack_id), run.pack_dir(pack_id) / "moved.json")  # a resume moved pack.json aside
    os.utime(record.parent, ns=(stamp, stamp))
    assert read_columnar(run.pack_dir(pack_id)) is None


@pytest.mark.parametrize("bad", [{"pack": "text"}, {"rows": "many"}, {"shared": 3}])
def test_a_columnar_file_whose_tail_is_of_another_shape_is_read_from_its_json(run, bad):
    """The JSON after a columnar file's batch is built key by key as it is read: a pack row that is no object, a
    count that is no number or shared values that are no list make collect read the pack's JSON records instead."""
    _packs(run, 1, [10.0, 10.1, 9.9])
    pack_id = "local-process-n01-001"
    path = write_columnar(run, pack_id)
    data = path.read_bytes()
    start = data.rindex(b'{"pack": ')
    stamp = os.stat(path).st_mtime_ns
    path.write_bytes(data[:start] + json.dumps({**json.loads(data[start:]), **bad}).encode())
    os.utime(path, ns=(stamp, stamp))  # rewritten, not newer: only its tail differs
    assert read_columnar(run.pack_dir(pack_id)) is None
    _same(load_records([run.root]), load_records([run.root], columnar=False))


def test_a_pack_with_a_bad_record_gets_no_columnar_file_and_collect_still_warns(run):
    _packs(run, 1, [10.0])
    pack_id = "local-process-n01-000"
    torn = run.training_record(pack_id, "torn")
    torn.write_text('{"schema": 1, "kind": "trai')
    assert write_columnar(run, pack_id) is None and not (run.pack_dir(pack_id) / COLUMNAR).exists()
    assert any(str(torn) in w for w in load_records([run.root]).warnings)


def test_the_pack_job_writes_the_columnar_file_with_its_pack_record(run):
    from gpupack.core.monitor import DeviceInfo
    from gpupack.core.plan import plan_in_order
    from gpupack.job.records import write_pack_record

    plan = plan_in_order(sweep="s", workload="w", params=[{"lr": 0.1}, {"lr": 0.2}], factor=2, partition="local",
                         mode="process")
    pack = plan.packs[0]
    records = []
    for t in pack.trainings:
        rec = training_record(pack_id=pack.pack_id, training_id=t.training_id, workload="w", params=dict(t.params),
                              mode="process", factor=2, partition="local", gpu_type="cpu", status="completed",
                              started_at=1.0, ended_at=5.0, timings={"startup_s": 1.0, "loop_s": 3.0})
        write_json_atomic(run.training_record(pack.pack_id, t.training_id), rec)
        records.append(rec)
    write_pack_record(run, pack, records, DeviceInfo(kind="cpu", name="cpu"), "cpu", cores=2, threads=1)
    table, pack_row = read_columnar(run.pack_dir(pack.pack_id))
    assert table.rows == 2 and pack_row["wall_s"] == 4.0 and pack_row["complete"] is True
    _same(load_records([run.root]), load_records([run.root], columnar=False))


def test_a_pack_job_writes_its_columnar_files_without_importing_pandas(run, tmp_path):
    """Arrow's pa.array imports pandas to ask whether its input is a pandas object (apache/arrow#34994): 0.4 s of a
    core at the end of every pack job, whose columnar files are its only use of Arrow. A job writes them, a pack's and
    a lane's, with pandas never imported, and they read as the JSON records do."""
    from gpupack.core.store.journal import append_records
    from gpupack.core.store.lane_columnar import read_lane_columnar

    pack_ids = _varied_run(run)
    lane = RunDir(tmp_path / "lane")
    append_records(lane, "lane-a", [read_json(p) for p in sorted(run.root.glob("packs/*/trainings/*.json"))])
    code = ("import sys; from pathlib import Path; from gpupack.core.store.columnar import write_columnar; "
            "from gpupack.core.store.lane_columnar import write_lane_columnar; "
            "from gpupack.core.store.rundir import RunDir; "
            "run, lane, *packs = map(Path, sys.argv[1:]); "
            "print([write_columnar(RunDir(run), p.name) is not None for p in packs], "
            "write_lane_columnar(RunDir(lane), 'lane-a'), 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(run.root), str(lane.root), *pack_ids], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == f"{[True] * len(pack_ids)} True False", out.stdout + out.stderr
    _same(load_records([run.root], columnar=False), load_records([run.root]))
    assert read_lane_columnar(lane, "lane-a", ColumnarReader()) is not None


@pytest.mark.parametrize("kind, values", [
    ("float64", [0.1, -0.0, 5e-324, 1.7976931348623157e308, float("nan"), float("inf"), float("-inf"), None, 3]),
    ("int64", [-(2 ** 63), 2 ** 63 - 1, 0, None]),
    ("bool_", [True, False, None]),
    ("large_string", ["", "é ü 漢", 'a"b\\n', "\x00\x1f", None, "x" * 10_000]),
    ("null", [None, None]),
])
def test_the_json_readers_arrays_are_pa_arrays_own(kind, values):
    """A job builds its columns by Arrow's JSON reader (pandas not imported), collect by pa.array: the same arrays."""
    from gpupack.core.store.columnar import _json_arrays

    arrow_type = getattr(pa, kind)() if kind != "large_string" else pa.large_string()
    (read,) = _json_arrays({"c": (arrow_type, values)}, len(values)) or [None]
    assert read is not None and read.type == arrow_type
    assert read.equals(pa.array(values, arrow_type)) or (kind == "float64" and _same_floats(read, values))


@pytest.mark.parametrize("by_json", [False, True])  # collect's pa.array; a pack job's JSON reader
@pytest.mark.parametrize("name", ["wall_s", "x"])  # a known float field, and a column of ints and floats
def test_an_int_a_double_cannot_hold_stays_whole_in_json_either_way(name, by_json, monkeypatch):
    """pa.array refuses an int over 2**53 in a float column (a double would round it), and such a column has always
    been JSON text, whole; Arrow's JSON reader would round it silently: both builders give the JSON column."""
    import gpupack.core.store.columnar as columnar

    if by_json:
        monkeypatch.setattr(columnar, "typed_arrays", lambda columns, rows: columnar._json_arrays(columns, rows))
    rows = [{"t": "a", name: 0.5}, {"t": "b", name: 2 ** 53 + 1}, {"t": "c", name: -(2 ** 53)}]
    batch = columnar.split_rows(rows).batch
    assert batch.column_names == ["t", f"json:{name}"]
    assert batch.column(1).to_pylist() == ["0.5", str(2 ** 53 + 1), str(-(2 ** 53))]
    assert columnar.column(name, [2 ** 53, 0.5])[0] == name  # a double holds it: a float column
    assert columnar.column(name, [2 ** 53 + 2, 0.5])[0] == f"json:{name}"


def _same_floats(read: pa.Array, values: list) -> bool:  # NaN is not equal to itself: compared by bits
    return [struct.pack("<d", v) if v is not None else None for v in read.to_pylist()] == \
        [struct.pack("<d", float(v)) if v is not None else None for v in values]


def test_collect_is_pure_it_imports_no_report_and_prints_nothing():
    """Aggregation is records in, frames out: report builds on collect, and the CLI and sweep print and write."""
    code = ("import sys, gpupack.results.analysis.aggregate; "
            "bad = [m for m in ('gpupack.results.report', 'gpupack.cli', 'rich', 'matplotlib') if m in sys.modules]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    import ast

    import gpupack.results.analysis.aggregate as collect_mod

    tree = ast.parse(Path(collect_mod.__file__).read_text())
    body = [n for n in tree.body if not (isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))]
    calls = {ast.unparse(n.func) for node in body for n in ast.walk(node) if isinstance(n, ast.Call)}
    assert not calls & {"print", "console.print", "Console"}, calls


# ---------------- collect at every moment of a run (issue 14, item 1) ----------------

def _detached_run(root: Path) -> RunDir:
    """A run right after wait=false: its plan and config, one training recorded, no pack finished."""
    from gpupack.core.plan import make_plan

    run = RunDir(root)
    plan = make_plan(sweep="s", workload="w", grid={"lr": [0.1, 0.2]}, fixed={}, factors=[1, 2], modes=["process"],
                     partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    run.config.write_text("cluster:\n  name: local\n  backend: local\n")
    pack, training = plan.packs[0], plan.packs[0].trainings[0]
    write_json_atomic(run.training_record(pack.pack_id, training.training_id), training_record(
        pack_id=pack.pack_id, training_id=training.training_id, workload="w", params=dict(training.params),
        mode="process", factor=pack.factor, partition="local", gpu_type="cpu", status="completed", started_at=0.0,
        ended_at=1.0, timings={"startup_s": 0.5, "loop_s": 0.5}, metrics={"val_accuracy": 0.5}))
    return run


def test_collect_right_after_wait_false_says_what_is_pending(tmp_path, capsys):
    from gpupack.cli import main

    run = _detached_run(tmp_path / "run")
    assert main(["collect", str(run.root)]) == 0  # with plots: the plot of no finished pack raised here
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "error" not in out.err, out.err
    assert "No pack has finished yet: 0 of 4 planned pack(s) have a record, 4 pending." in out.out, out.out
    assert "1 training record(s) so far" in out.out and f"python -m gpupack status {run.root}" in out.out


@pytest.mark.parametrize("with_config", [True, False])  # without: the RGU table comes from gpupack's own conf/
def test_collect_from_the_cli_imports_nothing_of_the_planning_side(tmp_path, with_config):
    """``python -m gpupack collect`` reads records and writes tables: Hydra's composition, submitit and the run flow
    are the planning side's, a quarter of a second of a 1 M collect's 5 s (issue 53) that it does not pay."""
    run = _detached_run(tmp_path / "run")
    if not with_config:
        run.config.unlink()
    planning = ("hydra", "submitit", "gpupack.submit", "gpupack.sweep.flow.run", "gpupack.sweep.setup.compose")
    code = (f"import sys; from gpupack.cli import main; code = main(['collect', {str(run.root)!r}, '--no-plots']); "
            f"print('LOADED', [m for m in {planning!r} if m in sys.modules], code)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "No pack has finished yet" in out.stdout, out.stdout + out.stderr  # it collected
    assert out.stdout.strip().splitlines()[-1] == "LOADED [] 0", out.stdout + out.stderr


def test_every_name_gpupack_sweep_declares_resolves_from_its_module():
    """gpupack.sweep names its flow's names twice, for the type checker (imports under TYPE_CHECKING) and for the first
    use (its module's sets): a name in one and not the other type-checks and fails where a caller first reads it."""
    import ast

    import gpupack.sweep as facade

    tree = ast.parse(Path(facade.__file__).read_text())
    typed = {a.asname or a.name for node in tree.body if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(
        node.test) for imp in node.body if isinstance(imp, ast.ImportFrom) for a in imp.names} - {"ProgressFn"}
    assert typed >= set(facade.__all__) - {"run"}, set(facade.__all__) - typed
    unresolved = [name for name in sorted(typed) if not hasattr(facade, name)]
    assert unresolved == [], unresolved


def test_collect_on_an_empty_directory_says_there_is_nothing_yet(tmp_path, capsys):
    from gpupack.cli import main

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["collect", str(empty)]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err and f"Nothing to collect yet in {empty}" in out.out, out.out + out.err


@pytest.mark.parametrize("rows, planned, counts", [
    ([("p", "a", "completed"), ("p", "b", "failed")], ["a", "b"], (2, 1, 1, 0, True)),
    ([("p", "a", "completed")], ["a", "b"], (2, 1, 0, 0, False)),  # b has no record: not done
    ([("p", "a", "skipped_memory", None)], ["a"], (1, 0, 0, 1, True)),  # skipped, run nowhere else: N infeasible
    ([("p", "a", "skipped_memory", "p.n01-000")], ["a"], (1, 0, 0, 0, False)),  # its refit has not recorded it yet
    ([("p", "a", "skipped_memory", "p.n01-000"), ("p.n01-000", "a", "completed")], ["a"],
     (1, 1, 0, 0, True)),  # ran in its refit pack: counted for the pack it refits
    ([("p", "a", "completed"), ("p", "z", "completed")], ["a"], (1, 1, 0, 0, True)),  # a record of no planned one
    ([], ["a"], (1, 0, 0, 0, False)),
    ([("q", "a", "completed")], [("p", "a"), ("q", "a")], (2, 1, 0, 0, False)),  # one grid point at N=1 and N=4:
    ([("lane-s001", "a", "completed", None, "queue")], [("queue", "a")], (1, 1, 0, 0, True)),  # ran in pack q only
])
def test_plan_counts_count_the_plans_trainings_by_their_current_record(rows, planned, counts):
    """Each training of each pack (a streamed one of its queue) by its own current record: the same grid point
    completed in pack q does not make pack p's training done."""
    from gpupack.results.analysis.load import plan_counts

    latest = pd.DataFrame([{"run_dir": "r", "pack_id": r[0], "training_id": r[1], "status": r[2],
                            "runs_in": r[3] if len(r) > 3 else None, "stream": r[4] if len(r) > 4 else None}
                           for r in rows])
    got = plan_counts(latest, {"r": [p if isinstance(p, tuple) else ("p", p) for p in planned]})
    assert (got.planned, got.completed, got.failed, got.skipped, got.done) == counts
    assert got.line().startswith("done:" if got.done else "not done:")
