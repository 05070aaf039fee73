"""Records: the only thing that crosses from jobs back to the user's side.

One JSON file per training and one per pack, each with a schema version, written atomically
(temp file in the same directory + fsync + rename) so a reader never sees half a record.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator, Mapping

SCHEMA_VERSION = 1
COMPLETED = "completed"
FAILED = "failed"  # the training exited non-zero
KILLED = "killed"  # the training died from a signal
OOM = "oom"  # out of memory, host or GPU: its N is infeasible on this device
TIMEOUT = "timeout"  # ran past packing.training_timeout_s and was stopped
STATUSES = (COMPLETED, FAILED, KILLED, OOM, TIMEOUT)


def _file_mode() -> int:
    """0o666 less the user's umask, and never writable by others whatever the umask says."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask & ~0o002


@contextlib.contextmanager
def atomic_file(path: Path, binary: bool = False) -> Iterator[IO[Any]]:
    """Write ``path`` all at once: a temp file in the same folder, fsync, the file mode of :func:`_file_mode`, then
    a rename, so a reader never sees half a file; on an error nothing is left behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    with atomic_file(path) as f:
        json.dump(data, f, indent=1, sort_keys=True, default=str)


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
