"""Disturbance measured and said (issue 41, item 4): packs measured under load from outside the job are named in
collect's analysis (gpupack.results.analysis.disturbance), its report and summary.json; the sampler's figures reach the
packs frame in every layout collect reads. The sampler's own accounting: tests/test_foreign.py."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from gpupack.core.plan import make_plan
from gpupack.core.store.records import pack_record, read_json, training_record, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.turns import run_in_turn
from gpupack.results.analysis.disturbance import disturbance, threshold
from gpupack.results.analysis.load import load_records
from gpupack.results.report.text import disturbance_lines
from gpupack.sweep.flow.collect import collect


@pytest.mark.parametrize("cores, bar", [(1, 0.25), (2, 0.25), (4, 0.4), (64, 6.4)])
def test_the_bar_is_a_quarter_core_or_a_tenth_of_the_jobs_cores(cores, bar):
    assert threshold(cores) == pytest.approx(bar)


def _pack(pack_id: str, factor: int, wall: float, cores_mean: float | None, gpu_procs: int | None = None,
          mode: str = "process", job_cores: int = 2, gpu_mb: float | None = None) -> dict:
    return {"pack_id": pack_id, "workload": "w", "partition": "local", "gpu_type": "cpu", "mode": mode,
            "factor": factor, "wall_s": wall, "sampler_foreign_cpu_cores_mean": cores_mean,
            "sampler_job_cores": job_cores, "sampler_host_cores": job_cores,
            "sampler_foreign_gpu_procs_max": gpu_procs, "sampler_foreign_gpu_mem_mb_max": gpu_mb}


# packs → (disturbed ids, their N, share of the group's pack time, mean foreign cores over the disturbed ones)
CASES = [
    pytest.param([_pack("a", 1, 10, 0.0), _pack("b", 2, 10, 0.1)], [], [], 0.0, None, id="quiet"),
    pytest.param([_pack("a", 1, 10, 0.0), _pack("b", 2, 30, 1.8), _pack("c", 2, 10, 0.25)], ["b", "c"], [2, 2],
                 0.8, (1.8 * 30 + 0.25 * 10) / 40, id="at the bar counts"),
    pytest.param([_pack("a", 1, 10, 0.3, job_cores=8), _pack("b", 1, 10, 0.9, job_cores=8)], ["b"], [1], 0.5, 0.9,
                 id="a tenth of 8 cores"),
    pytest.param([_pack("a", 1, 10, 0.0, gpu_procs=1, gpu_mb=512.0), _pack("b", 1, 10, 0.0, gpu_procs=0)], ["a"],
                 [1], 0.5, 0.0, id="another process on the GPU"),
    pytest.param([_pack("a", 1, 10, None), _pack("b", 1, 10, 1.0)], ["b"], [1], 1.0, 1.0,
                 id="an older record, not measured, is left out"),
]


@pytest.mark.parametrize("packs, ids, factors, share, cores", CASES)
def test_disturbed_packs_per_group(packs, ids, factors, share, cores):
    out = disturbance(pd.DataFrame(packs))
    assert len(out) == 1
    row = out.iloc[0]
    assert row["pack_ids"] == ids and row["factors"] == factors and row["disturbed"] == len(ids)
    assert row["share"] == pytest.approx(share)
    assert (row["foreign_cores_mean"] is None) if cores is None else row["foreign_cores_mean"] == pytest.approx(cores)
    assert bool(disturbance_lines(out)) == bool(ids)  # a quiet run says nothing


def test_groups_are_apart_and_records_without_figures_give_none():
    packs = pd.DataFrame([_pack("a", 1, 10, 1.0), _pack("b", 1, 10, 0.0, mode="fused")])
    out = disturbance(packs)
    assert out.set_index("mode")["disturbed"].to_dict() == {"fused": 0, "process": 1}
    assert disturbance(pd.DataFrame([{"pack_id": "a", "wall_s": 1.0}])).empty  # older records: nothing measured


def test_the_line_names_the_packs_share_and_load():
    packs = [_pack(f"cpu-process-n0{n}-00{i}", n, 10.0, 1.8 if i == 0 else 0.0) for n in (1, 2) for i in range(5)]
    packs[1]["sampler_foreign_gpu_procs_max"], packs[1]["sampler_foreign_gpu_mem_mb_max"] = 2, 700.0
    (line,) = disturbance_lines(disturbance(pd.DataFrame(packs)))
    assert line == ("Measured under foreign load (w on local (cpu), mode process): 3 of 10 packs (30% of its pack "
                    "time; other processes used 1.2 of 2 cores on average; 1 with another process on its GPU (up to 2, "
                    "700 MB)): cpu-process-n01-000, cpu-process-n01-001, cpu-process-n02-000 — their times are not "
                    "trusted as quiet figures.")


def _write_pack(run: RunDir, pack_id: str, factor: int, wall: float, foreign: float) -> None:
    for i in range(factor):
        tid = f"{pack_id}-{i}"
        write_json_atomic(run.training_record(pack_id, tid), training_record(
            pack_id=pack_id, training_id=tid, workload="w", params={"lr": 0.1, "seed": i}, mode="process",
            factor=factor, partition="local", gpu_type="cpu", status="completed", started_at=0.0, ended_at=wall,
            timings={"startup_s": 1.0, "loop_s": wall - 1.0}, throughput={"samples": 1000, "samples_per_s": 10.0},
            metrics={"val_accuracy": 0.5}))
    write_json_atomic(run.pack_record(pack_id), pack_record(
        pack_id=pack_id, mode="process", factor=factor, partition="local", gpu_type="cpu", wall_s=wall, complete=True,
        concurrent=factor, workload="w", n_completed=factor, cores=2,
        sampler={"foreign_cpu_cores_mean": foreign, "foreign_cpu_cores_max": foreign, "host_cores": 2,
                 "job_cores": 2, "foreign_gpu_procs_max": None, "foreign_gpu_mem_mb_max": None}))


def test_collect_says_it_in_the_terminal_the_html_and_summary_json(tmp_path):
    run = RunDir(tmp_path / "run")
    for i, foreign in enumerate([0.0, 1.5, 0.0]):
        _write_pack(run, f"local-process-n01-{i:03d}", 1, 10.0, foreign)
    console = Console(record=True, width=400)
    collect([run.root], console=console)
    said = "Measured under foreign load (w on local (cpu), mode process): 1 of 3 packs"
    printed = console.export_text()
    assert said in printed and "local-process-n01-001 — their times" in printed
    assert said in (run.root / "report.html").read_text()
    data = read_json(run.summary_json)
    assert data["disturbance"][0]["pack_ids"] == ["local-process-n01-001"]
    assert data["disturbance"][0]["foreign_cores_mean"] == 1.5 and data["disturbance_lines"][0].startswith(said)


def _lane_run(tmp_path: Path) -> tuple[RunDir, list[str]]:
    run = RunDir(tmp_path / "run")
    # about a second: a few of the sampler's intervals (a pack shorter than one has no figure: unknown)
    plan = make_plan(sweep="t", workload="tests.fake_workloads", grid={"lr": [0.1, 0.2]},
                     fixed={"steps": 30, "sleep_s": 0.03}, factors=[2], modes=["process"], partitions=["local"],
                     repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    (run.root / "config.yaml").write_text("cluster: {backend: local, name: local}\n")
    return run, [p.pack_id for p in plan.packs]


FOREIGN = ["sampler_foreign_cpu_cores_mean", "sampler_foreign_cpu_cores_max", "sampler_host_cores",
           "sampler_job_cores", "sampler_foreign_measured_s"]


@pytest.mark.parametrize("fold", [False, True], ids=["pack folders", "folded lane"])
@pytest.mark.slow
def test_the_figures_reach_the_packs_frame_in_every_layout(tmp_path, fold):
    """A real pack of two trainings: its pack record's figures are in the frame collect builds from its JSON, its
    columnar file, its lane's journal and its lane's columnar file alike; no NVML here: the GPU's are unknown."""
    run, ids = _lane_run(tmp_path)
    run_in_turn(str(run.root), ids, PackSettings(device="cpu", fold=fold, sample_interval_s=0.05))
    assert run.lane_columnar(ids[0]).is_file() if fold else (run.pack_dir(ids[0]) / "trainings.arrows").is_file()
    frames = [load_records([run.root]).packs, load_records([run.root], columnar=False).packs]
    for packs in frames:
        assert len(packs) == 1 and all(pd.notna(packs[c].iloc[0]) for c in FOREIGN), packs.T
        assert packs["sampler_foreign_cpu_cores_mean"].iloc[0] >= 0
        assert pd.isna(packs["sampler_foreign_gpu_procs_max"].iloc[0])
    assert frames[0][FOREIGN].equals(frames[1][FOREIGN])


