"""The job body: what runs inside one submitted job, on whatever backend submitted it.

It reads the plan, skips trainings that already have a completed record (resume), asks the pack's mode
to run the rest at once on the job's device, and writes one training record per training and one pack
record, all atomically. Earlier non-completed records are moved to ``attempts/`` first, never overwritten.
"""
from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpupack.monitor import DeviceInfo, detect_device, first_visible
from gpupack.pack import PackContext, TrainingOutcome, load_packer, options_of, threads_for
from gpupack.plan import Pack, Plan, Training
from gpupack.records import (COMPLETED, FAILED, KILLED, OOM, TIMEOUT, is_completed, pack_record, read_json,
                             training_record, write_json_atomic)
from gpupack.rgu import model_from_device_name
from gpupack.rundir import RunDir
from gpupack.sampler import Sampler


@dataclass(frozen=True)
class PackSettings:
    """What the job needs besides the plan; pickled by submitit with the call."""

    device: str = "auto"  # auto | cpu | cuda
    threads_per_training: int | None = None
    warmup_steps: int = 10
    training_timeout_s: float | None = None
    memory_limit_gb_per_training: float | None = None
    # The RGU table's name of the GPU this pack's partition gives (from the cluster preset), used when NVML
    # cannot name the device itself.
    gpu_model: str | None = None
    sample_interval_s: float = 1.0
    # Each mode's own options (mode → its Options dataclass instance: packing.process.*, packing.tf_logical.*).
    mode_options: Mapping[str, Any] = field(default_factory=dict)


def job_cores() -> int:
    """Cores this job may use: its CPU affinity (what SLURM or taskset gave it), not the node's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def choose_device(preference: str, info: DeviceInfo) -> str:
    if preference == "auto":
        return "cuda" if info.kind == "gpu" else "cpu"
    return preference


def job_id() -> str | None:
    for var in ("SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID"):
        if os.environ.get(var):
            task = os.environ.get("SLURM_ARRAY_TASK_ID")
            return f"{os.environ[var]}_{task}" if task and var == "SLURM_ARRAY_JOB_ID" else os.environ[var]
    return os.environ.get("SUBMITIT_LOCAL_JOB_ID") or str(os.getpid())


# How frameworks say "out of memory" (torch CPU/CUDA, TF, Python, C++), in a training's stderr tail.
OOM_PATTERNS = re.compile(
    r"CUDA out of memory|OutOfMemoryError|out of memory|MemoryError|can't allocate memory|ResourceExhausted"
    r"|OOM when allocating|std::bad_alloc|Cannot allocate memory", re.IGNORECASE)


def status_of(outcome: TrainingOutcome) -> str:
    if outcome.extra.get("timed_out"):
        return TIMEOUT
    if outcome.result is None and outcome.error and OOM_PATTERNS.search(outcome.error):
        return OOM
    if outcome.signal is not None:
        return KILLED
    if outcome.exit_code not in (0, None) or outcome.result is None:
        return FAILED
    return COMPLETED


def move_aside(path: Path, attempts_dir: Path) -> None:
    """Keep an earlier attempt's record: move it under attempts/<k>/ instead of overwriting it."""
    if not path.exists():
        return
    k = 1
    while (attempts_dir / str(k) / path.name).exists():
        k += 1
    target = attempts_dir / str(k) / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, target)


def gpu_model(info: DeviceInfo, settings: PackSettings) -> str | None:
    return model_from_device_name(info.name) if info.kind == "gpu" else settings.gpu_model


def build_training_record(outcome: TrainingOutcome, training: Training, pack: Pack, sweep: str,
                          device: DeviceInfo, ctx_device: str, threads: int, concurrent: int,
                          model: str | None = None) -> dict[str, Any]:
    result = outcome.result or {}
    return training_record(
        sweep=sweep, pack_id=pack.pack_id, training_id=training.training_id, workload=training.workload_label,
        params=dict(training.params), grid_index=training.grid_index, reseed=training.reseed,
        mode=pack.mode, factor=pack.factor, partition=pack.partition, concurrent=concurrent, probe=pack.probe,
        gpu_type=device.name if device.kind == "gpu" else "cpu", device=ctx_device, device_name=device.name,
        gpu_model=model, threads=threads, status=status_of(outcome), exit_code=outcome.exit_code, signal=outcome.signal,
        error=outcome.error, started_at=outcome.started_at, ended_at=outcome.ended_at,
        wall_s=outcome.ended_at - outcome.started_at,
        timings=result.get("timings"), throughput=result.get("throughput"), metrics=result.get("metrics"),
        memory=result.get("memory"), knobs=result.get("knobs"), loader_setting=result.get("loader_setting"),
        data=result.get("data"), host=socket.gethostname(), **outcome.extra,
    )


