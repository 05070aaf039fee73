"""One process hosts all N trainings of a pack (tf_logical: one TF process, N logical devices; fused: one torch
process, N models batched as one): the helper both modes share to start that host, follow each training's result
as it lands, stop it past its time limit, and record what it never finished.

The host is ``python -m <module> SPEC.json`` (SPEC: {"trainings": [worker specs...], ...}); it writes each
training's result (the worker's schema) or error file, so one training failing never hides the others'.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpupack.core.plan import Training
from gpupack.core.records import open_log, read_json, write_json_atomic
from gpupack.core.types import TrainingOutcome
from gpupack.errors import ConfigError
from gpupack.pack import PackContext, worker_env, worker_spec
from gpupack.pack.process import KILL_GRACE_S, POLL_S, _child_setup, tail


def host_specs(trainings: Sequence[Training], ctx: PackContext, spawned: float,
               devices: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Each training's worker spec, with where its error goes and (tf_logical) its device."""
    run, pack_id = ctx.run, ctx.pack.pack_id
    specs = []
    for i, t in enumerate(trainings):
        spec = worker_spec(t, ctx, spawned)
        spec.update(training_id=t.training_id, error_path=str(run.work(pack_id, t.training_id, "error")))
        if devices is not None:
            spec["device"] = devices[i]
        Path(spec["result_path"]).unlink(missing_ok=True)
        Path(spec["error_path"]).unlink(missing_ok=True)
        specs.append(spec)
    return specs


LIMIT_KEY = "packing.memory_limit_gb_per_training"


def refuse_rlimit_on_gpu(mode: str, limit_gb: float | None) -> None:
    """RLIMIT_AS on a GPU job: CUDA reserves far more address space than memory it uses (TensorFlow's allocator and
    the unified address space), so an address-space limit sized to host memory makes CUDA fail to start."""
    if limit_gb:
        raise ConfigError(LIMIT_KEY, limit_gb, f"{mode} on a GPU cannot run under an address-space limit "
                          "(RLIMIT_AS): CUDA reserves more address space than any host-memory figure",
                          "leave it null on GPU jobs: SLURM's cgroup already caps the job's host memory at the --mem "
                          "it asks for (cluster.mem_gb_per_training per training)")


def pack_memory_limit(per_training_bytes: int | None, n: int) -> int | None:
    """The address-space limit of the one host process of n trainings: n x one training's figure. Pure."""
    return per_training_bytes * n if per_training_bytes else None


def run_host(module: str, name: str, specs: list[dict[str, Any]], ctx: PackContext, spawned: float,
             extra: Mapping[str, Any] | None = None) -> list[TrainingOutcome]:
    """Start ``python -m module`` on the pack's specs and follow it to its end."""
    run, pack_id = ctx.run, ctx.pack.pack_id
    n = len(specs)
    host_spec = run.pack_dir(pack_id) / "work" / f"{name}.spec.json"
    write_json_atomic(host_spec, {"threads": ctx.threads * n, "trainings": specs, **(extra or {})})
    err_path = run.pack_dir(pack_id) / "logs" / f"{name}.err"
    with open_log(run.pack_dir(pack_id) / "logs" / f"{name}.out") as out, open_log(err_path) as err:
        proc = subprocess.Popen([sys.executable, "-m", module, str(host_spec)], stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env=worker_env(ctx.env, ctx.threads * n),
                                start_new_session=True,
                                # One process hosts all N: the per-training limit applies N times over.
                                preexec_fn=_child_setup(pack_memory_limit(ctx.memory_limit_bytes, len(specs))))
        for spec in specs:
            ctx.on_started(spec["training_id"], proc.pid)  # one process hosts them all
        return follow(proc, specs, ctx, spawned, err_path, name)


def follow(proc: subprocess.Popen, specs: list[dict[str, Any]], ctx: PackContext, spawned: float, err_path: Path,
           name: str) -> list[TrainingOutcome]:
    outcomes: dict[str, TrainingOutcome] = {}
    timed_out, kill_at = False, None
    try:
        while True:
            for spec in specs:
                tid = spec["training_id"]
                if tid not in outcomes:
                    outcome = landed(spec, spawned)
                    if outcome is not None:
                        outcomes[tid] = outcome
                        ctx.on_finished(outcome)
            if proc.poll() is not None or len(outcomes) == len(specs):
                break
            now = time.time()
            if ctx.training_timeout_s and not timed_out and now - spawned > ctx.training_timeout_s:
                timed_out, kill_at = True, now + KILL_GRACE_S
                proc.send_signal(signal.SIGTERM)
            elif kill_at is not None and now > kill_at:
                proc.kill()
                kill_at = None
            time.sleep(POLL_S)
        proc.wait()
    except BaseException:
        proc.kill()
        raise
    ended = time.time()
    for spec in specs:  # trainings the host never finished: it died, or was stopped
        tid = spec["training_id"]
        if tid not in outcomes:
            code = proc.returncode
            outcome = landed(spec, spawned) or TrainingOutcome(
                tid, spawned, ended, code, -code if code and code < 0 else None,
                ("stopped after packing.training_timeout_s; " if timed_out else "") +
                (tail(err_path) or f"the {name} process exited with code {code}"), None,
                extra={"timed_out": timed_out})
            outcomes[tid] = outcome
            ctx.on_finished(outcome)
    return [outcomes[s["training_id"]] for s in specs]


def landed(spec: Mapping[str, Any], spawned: float) -> TrainingOutcome | None:
    """A training's outcome once the host wrote its result or its error; None while it runs."""
    result_path, error_path = Path(spec["result_path"]), Path(spec["error_path"])
    extra = {"logical_device": spec["device"]} if str(spec.get("device", "")).startswith("/device:") else {}
    if result_path.exists():
        result = read_json(result_path)
        # Started when the shared host was spawned: its start-up is every training's, as in process mode.
        return TrainingOutcome(spec["training_id"], spawned, result["timings"]["finished"], 0, None, None,
                               result, extra=extra)
    if error_path.exists():
        error = read_json(error_path)
        return TrainingOutcome(spec["training_id"], spawned, error["ended"], 1, None, error["error"], None,
                               extra=extra)
    return None
