"""Fused packing: the N trainings of a pack train as one batched model in one process
(:mod:`gpupack.job.runtime.fused_shared`), each with its own hyperparameters where they do not change shapes, its own
loss, metrics and record. Those that change shapes (the workload's ``fuse_key``) split a pack into groups, planned up
front (:meth:`FusedPacker.group_key`). If the process dies, every training of the pack fails with it.
"""
from __future__ import annotations

from typing import Hashable, Mapping, Sequence

from gpupack.core.plan import Training
from gpupack.core.types import Capacity, PackSettings, TrainingOutcome
from gpupack.core.workload import Workload
from gpupack.errors import ConfigError
from gpupack.job.pack import PackContext, Packer
from gpupack.job.pack._shared import refuse_rlimit_on_gpu, run_shared


class FusedPacker(Packer):
    name = "fused"
    groups = True  # trainings of one pack must share a fuse key
    one_process = True

    def check(self, workload: Workload, factor: int, capacity: Capacity, settings: PackSettings) -> None:
        if not workload.fusable:
            raise ConfigError("packing.modes", "fused", f"{workload.name} cannot be fused (no batched model: it "
                              f"is a {workload.framework} workload without train_fused)",
                              f"use packing.modes=[process] for {workload.name}")
        if capacity.has_gpu and settings.device != "cpu":
            refuse_rlimit_on_gpu(self.name, settings.memory_limit_gb_per_training)

    def group_key(self, workload: Workload, params: Mapping[str, object]) -> Hashable:
        return workload.fuse_key(workload.params(params))

    def run(self, trainings: Sequence[Training], ctx: PackContext) -> list[TrainingOutcome]:
        if ctx.device == "cuda":  # a partition check could not tell this job would have a GPU (local, device=auto)
            refuse_rlimit_on_gpu(self.name, ctx.memory_limit_bytes / 2**30 if ctx.memory_limit_bytes else None)
        return run_shared("gpupack.job.runtime.fused_shared", "fused_shared", trainings, ctx)


PACKER = FusedPacker()
