"""The pack sampler through a fake NVML at the one seam (gpupack.core.monitor._nvml), and on this machine for
real."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpupack.core import monitor
from gpupack.job.runtime.sampler import Sampler
from tests.fakes import A100_40, H100, H100_1G, H100_3G, FakeGpu, FakeNvml, mig_nvml


@pytest.fixture
def two_trainings():
    procs = [subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:  # sampled once each is a running interpreter, not an image the kernel has barely mapped
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_gpu_samples_with_per_process_memory_and_unknown_memory(monkeypatch, two_trainings):
    a, b = two_trainings
    fake = FakeNvml(procs=[(a.pid, 512 * 2**20), (b.pid, None), (99999999, 7 * 2**20)])
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    messages: list[str] = []
    sampler = Sampler(interval_s=0.05, gpu="0", log=messages.append)
    sampler.register("ta", a.pid)
    sampler.register("tb", b.pid)
    sample = sampler.sample_once()
    assert sample["gpu_util"] == 37 and sample["gpu_mem_util"] == 12 and sample["gpu_mem_used_mb"] == 3000
    assert sample["trainings"]["ta"]["gpu_mem_mb"] == 512
    assert sample["trainings"]["tb"]["gpu_mem_mb"] is None  # NVML did not know: unknown, not 0
    assert sample["trainings"]["ta"]["rss_mb"] > 0
    report = sampler.start().stop()
    assert report["source"] == "nvml" and not messages and report["n_samples"] >= 2
    assert report["gpu_util_mean"] == 37 and report["gpu_mem_used_peak_mb"] == 3000
    assert report["gpu_mem_total_mb"] == 16 * 1024
    assert report["per_training"]["ta"]["peak_gpu_mem_mb"] == 512
    assert report["per_training"]["tb"]["peak_gpu_mem_mb"] is None
    assert report["per_training"]["tb"]["gpu_mem_known"] is False
    assert report["overhead_cpu_s"] >= 0 and report["overhead_fraction"] is not None
    assert "shutdown" in fake.calls


def test_mps_uses_the_mps_process_list(monkeypatch, two_trainings):
    a, _ = two_trainings
    fake = FakeNvml(mps_procs=[(a.pid, 256 * 2**20)])
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    sampler = Sampler(gpu="0", mps=True, log=lambda m: None)
    sampler.register("ta", a.pid)
    assert sampler.sample_once()["trainings"]["ta"]["gpu_mem_mb"] == 256
    assert f"mps {('gpu', 0)}" in fake.calls and not any(c.startswith("compute") for c in fake.calls)


def test_nvml_init_failure_falls_back_to_cpu_and_says_so_once(monkeypatch, two_trainings):
    a, _ = two_trainings
    monkeypatch.setattr(monitor, "_nvml", lambda: FakeNvml(fail_init=RuntimeError("Driver Not Loaded")))
    messages: list[str] = []
    sampler = Sampler(interval_s=0.02, gpu="0", log=messages.append)
    sampler.register("ta", a.pid)
    sampler.start()
    time.sleep(0.2)
    report = sampler.stop()
    assert len(messages) == 1 and "Driver Not Loaded" in messages[0] and "CPU" in messages[0]
    assert report["source"] == "cpu" and "Driver Not Loaded" in report["note"]
    assert report["n_samples"] >= 2 and "gpu_util" not in report["samples"][0]
    assert report["per_training"]["ta"]["peak_rss_mb"] > 0 and report["gpu_util_mean"] is None


def test_real_nvml_on_this_machine_is_handled(two_trainings):
    a, _ = two_trainings
    messages: list[str] = []
    sampler = Sampler(interval_s=0.05, gpu="0", log=messages.append)
    sampler.register("ta", a.pid)
    report = sampler.start().stop()
    if report["source"] == "cpu":  # no GPU or no driver here: said once, CPU sampled
        assert len(messages) == 1 and "NVML unavailable" in report["note"]
    else:
        assert report["gpu_mem_total_mb"] > 0
    assert report["per_training"]["ta"]["peak_rss_mb"] > 0


def test_a_training_that_ended_is_skipped_not_fatal(two_trainings):
    a, b = two_trainings
    sampler = Sampler(log=lambda m: None)
    sampler.register("ta", a.pid)
    sampler.register("tb", b.pid)
    b.kill()
    b.wait()
    sample = sampler.sample_once()
    assert "ta" in sample["trainings"] and "tb" not in sample["trainings"]


def test_a_training_the_sampler_never_saw_has_unknown_memory_not_zero():
    import os

    sampler = Sampler(interval_s=600, log=lambda msg: None)
    sampler.start()
    sampler.register("t-short", os.getpid())  # registered after the first sample, stopped before the next
    out = sampler.stop()
    assert out["per_training"]["t-short"]["peak_rss_mb"] is None
    assert out["per_training"]["t-short"]["cpu_percent_mean"] is None


# ---------------- MIG: the sampler opens the slice the job was given ----------------

@pytest.mark.parametrize("driver", ["recent", "old"])
def test_on_a_mig_slice_memory_is_sampled_and_utilization_is_unknown_not_zero(monkeypatch, two_trainings, driver):
    a, b = two_trainings
    fake = mig_nvml(driver=driver, procs=[(a.pid, 300 * 2**20), (b.pid, None)])
    asked: list[object] = []
    util = fake.nvmlDeviceGetUtilizationRates
    fake.nvmlDeviceGetUtilizationRates = lambda h: asked.append(h) or util(h)
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    messages: list[str] = []
    sampler = Sampler(interval_s=0.02, gpu=H100_1G.uuid, log=messages.append)
    assert sampler.source == "nvml" and sampler.mig and sampler.memory_total_mb == H100_1G.total_mb
    sampler.register("ta", a.pid)
    sampler.register("tb", b.pid)
    sample = sampler.sample_once()
    assert "gpu_error" not in sample  # NotSupported is not a failed sample: memory is still there
    assert sample["gpu_util"] is None and sample["gpu_mem_util"] is None and sample["gpu_mem_used_mb"] == 1500
    assert sample["trainings"]["ta"]["gpu_mem_mb"] == 300 and sample["trainings"]["tb"]["gpu_mem_mb"] is None
    assert f"compute {('mig', 1, 0)}" in fake.calls  # the slice's processes, not the whole GPU's
    sampler.start()
    time.sleep(0.15)
    report = sampler.stop()
    assert report["n_samples"] >= 3 and all(s["gpu_util"] is None and "gpu_error" not in s for s in report["samples"])
    assert len(asked) == 1  # asked once: NVML's NotSupported does not change between samples
    assert len(messages) == 1 and "utilization" in messages[0] and "MIG slice" in messages[0]
    assert report["source"] == "nvml" and "utilization" in report["note"]
    assert report["gpu_util_mean"] is None and report["gpu_util_max"] is None  # unknown, never 0
    assert report["gpu_mem_total_mb"] == H100_1G.total_mb and report["gpu_mem_used_peak_mb"] == 1500
    assert report["per_training"]["ta"]["peak_gpu_mem_mb"] == 300


def test_a_whole_gpu_still_reports_utilization(monkeypatch):
    monkeypatch.setattr(monitor, "_nvml", lambda: mig_nvml())
    messages: list[str] = []
    sampler = Sampler(gpu=A100_40.uuid, log=messages.append)
    sample = sampler.sample_once()
    assert not sampler.mig and sample["gpu_util"] == 55 and sample["gpu_mem_util"] == 20 and not messages
    assert sampler.memory_total_mb == A100_40.total_mb


@pytest.mark.parametrize("visible, slice_", [
    (H100_1G.uuid, H100_1G), (f"MIG-{H100.uuid}/2/0", H100_3G), ("1", H100_1G)])
def test_the_sampler_opens_the_device_detect_device_found(monkeypatch, visible, slice_):
    fake = mig_nvml(driver="old")
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    info = monitor.detect_device({"CUDA_VISIBLE_DEVICES": visible})
    sampler = Sampler(gpu=info.uuid, log=lambda m: None)  # what run_pack passes
    assert info.uuid == slice_.uuid and sampler.mig
    assert sampler.memory_total_mb == info.memory_total_mb == slice_.total_mb


@pytest.mark.parametrize("gpu", ["MIG-deadbeef-0000-5000-8000-000000000000", "-1", "9"])
def test_a_device_nvml_does_not_know_is_not_sampled_in_its_place(monkeypatch, gpu):
    fake = mig_nvml()
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    messages: list[str] = []
    sampler = Sampler(gpu=gpu, log=messages.append)
    assert sampler.source == "cpu" and sampler.nvml is None and sampler.memory_total_mb is None
    assert len(messages) == 1 and "CPU" in messages[0] and gpu in messages[0]
    assert "shutdown" in fake.calls  # NVML opened for the lookup is closed again


def test_a_pack_on_a_mig_slice_records_the_slice(monkeypatch, tmp_path):
    from gpupack.core.plan import make_plan
    from gpupack.core.store.records import write_json_atomic
    from gpupack.core.store.rundir import RunDir
    from gpupack.core.types import PackSettings
    from gpupack.job.body import run_pack

    fake = mig_nvml(driver="old")
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", H100_1G.uuid)
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload="tests.fake_workloads", grid={"lr": [0.1, 0.2]},
                     fixed={"steps": 10, "sleep_s": 0.03}, factors=[2], modes=["process"], partitions=["local"],
                     repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    rec = run_pack(str(run.root), plan.packs[0].pack_id, PackSettings(device="cpu", sample_interval_s=0.05))
    assert rec["n_completed"] == 2
    assert rec["device_name"] == H100_1G.name and rec["gpu_model"] == "H100-1g.10gb"
    assert rec["gpu_memory_total_mb"] == H100_1G.total_mb
    assert rec["sampler"]["source"] == "nvml" and rec["sampler"]["gpu_mem_total_mb"] == H100_1G.total_mb
    assert rec["sampler"]["n_samples"] >= 1 and rec["sampler"]["gpu_mem_used_peak_mb"] == 1500
    assert rec["sampler"]["gpu_util_mean"] is None and "utilization" in rec["sampler"]["note"]


@pytest.mark.slow
def test_a_training_of_several_processes_is_sampled_as_their_sum():
    """A training spread over k devices runs k processes (DDP ranks) under one training id: its figures are theirs
    together, not the last-registered rank's."""
    import psutil

    procs = [subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(60 * 2**20); time.sleep(30)"])
             for _ in range(2)]
    try:
        time.sleep(1.0)  # both hold their 60 MB
        s = Sampler(interval_s=0.1, no_gpu_reason="test")
        for p in procs:
            s.register("t-spread", p.pid)
        sample = s.sample_once()
        one = sum(psutil.Process(p.pid).memory_info().rss for p in procs[:1]) / 2**20
        assert sample["trainings"]["t-spread"]["rss_mb"] > 1.8 * one  # both ranks, not one
        report = s.report()
        assert list(report["per_training"]) == ["t-spread"]
        assert report["per_training"]["t-spread"]["peak_rss_mb"] > 1.8 * one
    finally:
        for p in procs:
            p.kill()
            p.wait()


