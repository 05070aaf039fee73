"""How the CLI stops on a signal: Ctrl-C (SIGINT), kill (SIGTERM) or a closed terminal (SIGHUP) raise
:class:`Stopped` in the main thread, so every ``finally`` runs (the local backend cancels its pack jobs on the way
out); the CLI then prints one line saying what became of the run and exits 128 + the signal's number."""
from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Iterator

from gpupack import sweep

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """The CLI was asked to stop (SIGTERM and SIGHUP would otherwise end it at once and orphan the local jobs). A
    KeyboardInterrupt, so what cleans up after Ctrl-C cleans up after the others too. ``what``: the run's fate."""

    def __init__(self, signum: int, what: str = "") -> None:
        super().__init__(signum, what)
        self.signum, self.what = signum, what

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a command killed by this signal


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While the CLI runs, SIGINT, SIGTERM and SIGHUP raise :class:`Stopped`; a second one while it stops is let go,
    so the cancel is not cut short. A signal the CLI was started with ignored stays ignored (``nohup`` must still
    outlive a closed terminal). Only the main thread may set handlers: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            raise Stopped(signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def stopped_line(stop: KeyboardInterrupt) -> str:
    """The one line the CLI prints when stopped: which signal, and what became of the run."""
    signum = stop.signum if isinstance(stop, Stopped) else signal.SIGINT
    what = stop.what if isinstance(stop, Stopped) and stop.what else "nothing was left running"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return f"stopped by {name}: {what}"


def after_stop(prepared: sweep.Prepared) -> str:
    """What became of a sweep the CLI was stopped in: local jobs were cancelled, a cluster's outlive the CLI."""
    run_dir = prepared.run.root
    if not prepared.submitter.detachable:
        return (f"its local pack jobs and their trainings were cancelled; finished trainings keep their records. "
                f"HINT: run the same command with run_dir={run_dir} to resume")
    jobs = sorted({str(j["job_id"]).split("_")[0] for j in prepared.submitter.jobs().values()})
    if not jobs:
        return "nothing was submitted"
    return (f"the pack jobs submitted to SLURM stay queued or running. HINT: follow them with python -m gpupack status "
            f"{run_dir}, collect with python -m gpupack collect {run_dir}, or cancel them with scancel "
            f"{' '.join(jobs)}")
