"""The one seam to NVML (nvidia-ml-py, ``import pynvml``): what device a job has.

With no GPU, no driver or no NVML library the answer says so, and the job runs on the CPU.
Tests fake :func:`_nvml` and nothing else.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from types import ModuleType
from typing import Mapping


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "gpu" or "cpu"
    name: str  # NVML's device name, or the CPU model
    memory_total_mb: float | None = None
    note: str = ""  # why there is no GPU, when there is none


def _nvml() -> ModuleType:
    import pynvml  # from nvidia-ml-py

    return pynvml


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def visible_index(env: Mapping[str, str]) -> int | None:
    """NVML index of the first GPU in CUDA_VISIBLE_DEVICES; None when it hides every GPU."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return 0
    first = visible.split(",")[0].strip()
    if first == "" or first == "-1":
        return None
    return int(first) if first.isdigit() else 0  # a UUID or MIG id: NVML index 0 of what we see


def detect_device(env: Mapping[str, str] | None = None) -> DeviceInfo:
    env = os.environ if env is None else env
    try:
        nvml = _nvml()
        nvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound / DriverNotLoaded on a CPU machine
        return DeviceInfo("cpu", cpu_name(), note=f"NVML unavailable ({err.__class__.__name__}: {err})")
    try:
        index = visible_index(env)
        if index is None:
            return DeviceInfo("cpu", cpu_name(), note="this job was given no GPU (CUDA_VISIBLE_DEVICES is empty)")
        if nvml.nvmlDeviceGetCount() <= index:
            return DeviceInfo("cpu", cpu_name(), note="NVML sees no GPU")
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        total = nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20
        return DeviceInfo("gpu", name, memory_total_mb=total)
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
