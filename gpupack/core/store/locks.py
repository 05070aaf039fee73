"""The one file lock of the run directory: ``flock``, used by every writer that must not interleave with another.

The kernel drops a flock when its holder dies, so no stale lock blocks a resume. A file system without flock (Lustre
mounted without ``-o flock``) refuses it: gpupack goes on unlocked, with a warning once per file.
"""
from __future__ import annotations

import fcntl
import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Iterator

_SAID: set[str] = set()  # the files whose lock this process said it cannot take


class Hold(Enum):
    """What asking for a lock without waiting got."""

    HELD = "held"
    BUSY = "busy"  # another process holds it
    UNLOCKABLE = "unlockable"  # the file system has no flock: going on unlocked (said)


def _unlockable(path: Path, err: OSError, risk: str) -> None:
    if str(path) not in _SAID:
        _SAID.add(str(path))
        print(f"gpupack: warning: cannot lock {path} ({err.strerror}); {risk}", file=sys.stderr)


@contextmanager
def held(fd: int, path: Path, *, shared: bool = False,
         risk: str = "do not run two writers of it at once") -> Iterator[None]:
    """``fd`` (an open descriptor of ``path``) locked while the block runs, waiting for it; shared: readers only."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        locked = True
    except OSError as err:
        _unlockable(path, err, risk)
        locked = False
    try:
        yield
    finally:
        if locked:
            fcntl.flock(fd, fcntl.LOCK_UN)


def try_hold(fd: int, path: Path, risk: str) -> Hold:
    """``fd`` (an open descriptor of ``path``) locked now, or why not; it stays held until the descriptor is closed."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return Hold.BUSY
    except OSError as err:
        _unlockable(path, err, risk)
        return Hold.UNLOCKABLE
    return Hold.HELD
