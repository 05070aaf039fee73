"""TensorFlow logical-device packing ("split"): one TF process per pack, its device split into N logical
devices before TensorFlow initialises, and the N trainings run at once in threads, each pinned to its own
logical device with ``tf.device``.

On a GPU each logical GPU gets ``memory_limit`` = the pack's GPU memory budget / N; on a CPU the splits are
plain logical CPUs (TensorFlow refuses memory limits there). The TF process is :mod:`gpupack.tf_host`; this
packer starts it, follows each training's result as it lands, and records a training whose thread raised as
failed while the others go on.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from gpupack.errors import ConfigError
from gpupack.pack import Capacity, Packer, PackContext, TrainingOutcome, worker_env, worker_spec
from gpupack.pack.process import KILL_GRACE_S, POLL_S, _child_setup, tail
from gpupack.plan import Training
from gpupack.records import read_json, write_json_atomic
from gpupack.workload import Workload, load_workload



def split_memory_mb(total_mb: float, n: int, reserve_mb: float, budget_mb: float | None,
                    min_per_split_mb: float, key: str = "packing.factors") -> int:
    """Memory limit of each of n logical GPUs: the budget (or the GPU's memory less the reserve) / n.

    Refused when a split would fall below what the workload needs to train at all.
    """
    budget = budget_mb if budget_mb is not None else total_mb - reserve_mb
    if budget > total_mb:
        raise ConfigError("packing.tf_gpu_memory_budget_mb", budget_mb, f"more than the GPU's {total_mb:.0f} MB",
                          f"give at most {total_mb - reserve_mb:.0f}")
    per = int(budget // n)
    if per < min_per_split_mb:
        raise ConfigError(key, n, f"{n} logical GPUs of {per} MB each (budget {budget:.0f} MB of {total_mb:.0f} MB) "
                          f"are below the workload's minimum of {min_per_split_mb:.0f} MB",
                          f"use N <= {int(budget // min_per_split_mb)}, or raise packing.tf_gpu_memory_budget_mb")
    return per


def logical_devices(kind: str, n: int) -> list[str]:
    return [f"/device:{'GPU' if kind == 'gpu' else 'CPU'}:{i}" for i in range(n)]


class TfLogicalPacker(Packer):
    name = "tf_logical"

    def check(self, workload: Workload, factor: int, capacity: Capacity, settings: Any) -> None:
        if workload.framework != "tensorflow":
            raise ConfigError("packing.modes", "tf_logical", f"{workload.name} is a {workload.framework} workload and "
                              "TF logical devices only host TensorFlow trainings",
                              f"use packing.modes=[process] for {workload.name}")
        if capacity.has_gpu and capacity.gpu_memory_mb:
            split_memory_mb(capacity.gpu_memory_mb, factor, settings.tf_gpu_memory_reserve_mb,
                            settings.tf_gpu_memory_budget_mb, workload.min_gpu_memory_mb)

    def run(self, trainings: Sequence[Training], ctx: PackContext) -> list[TrainingOutcome]:
        run, pack_id = ctx.run, ctx.pack.pack_id
        n = len(trainings)
        on_gpu = ctx.device == "cuda" and ctx.gpu_memory_total_mb is not None
        memory_mb = None
        if on_gpu:
            workload = load_workload(trainings[0].workload)
            memory_mb = split_memory_mb(ctx.gpu_memory_total_mb, n, ctx.settings.tf_gpu_memory_reserve_mb,
                                        ctx.settings.tf_gpu_memory_budget_mb, workload.min_gpu_memory_mb)
        devices = logical_devices("gpu" if on_gpu else "cpu", n)
        spawned = time.time()
        specs = []
        for t, device in zip(trainings, devices):
            spec = worker_spec(t, ctx, spawned)
            spec.update(device=device, training_id=t.training_id,
                        error_path=str(run.work(pack_id, t.training_id, "error")))
            Path(spec["result_path"]).unlink(missing_ok=True)
            Path(spec["error_path"]).unlink(missing_ok=True)
            specs.append(spec)
        host_spec = run.pack_dir(pack_id) / "work" / "tf_host.spec.json"
        write_json_atomic(host_spec, {"kind": "gpu" if on_gpu else "cpu", "memory_limit_mb": memory_mb,
                                      "threads": ctx.threads * n, "trainings": specs})
        err_path = run.pack_dir(pack_id) / "logs" / "tf_host.err"
        err_path.parent.mkdir(parents=True, exist_ok=True)
        with open(run.pack_dir(pack_id) / "logs" / "tf_host.out", "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "gpupack.tf_host", str(host_spec)], stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, env=worker_env(ctx.env, ctx.threads * n),
                                    start_new_session=True, preexec_fn=_child_setup(ctx.memory_limit_bytes))
            for t in trainings:
                ctx.on_started(t.training_id, proc.pid)  # one process hosts them all
            return self._follow(proc, specs, ctx, spawned, err_path)

    def _follow(self, proc: subprocess.Popen, specs: list[dict[str, Any]], ctx: PackContext, spawned: float,
                err_path: Path) -> list[TrainingOutcome]:
        outcomes: dict[str, TrainingOutcome] = {}
        timed_out, kill_at = False, None
        try:
            while True:
                for spec in specs:
                    tid = spec["training_id"]
                    if tid not in outcomes:
                        outcome = _landed(spec, spawned)
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
        for spec in specs:  # trainings the TF process never finished: it died, or was stopped
            tid = spec["training_id"]
            if tid not in outcomes:
                landed = _landed(spec, spawned)
                code = proc.returncode
                outcome = landed or TrainingOutcome(
                    tid, spawned, ended, code, -code if code and code < 0 else None,
                    ("stopped after packing.training_timeout_s; " if timed_out else "") +
                    (tail(err_path) or f"the TF process exited with code {code}"), None,
                    extra={"timed_out": timed_out})
                outcomes[tid] = outcome
                ctx.on_finished(outcome)
        return [outcomes[s["training_id"]] for s in specs]


def _landed(spec: dict[str, Any], spawned: float) -> TrainingOutcome | None:
    """A training's outcome once its thread wrote a result or an error; None while it runs."""
    result_path, error_path = Path(spec["result_path"]), Path(spec["error_path"])
    if result_path.exists():
        result = read_json(result_path)
        # Started when the shared TF process was spawned: its start-up is every training's, as in process mode.
        return TrainingOutcome(spec["training_id"], spawned, result["timings"]["finished"], 0, None, None,
                               result, extra={"logical_device": spec["device"]})
    if error_path.exists():
        error = read_json(error_path)
        return TrainingOutcome(spec["training_id"], spawned, error["ended"], 1, None, error["error"], None,
                               extra={"logical_device": spec["device"]})
    return None


PACKER = TfLogicalPacker()
