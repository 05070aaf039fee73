"""What a job is charged, as the Alliance charges it. Pure.

The Alliance's "Allocations and compute scheduling" page (docs.alliancecan.ca, 2026-04-10): "Research groups are
charged for the maximum number of RGU-core-memory bundles they use." Each cluster gives one GPU (or MIG slice) a
bundle of cores and memory; a job is charged the largest of its GPUs, its cores and its memory, each counted in
bundles, times the RGU of one bundle. The page's example, a bundle of 1 RGU, 3 cores and 4 GB: 1 RGU with 5 cores and
5 GB is 1.66 RGU equivalents (by cores). A site without bundles is costed by its GPU's RGU alone.
"""
from __future__ import annotations

from dataclasses import dataclass

GPU, CORES, MEMORY, GPU_ONLY = "gpu", "cores", "memory", "gpu (no bundle known)"


@dataclass(frozen=True)
class Bundle:
    """What one GPU (or MIG slice) brings with it on a cluster: its RGU, cores and memory."""

    rgu: float
    cores: float | None = None
    mem_gb: float | None = None


@dataclass(frozen=True)
class Bill:
    """What one job is charged per hour: RGU equivalents, the term that set them, and each term's count of bundles."""

    rgu_equivalents: float
    term: str  # gpu | cores | memory | "gpu (no bundle known)"
    gpu_bundles: float
    core_bundles: float | None
    memory_bundles: float | None

    @property
    def bundles(self) -> float:
        """Bundles charged: the largest of the three counts."""
        return max(b for b in (self.gpu_bundles, self.core_bundles, self.memory_bundles) if b is not None)

    @property
    def multiple(self) -> float:
        """How many times its GPUs' RGU the job is charged (1.0: the GPUs bill)."""
        return self.bundles / self.gpu_bundles


def bill(bundle: Bundle, cores: float | None, mem_gb: float | None, gpus: float = 1.0) -> Bill:
    """RGU per hour: max(gpus, cores / bundle cores, mem / bundle mem) x the bundle's RGU; unknown terms left out."""
    core_bundles = cores / bundle.cores if bundle.cores and cores is not None else None
    memory_bundles = mem_gb / bundle.mem_gb if bundle.mem_gb and mem_gb is not None else None
    terms = {GPU: gpus, CORES: core_bundles, MEMORY: memory_bundles}
    known = {k: v for k, v in terms.items() if v is not None}
    term = max(known, key=lambda k: (known[k], k == GPU))  # a tie bills as the GPU: nothing is over its bundle
    if core_bundles is None and memory_bundles is None:
        term = GPU_ONLY
    return Bill(known.get(term, gpus) * bundle.rgu, term, gpus, core_bundles, memory_bundles)


def over_bundle(bundle: Bundle, cores: float | None, mem_gb: float | None) -> Bill | None:
    """The bill of a one-GPU job that asks more cores or memory than the GPU's bundle, else None."""
    charged = bill(bundle, cores, mem_gb)
    return charged if charged.term in (CORES, MEMORY) else None
