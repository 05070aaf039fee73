"""Where gpupack's modules were before they moved, for what an earlier gpupack wrote down by a module's name and a
run's jobs may read after an upgrade: a pickle (:mod:`gpupack.core.store.pickling`) and a plan's workload
(:func:`gpupack.job.workloads.load_workload`)."""
from __future__ import annotations

# core's modules before its sub-packages, and the two that moved down from gpupack.runtime
MOVED = {f"gpupack.core.{old}": f"gpupack.core.{new}" for old, new in {
    **{m: f"store.{m}" for m in ("rundir", "records", "journal", "claims", "columnar", "lane_columnar", "pickling",
                                 "storage", "rank_choice")},
    "memory": "memory.figures", **{m: f"memory.{m}" for m in ("pack_fit", "admission", "victims")},
    **{m: f"cost.{m}" for m in ("billing", "rgu")}}.items()} | {
    f"gpupack.runtime.{m}": f"gpupack.core.{m}" for m in ("jobenv", "monitor")}

# The folders that became parts of a wing: a module under one of them moved with it, whatever its name.
MOVED_FOLDERS = {f"gpupack.{old}": f"gpupack.{new}" for old, new in {
    **{m: f"job.{m}" for m in ("pack", "spread", "runtime", "workloads")},
    **{m: f"results.{m}" for m in ("analysis", "report")}, **{m: f"sweep.{m}" for m in ("flow", "setup")},
    "cli_show": "cli.show", "cli_stop": "sweep.stop"}.items()}


def moved(module: str) -> str:
    """Where a module an older gpupack named lives now (the name itself where it did not move)."""
    if module in MOVED:
        return MOVED[module]
    for old, new in MOVED_FOLDERS.items():
        if module == old or module.startswith(old + "."):
            return new + module[len(old):]
    return module
