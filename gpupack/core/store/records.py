"""Records: the only thing that crosses from jobs back to the user's side.

One JSON file per training and one per pack, each with a schema version, written atomically (:func:`atomic_file`).
Every file and folder gpupack writes gets the user's umask and is never world-writable (:func:`file_mode`).
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, ContextManager, Iterator, Literal, Mapping, TypedDict, TypeGuard, cast, overload

SCHEMA_VERSION = 1
COMPLETED = "completed"
FAILED = "failed"  # the training exited non-zero
KILLED = "killed"  # the training died from a signal
OOM = "oom"  # out of memory, host or GPU: its N is infeasible on this device
TIMEOUT = "timeout"  # ran past packing.training_timeout_s and was stopped
VICTIM = "victim"  # taken down by another training's fault (gpupack.core.memory.victims), then run again
# Not started: its pack's measured need passed the device's memory share (gpupack.core.memory.pack_fit). Checked
# again on resume, never an unfinished training.
SKIPPED_MEMORY = "skipped_memory"
PRUNED = "pruned"  # stopped by its search's pruner: finished, neither failed nor run again
STATUSES = (COMPLETED, FAILED, KILLED, OOM, TIMEOUT, VICTIM, SKIPPED_MEMORY, PRUNED)
FINISHED = (COMPLETED, PRUNED)  # a training that needs nothing more: it completed, or its search pruned it


class Logs(TypedDict):
    """Where a folded record's log is kept (gpupack.core.store.journal): a file under the run, a stretch of it."""

    file: str
    offset: int
    length: int


class Memory(TypedDict, total=False):
    """What a training peaked at: its own report or the sampler's, and NVML's figure of its whole process."""

    peak_rss_mb: float | None
    peak_gpu_mem_mb: float | None
    from_sampler: list[str]
    process_gpu_mem_mb: float
    shared_by: int  # N trainings ran in one process (fused, tf_logical): its peak is the pack's, not the training's


class Peaks(TypedDict, total=False):
    """The sampler's figures of one training (gpupack.job.runtime.sampler.Sampler.figures)."""

    peak_rss_mb: float | None
    cpu_percent_mean: float | None
    peak_gpu_mem_mb: float | None
    gpu_mem_known: bool | None


class Sampled(TypedDict, total=False):
    """What the sampler said of a pack; the foreign load's figures are read with ``.get``."""

    source: str | None
    note: str | None
    interval_s: float
    mps: bool
    n_samples: int
    samples: list[dict[str, object]]
    gpu_util_mean: float | None
    gpu_util_max: float | None
    gpu_mem_used_peak_mb: float | None
    gpu_mem_total_mb: float | None
    cpu_percent_mean: float | None
    per_training: dict[str, Peaks]
    overhead_cpu_s: float
    overhead_fraction: float | None


class TrainingRecord(TypedDict, total=False):
    """A training's record; a mode's own fields (TrainingOutcome.extra) are read with ``.get``."""

    schema: int
    kind: str
    sweep: str
    pack_id: str
    training_id: str
    workload: str
    params: dict[str, object]
    grid_index: int
    reseed: int
    repeat: int
    mode: str
    factor: int
    partition: str
    concurrent: int
    loader_alone: bool
    phase: str
    gpu_type: str
    device: str
    device_name: str
    gpu_model: str | None
    threads: int
    framework: str | None  # the framework and version its process ran ("torch 2.13.0+cpu"; None: not imported)
    status: str
    exit_code: int | None
    signal: int | None
    error: str | None
    started_at: float
    ended_at: float
    wall_s: float
    timings: object
    throughput: object
    metrics: object
    memory: Memory | None
    knobs: object
    loader_setting: object
    data: object
    host: str | None
    # a spread training's, a round's, a drift check's (gpupack.job.records.spread_fields, order_fields)
    devices: int
    strategy: str | None
    spread: object
    round: int
    reference_of: str
    threads_set: int  # a set-up of the reference's (gpupack.core.plan.setup_packs): the threads it set
    # the job's and the mode's
    job_id: str | None
    cuda_visible_devices: str | None
    slot: int
    timed_out: bool
    memory_share: object
    # a streaming lane's: its queue, its lane, its home (the pack whose folder holds its records)
    stream: str | None
    lane: int
    home: str
    # skipped for memory, run in a refit pack, amended as oom or as a fault's victim
    skipped_memory: str
    runs_in: str | None
    refit_of: str | None
    oom_killed_by: str
    victim_of: str
    died_as: object
    fork_fallback: str | None  # a fork-server mode's: why it started a fresh interpreter
    logs: dict[str, Logs]  # a folded record's (gpupack.core.store.journal.LOGS)


