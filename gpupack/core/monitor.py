"""The one seam to NVML (nvidia-ml-py, ``import pynvml``): what device a job has.

The device is the one CUDA_VISIBLE_DEVICES names first: an index, a ``GPU-<uuid>``, or a MIG slice (``MIG-<uuid>``,
or ``MIG-GPU-<uuid>/<gi>/<ci>`` on R450/R460 drivers), looked up as itself (its own name and memory). Without a GPU
NVML knows, the answer says why and the job runs on the CPU. Tests fake :func:`_nvml` and nothing else.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import platform
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Iterator, Mapping, cast

# pynvml ships no types: the module and its handles are the NVML seam's dynamic edge, named here once.
Nvml = Any  # the pynvml module (or a test's fake of it)
NvmlHandle = Any  # an NVML device handle: a GPU's or a MIG slice's


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "gpu" or "cpu"
    name: str  # NVML's device name (a MIG slice's own, e.g. "NVIDIA H100 80GB HBM3 MIG 1g.10gb"), or the CPU model
    memory_total_mb: float | None = None  # a MIG slice's own memory, not its parent GPU's
    note: str = ""  # why there is no GPU, when there is none; how the GPU was chosen, when that was a guess
    uuid: str | None = None  # NVML's UUID ("GPU-…", or "MIG-…" for a slice): the sampler opens the same device by it
    mig: bool = False  # a MIG slice of a GPU, not a whole GPU


@dataclass(frozen=True)
class VisibleGpu:
    """The device CUDA_VISIBLE_DEVICES gives the job, as an NVML handle (a MIG device handle for a slice)."""
    handle: NvmlHandle
    mig: bool
    note: str = ""


def _nvml() -> ModuleType:
    import pynvml  # from nvidia-ml-py

    return cast(ModuleType, pynvml)  # no stubs: the NVML seam's one dynamic edge


def cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def first_visible(env: Mapping[str, str]) -> str | None:
    """The first device CUDA_VISIBLE_DEVICES names ("0" when it is unset); None when it hides every GPU ("-1,0")."""
    return next(iter(visible_devices(env, 1)), None)


def visible_devices(env: Mapping[str, str], k: int) -> list[str]:
    """The first ``k`` devices CUDA_VISIBLE_DEVICES names (unset: 0..k-1), to the first invalid entry, as CUDA does."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(i) for i in range(k)]
    return list(itertools.takewhile(lambda e: e not in ("", "-1"), (e.strip() for e in visible.split(","))))[:k]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value  # older bindings return bytes


def _uuid(nvml: Nvml, handle: NvmlHandle) -> str:
    try:
        return _text(nvml.nvmlDeviceGetUUID(handle))
    except Exception:  # a device whose UUID NVML cannot read matches no UUID
        return ""


def _mig_enabled(nvml: Nvml, handle: NvmlHandle) -> bool:
    try:
        return bool(nvml.nvmlDeviceGetMigMode(handle)[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))
    except Exception:  # NotSupported before Ampere; bindings without MIG
        return False


def _mig_devices(nvml: Nvml, parent: NvmlHandle) -> Iterator[NvmlHandle]:
    """The MIG device handles that exist under a GPU (none when it is not in MIG mode)."""
    try:
        count = nvml.nvmlDeviceGetMaxMigDeviceCount(parent)
    except Exception:  # NotSupported before Ampere; bindings without MIG
        return
    for i in range(count):
        try:
            yield nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
        except Exception:  # NotFound: the count is how many may exist, not how many do
            continue


def _devices(nvml: Nvml) -> Iterator[tuple[NvmlHandle, NvmlHandle]]:
    """Every GPU NVML sees (parent None), each followed by its MIG devices (with their parent GPU)."""
    for i in range(nvml.nvmlDeviceGetCount()):
        gpu = nvml.nvmlDeviceGetHandleByIndex(i)
        yield gpu, None
        for mig in _mig_devices(nvml, gpu):
            yield mig, gpu


def _as_cuda_sees(nvml: Nvml, gpu: NvmlHandle, named: str) -> VisibleGpu:
    """A whole GPU, or, when it is in MIG mode, the slice of it CUDA runs on (never the whole GPU)."""
    if not _mig_enabled(nvml, gpu):
        return VisibleGpu(gpu, mig=False)
    slices = list(_mig_devices(nvml, gpu))
    if not slices:
        raise LookupError(f"{named} is in MIG mode and has no MIG device")
    note = "" if len(slices) == 1 else (
        f"{named} is in MIG mode with {len(slices)} MIG devices and CUDA_VISIBLE_DEVICES names the whole GPU: "
        f"taken as its first MIG device; name the slice by its MIG UUID to be sure")
    return VisibleGpu(slices[0], mig=True, note=note)


def _by_index(nvml: Nvml, index: int) -> VisibleGpu:
    count = nvml.nvmlDeviceGetCount()
    if count <= index:
        raise LookupError(f"NVML sees no GPU {index} (it sees {count})")
    return _as_cuda_sees(nvml, nvml.nvmlDeviceGetHandleByIndex(index), f"GPU {index}")


