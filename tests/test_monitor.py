"""The NVML seam: a fake NVML at gpupack.core.monitor._nvml, and the real one on this machine."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from gpupack.core import monitor
from gpupack.core.cost.rgu import model_from_device_name
from gpupack.sweep.setup.compose import config_dir
from tests.fakes import A100_1G, A100_40, A100_80, H100, H100_1G, H100_3G, V100, FakeNvml, mig_nvml


@pytest.mark.parametrize("visible, names, kind, name", [
    (None, ["Tesla V100-SXM2-16GB"], "gpu", "Tesla V100-SXM2-16GB"),
    ("1", ["Tesla P100-PCIE-12GB", "Tesla T4"], "gpu", "Tesla T4"),
    ("", ["Tesla T4"], "cpu", None),  # the job was given no GPU
    ("0", [], "cpu", None),
])
def test_detect_device_with_fake_nvml(monkeypatch, visible, names, kind, name):
    fake = FakeNvml(names=names)
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    info = monitor.detect_device(env)
    assert info.kind == kind
    if name:
        assert info.name == name and info.memory_total_mb == 16 * 1024
    else:
        assert info.note
    assert fake.shutdowns == 1  # NVML opened is closed again


def test_nvml_init_failure_falls_back_to_cpu_and_says_why(monkeypatch):
    fake = FakeNvml(names=[], fail_init=RuntimeError("NVML Shared Library Not Found"))
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    info = monitor.detect_device({})
    assert info.kind == "cpu" and "NVML Shared Library Not Found" in info.note
    assert monitor.gpu_count() == 0


def test_real_nvml_on_this_machine_is_handled():
    info = monitor.detect_device({})
    assert info.kind in ("gpu", "cpu")
    if info.kind == "cpu":
        assert info.note and info.name
        assert monitor.gpu_count() == 0  # NVML missing, or a driver with no GPU: none to pack on
    else:
        assert monitor.gpu_count() >= 1 and info.memory_total_mb


# ---------------- MIG: the device CUDA_VISIBLE_DEVICES names, a slice as itself ----------------

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
    fake = mig_nvml(driver=driver)
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
    fake = mig_nvml(driver="old")  # the harder path: NVML does not look the MIG UUID up, the slices are walked
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    info = monitor.detect_device({"CUDA_VISIBLE_DEVICES": H100_1G.uuid})
    assert info.kind == "gpu" and info.mig and info.name == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert 9 * 1024 < info.memory_total_mb < 11 * 1024  # the slice's ~10 GB, not the parent's 80 GB
    model = model_from_device_name(info.name)
    weights = OmegaConf.load(config_dir() / "rgu" / "alliance.yaml").models
    assert model == "H100-1g.10gb" and weights[model] == 1.74 and weights["H100-80gb"] == 12.2


def test_a_mig_mode_gpu_named_by_index_with_several_slices_says_which_was_taken(monkeypatch):
    monkeypatch.setattr(monitor, "_nvml", lambda: mig_nvml())
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
    from gpupack.core.monitor import visible_devices

    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert visible_devices(env, k) == expected
