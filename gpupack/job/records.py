"""Every record the job body writes, built here and only here: a training's (ended, skipped for memory, lost to an
OOM SLURM told after the job, amended as oom or as a fault's victim), a pack's (ended, or rebuilt from its trainings'
where its own was lost), and an earlier attempt's kept aside.
"""
from __future__ import annotations

import itertools
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence, cast

from gpupack.core.cost.rgu import model_from_device_name
from gpupack.core.jobenv import JobEnvironment
from gpupack.core.monitor import DeviceInfo
from gpupack.core.plan import Pack, Plan, Training, refit_parent
from gpupack.core.store.journal import RunRecords
from gpupack.core.store.records import (
    COMPLETED,
    FAILED,
    FINISHED,
    KILLED,
    OOM,
    PRUNED,
    SKIPPED_MEMORY,
    TIMEOUT,
    VICTIM,
    Memory,
    PackRecord,
    TrainingRecord,
    make_dirs,
    pack_record,
    training_record,
    write_json_atomic,
)
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings, TrainingOutcome
from gpupack.job.runtime.oom import OOM_KILLED_BY, ran_out_of_memory


@dataclass(frozen=True)
class OnDevice:
    """Where an attempt's trainings ran, as their records say."""

    info: DeviceInfo
    device: str
    threads: int
    concurrent: int
    model: str | None


def status_of(outcome: TrainingOutcome) -> str:
    if outcome.extra.get("pruned"):  # its search's pruner stopped it (a decision: however its process then ended)
        return PRUNED
    if outcome.extra.get("timed_out"):
        return TIMEOUT
    if ran_out_of_memory(outcome):
        return OOM
    if outcome.signal is not None:
        return KILLED
    if outcome.exit_code not in (0, None) or outcome.result is None:
        return FAILED
    return COMPLETED


def gpu_model(info: DeviceInfo, settings: PackSettings) -> str | None:
    return model_from_device_name(info.name) if info.kind == "gpu" else settings.gpu_model


def order_fields(pack: Pack) -> dict[str, object]:
    """Where the pack stands in the run's order: its round, the pack it repeats, a reference set-up's threads."""
    return {k: v for k, v in (("round", pack.round), ("reference_of", pack.reference_of),
                              ("threads_set", pack.threads)) if v is not None}


def spread_fields(pack: Pack, result: Mapping[str, object] | None = None) -> dict[str, object]:
    """A spread pack's record fields: k devices, the strategy, and what it measured; nothing for a packing pack."""
    if pack.spread is None:
        return {}
    return {"devices": pack.devices, "strategy": pack.spread, "spread": (result or {}).get("spread")}


# ---------------- a training's record ----------------

def build_training_record(outcome: TrainingOutcome, training: Training, pack: Pack, plan: Plan,
                          on: OnDevice) -> TrainingRecord:
    result = outcome.result or {}
    return training_record(
        sweep=plan.sweep, pack_id=pack.pack_id, training_id=training.training_id, workload=training.workload_label,
        params=dict(training.params), grid_index=training.grid_index, reseed=training.reseed, repeat=training.repeat,
        mode=pack.mode, factor=pack.factor, partition=pack.partition, concurrent=on.concurrent,
        loader_alone=pack.loader_alone, gpu_type=on.info.name if on.info.kind == "gpu" else "cpu", device=on.device,
        device_name=on.info.name, gpu_model=on.model, threads=on.threads, status=status_of(outcome),
        exit_code=outcome.exit_code, signal=outcome.signal,
        error=outcome.error, started_at=outcome.started_at, ended_at=outcome.ended_at,
        wall_s=outcome.ended_at - outcome.started_at,
        timings=result.get("timings"), throughput=result.get("throughput"), metrics=result.get("metrics"),
        memory=result.get("memory"), knobs=result.get("knobs"), loader_setting=result.get("loader_setting"),
        data=result.get("data"), framework=result.get("framework"), host=socket.gethostname(),
        **spread_fields(pack, result), **order_fields(pack),
        **outcome.extra,
        **({"phase": plan.phase} if plan.phase else {}),  # packing.factors=auto: a probe's, or the run's at the best N
    )


