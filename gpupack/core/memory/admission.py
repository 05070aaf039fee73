"""Slots admitted by memory (packing.admission): which training a streaming lane's freed slot takes now, or none yet.

A freed slot takes the next training of its queue only when its expected peak (:func:`expected_peak`) fits both the
device's free memory and the lane's budget less what its running trainings are expected to hold (one just started has
not allocated yet). A head that does not fit lets smaller trainings go past it a bounded number of times, then is
reserved until it starts, so it is never starved. A lane with nothing running, or a head whose peak is not known,
takes its head as without admission. Everything here is pure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from gpupack.core.memory.figures import Figure, gpu_peak_mb, host_peak_mb
from gpupack.core.memory.pack_fit import pack_budget

# A head passed over this many times by smaller trainings (N slots: one generation of the lane's slots) is reserved.
PASSES_PER_SLOT = 1


@dataclass(frozen=True)
class Candidate:
    """One of the queue's next trainings and the memory it is expected to peak at (MB; None: not known)."""

    training_id: str
    peak_mb: float | None


@dataclass(frozen=True)
class LaneMemory:
    """The lane's memory now: the device's free, the lane's budget (None: unknown), what its running trainings hold."""

    free_mb: float | None
    budget_mb: float | None
    committed_mb: float = 0.0
    running: int = 0

    @property
    def available_mb(self) -> float:
        """What a training started now may take: the least of the device's free memory and the budget's rest."""
        limits = [x for x in (self.free_mb, None if self.budget_mb is None else self.budget_mb - self.committed_mb)
                  if x is not None]
        return min(limits) if limits else math.inf


@dataclass(frozen=True)
class Admission:
    """What a freed slot does: take ``candidates[take]``, or wait (``take`` None); ``why`` says so in words."""

    take: int | None
    why: str

    @property
    def passes_head(self) -> bool:
        return self.take is not None and self.take > 0


def admit(candidates: Sequence[Candidate], room: LaneMemory, head_passes: int, max_passes: int) -> Admission:
    """Which of ``candidates`` (the queue's next trainings, head first; not empty) a freed slot takes now, or wait.
    ``head_passes``: how many trainings went past the head already; at ``max_passes`` it is reserved. Pure."""
    head = candidates[0]
    available = room.available_mb
    if head.peak_mb is None:
        return Admission(0, "its peak is not known: admitted as without admission")
    if head.peak_mb <= available:
        return Admission(0, f"its {head.peak_mb:.0f} MB fit the {available:.0f} MB free")
    if room.running == 0:
        return Admission(0, "nothing else runs in the lane: waiting would free nothing")
    if head_passes >= max_passes:
        return Admission(None, f"the head ({head.peak_mb:.0f} MB) was passed over {head_passes} time(s): reserved "
                               f"until {available:.0f} MB free grows to fit it")
    for i, other in enumerate(candidates[1:], start=1):
        if other.peak_mb is not None and other.peak_mb <= available:
            return Admission(i, f"the head's {head.peak_mb:.0f} MB do not fit the {available:.0f} MB free; "
                                f"a {other.peak_mb:.0f} MB training does")
    return Admission(None, f"none of the next {len(candidates)} fits the {available:.0f} MB free")


def max_passes(slots: int) -> int:
    """How many trainings may go past a head that does not fit before it is reserved. Pure."""
    return max(1, PASSES_PER_SLOT * slots)


def expected_peak(earlier: Figure | None, stated_mb: float | None, this_run_mb: float | None) -> Figure | None:
    """A setting's expected peak: earlier records, else sweep.training_memory_mb, else this run's peak; None. Pure."""
    if earlier is not None:
        return earlier
    if stated_mb is not None:
        return Figure(float(stated_mb), f"sweep.training_memory_mb={stated_mb:g}")
    if this_run_mb is not None:
        return Figure(float(this_run_mb), "the peak of its setting in this run", measured=True)
    return None


def lane_budget_mb(on_gpu: bool, fraction: float, device_total_mb: float | None, host_total_mb: float | None,
                   host_memory_mb: float | None) -> float | None:
    """What a lane's trainings may hold together: a pack's memory share (:func:`pack_budget`); None: unknown. Pure."""
    budget = pack_budget(on_gpu, fraction, device_total_mb, host_total_mb, host_memory_mb)
    return None if budget is None else budget.mb


def peak_of(record: Mapping[str, object], on_gpu: bool) -> float | None:
    """The peak a training's record says it reached on the lane's device (MB); None: not recorded. Pure."""
    memory = record.get("memory")
    if not isinstance(memory, Mapping):
        return None
    return gpu_peak_mb(memory) if on_gpu else host_peak_mb(memory)
