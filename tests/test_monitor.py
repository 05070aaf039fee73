"""The NVML seam: a fake NVML at gpupack.runtime.monitor._nvml, and the real one on this machine."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from gpupack.core.rgu import model_from_device_name
from gpupack.runtime import monitor
from gpupack.setup.compose import config_dir


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


# ---------------- MIG: the device CUDA_VISIBLE_DEVICES names, a slice as itself ----------------

class FakeNvmlError(Exception):
    pass


class FakeNotFound(FakeNvmlError):
    pass


class FakeNotSupported(FakeNvmlError):
    pass


@dataclass
class FakeMig:
    name: str
    uuid: str
    total_mb: float
    gi: int  # GPU instance ID
    ci: int  # compute instance ID


@dataclass
class FakeGpu:
    name: str
    uuid: str
    total_mb: float
    migs: dict[int, FakeMig] | None = None  # MIG device index -> slice; None: no MIG (before Ampere)
    mig_mode: bool = False


H100_1G = FakeMig("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "MIG-1c1f9a3e-6b2d-5f0c-9d7e-2a4b8c6d0e11", 9984, 9, 0)
H100_3G = FakeMig("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "MIG-3c3f9a3e-6b2d-5f0c-9d7e-2a4b8c6d0e33", 40448, 2, 0)
A100_1G = FakeMig("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "MIG-a1a1d2c4-0e5f-5a6b-8c7d-9e0f1a2b3c4d", 9728, 13, 0)
MACHINE = [  # NVML index order
    FakeGpu("Tesla V100-SXM2-16GB", "GPU-0a0b0c0d-1111-2222-3333-444455556666", 16384),
    # MIG device indices 0 and 2 exist, 1 does not: the max count is how many may exist, not how many do
    FakeGpu("NVIDIA H100 80GB HBM3", "GPU-h100h100-7777-8888-9999-aaaabbbbcccc", 81559, {0: H100_1G, 2: H100_3G}, True),
    FakeGpu("NVIDIA A100-SXM4-80GB", "GPU-a100a100-dddd-eeee-ffff-000011112222", 81920, {0: A100_1G}, True),
    FakeGpu("NVIDIA A100-SXM4-40GB", "GPU-a140a140-3333-4444-5555-666677778888", 40960, {}, False),  # MIG off
]


class MigNvml:
    """Answers like nvidia-ml-py on a node with MIG slices. ``driver="recent"``: nvmlDeviceGetHandleByUUID finds
    GPUs, MIG UUIDs and the MIG-GPU-<uuid>/<gi>/<ci> form; ``"old"``: only whole GPUs by their full UUID."""

    NVMLError = FakeNvmlError
    NVMLError_NotFound = FakeNotFound
    NVMLError_NotSupported = FakeNotSupported
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, gpus=MACHINE, driver="recent", procs=(), used_mb=1500):
        self.gpus, self.driver, self.procs, self.used_mb = gpus, driver, procs, used_mb
        self.calls: list[str] = []

    def _dev(self, h):
        return self.gpus[h[1]] if h[0] == "gpu" else self.gpus[h[1]].migs[h[2]]

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if i >= len(self.gpus):
            raise FakeNvmlError("Invalid Argument")
        return ("gpu", i)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, g in enumerate(self.gpus):
            if g.uuid == uuid:
                return ("gpu", i)
            for j, m in (g.migs or {}).items():
                legacy = f"MIG-{g.uuid}/{m.gi}/{m.ci}"
                if self.driver == "recent" and uuid in (m.uuid, legacy):
                    return ("mig", i, j)
        raise FakeNotFound("Not Found")

    def nvmlDeviceGetMigMode(self, h):
        g = self._dev(h)
        if h[0] == "mig" or g.migs is None:
            raise FakeNotSupported("Not Supported")
        return [int(g.mig_mode), int(g.mig_mode)]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        g = self._dev(h)
        if h[0] == "mig" or g.migs is None:
            raise FakeNotSupported("Not Supported")
        return 7 if g.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        if j not in (self._dev(h).migs or {}):
            raise FakeNotFound("Not Found")
        return ("mig", h[1], j)

    def nvmlDeviceGetGpuInstanceId(self, h):
        if h[0] != "mig":
            raise FakeNotSupported("Not Supported")
        return self._dev(h).gi

    def nvmlDeviceGetComputeInstanceId(self, h):
        if h[0] != "mig":
            raise FakeNotSupported("Not Supported")
        return self._dev(h).ci

    def nvmlDeviceGetUUID(self, h):
        return self._dev(h).uuid

    def nvmlDeviceGetName(self, h):
        return self._dev(h).name.encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=int(self._dev(h).total_mb * 2**20), used=self.used_mb * 2**20)

    def nvmlDeviceGetUtilizationRates(self, h):
        if h[0] == "mig":  # what NVML answers on a MIG device handle
            raise FakeNotSupported("Not Supported")
        return SimpleNamespace(gpu=55, memory=20)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self.calls.append(f"compute {h}")
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self.procs]


V100, H100, A100_80, A100_40 = MACHINE
NO_SUCH_MIG = "MIG-deadbeef-0000-5000-8000-000000000000"


@pytest.mark.parametrize("driver", ["recent", "old"])
@pytest.mark.parametrize("visible, device, mig", [
    (None, V100, False),  # unset: CUDA's device 0
    ("0", V100, False),
    ("3,0", A100_40, False),  # the first entry; MIG-capable with MIG off: the whole GPU
    (A100_40.uuid, A100_40, False),
    (V100.uuid[:12], V100, False),  # CUDA takes a unique UUID prefix
    (H100_1G.uuid, H100_1G, True),
    (f"{H100_1G.uuid},{A100_1G.uuid}", H100_1G, True),
    (A100_1G.uuid, A100_1G, True),
    (f"MIG-{H100.uuid}/2/0", H100_3G, True),  # R450/R460: MIG-GPU-<uuid>/<gi>/<ci>
    (f"MIG-{A100_80.uuid}/13/0", A100_1G, True),
    ("2", A100_1G, True),  # a MIG-mode GPU by index: CUDA runs on its (only) slice, never on the whole GPU
    (NO_SUCH_MIG, None, None),
    ("GPU-deadbeef-0000-4000-8000-000000000000", None, None),
    (f"MIG-{H100.uuid}/5/0", None, None),  # no GPU instance 5 on that GPU
    (f"MIG-{H100.uuid}/x", None, None),
    ("GPU-", None, None),  # the start of every GPU's UUID: ambiguous
    ("7", None, None),
    ("", None, None),
    ("-1", None, None),
    ("-1,0", None, None),
    ("nonsense", None, None),
])
def test_detect_device_names_what_cuda_visible_devices_names(monkeypatch, driver, visible, device, mig):
    fake = MigNvml(driver=driver)
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    info = monitor.detect_device({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})
    if device is None:  # never index 0 (or any other device) in its place
        assert info.kind == "cpu" and info.note and info.uuid is None and info.memory_total_mb is None
        if visible and visible.startswith(("MIG-", "GPU-")):
            assert visible.split(",")[0] in info.note
    else:
        assert (info.kind, info.name, info.memory_total_mb) == ("gpu", device.name, device.total_mb)
        assert info.uuid == device.uuid and info.mig is mig and info.note == ""
    assert fake.calls == ["shutdown"]


def test_an_h100_1g_10gb_slice_is_named_sized_and_costed_as_the_slice(monkeypatch):
    fake = MigNvml(driver="old")  # the harder path: NVML does not look the MIG UUID up, the slices are walked
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    info = monitor.detect_device({"CUDA_VISIBLE_DEVICES": H100_1G.uuid})
    assert info.kind == "gpu" and info.mig and info.name == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert 9 * 1024 < info.memory_total_mb < 11 * 1024  # the slice's ~10 GB, not the parent's 80 GB
    model = model_from_device_name(info.name)
    weights = OmegaConf.load(config_dir() / "rgu" / "alliance.yaml").models
    assert model == "H100-1g.10gb" and weights[model] == 1.7 and weights["H100-80gb"] == 12.2


def test_a_mig_mode_gpu_named_by_index_with_several_slices_says_which_was_taken(monkeypatch):
    monkeypatch.setattr(monitor, "_nvml", lambda: MigNvml())
    info = monitor.detect_device({"CUDA_VISIBLE_DEVICES": "1"})
    assert info.kind == "gpu" and info.mig and info.name == H100_1G.name and info.uuid == H100_1G.uuid
    assert "MIG mode" in info.note and "first MIG device" in info.note


@pytest.mark.parametrize("name, model", [
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "H100-1g.10gb"), ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "H100-1g.10gb"),
    ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "A100-1g.10gb"), ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "A100-1g.5gb"),
    ("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", "A100-3g.20gb"),  # one compute instance of a 3g.20gb GPU instance
    ("NVIDIA H100 80GB HBM3 MIG", None),  # a slice whose profile cannot be read: unknown, not the H100-80gb weight
    ("NVIDIA H200 MIG 1g.18gb", None), ("NVIDIA A30 MIG 1g.6gb", None),
])
def test_real_mig_device_names_map_to_slice_models(name, model):
    assert model_from_device_name(name) == model


@pytest.mark.parametrize("visible, k, expected", [
    (None, 2, ["0", "1"]), ("3,1,2", 2, ["3", "1"]), ("GPU-a,GPU-b", 2, ["GPU-a", "GPU-b"]), ("0,-1,2", 3, ["0"]),
    ("", 2, []), ("5", 4, ["5"]),
])
def test_the_first_k_visible_devices(visible, k, expected):
    from gpupack.runtime.monitor import visible_devices

    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert visible_devices(env, k) == expected