def finished_training_record(outcome: TrainingOutcome, training: Training, pack: Pack, plan: Plan, on: OnDevice,
                             fields: Mapping[str, object], sampled: Mapping[str, object]) -> TrainingRecord:
    """The record of a training that ran and ended; ``fields``: more of its fields; ``sampled``: the sampler's. One
    that ran out of memory with a share of the GPU says what its share was and what would give it more."""
    rec = cast(TrainingRecord, {**build_training_record(outcome, training, pack, plan, on), **fields})
    fill_memory(rec, sampled)
    share = rec.get("memory_share")
    if rec.get("status") == OOM and isinstance(share, Mapping):  # its share may be what it hit, not the device
        source = share.get("source") or "packing.memory_fraction / N"
        rec["error"] = (f"{rec.get('error') or 'out of memory'}\nHINT: its share of the GPU was {share['mb']:.0f} MB "
                        f"({share['fraction']:.3g} of the device, packing.memory_share=on: {source}); "
                        "lower N, raise packing.memory_fraction or packing.memory_margin, "
                        "or set packing.memory_share=off")
    return rec


def skipped_training_record(training: Training, pack: Pack, plan: Plan, on: OnDevice, why: str,
                            runs_in: str | None, now: float) -> TrainingRecord:
    """The record of a training of a pack skipped for memory; ``runs_in``: the refit pack that runs it (or None)."""
    outcome = TrainingOutcome(training.training_id, now, now, None, error=f"skipped for memory: {why}")
    rec = build_training_record(outcome, training, pack, plan, on)
    rec.update({"status": SKIPPED_MEMORY, "skipped_memory": why, "runs_in": runs_in})
    return rec


def lost_training_record(training: Training, pack: Pack, plan: Plan, sibling: TrainingRecord,
                         why: str) -> TrainingRecord:
    """The oom record of a training left with none when SLURM killed its job, as its ``sibling``'s record says."""
    info = DeviceInfo(kind="cpu" if sibling.get("gpu_type") == "cpu" else "gpu", name=str(sibling.get("device_name")))
    outcome = TrainingOutcome(training.training_id, float(sibling["started_at"]), time.time(), None, signal.SIGKILL,
                              why, extra={OOM_KILLED_BY: why})
    on = OnDevice(info, str(sibling.get("device")), int(sibling.get("threads") or 1),
                  int(sibling.get("concurrent") or pack.factor), sibling.get("gpu_model"))
    rec = build_training_record(outcome, training, pack, plan, on)
    rec["host"] = sibling.get("host")  # where it ran, not this submitting host
    if refit_parent(pack.pack_id) is not None:  # as the refit pack's own records say (run_refits)
        rec["refit_of"] = refit_parent(pack.pack_id)
    return rec


def as_oom(rec: TrainingRecord, why: str) -> TrainingRecord:
    """A SIGKILLed training's record, once SLURM said its job ran out of memory (``why``)."""
    error = f"{rec['error']}\n{why}" if rec.get("error") else why
    return cast(TrainingRecord, {**rec, "status": OOM, OOM_KILLED_BY: why, "error": error})


def as_victim(rec: TrainingRecord, culprit: str) -> TrainingRecord:
    """The record of a training another's fault (``culprit``'s, gpupack.core.memory.victims) took down."""
    return {**rec, "status": VICTIM, "victim_of": culprit, "died_as": rec.get("status")}


