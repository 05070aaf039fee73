"""A write that the file system refused for space, quota, a read-only mount or permission, turned into one
:class:`gpupack.errors.StorageError` where gpupack meets its user (:mod:`gpupack.sweep`'s run and collect, a pack's
job). Any other OSError is a fault of its own and keeps its traceback.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from gpupack.errors import NO_PERMISSION, NO_SPACE, OUT_OF_QUOTA, READ_ONLY, StorageError

FAULTS: dict[int, str] = {errno.ENOSPC: NO_SPACE, errno.EDQUOT: OUT_OF_QUOTA, errno.EROFS: READ_ONLY,
                          errno.EACCES: NO_PERMISSION, errno.EPERM: NO_PERMISSION}

# A job's failure as the front-end reads it back (submitit's text: a traceback, or the job's error stream): the last
# line a gpupack error ended it with, as Python prints an uncaught exception.
_GPUPACK_ERROR_LINE = re.compile(r"^gpupack\.errors\.\w+: (.+)$", re.MULTILINE)


def fault_of(err: BaseException) -> str | None:
    """What failed, where ``err`` is a write refused for space, quota or permission (by errno); else None. Pure."""
    return FAULTS.get(err.errno) if isinstance(err, OSError) and err.errno is not None else None


def free_bytes(path: Path | str) -> int | None:
    """The bytes free to this user on ``path``'s file system (its nearest folder that exists), None where not known."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def storage_error(err: BaseException, where: Path | str) -> StorageError | None:
    """``err`` as a StorageError naming its file (else ``where``); None where it is not such a fault."""
    why = fault_of(err)
    if why is None:
        return None
    filename = getattr(err, "filename", None)
    path = os.fsdecode(filename) if isinstance(filename, (str, bytes)) else str(where)
    return StorageError(path, why, free_bytes(path) if why in (NO_SPACE, OUT_OF_QUOTA) else None)


@contextlib.contextmanager
def storage_faults(where: Path | str) -> Iterator[None]:
    """Raise a StorageError in place of an OSError of :data:`FAULTS` raised inside, the original chained."""
    try:
        yield
    except OSError as err:
        fault = storage_error(err, where)
        if fault is None:
            raise
        raise fault from err


# What a test write into a folder writes: a block's worth, since an empty file (an inode) may still fit on a full disk
TEST_BYTES = 4096


def write_fault(folder: Path | str) -> StorageError | None:
    """The StorageError a test write into ``folder`` meets now, else None: asked where a failed job left no reason."""
    made: tuple[int, str] | None = None
    try:
        made = tempfile.mkstemp(dir=folder, prefix=f".write-test.{os.getpid()}.")
        os.write(made[0], bytes(TEST_BYTES))
        os.fsync(made[0])
    except OSError as err:
        return storage_error(OSError(err.errno, err.strerror), folder)  # the folder, not the test file's passing name
    finally:
        if made is not None:
            os.close(made[0])
            with contextlib.suppress(OSError):
                os.unlink(made[1])
    return None


def failure_line(text: str | None) -> str | None:
    """The last line a job's failure text holds of a gpupack error that ended the job; None where none did. Pure."""
    found = _GPUPACK_ERROR_LINE.findall(text or "")
    return found[-1].strip() if found else None
