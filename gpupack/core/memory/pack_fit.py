"""Packs admitted by memory (packing.admission): whether a whole pack of N may start, by what its trainings were
measured to need (:func:`training_peak`).

The pack fits where the sum of the known peaks stays within the device's memory share (:func:`pack_budget`); what
is not known counts as nothing, and a pack of one training always starts (it measures its setting). A pack that does
not fit is recorded as skipped for memory; its trainings run in packs of the largest N that fits
(:func:`largest_fit`, :func:`gpupack.core.plan.refit_packs`), unless the plan runs their points at a smaller N anyway
(:func:`gpupack.core.plan.run_at_smaller_n`). Everything here is pure.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from gpupack.core.memory.figures import Figure


@dataclass(frozen=True)
class Budget:
    """What a pack's trainings may hold together (MB), and what it is, in words."""

    mb: float
    words: str


@dataclass(frozen=True)
class Fit:
    """Whether a pack may start, and why, in words (what it needs against what it may hold)."""

    fits: bool
    why: str


def pack_budget(on_gpu: bool, fraction: float, device_total_mb: float | None, host_total_mb: float | None,
                host_memory_mb: float | None) -> Budget | None:
    """A pack's memory share on its device: ``fraction`` of the GPU's memory; on a CPU ``host_memory_mb``
    (packing.host_memory_mb) where given, else ``fraction`` of the host's. None: nothing to go by. Pure."""
    if on_gpu:
        return Budget(fraction * device_total_mb, f"{fraction:g} x {gb(device_total_mb)} GPU memory") \
            if device_total_mb else None
    if host_memory_mb is not None:
        return Budget(float(host_memory_mb), f"packing.host_memory_mb={host_memory_mb:g}")
    return Budget(fraction * host_total_mb, f"{fraction:g} x {gb(host_total_mb)} host memory") \
        if host_total_mb else None


def training_peak(this_run: Figure | None, earlier: Figure | None, stated_mb: float | None) -> Figure | None:
    """A setting's expected peak: this run's, earlier runs', or sweep.training_memory_mb; None: not known. Pure."""
    if this_run is not None:
        return this_run
    if earlier is not None:
        return earlier
    return Figure(float(stated_mb), f"sweep.training_memory_mb={stated_mb:g}") if stated_mb is not None else None


def pack_fit(n: int, peaks: Sequence[Figure | None], budget: Budget | None) -> Fit:
    """Whether a pack of ``n`` fits ``budget``: the sum of its known ``peaks`` (None: unknown) within it. Pure."""
    if n <= 1:
        return Fit(True, "one training: the smallest pack, started whatever it is expected to need")
    if budget is None:
        return Fit(True, "no memory share known: started as without admission")
    known = [p for p in peaks if p is not None]
    if not known:
        return Fit(True, "no training's peak is known yet: started as without admission")
    need = sum(p.mb for p in known)
    verdict = "<=" if need <= budget.mb else ">"
    counts = Counter(p.mb for p in known)  # equal peaks counted ("4 x 12.6 GB"), largest first
    terms = " + ".join(f"{k} x {gb(mb)}" for mb, k in sorted(counts.items(), reverse=True))
    why = (f"N={n} needs {terms} = {gb(need)} {verdict} {budget.words} ({gb(budget.mb)})"
           + (f", {len(peaks) - len(known)} training(s) not known" if len(known) < len(peaks) else "")
           + "; " + "; ".join(dict.fromkeys(p.source for p in known)))
    return Fit(need <= budget.mb, why)


@dataclass(frozen=True)
class Refit:
    """The N a skipped pack's trainings run at instead, and why, in words."""

    n: int
    why: str


def largest_fit(peaks: Sequence[Figure | None], budget: Budget | None, most: int | None = None) -> Refit:
    """The largest N up to ``most`` (default: below ``len(peaks)``; at least 1) at which the N largest known peaks
    fit ``budget`` by :func:`pack_fit`, so every pack of N dealt from them in any order fits. Pure."""
    largest = sorted(peaks, key=lambda p: -1.0 if p is None else p.mb, reverse=True)
    top = len(peaks) - 1 if most is None else min(most, len(peaks))
    for n in range(top, 1, -1):
        fit = pack_fit(n, largest[:n], budget)
        if fit.fits:
            return Refit(n, f"the largest N that fits: {fit.why}")
    return Refit(1, "one training at a time: no pack of 2 of them fits"
                 + (f" ({pack_fit(2, largest[:2], budget).why})" if len(peaks) > 1 else ""))


def gb(mb: float) -> str:
    """MB in words: GB with one decimal from 1 GB up, whole MB below. Pure."""
    return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb:.0f} MB"