def fill_memory(rec: TrainingRecord, sampled: Mapping[str, object]) -> None:
    """A memory figure the training did not report itself is the sampler's (named in ``memory.from_sampler``: a peak
    shorter than its interval can be missed). NVML's figure of its whole process on a GPU is kept beside torch's own
    (``process_gpu_mem_mb``), which leaves the CUDA context out: a share of the GPU is sized by the higher."""
    memory = dict(rec.get("memory") or {})  # None: a training that failed before reporting anything
    filled = [key for key in ("peak_rss_mb", "peak_gpu_mem_mb")
              if memory.get(key) is None and sampled.get(key) is not None]
    if filled:
        memory = {"peak_rss_mb": None, "peak_gpu_mem_mb": None, **memory,
                  **{key: sampled[key] for key in filled}, "from_sampler": filled}
    whole = sampled.get("peak_gpu_mem_mb")
    if "peak_gpu_mem_mb" not in filled and memory.get("peak_gpu_mem_mb") and isinstance(whole, (int, float)) \
            and whole > 0:
        memory["process_gpu_mem_mb"] = whole  # NVML's, beside torch's own
    if filled or "process_gpu_mem_mb" in memory:
        rec["memory"] = cast(Memory, memory)


def move_aside(run: RunDir, pack_id: str, path: Path) -> None:
    """Keep an earlier attempt's record of the pack: move it under attempts/<k>/ instead of overwriting it."""
    if not path.exists():
        return
    k = next(k for k in itertools.count(1) if not run.attempt_record(pack_id, k, path).exists())
    target = run.attempt_record(pack_id, k, path)
    make_dirs(target.parent)
    os.replace(path, target)


# ---------------- a pack's record ----------------

def slot_use(records: Sequence[TrainingRecord], slots: int, started: float, ended: float) -> dict[str, object]:
    """``slot_occupancy`` = Σ training wall / (N × pack wall), and the idle gaps within each slot. Pure."""
    wall = ended - started
    busy = sum(float(r["ended_at"]) - float(r["started_at"]) for r in records)
    by_slot: dict[int, list[tuple[float, float]]] = {}
    for r in records:  # a mode whose trainings share one process names no slots: no gaps to tell
        if r.get("slot") is not None:
            by_slot.setdefault(int(r["slot"]), []).append((float(r["started_at"]), float(r["ended_at"])))
    ordered = [sorted(spans) for spans in by_slot.values()]
    gaps = [b[0] - a[1] for spans in ordered for a, b in zip(spans, spans[1:])]
    return {"slots": slots, "busy_s": busy,
            "slot_occupancy": busy / (slots * wall) if wall > 0 and slots else None,
            "slot_gap_mean_s": sum(gaps) / len(gaps) if gaps else None,
            "slot_gap_max_s": max(gaps) if gaps else None}


def _pack_fields(pack: Pack, records: Sequence[TrainingRecord], started: float, ended: float, together: bool,
                 phase: str | None) -> dict[str, object]:
    """What a pack's record and a rebuilt one say alike. Time per training means something only where all N ran
    together in one attempt (``together``, and never a lane's slots)."""
    return {"pack_id": pack.pack_id, "mode": pack.mode, "factor": pack.factor, "partition": pack.partition,
            "loader_alone": pack.loader_alone, "concurrent": len(records),
            "complete": together and len(records) == pack.factor and pack.stream is None,
            "training_ids": [r["training_id"] for r in records],
            "n_completed": sum(r.get("status") == COMPLETED for r in records),
            "n_failed": sum(r.get("status") not in FINISHED for r in records),
            "n_pruned": sum(r.get("status") == PRUNED for r in records),
            "n_oom": sum(r.get("status") == OOM for r in records),
            "started_at": started, "ended_at": ended, "wall_s": ended - started, "written_at": time.time(),
            "workload": pack.trainings[0].workload_label if pack.trainings  # else (a search lane's) its records'
            else next((str(r["workload"]) for r in records if r.get("workload")), None),
            **spread_fields(pack), **order_fields(pack),
            **slot_use(records, pack.factor, started, ended), **({"phase": phase} if phase else {})}