CHILD = ("import subprocess, sys, time\n"
         "subprocess.Popen([sys.executable, '-c', 'import time; x = bytearray(80 * 2**20); time.sleep(30)'])\n"
         "time.sleep(30)")


@pytest.mark.parametrize("under_job", [True, False])
def test_a_trainings_children_count_in_its_figures_from_one_walk_of_the_table(under_job):
    """A training's loader worker (its child) counts in its RSS: found from the job's tree that the load reading walks
    once a sample (a pack's trainings are under the job), or, for a process outside it, by psutil's own walk."""
    import psutil

    from gpupack.job.runtime.foreign import ForeignLoad

    training = subprocess.Popen([sys.executable, "-c", CHILD])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # a job it is not under
    try:
        deadline = time.time() + 20
        while time.time() < deadline:  # its child holds its 80 MB
            kids = psutil.Process(training.pid).children()
            if kids and kids[0].memory_info().rss > 70 * 2**20:
                break
            time.sleep(0.1)
        foreign = ForeignLoad([0]) if under_job else ForeignLoad([0], root=other.pid)
        s = Sampler(interval_s=0.1, no_gpu_reason="test", foreign=foreign)
        s.register("t", training.pid)
        sample = s.sample_once()
        assert (training.pid in {pid for pid, _ in foreign.latest}) == under_job
        assert sample["trainings"]["t"]["rss_mb"] > 80
    finally:
        for child in psutil.Process(training.pid).children():
            child.kill()
        for proc in (training, other):
            proc.kill()
            proc.wait()