TINY = ["+sweep=mnist_pack", "packing.factors=[1,2]", "packing.repeats=1", "sweep.grid.lr=[0.1]",
        "sweep.grid.batch_size=[128]", "sweep.fixed.train_samples=10000", "sweep.fixed.val_samples=1000",
        "sweep.fixed.epochs=1", "packing.sample_interval_s=0.3"]


@pytest.mark.slow
@pytest.mark.quiet
def test_a_cpu_hog_beside_a_real_run_is_named_in_collects_output(tmp_path, subprocess_env):
    """From outside: a tiny real sweep with a process that keeps a core busy the whole time beside it; collect names
    its packs as measured under foreign load."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        run_dir = tmp_path / "run"
        proc = subprocess.run([sys.executable, "-m", "gpupack", *TINY, f"run_dir={run_dir}"], capture_output=True,
                              text=True, env=subprocess_env, cwd=tmp_path, timeout=300)
    finally:
        hog.kill()
        hog.wait()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collected = subprocess.run([sys.executable, "-m", "gpupack.collect", str(run_dir)], capture_output=True,
                               text=True, env=subprocess_env, timeout=120)
    assert collected.returncode == 0, collected.stderr
    out = " ".join(collected.stdout.split())  # rich wraps long lines
    print(out)
    # N=1 (at both its set-ups), N=2 and the drift check, and the rounds measured again (no N can be named from
    # packs all under load): every one of them ran beside the hog
    plans = [run_dir / "plan.json", *sorted(run_dir.glob("again/*/plan.json"))]
    assert len(plans) == 2, plans
    packs = [p["pack_id"] for plan in plans for p in json.loads(plan.read_text())["packs"]]
    n = len(packs)
    assert f"Measured under foreign load (mnist_torch on local (cpu), mode process): {n} of {n} packs" in out
    assert "No answer for mnist_torch on local (cpu), mode process: every pack of every N" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    (group,) = summary["disturbance"]
    assert sorted(group["pack_ids"]) == sorted(packs)
    assert group["foreign_cores_mean"] >= 0.5  # a whole core, less what the run's own trainings took from it


@pytest.mark.slow
@pytest.mark.quiet
def test_the_command_that_runs_the_sweep_here_is_not_load_from_outside(tmp_path, monkeypatch):
    """From outside: the local backend's command shares the host with its jobs. While it runs the sweep, a thread of
    it keeps a core busy (as its imports while the first jobs start do, briefly): that is the run's own CPU, and no
    pack is named as measured under foreign load. (A process of its own beside the run is: the test above.)"""
    import threading

    from gpupack import sweep

    monkeypatch.chdir(tmp_path)
    stop = threading.Event()

    def burn() -> None:
        while not stop.is_set():
            sum(range(10_000))

    burner = threading.Thread(target=burn, daemon=True)
    run_dir = tmp_path / "run"
    prepared = sweep.prepare([*TINY, "packing.remeasure=0", f"run_dir={run_dir}"])
    burner.start()
    try:
        outcome = sweep.run(prepared, plots=False)
    finally:
        stop.set()
        burner.join()
    assert outcome.ok
    packs = load_records([run_dir]).packs
    assert len(packs) >= 3 and packs["sampler_foreign_cpu_cores_mean"].notna().all(), packs
    foreign = packs["sampler_foreign_cpu_cores_mean"]
    assert (foreign < threshold(1)).all(), foreign.tolist()  # the busy core is the command's: none of it foreign
    assert outcome.collected is not None
    said = outcome.collected.disturbance
    assert said.empty or int(said["disturbed"].sum()) == 0, said.to_dict("records")