def write_pack_record(run: RunDir, pack: Pack, records: Sequence[TrainingRecord], info: DeviceInfo,
                      device: str, cores: int, threads: int, model: str | None = None,
                      sampled: Mapping[str, object] | None = None, mode_started: float | None = None,
                      phase: str | None = None, job: JobEnvironment | None = None,
                      extra: Mapping[str, object] | None = None) -> PackRecord:
    """Write the pack record of this attempt. Its wall runs from its first training's start (each training's start-up
    inside) to its last one's end; what its mode did before (``mode_started``: a fork server's preload) is its
    ``setup_s``, outside the wall as a job's start is."""
    fields = (job or JobEnvironment.here()).record_fields()
    first = min((float(r["started_at"]) for r in records), default=None)
    started = first if first is not None else (mode_started or time.time())  # else its mode's set-up's, else now
    ended = max([float(r["ended_at"]) for r in records], default=started)
    setup = {"setup_s": max(0.0, first - mode_started)} if first is not None and mode_started else {}
    rec = pack_record(
        **_pack_fields(pack, records, started, ended, True, phase),
        gpu_type=info.name if info.kind == "gpu" else "cpu", device=device, device_name=info.name,
        device_note=info.note, gpu_model=model, gpu_memory_total_mb=info.memory_total_mb,
        cores=cores, threads_per_training=threads, host=socket.gethostname(),
        **fields,  # the job (its id, its GPUs) and what the scheduler gave it
        sampler=sampled, **setup, **(extra or {}))
    write_json_atomic(run.pack_record(pack.pack_id), rec)
    # the pack's trainings in one columnar file, which collect reads instead of one file per training (a lane's
    # trainings' records live in other lanes' folders too: collect reads the JSON)
    try:
        if pack.stream is None:
            from gpupack.core.store.columnar import write_columnar  # pyarrow at its end only

            write_columnar(run, pack.pack_id)
    except Exception as err:  # only a faster copy: without it collect reads the JSON records, the same rows
        print(f"gpupack: warning: no columnar file for pack {pack.pack_id} ({err!r})", file=sys.stderr)
    return rec


# ---------------- a pack's record rebuilt from its trainings' ----------------

REBUILT = ("its record was lost (its journal line torn by a writer killed mid-append, or its file never written): "
           "rebuilt from its trainings' records, without the sampler's figures or the set-up time")


def rebuilt_pack_record(pack: Pack, records: Sequence[TrainingRecord], phase: str | None = None) -> PackRecord:
    """What :func:`write_pack_record` would have said of a pack whose own record was lost (:data:`REBUILT`), from its
    trainings' ``records``: complete (a timing of N) only where N ran together in one job. Pure."""
    first: TrainingRecord = records[0] if records else {}
    started = min((float(r["started_at"]) for r in records), default=0.0)
    ended = max((float(r["ended_at"]) for r in records), default=started)
    together = len({(r.get("job_id"), r.get("concurrent")) for r in records}) == 1 \
        and first.get("concurrent") == pack.factor
    rec = pack_record(
        **_pack_fields(pack, records, started, ended, together, phase),
        **{k: first.get(k) for k in ("gpu_type", "device", "device_name", "gpu_model", "host", "job_id",
                                     "cuda_visible_devices")},
        threads_per_training=first.get("threads"), sampler=None, rebuilt=REBUILT)
    if pack.stream is not None:  # a lane's: its queue, and nothing it left (every training has its record)
        rec.update({"stream": pack.stream, "lane": pack.index, "claimed": rec["training_ids"], "unclaimed": 0})
    return rec


def rebuild_pack_record(run: RunDir, plan: Plan, pack: Pack, records: RunRecords,
                        pairs: Sequence[tuple[str, str]] | None = None) -> PackRecord | None:
    """Write the rebuilt record (:func:`rebuilt_pack_record`) of ``pack`` into its folder, saying so on stderr, from
    the records of ``pairs`` (home, training id; else its own trainings) that ran in it; None where none did."""
    if pairs is None:
        pairs = [(pack.pack_id, t.training_id) for t in pack.trainings]
    ran = [rec for home, tid in pairs if (rec := records.training(home, tid)) is not None
           and rec.get("pack_id") == pack.pack_id]
    if not ran:
        return None
    rebuilt = rebuilt_pack_record(pack, ran, plan.phase)
    write_json_atomic(run.pack_record(pack.pack_id), rebuilt)
    print(f"gpupack: warning: pack {pack.pack_id}: {REBUILT} ({len(ran)} training(s))", file=sys.stderr)
    return rebuilt
