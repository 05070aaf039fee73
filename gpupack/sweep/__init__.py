"""gpupack as a library: the one flow the CLI, the Hydra launcher and a notebook call, printing nothing.

    prepared = prepare(["+sweep=mnist_pack", "packing.factors=[1,2]"])   # compose → validate → plan; writes nothing
    outcome = run(prepared)                                               # run dir, lock, resume, submit, wait, collect
    status(outcome.run_dir); collect([outcome.run_dir])

The CLI (:mod:`gpupack.cli`) parses arguments and prints what these return; the Hydra launcher plugin
(``hydra_plugins.gpupack_launcher``) builds its own :class:`Prepared` from a Hydra multirun and calls :func:`run`.
The work is in :mod:`gpupack.sweep.flow`: a run with fixed factors (``flow.run``), ``packing.factors=auto``
(``flow.auto``), status and clearing OOMs (``flow.status``), collect (``flow.collect``).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable

from gpupack.core.store.storage import storage_faults

if TYPE_CHECKING:
    from gpupack.submit import ProgressFn
    from gpupack.sweep.flow.auto import first_step
    from gpupack.sweep.flow.collect import Step, collect, find_runs
    from gpupack.sweep.flow.run import (
        Beside,
        Opened,
        Outcome,
        Prepared,
        ask_submitter,
        default_run_dir,
        forecast,
        packs_to_run,
        prepare,
        prepare_run,
        unfinished_beside,
    )
    from gpupack.sweep.flow.status import (
        SKIPPED,
        STOPPED,
        T_SKIPPED,
        TRAINING_STATES,
        PackStatus,
        RunStatus,
        clear_oom,
        follow,
        has_ended,
        pack_status,
        status,
    )

# Each name comes from its module when first used: planning stands on Hydra and submitit, collect on the tables and
# plots (pandas, pyarrow, matplotlib), and a command pays only for the side it uses.
_HOMES = {"run": ("Beside", "Opened", "Outcome", "Prepared", "ask_submitter", "default_run_dir", "forecast",
                  "packs_to_run", "prepare", "prepare_run", "unfinished_beside"),
          "status": ("SKIPPED", "STOPPED", "T_SKIPPED", "TRAINING_STATES", "PackStatus", "RunStatus", "clear_oom",
                     "follow", "has_ended", "pack_status", "status"),
          "collect": ("collect", "find_runs", "Step"),
          "auto": ("first_step",)}


def __getattr__(name: str) -> object:
    home = next((module for module, names in _HOMES.items() if name in names), None)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gpupack.sweep.flow.{home}"), name)
    globals()[name] = value  # once: later reads are a plain attribute
    return value


__all__ = ["Prepared", "Opened", "Outcome", "PackStatus", "RunStatus", "prepare", "prepare_run",
           "ask_submitter", "forecast", "run", "status", "follow", "has_ended", "collect", "clear_oom",
           "default_run_dir", "find_runs", "Beside", "unfinished_beside",
           "pack_status", "packs_to_run", "STOPPED", "SKIPPED", "T_SKIPPED", "Step", "TRAINING_STATES", "first_step"]


def run(prepared: Prepared, *, progress: ProgressFn | None = None, on_open: Callable[[Opened], None] | None = None,
        collect_outputs: bool = True, plots: bool | None = None,
        on_step: Callable[[Step], None] | None = None) -> Outcome:
    """Open the run directory (resume or refuse, lock), submit what is left, and — unless the sweep detaches —
    wait for it and collect. ``on_open`` sees what was found before anything is submitted. With
    ``packing.factors=auto``: probe for the best N, then run the grid at it (``on_step`` sees each probed N).
    ``plots``: the end's PNG plots and report.html; None: as the config says (collect.plots)."""
    if plots is None:
        plots = prepared.spec.plots if prepared.spec is not None else True
    prepared.submitter.require_reachable()  # a scheduler that does not answer here: said before anything is written
    # the run directory's file system refusing a write (full, over quota, read-only, not ours) is a StorageError: one
    # line for a front-end to print, and what finished stays recorded for the same call to resume
    with storage_faults(prepared.run.root):
        if prepared.spec is not None and prepared.spec.auto is not None:
            from gpupack.sweep.flow.auto import run_auto

            return run_auto(prepared, progress=progress, plots=plots, on_step=on_step)
        from gpupack.sweep.flow.run import run_plain

        return run_plain(prepared, progress=progress, on_open=on_open, collect_outputs=collect_outputs, plots=plots)
