"""Waiting for a process's end without polling: a pidfd (Linux 5.3 and later) is readable once its process has ended,
so a loop wakes at once when one it follows ends. Without a pidfd the loop looks at each timeout."""
from __future__ import annotations

import contextlib
import os
import select
import time
from typing import Iterable


def pidfd(pid: int) -> int | None:
    """A pidfd of ``pid``, or None where there is none. The caller closes it."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def close_fd(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def wait_readable(fds: Iterable[int | None], timeout_s: float) -> None:
    """Until one of ``fds`` (a None skipped) is readable (a pidfd: its process ended) or ``timeout_s`` has passed."""
    ready = [fd for fd in set(fds) if fd is not None]
    if not ready:
        time.sleep(timeout_s)
        return
    with contextlib.suppress(OSError, ValueError):  # a descriptor closed under it: look again now
        select.select(ready, [], [], timeout_s)
