"""Disturbance measured (issue 41, item 4): packs measured under load from outside the job are named in collect's
analysis (gpupack.analysis.disturbance); the sampler's figures reach the packs frame in every layout collect reads.
The sampler's own accounting: tests/test_foreign.py."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gpupack.analysis.disturbance import disturbance, threshold
from gpupack.analysis.load import load_records
from gpupack.core.plan import make_plan
from gpupack.core.records import write_json_atomic
from gpupack.core.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.turns import run_in_turn


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


def test_groups_are_apart_and_records_without_figures_give_none():
    packs = pd.DataFrame([_pack("a", 1, 10, 1.0), _pack("b", 1, 10, 0.0, mode="fused")])
    out = disturbance(packs)
    assert out.set_index("mode")["disturbed"].to_dict() == {"fused": 0, "process": 1}
    assert disturbance(pd.DataFrame([{"pack_id": "a", "wall_s": 1.0}])).empty  # older records: nothing measured


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
