"""Out of memory as a training's process shows it: the words frameworks say it with in its stderr tail, and the
cgroup's OOM kills counted while the pack ran (a SIGKILL for memory, not by a person or a scheduler)."""
from __future__ import annotations

import re
import signal
from pathlib import Path

from gpupack.core.types import TrainingOutcome

# How frameworks say "out of memory" (torch CPU/CUDA, TF, Python, C++), in a training's stderr tail.
OOM_PATTERNS = re.compile(
    r"CUDA out of memory|OutOfMemoryError|out of memory|MemoryError|can't allocate memory|ResourceExhausted"
    r"|OOM when allocating|std::bad_alloc|Cannot allocate memory", re.IGNORECASE)

CGROUP_ROOT = Path("/sys/fs/cgroup")
OOM_KILLED_BY = "oom_killed_by"  # in a training's record: what says a SIGKILL was for memory


def ran_out_of_memory(outcome: TrainingOutcome) -> bool:
    """The training said it ran out of memory (with no result), or was SIGKILLed for memory (:func:`note_oom_kill`)."""
    said = outcome.result is None and bool(outcome.error) and OOM_PATTERNS.search(outcome.error or "") is not None
    return said or bool(outcome.extra.get(OOM_KILLED_BY))


def memory_events_path(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> Path | None:
    """The file where this process's cgroup (its trainings' too) counts OOM kills: v2 ``memory.events``, else v1
    ``memory.oom_control``; None where neither is readable. Tests point it at a file of their own."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    candidates: list[Path] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.strip().lstrip("/")
        if controllers == "":  # v2; on a hybrid host its tree is mounted at unified/
            candidates += [root / rel / "memory.events", root / "unified" / rel / "memory.events"]
        elif "memory" in controllers.split(","):  # v1; in a container without a cgroup namespace, its own
            candidates += [root / "memory" / rel / "memory.oom_control", root / "memory" / "memory.oom_control"]
    return next((c for c in candidates if c.is_file()), None)


def oom_kill_count(path: Path | None = None) -> int | None:
    """The ``oom_kill`` counter of ``path`` (default: :func:`memory_events_path`); None where it cannot be read."""
    path = memory_events_path() if path is None else path
    if path is None:
        return None
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def note_oom_kill(outcome: TrainingOutcome, oom_kills_before: int | None) -> None:
    """A training SIGKILLed while its cgroup's oom_kill counter rose was killed for memory: its record says oom."""
    if outcome.signal != signal.SIGKILL or oom_kills_before is None or outcome.extra.get("timed_out"):
        return
    now = oom_kill_count()
    if now is None or now <= oom_kills_before:
        return
    outcome.extra[OOM_KILLED_BY] = f"cgroup: {now - oom_kills_before} OOM kill(s) counted while the pack ran"
    why = f"killed by the out-of-memory killer ({outcome.extra[OOM_KILLED_BY]})"
    outcome.error = f"{outcome.error}\n{why}" if outcome.error else why