def _by_uuid(nvml: Nvml, uuid: str) -> VisibleGpu:
    try:  # recent drivers look up MIG UUIDs too
        handle, mig = nvml.nvmlDeviceGetHandleByUUID(uuid), uuid.startswith("MIG-")
    except Exception:  # NotFound, an older driver, or an abbreviated UUID (CUDA takes a unique prefix)
        found = [(u, h, parent) for h, parent in _devices(nvml) if (u := _uuid(nvml, h)).startswith(uuid)]
        exact = [f for f in found if f[0] == uuid]
        if not exact and len(found) != 1:
            raise LookupError(f"{uuid} (from CUDA_VISIBLE_DEVICES) is the start of {len(found)} devices' UUIDs"
                              if found else f"NVML knows no GPU or MIG device {uuid} (from CUDA_VISIBLE_DEVICES)")
        _, handle, parent = (exact or found)[0]
        mig = parent is not None
    return VisibleGpu(handle, mig=True) if mig else _as_cuda_sees(nvml, handle, uuid)


def _instance_ids(nvml: Nvml, mig: NvmlHandle) -> tuple[int, int] | None:
    try:
        return nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig)
    except Exception:  # a MIG device NVML cannot place matches no gi/ci
        return None


def _by_legacy_mig(nvml: Nvml, entry: str) -> VisibleGpu:
    """``MIG-GPU-<uuid>/<gi>/<ci>``: the slice with GPU instance ID gi and compute instance ID ci of that GPU."""
    with contextlib.suppress(Exception):  # the drivers that wrote this form look it up themselves
        return VisibleGpu(nvml.nvmlDeviceGetHandleByUUID(entry), mig=True)
    parts = entry[len("MIG-"):].split("/")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise LookupError(f"CUDA_VISIBLE_DEVICES names {entry!r}, not MIG-GPU-<uuid>/<gi>/<ci>")
    parent_uuid, ids = parts[0], (int(parts[1]), int(parts[2]))
    for handle, parent in _devices(nvml):
        if parent is not None and _uuid(nvml, parent) == parent_uuid and _instance_ids(nvml, handle) == ids:
            return VisibleGpu(handle, mig=True)
    raise LookupError(f"NVML knows no MIG device {entry} (from CUDA_VISIBLE_DEVICES)")


def resolve_visible(env: Mapping[str, str], nvml: Nvml) -> VisibleGpu | None:
    """The NVML handle of the device CUDA_VISIBLE_DEVICES names first, over an initialized ``nvml``. None when it
    hides every GPU; LookupError (saying why) when it names a device NVML does not know, never index 0 instead."""
    entry = first_visible(env)
    if entry is None:
        return None
    if entry.isdigit():
        return _by_index(nvml, int(entry))
    if entry.startswith("MIG-GPU-"):
        return _by_legacy_mig(nvml, entry)
    if entry.startswith(("GPU-", "MIG-")):
        return _by_uuid(nvml, entry)
    raise LookupError(f"CUDA_VISIBLE_DEVICES names {entry!r}: not an index, GPU-<uuid> or MIG-<uuid>")


def detect_device(env: Mapping[str, str] | None = None) -> DeviceInfo:
    env = os.environ if env is None else env
    try:
        nvml = _nvml()
        nvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound / DriverNotLoaded on a CPU machine
        return DeviceInfo("cpu", cpu_name(), note=f"NVML unavailable ({err.__class__.__name__}: {err})")
    try:
        try:
            visible = resolve_visible(env, nvml)
        except LookupError as err:
            return DeviceInfo("cpu", cpu_name(), note=str(err))
        if visible is None:
            return DeviceInfo("cpu", cpu_name(), note="this job was given no GPU "
                              f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')!r})")
        name = _text(nvml.nvmlDeviceGetName(visible.handle))
        total = nvml.nvmlDeviceGetMemoryInfo(visible.handle).total / 2**20
        return DeviceInfo("gpu", name, memory_total_mb=total, note=visible.note,
                          uuid=_uuid(nvml, visible.handle) or None, mig=visible.mig)
    finally:
        nvml.nvmlShutdown()


def free_memory_mb(on_gpu: bool, env: Mapping[str, str] | None = None) -> float | None:
    """Memory free now on the job's device (MB): NVML's on a GPU, the host's available on a CPU; None: unknown."""
    if not on_gpu:
        import psutil  # deferred: only a streaming lane that admits by memory asks

        return float(psutil.virtual_memory().available) / 2**20
    env = os.environ if env is None else env
    try:
        nvml = _nvml()
        nvml.nvmlInit()
    except Exception:  # no driver or library: nothing to measure by
        return None
    try:
        visible = resolve_visible(env, nvml)
        return None if visible is None else float(nvml.nvmlDeviceGetMemoryInfo(visible.handle).free) / 2**20
    except (LookupError, nvml.NVMLError):
        return None
    finally:
        nvml.nvmlShutdown()


def gpu_count() -> int:
    """GPUs NVML sees on this machine; 0 without NVML or a driver."""
    try:
        nvml = _nvml()
        nvml.nvmlInit()
    except Exception:
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    finally:
        nvml.nvmlShutdown()
