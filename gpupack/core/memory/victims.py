"""Victims of a neighbour's fault: which of a pack's failed trainings were taken down by another's.

N trainings on one GPU can fail together (an MPS client's fatal fault ends every client of its server; a device reset
or ECC error ends every context), and counting each death as its own would blame N for one training's fault. The rule
(pure): the first training of the pack to fail faulted; one that failed within :data:`WINDOW_S` after it, of a crash
signal or a CUDA, MPS or NCCL error, is its victim. Never a victim: an OOM, a time limit, a scheduler's SIGTERM or
SIGKILL. The job body records a victim as ``victim`` and runs it again once, in a fresh start of the pack's mode: a
victim never counts against its N.
"""
from __future__ import annotations

import re
import signal
from typing import Sequence

from gpupack.core.store.records import COMPLETED, FAILED, KILLED, TIMEOUT, VICTIM, TrainingRecord

WINDOW_S = 10.0  # a victim dies within this long after the fault: an MPS server or a reset ends its clients at once
# What a process prints when the device or its MPS server failed under it, not its own program's mistake
COLLATERAL = re.compile(r"CUDA error|CUDA_ERROR|cudaError|CUBLAS_STATUS|CUDNN_STATUS|\bMPS\b|illegal memory access|"
                        r"unspecified launch failure|busy or unavailable|device-side assert|ECC error|NCCL error|"
                        r"Xid", re.IGNORECASE)


# The signals a process dies of when its device or MPS server fails under it (a CUDA fatal error aborts)
CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL)


def collateral(rec: TrainingRecord) -> bool:
    """A death a neighbour's fault can cause: failed or killed by a crash signal, a device, MPS or NCCL error. Pure."""
    if rec.get("status") not in (FAILED, KILLED):
        return False
    return rec.get("signal") in CRASH_SIGNALS or bool(COLLATERAL.search(str(rec.get("error") or "")))


def victims(records: Sequence[TrainingRecord]) -> dict[str, str]:
    """A pack attempt's victims: training id → the first training to fail, whose fault took it down. Pure."""
    failed = sorted((r for r in records if r.get("status") not in (COMPLETED, TIMEOUT)),
                    key=lambda r: float(r.get("ended_at") or 0))
    if len(failed) < 2:
        return {}
    first = failed[0]
    return {str(r["training_id"]): culprit for r in failed[1:]
            if (culprit := culprit_of(r, [first])) is not None}


def culprit_of(rec: TrainingRecord, earlier: Sequence[TrainingRecord]) -> str | None:
    """The training whose fault took ``rec`` down: of ``earlier`` on its device, the first to fail (no victim, no time
    limit) within :data:`WINDOW_S` before it, where ``rec``'s death is :func:`collateral`; None: its own. Pure."""
    if not collateral(rec):
        return None
    end = float(rec.get("ended_at") or 0)
    faults = [r for r in earlier if r.get("status") not in (COMPLETED, TIMEOUT, VICTIM)
              and r.get("training_id") != rec.get("training_id")
              and 0 <= end - float(r.get("ended_at") or 0) <= WINDOW_S]
    first = min(faults, key=lambda r: float(r.get("ended_at") or 0), default=None)
    return None if first is None else str(first["training_id"])