class RefitNote(TypedDict):
    """A pack skipped for memory says at which N its trainings run instead, why, and in which refit packs."""

    n: int | None
    why: str
    packs: list[str]


class Admission(TypedDict):
    """What a streaming lane's admission did (gpupack.job.stream.Lane.admission)."""

    budget_mb: float | None
    passed_over: int
    waits: int


class PackRecord(TypedDict, total=False):
    """A pack's record; the scheduler's fields (JobEnvironment.record_fields) are read with ``.get``."""

    schema: int
    kind: str
    pack_id: str
    mode: str
    factor: int
    partition: str
    loader_alone: bool
    phase: str
    gpu_type: str
    device: str
    device_name: str
    device_note: str | None
    gpu_model: str | None
    gpu_memory_total_mb: float | None
    concurrent: int
    complete: bool
    training_ids: list[str]
    n_completed: int
    n_failed: int
    n_pruned: int  # pruned by its search (search=optuna): finished, not failed
    n_oom: int
    started_at: float
    ended_at: float
    wall_s: float
    written_at: float
    setup_s: float
    cores: int
    threads_per_training: int | None
    host: str | None
    workload: str | None
    job_id: str | None
    cuda_visible_devices: str | None
    sampler: Sampled | None
    billing: dict[str, object]
    rebuilt: str
    # a spread pack's, a round's, a drift check's
    devices: int
    strategy: str | None
    spread: object
    round: int
    reference_of: str
    threads_set: int
    # how busy its slots were (gpupack.job.records.slot_use)
    slots: int
    busy_s: float
    slot_occupancy: float | None
    slot_gap_mean_s: float | None
    slot_gap_max_s: float | None
    # run again as a fault's victims; a refit pack's parent; skipped for memory (gpupack.job.oom.Skip.fields)
    victims_rerun: dict[str, str]
    refit_of: str
    skipped_memory: str
    refit: RefitNote
    skipped_training_ids: list[str]
    # a streaming lane's (gpupack.job.lanes.run_lane)
    stream: str | None
    lane: int
    released: list[str]
    torn_claims: dict[str, str]
    claimed: list[str]
    stopped_claiming: str | None
    unclaimed: int
    admission: Admission
    # a search's lane (gpupack.search.lane.SearchLane, run by gpupack.job.lanes.run_lane)
    search_ended: str | None  # why the study gave it no more trials
    failed_dead: list[int]  # trials an earlier run of the lane left unfinished, told failed
    logs: dict[str, Logs]  # a folded record's own logs (gpupack.core.store.journal.LOGS)


# The umask, read once per process: flipping it to read it races with another thread's writes.
_umask_lock = threading.Lock()
_umask: int | None = None


def _read_umask() -> int:
    """The umask without changing it (/proc/self/status), else via 0o077: a file made meanwhile is private, not open."""
    status = "/proc/self/status"
    with contextlib.suppress(OSError, ValueError, IndexError), open(status, encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    umask = os.umask(0o077)
    os.umask(umask)
    return umask


def umask() -> int:
    """The umask gpupack started under, read at the first call only (under a lock) and never flipped again."""
    global _umask
    with _umask_lock:
        if _umask is None:
            _umask = _read_umask()
        return _umask


def file_mode() -> int:
    """0o666 less the user's umask, and never writable by others whatever the umask says."""
    return 0o666 & ~umask() & ~0o002


def dir_mode() -> int:
    """0o777 less the user's umask, and never writable by others whatever the umask says."""
    return 0o777 & ~umask() & ~0o002


def make_dirs(path: Path) -> None:
    """``mkdir -p`` whose every new folder gets :func:`dir_mode` (os.makedirs gives parents the bare umask's)."""
    missing: list[Path] = []
    folder = Path(path)
    while not folder.is_dir() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, dir_mode())  # the kernel masks it with the same umask: the mode is dir_mode() exactly
        except FileExistsError:
            if not folder.is_dir():
                raise


