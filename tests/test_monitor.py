"""The NVML seam: a fake NVML at gpupack.monitor._nvml, and the real one on this machine."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpupack import monitor


class FakeNvml:
    def __init__(self, names, fail=None):
        self.names, self.fail, self.shutdowns = names, fail, 0

    def nvmlInit(self):
        if self.fail:
            raise self.fail

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.names[h].encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=16 * 2**30)


@pytest.mark.parametrize("visible, names, kind, name", [
    (None, ["Tesla V100-SXM2-16GB"], "gpu", "Tesla V100-SXM2-16GB"),
    ("1", ["Tesla P100-PCIE-12GB", "Tesla T4"], "gpu", "Tesla T4"),
    ("", ["Tesla T4"], "cpu", None),  # the job was given no GPU
    ("0", [], "cpu", None),
])
def test_detect_device_with_fake_nvml(monkeypatch, visible, names, kind, name):
    fake = FakeNvml(names)
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    info = monitor.detect_device(env)
    assert info.kind == kind
    if name:
        assert info.name == name and info.memory_total_mb == 16 * 1024
    else:
        assert info.note


def test_nvml_init_failure_falls_back_to_cpu_and_says_why(monkeypatch):
    monkeypatch.setattr(monitor, "_nvml", lambda: FakeNvml([], fail=RuntimeError("NVML Shared Library Not Found")))
    info = monitor.detect_device({})
    assert info.kind == "cpu" and "NVML Shared Library Not Found" in info.note
    assert monitor.gpu_count() == 0


def test_real_nvml_on_this_machine_is_handled():
    info = monitor.detect_device({})
    assert info.kind in ("gpu", "cpu")
    if info.kind == "cpu":
        assert info.note and info.name
    assert monitor.gpu_count() >= 0
