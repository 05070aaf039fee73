"""What the backend answered, once, and the checks against it (fit, idle GPUs, billing, how far packing.factors=auto's
ladder can climb). Pure: nothing is asked of the backend here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from gpupack.core.cost.billing import CORES, Bundle, over_bundle
from gpupack.core.memory.figures import Figure, TrainingMemory, check_memory
from gpupack.core.types import Capacity, PackRequest
from gpupack.errors import ConfigError


@dataclass(frozen=True)
class ClusterFacts:
    """What the backend answered, once, before validation: validation reads these and asks nothing else."""

    partitions: tuple[str, ...]
    capacities: Mapping[str, Capacity]
    # What a pack of N asks for: a pure function of the backend's options and, where given, one training's host
    # memory figure (measured on the partitions' device, or not: then a default, saying why).
    request: Callable[..., PackRequest]
    # How many streaming jobs of one (partition, mode, N) may run at once on a partition (packing.jobs=null).
    stream_jobs: Callable[[str], int] = lambda partition: 1


def check_fit(factors: Sequence[int], facts: ClusterFacts, key: Callable[[int], str], noun: str = "trainings",
              request_host_mb: Figure | None = None, per_node: bool = False) -> None:
    """Each pack of N must fit what one job on each partition can have (CPUs, host memory); ``per_node``: a job of
    several GPUs (spread), bounded by a whole node rather than one GPU's share. Pure."""
    for name, cap in facts.capacities.items():
        max_cpus = (cap.node_cpus or cap.max_cpus) if per_node else cap.max_cpus
        for i, n in enumerate(factors):
            req = facts.request(n, request_host_mb)
            if max_cpus and req.cpus and req.cpus > max_cpus:
                raise ConfigError(key(i), n, f"{n} {noun} x {req.cpus_key}={req.cpus_each:g} = {req.cpus} CPUs, but "
                                  f"one {name} {'node has' if per_node else 'GPU job gets at most'} {max_cpus}",
                                  f"lower N, or set {req.cpus_key}={max_cpus / n:.2g} so N {noun} share the cores")
            if cap.max_mem_mb and req.mem_mb and req.mem_mb > cap.max_mem_mb:
                raise ConfigError(key(i), n, f"{n} {noun} x {req.mem_key}={req.mem_gb_each:g} ({req.mem_why}) = "
                                  f"{req.mem_mb / 1024:.1f} GB, but a {name} node has {cap.max_mem_mb / 1024:.1f} GB",
                                  f"lower N or {req.mem_key}")


def idle_gpu_warnings(factors: Sequence[int], facts: ClusterFacts, measured_host_mb: Figure | None) -> list[str]:
    """Where a pack's request lets fewer packs onto a node than it has GPUs (the others idle): say so. Pure."""
    out = []
    for name, cap in facts.capacities.items():
        if not (cap.node_gpus and cap.node_gpus > 1):
            continue
        for n in factors:
            req = facts.request(n, measured_host_mb)
            per_node = [cap.node_gpus]
            if req.cpus and cap.node_cpus:
                per_node.append(cap.node_cpus // req.cpus)
            if req.mem_mb and cap.node_mem_mb:
                per_node.append(int(cap.node_mem_mb // req.mem_mb))
            if min(per_node) < cap.node_gpus:
                out.append(f"{name}: a pack of N={n} asks {req.cpus} CPUs and {(req.mem_mb or 0) / 1024:.1f} GB "
                           f"({req.mem_key}={req.mem_gb_each:g}, {req.mem_why}); a node has {cap.node_gpus} GPUs, "
                           f"{cap.node_cpus} CPUs and {(cap.node_mem_mb or 0) / 1024:.1f} GB, so {min(per_node)} "
                           f"pack(s) fit per node and {cap.node_gpus - min(per_node)} GPU(s) sit idle. HINT: lower "
                           f"{req.mem_key} or {req.cpus_key} to a node's share per GPU")
    return out


def bundle_warnings(factors: Sequence[int], facts: ClusterFacts, measured_host_mb: Figure | None) -> list[str]:
    """Where a pack of N asks more cores or memory than one GPU's bundle (billed for the largest of the three): say
    what it asks, the bundle, the billed multiple of the GPU's RGU, and the fix. Pure."""
    out = []
    for name, cap in facts.capacities.items():
        bundle = Bundle(1.0, cap.bundle_cores, cap.bundle_mem_gb)
        for n in factors:
            req = facts.request(n, measured_host_mb)
            over = over_bundle(bundle, req.cpus, (req.mem_mb or 0) / 1024 if req.mem_mb else None)
            if over is None:
                continue
            fix = (f"fewer cores per training ({req.cpus_key})" if over.term == CORES else
                   f"measured memory sizing ({req.mem_key}=null after a first run) or less per training "
                   f"({req.mem_key})")
            out.append(f"{name}: a pack of N={n} asks {req.cpus} cores and {(req.mem_mb or 0) / 1024:.1f} GB; one "
                       f"GPU's bundle here is {cap.bundle_cores:g} cores and {cap.bundle_mem_gb:g} GB, so the pack is "
                       f"billed by {over.term}: {over.multiple:.2f}x the GPU's RGU. HINT: {fix}, or a smaller N")
    return out


def auto_ladder(ladder: Sequence[int], facts: ClusterFacts, memory: TrainingMemory, fraction: float,
                check_mode: Callable[[int], None]) -> tuple[tuple[int, ...], str | None, str | None]:
    """The ladder as far as a job on every partition holds it (the first rung must) and why it stops there; and where
    memory would stop it by today's figures (a forecast: the probe re-checks with what it measures). Pure."""
    memory_note = None
    for i, n in enumerate(ladder):
        try:
            check_fit([n], facts, key=lambda _: "packing.auto.ladder", request_host_mb=memory.host)
            check_mode(n)
        except ConfigError as err:
            if i == 0:
                raise
            return tuple(ladder[:i]), f"N={n} not tried: {err.why}", memory_note
        try:
            check_memory([n], facts.capacities, memory, fraction, key=lambda _: "packing.auto.ladder")
        except ConfigError as err:
            if i == 0:
                raise
            memory_note = memory_note or f"by today's memory figures the climb stops before N={n} ({err.why})"
    return tuple(ladder), None, memory_note