def open_log(path: Path, append: bool = False) -> IO[bytes]:
    """Open a log for writing in binary (truncated, or appended to), with :func:`file_mode`, its folder made."""
    make_dirs(Path(path).parent)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, file_mode()), "ab" if append else "wb")


@overload
def atomic_file(path: Path, binary: Literal[False] = False) -> ContextManager[IO[str]]: ...


@overload
def atomic_file(path: Path, binary: Literal[True]) -> ContextManager[IO[bytes]]: ...


def atomic_file(path: Path, binary: bool = False) -> ContextManager[IO[str] | IO[bytes]]:
    """Write ``path`` all at once (:func:`_atomic_file`): text, or bytes where ``binary``."""
    return _atomic_file(path, binary)


@contextlib.contextmanager
def _atomic_file(path: Path, binary: bool) -> Iterator[IO[str] | IO[bytes]]:
    """Write ``path`` all at once: a temp file in the same folder, fsync, :func:`file_mode`, then a rename; on an
    error nothing is left behind. An OSError that names no file (pyarrow's) is given ``path``, so a full disk is said
    where it struck (:mod:`gpupack.core.store.storage`)."""
    tmp: str | None = None
    try:
        make_dirs(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")) as f:
            os.fchmod(f.fileno(), file_mode())
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename is None:
            err.filename = str(path)
        raise


def write_json_atomic(path: Path, data: Mapping[str, object]) -> None:
    with atomic_file(path) as f:
        json.dump(data, f, indent=1, sort_keys=True, default=str)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object at ``path``: the one edge where a file's JSON comes in untyped (callers narrow it)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def training_record(**fields: object) -> TrainingRecord:
    """A training's record of ``fields`` (a mode's own fields among them: a cast, not a check)."""
    return cast(TrainingRecord, {"schema": SCHEMA_VERSION, "kind": "training", **fields})


def pack_record(**fields: object) -> PackRecord:
    """A pack's record of ``fields`` (the scheduler's own fields among them: a cast, not a check)."""
    return cast(PackRecord, {"schema": SCHEMA_VERSION, "kind": "pack", **fields})


def read_json_or_none(path: Path | str) -> dict[str, Any] | None:
    """The JSON object at ``path``; None when it is missing, torn or not an object (nothing usable was written)."""
    try:
        return read_json(Path(path))
    except (OSError, ValueError):
        return None


def is_completed(path: Path) -> bool:
    """True when ``path`` holds a complete training record of a training that finished."""
    rec = read_training(path)
    return rec is not None and rec.get("status") == COMPLETED


def is_training_record(data: Mapping[str, Any]) -> TypeGuard[TrainingRecord]:
    """Whether ``data``, read from disk, is a training's record: it names its training and how it ended, as text."""
    return isinstance(data.get("training_id"), str) and isinstance(data.get("status"), str)


def is_pack_record(data: Mapping[str, Any]) -> TypeGuard[PackRecord]:
    """Whether ``data``, read from disk, is a pack's record as gpupack writes it: it names its pack, as text."""
    return isinstance(data.get("pack_id"), str)


def read_training(path: Path | str) -> TrainingRecord | None:
    """The training record at ``path``; None where it is missing, torn or not a training's record."""
    data = read_json_or_none(path)
    return data if data is not None and is_training_record(data) else None


def read_pack(path: Path | str) -> PackRecord | None:
    """The pack record at ``path``; None where it is missing, torn or not a pack's record (:func:`is_pack_record`)."""
    data = read_json_or_none(path)
    return data if data is not None and is_pack_record(data) else None
