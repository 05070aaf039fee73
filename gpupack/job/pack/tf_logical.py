"""TensorFlow logical-device packing ("split"): one TF process per pack (:mod:`gpupack.job.runtime.tf_shared`), its
device split into N logical devices before TensorFlow initialises, the N trainings in threads, each pinned to its own.
On a GPU each logical GPU gets the pack's GPU memory budget / N; on a CPU they are plain logical CPUs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from gpupack.core.plan import Training
from gpupack.core.types import Capacity, PackSettings, TrainingOutcome
from gpupack.core.workload import Workload
from gpupack.errors import ConfigError, require_memory
from gpupack.job.pack import PackContext, Packer
from gpupack.job.pack._shared import refuse_rlimit_on_gpu, run_shared
from gpupack.job.workloads import load_workload


def split_memory_mb(total_mb: float, n: int, reserve_mb: float, budget_mb: float | None,
                    min_per_split_mb: float, key: str = "packing.factors") -> int:
    """Memory limit of each of n logical GPUs: the budget (or all but the reserve) / n, refused below the minimum."""
    budget = budget_mb if budget_mb is not None else total_mb - reserve_mb
    if budget > total_mb:
        raise ConfigError("packing.tf_logical.gpu_memory_budget_mb", budget_mb,
                          f"more than the GPU's {total_mb:.0f} MB", f"give at most {total_mb - reserve_mb:.0f}")
    per = int(budget // n)
    if per < min_per_split_mb:
        raise ConfigError(key, n, f"{n} logical GPUs of {per} MB each (budget {budget:.0f} MB of {total_mb:.0f} MB) "
                          f"are below the workload's minimum of {min_per_split_mb:.0f} MB",
                          f"use N <= {int(budget // min_per_split_mb)}, "
                          "or raise packing.tf_logical.gpu_memory_budget_mb")
    return per


def logical_devices(kind: str, n: int) -> list[str]:
    return [f"/device:{'GPU' if kind == 'gpu' else 'CPU'}:{i}" for i in range(n)]


@dataclass
class TfLogicalOptions:
    """packing.tf_logical.*: how a GPU is split into N logical GPUs."""

    gpu_memory_budget_mb: Optional[int] = None  # shared out among the N logical GPUs (MB); null: all but the reserve
    gpu_memory_reserve_mb: int = 1024

    def check(self) -> None:
        """Refuse a value out of range, whether or not tf_logical is used (against a GPU: :func:`split_memory_mb`)."""
        require_memory(self.gpu_memory_budget_mb, "packing.tf_logical.gpu_memory_budget_mb", "MB",
                       "packing.tf_logical.gpu_memory_budget_mb=8000, or null for the GPU's memory less "
                       "gpu_memory_reserve_mb")
        require_memory(self.gpu_memory_reserve_mb, "packing.tf_logical.gpu_memory_reserve_mb", "MB",
                       "packing.tf_logical.gpu_memory_reserve_mb=1024 (kept back for the CUDA context and "
                       "TensorFlow)", allow_none=False, allow_zero=True)


class TfLogicalPacker(Packer):
    name = "tf_logical"
    split_label = "split (TF logical)"
    line_style = "--"
    one_process = True
    Options = TfLogicalOptions

    def check(self, workload: Workload, factor: int, capacity: Capacity, settings: PackSettings) -> None:
        if workload.framework != "tensorflow":
            raise ConfigError("packing.modes", "tf_logical", f"{workload.name} is a {workload.framework} workload and "
                              "TF logical devices only run TensorFlow trainings",
                              f"use packing.modes=[process] for {workload.name}")
        if capacity.has_gpu and settings.device != "cpu":
            refuse_rlimit_on_gpu(self.name, settings.memory_limit_gb_per_training)
        if capacity.has_gpu and capacity.gpu_memory_mb:
            opts = settings.options(self.name, TfLogicalOptions)
            split_memory_mb(capacity.gpu_memory_mb, factor, opts.gpu_memory_reserve_mb, opts.gpu_memory_budget_mb,
                            workload.min_gpu_memory_mb)

    def run(self, trainings: Sequence[Training], ctx: PackContext) -> list[TrainingOutcome]:
        n = len(trainings)
        total_mb = ctx.gpu_memory_total_mb if ctx.device == "cuda" else None
        on_gpu = total_mb is not None
        memory_mb = None
        if total_mb is not None:  # a partition check could not tell this job would have a GPU (local, device=auto)
            refuse_rlimit_on_gpu(self.name, ctx.memory_limit_bytes / 2**30 if ctx.memory_limit_bytes else None)
            workload = load_workload(trainings[0].workload)
            opts = (ctx.settings or PackSettings()).options(self.name, TfLogicalOptions)
            memory_mb = split_memory_mb(total_mb, n, opts.gpu_memory_reserve_mb,
                                        opts.gpu_memory_budget_mb, workload.min_gpu_memory_mb)
        return run_shared("gpupack.job.runtime.tf_shared", "tf_shared", trainings, ctx,
                          logical_devices("gpu" if on_gpu else "cpu", n),
                          extra={"kind": "gpu" if on_gpu else "cpu", "memory_limit_mb": memory_mb})


PACKER = TfLogicalPacker()
