"""The pack sampler through a fake NVML at the one seam (gpupack.monitor._nvml), and on this machine for real."""
from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from gpupack import monitor
from gpupack.sampler import Sampler


class FakeNvml:
    """Answers like nvidia-ml-py: utilization, memory, and the compute processes on the GPU."""

    def __init__(self, procs, util=(37, 12), used_mb=3000, fail_init=None, mps_procs=None):
        self.procs, self.util, self.used_mb, self.fail_init = procs, util, used_mb, fail_init
        self.mps_procs = mps_procs
        self.calls: list[str] = []

    def nvmlInit(self):
        if self.fail_init:
            raise self.fail_init

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"gpu{i}"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=16 * 2**30, used=self.used_mb * 2**20)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.util[0], memory=self.util[1])

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self.calls.append("compute")
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self.procs]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h):
        self.calls.append("mps")
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in (self.mps_procs or [])]


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
    fake = FakeNvml([(a.pid, 512 * 2**20), (b.pid, None), (99999999, 7 * 2**20)])
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    messages: list[str] = []
    sampler = Sampler(interval_s=0.05, gpu_index=0, log=messages.append)
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
    fake = FakeNvml([], mps_procs=[(a.pid, 256 * 2**20)])
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    sampler = Sampler(gpu_index=0, mps=True, log=lambda m: None)
    sampler.register("ta", a.pid)
    assert sampler.sample_once()["trainings"]["ta"]["gpu_mem_mb"] == 256
    assert "mps" in fake.calls and "compute" not in fake.calls


def test_nvml_init_failure_falls_back_to_cpu_and_says_so_once(monkeypatch, two_trainings):
    a, _ = two_trainings
    monkeypatch.setattr(monitor, "_nvml", lambda: FakeNvml([], fail_init=RuntimeError("Driver Not Loaded")))
    messages: list[str] = []
    sampler = Sampler(interval_s=0.02, gpu_index=0, log=messages.append)
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
    sampler = Sampler(interval_s=0.05, gpu_index=0, log=messages.append)
    sampler.register("ta", a.pid)
    report = sampler.start().stop()
    if report["source"] == "cpu":  # no GPU or no driver here: said once, CPU sampled
        assert len(messages) == 1 and "NVML unavailable" in report["note"]
    else:
        assert report["gpu_mem_total_mb"] > 0
    assert report["per_training"]["ta"]["peak_rss_mb"] > 0


def test_a_training_that_ended_is_skipped_not_fatal(two_trainings):
    a, b = two_trainings
    sampler = Sampler(gpu_index=None, log=lambda m: None)
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
