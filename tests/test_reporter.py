"""The reporter: steady throughput leaves warm-up out; the curve has one point per window. And the report collect
prints (gpupack/results/report/): the main table fits 120 columns, a shared host is said, seeds are not ranked."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from gpupack.core import workload
from gpupack.core.store.records import pack_record, training_record, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.results.analysis.aggregate import aggregate
from gpupack.results.report.files import write_outputs
from gpupack.results.report.terminal import render, summary_table


def test_steady_throughput_excludes_warmup_and_curve_has_windows(monkeypatch):
    clock = iter([0.0] + [0.0 + 0.1 * i for i in range(1, 101)] + [10.0])
    monkeypatch.setattr(workload.time, "time", lambda: next(clock))
    rep = workload.Reporter(warmup_steps=10, curve_window_s=1.0)
    rep.loop_started()
    for _ in range(100):
        rep.step(32)
    rep.loop_ended()
    out = rep.summary()
    assert out["steps"] == 100 and out["samples"] == 3200 and out["warmup_excluded"]
    # steps 11..100 (90 x 32 samples) between step 10 (t=1.0) and the end (t=10.0)
    assert out["samples_per_s"] == pytest.approx(90 * 32 / 9.0)
    assert len(out["curve"]) == 10 and out["curve"][0] == (1.0, 320.0)


def test_too_few_steps_falls_back_to_the_whole_loop(monkeypatch):
    clock = iter([0.0, 0.5, 1.0, 2.0])
    monkeypatch.setattr(workload.time, "time", lambda: next(clock))
    rep = workload.Reporter(warmup_steps=10)
    rep.loop_started()
    rep.step(10)
    rep.step(10)
    rep.loop_ended()
    out = rep.summary()
    assert out["samples_per_s"] == pytest.approx(10.0) and not out["warmup_excluded"]


def test_long_trainings_keep_a_bounded_curve(monkeypatch):
    ticks = iter(range(10**6))
    monkeypatch.setattr(workload.time, "time", lambda: float(next(ticks)))
    rep = workload.Reporter(warmup_steps=1, curve_window_s=1.0, curve_points=16)
    rep.loop_started()
    for _ in range(1000):
        rep.step(5)
    rep.loop_ended()
    curve = rep.summary()["curve"]
    assert 8 <= len(curve) <= 16
    assert all(rate == pytest.approx(5.0) for _, rate in curve[:-1])  # 5 samples per 1 s tick, however merged
    assert 0 < curve[-1][1] <= 5.0  # the last, partial window
    assert [t for t, _ in curve] == sorted(t for t, _ in curve)


def test_a_loop_that_reports_no_samples_has_no_throughput():
    """A Hydra job (or any training that never calls step): samples/s is unknown, not 0."""
    rep = workload.Reporter()
    rep.loop_started()
    rep.loop_ended()
    assert rep.summary()["samples_per_s"] is None



# ---------------- the report (issue 14, item 11) ----------------

def _pack(run: RunDir, partition: str, factor: int, index: int, wall: float, statuses: list[str],
          params: list[dict], host: str = "node1", gpu: str = "Tesla V100-SXM2-16GB", model: str = "V100-16gb") -> None:
    pack_id = f"{partition}-process-n{factor:02d}-{index:03d}"
    for i, status in enumerate(statuses):
        write_json_atomic(run.training_record(pack_id, f"t{factor}-{index}-{i}"), training_record(
            pack_id=pack_id, training_id=f"{partition}-{factor}-{index}-{i}", workload="mnist_torch",
            params=params[i], mode="process", factor=factor, partition=partition, gpu_type=gpu, gpu_model=model,
            status=status, started_at=0.0, ended_at=wall, host=host,
            timings={"startup_s": 1.234, "loop_s": wall - 1.234},
            throughput={"samples": 60000, "samples_per_s": 23456.7}, metrics={"val_accuracy": 0.9 + 0.001 * i},
            memory={"peak_rss_mb": 1234.5}))
    write_json_atomic(run.pack_record(pack_id), pack_record(
        pack_id=pack_id, mode="process", factor=factor, partition=partition, gpu_type=gpu, wall_s=wall,
        complete=True, concurrent=len(statuses), host=host,
        sampler={"source": "nvml", "gpu_util_mean": 87.6, "gpu_mem_used_peak_mb": 12345.0}))


def _sweep(run: RunDir, partitions: tuple[str, ...] = ("v100",), grid: bool = True, host: str = "node1") -> None:
    """N = 1, 2, 4 over several packs each, an OOM at N=4: the widest cells the table has."""
    for partition in partitions:
        for factor, wall in ((1, 123.45), (2, 150.0), (4, 260.0)):
            for index in range(3):
                statuses = ["completed"] * factor
                if factor == 4 and index == 0:
                    statuses[-1] = "oom"
                params = [{"lr": 0.1 * (1 + (i % 2 if grid else 0)), "seed": index * factor + i} for i in range(factor)]
                _pack(run, partition, factor, index, wall * (1 + 0.01 * index), statuses, params, host=host)


def _render(run_dirs: list[Path], wide: bool = False) -> str:
    console = Console(record=True, width=250 if wide else 120)  # --wide is for a wide terminal
    render(aggregate(run_dirs), console, wide=wide)
    return console.export_text()


def test_the_main_table_fits_120_columns_and_wide_shows_every_column(tmp_path):
    run = RunDir(tmp_path / "run")
    _sweep(run, partitions=("v100", "a100"), host="node1")
    c = aggregate([run.root])
    console = Console(record=True, width=120)
    table = summary_table(c.summary, "t", set())
    assert console.measure(table).maximum <= 120  # its natural width: no cell wraps
    text = _render([run.root])
    lines = text.splitlines()
    assert max(map(len, lines)) <= 120
    rows = [line for line in lines if line.lstrip().startswith(("v100 (V100-16gb)", "a100 (V100-16gb)"))]
    assert len(rows) == len(c.summary) == 6  # one line per row: none wrapped
    assert "1/12 (1 OOM: infeasible)" in text and "start/loop s" not in text and "util %" not in text
    assert "│ 2* │" in text and "│  1 │" in text  # N marked, between column rules
    assert "2 x oom: oom" in text  # no error text: the status says why, never "nan"
    wide = _render([run.root], wide=True)
    assert "start/loop s" in wide and "util %" in wide and "gpu 88" in wide
    write_outputs(c, run.root, plots=False)
    csv = pd.read_csv(run.summary_csv)
    assert {"startup_s", "loop_s", "gpu_util_mean", "samples_per_s", "tpt_ci_low_s", "oom"} <= set(csv.columns)


def test_collect_takes_wide(tmp_path, capsys):
    from gpupack.cli import main

    run = RunDir(tmp_path / "run")
    _sweep(run)
    assert main(["collect", str(run.root), "--no-plots"]) == 0
    assert "start/loop s" not in capsys.readouterr().out
    assert main(["collect", str(run.root), "--no-plots", "--wide"]) == 0
    assert "start/loop s" in capsys.readouterr().out


SHARED = "sharing its cores"


def test_packs_of_several_partitions_on_one_host_are_said_to_share_its_cores(tmp_path):
    run = RunDir(tmp_path / "run")
    _sweep(run, partitions=("p100", "v100"), host="slurm-test")
    lines = [line for line in _render([run.root]).splitlines() if SHARED in line]
    assert len(lines) == 1 and "slurm-test" in lines[0] and len(lines[0]) <= 120


def test_the_local_test_cluster_is_said_to_share_cores_even_with_one_partition(tmp_path):
    run = RunDir(tmp_path / "run")
    _sweep(run, partitions=("v100",), host="me")
    assert SHARED not in _render([run.root])  # one partition on one host: nothing says the packs shared cores
    run.config.write_text("cluster:\n  name: slurm\n  backend: slurm\n  nodes_share_one_host: true\n  partitions:\n"
                          "    p100: {gpu: p100}\n    v100: {gpu: v100}\n    a100: {gpu: a100}\n")
    assert SHARED in _render([run.root])


def test_packs_on_different_hosts_are_not_said_to_share(tmp_path):
    runs = [RunDir(tmp_path / "a"), RunDir(tmp_path / "b")]
    _sweep(runs[0], partitions=("p100",), host="n1")
    _sweep(runs[1], partitions=("v100",), host="n2")
    assert SHARED not in _render([r.root for r in runs])


def test_no_real_grid_ranks_no_seeds(tmp_path):
    run = RunDir(tmp_path / "run")
    _sweep(run, grid=False)  # one grid point, repeated with different seeds
    text = _render([run.root])
    assert "Best hyperparameters by val_accuracy" not in text and "seed=" not in text
    assert "Best hyperparameters: nothing to rank" in text
    other = RunDir(tmp_path / "grid")
    _sweep(other, grid=True)
    ranked = _render([other.root])
    assert "Best hyperparameters by val_accuracy (highest first" in ranked and "lr=" in ranked and "seed=" not in ranked


def test_a_failure_whose_last_line_says_its_fix_is_shown_whole(tmp_path):
    """The H200's MPS pack (2026-11-30): 11 trainings ended on the share's HINT, whose fix comes last; the terminal cut
    the line at 160 characters, before the fix."""
    import json

    run = RunDir(tmp_path / "run")
    _sweep(run, partitions=("v100",), host="node1")
    hint = ("HINT: its share of the GPU was 593 MB (0.00412 of the device, packing.memory_share=on: the peak of 1 "
            "training(s) of its setting on h200 in this run: 474 MB x (1 + packing.memory_margin=0.25)); lower N, "
            "raise packing.memory_fraction or packing.memory_margin, or set packing.memory_share=off")
    path = next(p for p in run.root.glob("packs/*/trainings/*.json") if json.loads(p.read_text())["status"] == "oom")
    path.write_text(json.dumps({**json.loads(path.read_text()), "error": f"torch.OutOfMemoryError: ...\n{hint}"}))
    text = _render([run.root], wide=True)
    assert "or set packing.memory_share=off" in " ".join(text.split()), text