def two_gpus(rank0: int, rank1: int) -> FakeNvml:
    """Two whole GPUs: GPU 0 busy at 80 %, GPU 1 at 40 %; each rank of a DDP training has its context on its own GPU,
    and rank 0 a small one on GPU 1 too."""
    return FakeNvml([FakeGpu("Tesla V100-SXM2-16GB", "GPU-00000000-0000-4000-8000-000000000000", 16384, util=(80, 10),
                             used_mb=3000, procs=[(rank0, 2000 * 2**20)]),
                     FakeGpu("Tesla V100-SXM2-16GB", "GPU-00000001-0000-4000-8000-000000000000", 16384, util=(40, 10),
                             used_mb=1000, procs=[(rank1, 900 * 2**20), (rank0, 100 * 2**20)])])


def test_a_job_spread_over_two_gpus_samples_both(monkeypatch, two_trainings):
    rank0, rank1 = (p.pid for p in two_trainings)
    monkeypatch.setattr(monitor, "_nvml", lambda: two_gpus(rank0, rank1))
    s = Sampler(interval_s=0.1, gpu="0", more_gpus=["1"])
    s.register("t-ddp", rank0)
    s.register("t-ddp", rank1)
    sample = s.sample_once()
    assert sample["gpu_util"] == 60.0 and sample["gpu_mem_used_mb"] == 4000.0  # mean utilization, summed memory
    assert [g["gpu_util"] for g in sample["gpus"]] == [80.0, 40.0]
    assert sample["gpu_proc_mem_mb"] == {rank0: 2100.0, rank1: 900.0}  # rank 0 on both GPUs: summed
    assert sample["trainings"]["t-ddp"]["gpu_mem_mb"] == 3000.0  # the training: both ranks on both GPUs
    assert s.memory_total_mb == 32 * 1024
    s.stop()


