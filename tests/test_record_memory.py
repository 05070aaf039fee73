"""A training record says the memory the tables show: a program that reports none (the ``command`` workload) gets
the sampler's figures in its record, marked as the sampler's (issue 28: the record said null, the table rss 254)."""
from __future__ import annotations

import sys

import pytest

from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.body import run_pack
from gpupack.job.records import fill_memory
from gpupack.job.workloads.command import WORKLOAD


@pytest.mark.parametrize("memory, sampled, expected", [
    # reported by the training itself: kept, whatever the sampler saw; NVML's figure of its whole process beside
    ({"peak_rss_mb": 500.0, "peak_gpu_mem_mb": 120.0}, {"peak_rss_mb": 480.0, "peak_gpu_mem_mb": 300.0},
     {"peak_rss_mb": 500.0, "peak_gpu_mem_mb": 120.0, "process_gpu_mem_mb": 300.0}),
    ({"peak_rss_mb": 500.0, "peak_gpu_mem_mb": 120.0}, {"peak_rss_mb": 480.0, "peak_gpu_mem_mb": None},
     {"peak_rss_mb": 500.0, "peak_gpu_mem_mb": 120.0}),  # NVML could not say the process's own
    # reported nothing: the sampler's, named
    ({"peak_rss_mb": None, "peak_gpu_mem_mb": None}, {"peak_rss_mb": 313.8, "peak_gpu_mem_mb": None},
     {"peak_rss_mb": 313.8, "peak_gpu_mem_mb": None, "from_sampler": ["peak_rss_mb"]}),
    ({"peak_rss_mb": 200.0, "peak_gpu_mem_mb": None}, {"peak_rss_mb": 180.0, "peak_gpu_mem_mb": 900.0},
     {"peak_rss_mb": 200.0, "peak_gpu_mem_mb": 900.0, "from_sampler": ["peak_gpu_mem_mb"]}),
    # never sampled (ended between two samples): unknown stays unknown, never 0
    ({"peak_rss_mb": None, "peak_gpu_mem_mb": None}, {}, {"peak_rss_mb": None, "peak_gpu_mem_mb": None}),
    # a training that failed before it reported anything has no memory figures of its own
    (None, {"peak_rss_mb": 90.0}, {"peak_rss_mb": 90.0, "peak_gpu_mem_mb": None, "from_sampler": ["peak_rss_mb"]}),
    (None, {}, None),
])
def test_fill_memory(memory, sampled, expected):
    rec = {"memory": None if memory is None else dict(memory)}
    fill_memory(rec, sampled)
    assert rec["memory"] == expected


@pytest.mark.slow
def test_a_program_that_reports_no_memory_gets_the_sampled_peak_in_its_record(tmp_path):
    run = RunDir(tmp_path / "run")
    hold = "import time; x = b'x' * 80_000_000; time.sleep(1.5)"  # 80 MB written, held while the sampler looks
    plan = make_plan(sweep="t", workload="command", grid={"tag": ["a", "b"]},
                     fixed={**WORKLOAD.defaults(), "argv": [sys.executable, "-c", hold, "{tag}"]}, factors=[2],
                     modes=["process"], partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    pack = plan.packs[0]
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu", sample_interval_s=0.1))
    assert rec["n_completed"] == 2
    for t in pack.trainings:
        memory = read_json(run.training_record(pack.pack_id, t.training_id))["memory"]
        sampled = rec["sampler"]["per_training"][t.training_id]["peak_rss_mb"]
        assert memory["peak_rss_mb"] == sampled and sampled > 80  # the record says what the table's rss column does
        assert memory["from_sampler"] == ["peak_rss_mb"]
