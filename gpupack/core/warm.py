"""Imports made meanwhile: a process about to wait (for its first jobs, its first trials) imports in a thread what it
will need after.

A step is a function that imports (an ``import`` statement, which the layer contracts see). The thread stops at the
first that fails: that import is made again where it is needed, and fails there. Not a daemon: a process that ends
first lets it finish its module rather than stop it holding the import lock."""
from __future__ import annotations

import threading
from typing import Callable, Sequence


def never() -> bool:
    return False


def warm(steps: Sequence[Callable[[], object]], began: Callable[[], bool] = never,
         name: str = "gpupack-warm") -> threading.Thread:
    """Run ``steps`` in order in a thread, each only while ``began()`` is false."""

    def load() -> None:
        for step in steps:
            if began():
                return
            try:
                step()
            except Exception:  # noqa: BLE001 — imported again where it is needed, and said there
                return

    thread = threading.Thread(target=load, name=name)
    thread.start()
    return thread