def run_pack(run_root: str, pack_id: str, settings: PackSettings) -> dict[str, Any]:
    run = RunDir(Path(run_root))
    plan = Plan.from_json(read_json(run.plan))
    pack = plan.pack(pack_id)
    todo = [t for t in pack.trainings if not is_completed(run.training_record(pack_id, t.training_id))]
    if not todo:
        return read_json(run.pack_record(pack_id))
    attempts = run.pack_dir(pack_id) / "attempts"
    for t in todo:
        move_aside(run.training_record(pack_id, t.training_id), attempts)
    move_aside(run.pack_record(pack_id), attempts)

    info = detect_device()
    device = choose_device(settings.device, info)
    cores = job_cores()
    threads = threads_for(cores, len(todo), settings.threads_per_training)
    by_id = {t.training_id: t for t in todo}
    records: list[dict[str, Any]] = []

    def on_finished(outcome: TrainingOutcome) -> None:
        rec = build_training_record(outcome, by_id[outcome.training_id], pack, plan.sweep, info, device, threads,
                                    len(todo), gpu_model(info, settings))
        if plan.phase:  # packing.factors=auto: a probe's record, or the run's at the best N
            rec["phase"] = plan.phase
        write_json_atomic(run.training_record(pack_id, rec["training_id"]), rec)
        records.append(rec)

    mps = bool(getattr(options_of(settings, pack.mode), "mps", False))  # the sampler lists MPS clients then
    sampler = Sampler(interval_s=settings.sample_interval_s, mps=mps, no_gpu_reason=info.note,
                      gpu=(info.uuid or first_visible(os.environ)) if info.kind == "gpu" else None)
    ctx = PackContext(run=run, pack=pack, device=device, threads=threads, env=dict(os.environ), settings=settings,
                      gpu_memory_total_mb=info.memory_total_mb,
                      warmup_steps=settings.warmup_steps, on_finished=on_finished, on_started=sampler.register,
                      training_timeout_s=settings.training_timeout_s,
                      memory_limit_bytes=int(settings.memory_limit_gb_per_training * 2**30)
                      if settings.memory_limit_gb_per_training else None)
    sampler.start()
    mode_started = time.time()  # the pack's clock: what a mode does before its trainings start (a fork server's
    try:                        # preload, a TF host's start) is the pack's time too
        load_packer(pack.mode).run(todo, ctx)
    finally:
        sampled = sampler.stop()
    return write_pack_record(run, pack, records, info, device, cores, threads, gpu_model(info, settings), sampled,
                             mode_started=mode_started, phase=plan.phase)


def write_pack_record(run: RunDir, pack: Pack, records: Sequence[dict[str, Any]], info: DeviceInfo,
                      device: str, cores: int, threads: int, model: str | None = None,
                      sampled: dict[str, Any] | None = None, mode_started: float | None = None,
                      phase: str | None = None) -> dict[str, Any]:
    started = min([r["started_at"] for r in records] + ([mode_started] if mode_started else []))
    ended = max(r["ended_at"] for r in records)
    rec = pack_record(
        pack_id=pack.pack_id, mode=pack.mode, factor=pack.factor, partition=pack.partition, probe=pack.probe,
        gpu_type=info.name if info.kind == "gpu" else "cpu", device=device, device_name=info.name,
        device_note=info.note, gpu_model=model, gpu_memory_total_mb=info.memory_total_mb,
        # Time per training is only meaningful when all N trainings ran together in this attempt.
        concurrent=len(records), complete=len(records) == pack.factor,
        training_ids=[r["training_id"] for r in records],
        n_completed=sum(r["status"] == COMPLETED for r in records),
        n_failed=sum(r["status"] != COMPLETED for r in records),
        n_oom=sum(r["status"] == OOM for r in records),
        started_at=started, ended_at=ended, wall_s=ended - started, written_at=time.time(),
        cores=cores, threads_per_training=threads, host=socket.gethostname(), job_id=job_id(),
        workload=pack.trainings[0].workload_label if pack.trainings else None,
        # What the scheduler gave the job, to cross-check with sacct's gres/gpu.
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), slurm_job_gpus=os.environ.get("SLURM_JOB_GPUS"),
        slurm_partition=os.environ.get("SLURM_JOB_PARTITION"),
        sampler=sampled,
    )
    if phase:
        rec["phase"] = phase
    write_json_atomic(run.pack_record(pack.pack_id), rec)
    return rec
