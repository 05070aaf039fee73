"""Records: the only thing that crosses from jobs back to the user's side.

One JSON file per training and one per pack, each with a schema version, written atomically
(temp file in the same directory + fsync + rename) so a reader never sees half a record.

Every file and folder gpupack writes (records, logs, run directories) gets the user's umask and is never
world-writable: :func:`file_mode`, :func:`dir_mode`, :func:`make_dirs`, :func:`open_log`.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, Iterator, Mapping

SCHEMA_VERSION = 1
COMPLETED = "completed"
FAILED = "failed"  # the training exited non-zero
KILLED = "killed"  # the training died from a signal
OOM = "oom"  # out of memory, host or GPU: its N is infeasible on this device
TIMEOUT = "timeout"  # ran past packing.training_timeout_s and was stopped
VICTIM = "victim"  # taken down by another training's fault (gpupack.core.memory.victims), then run again
# Not started: its pack's measured need passed the device's memory share (gpupack.core.memory.pack_fit); its N is
# infeasible there. Checked again on resume (a larger share, a smaller peak may let it run), never an unfinished
# training.
SKIPPED_MEMORY = "skipped_memory"
STATUSES = (COMPLETED, FAILED, KILLED, OOM, TIMEOUT, VICTIM, SKIPPED_MEMORY)


# The umask, read once per process. Flipping it to read it (os.umask(0); os.umask(old)) is a race: another thread
# (tf_logical's N trainings each write a result) may read the 0, or restore it after this one did.
_umask_lock = threading.Lock()
_umask: int | None = None


def _read_umask() -> int:
    """The process umask without changing it: Linux (>= 4.7) says it in /proc/self/status. Elsewhere one round trip
    through a restrictive 0o077, never 0, so a file another thread creates in that instant is private, not open."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
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
    """``mkdir -p`` whose every new folder gets :func:`dir_mode` (pathlib and os.makedirs give parents the bare
    umask's mode: world-writable under umask 000)."""
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
    """Open a log for writing in binary (truncated, or appended to), created with :func:`file_mode` in a folder made
    by :func:`make_dirs`."""
    make_dirs(Path(path).parent)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, file_mode()), "ab" if append else "wb")


@contextlib.contextmanager
def atomic_file(path: Path, binary: bool = False) -> Iterator[IO[Any]]:
    """Write ``path`` all at once: a temp file in the same folder, fsync, the file mode of :func:`file_mode`, then
    a rename, so a reader never sees half a file; on an error nothing is left behind. An OSError that names no file
    (pyarrow's writer says only its errno) is given ``path``: a full disk is then said where it struck
    (:mod:`gpupack.core.store.storage`)."""
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


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    with atomic_file(path) as f:
        json.dump(data, f, indent=1, sort_keys=True, default=str)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def training_record(**fields: Any) -> dict[str, Any]:
    return {"schema": SCHEMA_VERSION, "kind": "training", **fields}


def pack_record(**fields: Any) -> dict[str, Any]:
    return {"schema": SCHEMA_VERSION, "kind": "pack", **fields}


def read_json_or_none(path: Path | str) -> dict[str, Any] | None:
    """The JSON object at ``path``; None when it is missing, torn or not an object (nothing usable was written)."""
    try:
        return read_json(Path(path))
    except (OSError, ValueError):
        return None


def is_completed(path: Path) -> bool:
    """True when ``path`` holds a complete training record of a training that finished."""
    rec = read_json_or_none(path)
    return rec is not None and rec.get("status") == COMPLETED
