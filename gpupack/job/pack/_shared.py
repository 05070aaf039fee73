"""One process runs all N trainings of a pack (tf_logical, fused): starting it, following each training's result as
it lands, stopping it past its time limit, and recording what it never finished.

The shared process is ``python -m <module> SPEC.json``; it writes each training's result or error file, so one
training failing never hides the others'.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from gpupack.core.plan import Training
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.types import TrainingOutcome
from gpupack.errors import ConfigError
from gpupack.job.pack import PackContext, ended_outcome, worker_env, worker_spec
from gpupack.job.runtime.supervisor import ChildExit, ChildSpec, Supervisor, tail

if TYPE_CHECKING:  # a training's spec, as the shared process reads it
    from gpupack.job.runtime.worker import SharedSpec


def shared_specs(trainings: Sequence[Training], ctx: PackContext, spawned: float,
                 devices: Sequence[str] | None = None) -> list[SharedSpec]:
    """Each training's worker spec, with where its error goes and (tf_logical) its device."""
    specs = []
    for i, t in enumerate(trainings):
        spec: SharedSpec = {**worker_spec(t, ctx, spawned), "training_id": t.training_id,
                            "error_path": str(ctx.work(t.training_id, "error"))}
        if devices is not None:
            spec["device"] = devices[i]
        Path(spec["result_path"]).unlink(missing_ok=True)
        Path(spec["error_path"]).unlink(missing_ok=True)
        specs.append(spec)
    return specs


def refuse_rlimit_on_gpu(mode: str, limit_gb: float | None) -> None:
    """Refuse RLIMIT_AS on a GPU job: CUDA reserves more address space than any host-memory limit allows."""
    if limit_gb:
        raise ConfigError("packing.memory_limit_gb_per_training", limit_gb,
                          f"{mode} on a GPU cannot run under an address-space limit "
                          "(RLIMIT_AS): CUDA reserves more address space than any host-memory figure",
                          "leave it null on GPU jobs: SLURM's cgroup already caps the job's host memory at the --mem "
                          "it asks for (cluster.mem_gb_per_training per training)")


def run_shared(module: str, name: str, trainings: Sequence[Training], ctx: PackContext,
               devices: Sequence[str] | None = None,
               extra: Mapping[str, object] | None = None) -> list[TrainingOutcome]:
    """Run ``python -m module`` on the trainings' specs: each one's outcome as it lands, or at the process's end."""
    run, pack_id = ctx.run, ctx.pack.pack_id
    spawned = time.time()
    specs = shared_specs(trainings, ctx, spawned, devices)
    n = len(specs)
    spec_path = ctx.work(name, "spec")
    write_json_atomic(spec_path, {"threads": ctx.threads * n, "trainings": specs, **(extra or {})})
    # One process runs all N: the per-training limit applies N times over. Its time limit counts from the spawn.
    child = ChildSpec(name, [sys.executable, "-m", module, str(spec_path)], run.log(pack_id, name, "out"),
                      run.log(pack_id, name, "err"),
                      worker_env(ctx.env, ctx.threads * n), started_at=spawned,
                      memory_limit_bytes=ctx.memory_limit_bytes * n if ctx.memory_limit_bytes else None)
    outcomes: dict[str, TrainingOutcome] = {}

    def look(ended: ChildExit | None = None) -> None:
        """Each training's outcome as it lands; ``ended``: the process's end, that of a training it never finished."""
        for spec in specs:
            tid = spec["training_id"]
            if tid in outcomes:
                continue
            outcome = landed(spec, spawned)
            if outcome is None and ended is not None:  # it died, or was stopped
                code = ended.returncode
                outcome = ended_outcome(tid, spawned, ended.ended_at, code, result=None, timed_out=ended.timed_out,
                                        error=tail(ended.err_path) or f"the {name} process exited with code {code}")
            if outcome is not None:
                outcomes[tid] = outcome
                ctx.on_finished(outcome)

    with Supervisor(ctx.training_timeout_s or None) as supervisor:
        pid = supervisor.start(child).pid
        if pid is None:  # no interpreter for it (no memory, no process left): the pack fails, as it always did
            raise supervisor.children[0].start_error or OSError(f"the {name} process did not start")
        for spec in specs:
            ctx.on_started(spec["training_id"], pid)  # one process runs them all
        (ended,) = supervisor.follow(on_poll=look)
    look(ended)
    return [outcomes[s["training_id"]] for s in specs]


def landed(spec: SharedSpec, spawned: float) -> TrainingOutcome | None:
    """A training's outcome once the shared process wrote its result or its error; None while it runs."""
    result_path, error_path = Path(spec["result_path"]), Path(spec["error_path"])
    logical = str(spec.get("device", "")).startswith("/device:")
    extra: dict[str, object] = {"logical_device": spec["device"]} if logical else {}
    if result_path.exists():
        result = read_json(result_path)
        # Started when the shared process was spawned: its start-up is every training's, as in process mode.
        return TrainingOutcome(spec["training_id"], spawned, result["timings"]["finished"], 0, None, None,
                               result, extra=extra)
    if error_path.exists():
        error = read_json(error_path)
        return TrainingOutcome(spec["training_id"], spawned, error["ended"], 1, None, error["error"], None,
                               extra=extra)
    return None
