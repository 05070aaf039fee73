"""A search's plan: K streaming lanes of N slots per (partition, mode), whose freed slots ask the study. Pure."""
from __future__ import annotations

from typing import Sequence

from gpupack.core.plan import Pack, Plan


def search_plan(*, sweep: str, workload: str, factor: int, partitions: Sequence[str], modes: Sequence[str],
                jobs: int, n_trials: int, phase: str | None = None) -> Plan:
    """``jobs`` lanes of ``factor`` slots per (partition, mode), no more lanes than ``n_trials`` fill at the start."""
    k = max(1, min(jobs, -(-n_trials // factor)))
    packs = tuple(Pack(f"{partition}-{mode}-n{factor:02d}-s{j:03d}", partition, mode, factor, j, (),
                       stream=f"{partition}-{mode}-n{factor:02d}-search", search=True)  # its lanes' claims' queue
                  for partition in partitions for mode in modes for j in range(k))
    note = (f"search: {k} lane(s) of {factor} slots per (partition, mode) ask the study for its {n_trials} trials; "
            "a slot that frees asks for the next at once")
    return Plan(sweep=sweep, workload=workload, grid_size=n_trials, packs=packs, notes=(note,), phase=phase)
