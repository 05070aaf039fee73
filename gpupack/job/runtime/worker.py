"""One training, in its own process: ``python -m gpupack.job.runtime.worker SPEC.json``.

The worker trains as the packer's spec says and writes its result; only the packer, which knows how the process
ended, writes the training record.
"""
from __future__ import annotations

import time

_PROCESS_START = time.time()  # before any heavy import, so start-up is measured whole

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Mapping, NoReturn, TypedDict  # noqa: E402

if TYPE_CHECKING:  # imported by name when the training runs, or when it joins a spread
    from gpupack.core.placement import Spread
    from gpupack.core.store.curves import CurveSpec, PrunedAt
    from gpupack.core.workload import Reporter, Workload


class _SpreadSpec(TypedDict, total=False):
    spread: Mapping[str, object]  # a spread training's placement (Placement.to_json); absent: one device
    curve: CurveSpec  # a search's trial: where its curve goes to its lane (gpupack.core.store.curves); absent: none


class WorkerSpec(_SpreadSpec):
    """What the worker is told of one training, as JSON: its spec file (the packer's gpupack.job.pack.worker_spec)."""

    workload: str
    params: dict[str, object]
    device: str
    threads: int
    warmup_steps: int
    spawned_at: float
    result_path: str
    logs: list[str]  # its .out and .err logs


class SharedSpec(WorkerSpec):
    """A training's spec in the shared process of N (tf_shared, fused_shared): its id, and where its error goes."""

    training_id: str
    error_path: str


class Timings(TypedDict, total=False):
    """When a training's phases began and ended (epoch seconds), and how long they took."""
    spawned_at: float
    process_start: float
    loop_start: float | None
    loop_end: float | None
    finished: float
    startup_s: float | None
    loop_s: object  # the Reporter's
    teardown_s: float | None
    thread_start: float  # a shared process's training: its thread's start


class TrainingResult(TypedDict, total=False):
    """What a training's process writes at its spec's ``result_path``; the packer composes the record from it."""
    metrics: dict[str, object]
    memory: dict[str, object]
    knobs: dict[str, object]
    loader_setting: str | None
    data: object
    throughput: Mapping[str, object]
    timings: Timings
    memory_share_applied: float
    spread: dict[str, object]
    pruned: PrunedAt  # a search's trial its pruner stopped (TrainingContext.report): recorded pruned, not failed
    framework: str | None  # what its figures were measured with: "torch 2.13.0+cpu"


def run_training(spec: WorkerSpec, process_start: float) -> TrainingResult:
    """Train once in this process and return the result: timings, throughput and metrics."""
    from gpupack.core.workload import Reporter, TrainingContext, params_from_mapping
    from gpupack.job.workloads import load_workload

    workload = load_workload(spec["workload"])
    params = params_from_mapping(workload, spec["params"])
    reporter = Reporter(warmup_steps=int(spec.get("warmup_steps", 10)))
    spread = join_spread(spec.get("spread"))
    logs = spec.get("logs")
    ctx = TrainingContext(device=spread.device if spread else spec["device"], threads=int(spec["threads"]),
                          reporter=reporter, spread=spread, logs=(logs[0], logs[1]) if logs else None,
                          curve=spec.get("curve"))
    try:
        from gpupack.job.runtime.memshare import limit_torch

        # its share of the GPU before its first CUDA allocation (a torch workload: torch imported for it here)
        applied = limit_torch(load=workload.framework == "torch") if str(ctx.device).startswith("cuda") else None
        metrics = workload.train(params, ctx)
        result = compose_result(spec, workload, params, reporter, metrics, process_start)
        if applied is not None:
            result["memory_share_applied"] = applied
        if ctx.pruned is not None:  # its lane told the study pruned already; the packer records it so
            result["pruned"] = ctx.pruned
        if spread is not None:  # what the strategy measured (all-reduce bytes and time per step), and where it ran
            result["spread"] = {**spread.placement.to_json(), **spread.stats()}
        return result
    finally:
        if spread is not None:
            spread.close()


def join_spread(placement: Mapping[str, object] | None) -> Spread | None:
    """One training spread over k devices: its strategy sets this process up and returns the workload's Spread."""
    if not placement:
        return None
    from gpupack.core.placement import Placement  # only a spread training's process needs them
    from gpupack.job.runtime.joins import join

    return join(Placement.from_json(placement))


def shared_by(result: TrainingResult, n: int) -> TrainingResult:
    """Mark a result's memory as its process's, shared by ``n`` trainings: its peak sizes no training's share."""
    if n > 1:
        result["memory"] = {**result["memory"], "shared_by": n}
    return result


def compose_result(spec: WorkerSpec, workload: Workload, params: object,
                   reporter: Reporter, metrics: Mapping[str, object],
                   process_start: float) -> TrainingResult:
    """One training's result from what it reported (the worker, and every training of a fused pack)."""
    import resource

    finished = time.time()
    # Peak resident memory of this training and of the loader workers it started (Linux reports KiB).
    peak_rss_mb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    loop = reporter.summary()
    spawned = float(spec.get("spawned_at", process_start))
    version = getattr(sys.modules.get(workload.framework), "__version__", None)  # None: its process never imported it
    return {
        "metrics": {k: v for k, v in metrics.items() if k != "data"},
        "memory": {"peak_rss_mb": round(peak_rss_mb, 1), "peak_gpu_mem_mb": metrics.get("peak_gpu_mem_mb")},
        # The throughput knobs' values, and the input-pipeline setting this training shares with its loader alone.
        "knobs": {k: getattr(params, k) for k in workload.knob_keys},
        "loader_setting": json.dumps({k: getattr(params, k) for k in workload.loader_keys}, sort_keys=True,
                                     default=str) if workload.loader_keys else None,
        "data": metrics.get("data"),
        "framework": f"{workload.framework} {version}" if version else None,
        "throughput": loop,
        # start-up: process spawn → first step (imports, data, model); the table shows it apart.
        "timings": {"spawned_at": spawned, "process_start": process_start, "loop_start": reporter.loop_start,
                    "loop_end": reporter.loop_end, "finished": finished,
                    "startup_s": (reporter.loop_start - spawned) if reporter.loop_start is not None else None,
                    "loop_s": loop["loop_s"],
                    "teardown_s": (finished - reporter.loop_end) if reporter.loop_end is not None else None},
    }


def main(argv: list[str] | None = None, process_start: float | None = None) -> int:
    """Train as the spec says and write the result. ``process_start``: when this process began (forked: its fork)."""
    from gpupack.core.store.records import (
        write_json_atomic,  # after _PROCESS_START: a training's imports are its start-up
    )

    spec: WorkerSpec = json.loads(Path((sys.argv[1:] if argv is None else argv)[0]).read_text())
    try:
        result = run_training(spec, _PROCESS_START if process_start is None else process_start)
    except Exception:  # the packer records the failure from the exit code and the stderr tail
        traceback.print_exc()
        return _end_rank(spec, 1)
    write_json_atomic(Path(spec["result_path"]), result)
    return _end_rank(spec, 0)


def _end_rank(spec: WorkerSpec, code: int) -> int:
    """A DDP rank ends here, before the interpreter's finalization, where gloo's threads can abort the process
    (pytorch#179291) or a failure's traceback hold a DDP model that waits on them for ever."""
    if spec.get("spread"):
        exit_at_once(code)
    return code


def exit_at_once(code: int) -> NoReturn:
    """End a process whose results are written, skipping its teardown (a second freeing torch, stray exit handlers)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