def test_a_gpu_of_the_job_nvml_does_not_know_is_said_and_left_out(monkeypatch, two_trainings):
    monkeypatch.setattr(monitor, "_nvml", lambda: two_gpus(*(p.pid for p in two_trainings)))
    said: list[str] = []
    s = Sampler(interval_s=0.1, gpu="0", more_gpus=["7"], log=said.append)
    assert s.more_handles == [] and "GPU '7' of this job not sampled" in s.note and said
    assert "gpus" not in s.sample_once()
    s.stop()


# ---------------- its own cost: at most 1 % of a core ----------------

@pytest.mark.parametrize("interval, cost, wait", [
    (1.0, 0.002, 1.0),  # a cheap sample: the interval asked
    (1.0, 0.024, 2.376),  # 34 trainings on the H200 (24 ms a sample): stretched to 1 % of a core
    (0.05, 0.002, 0.198),  # a short interval asked: stretched all the same
    (5.0, 0.024, 5.0),  # a long one is long enough
])
def test_the_sampler_waits_long_enough_to_stay_within_one_percent_of_a_core(interval, cost, wait):
    from gpupack.job.runtime.sampler import MAX_OVERHEAD, next_wait

    assert next_wait(interval, cost) == pytest.approx(wait)
    assert cost / (cost + next_wait(interval, cost)) <= MAX_OVERHEAD + 1e-12


def test_a_sample_that_costs_more_stretches_the_samplers_next_wait(monkeypatch):
    """Each sample's CPU (a clock that says 24 ms a sample) sets the wait after it: the sampler's share of a core
    stays at 1 % at any N."""
    import os

    import gpupack.job.runtime.sampler as sampler_module

    clock = iter(i * 0.012 for i in range(10**6))  # read twice a round: before and after a sample
    monkeypatch.setattr(sampler_module, "_cpu_time", lambda: next(clock))
    sampler = Sampler(interval_s=0.01, log=lambda msg: None)
    waits: list[float] = []
    rounds = iter(range(4))

    def wait(timeout: float) -> bool:
        waits.append(timeout)
        return next(rounds, None) is None  # stop after four rounds

    monkeypatch.setattr(sampler._stop, "wait", wait)
    monkeypatch.setattr(sampler._stop, "is_set", lambda: len(waits) >= 4)
    sampler.register("t", os.getpid())
    sampler._run()
    assert waits == pytest.approx([0.012 / 0.01 - 0.012] * 4)  # 1.188 s, not the 0.01 s asked
    assert sampler.cpu_time_s / (sampler.cpu_time_s + sum(waits)) <= 0.01 + 1e-12
