"""cloudpickle that keeps where a function's code came from.

What gpupack ships by value (a Hydra app's task function and the ``__main__`` code it reaches) must fail in the job
with a traceback that names the app's file and line. cloudpickle 3.1.3 rewrites every pickled code object's
``co_filename`` to ``"<dynamic-code>"``; here code objects travel by ``marshal`` (the ``.pyc`` format), which keeps
every field of the code and of the code nested in it. The job runs the interpreter that launched it, so the marshal
format never crosses Python versions.
"""
from __future__ import annotations

import io
import marshal
import os
import pickle
import struct
import time
import types
from collections import ChainMap
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping

from gpupack.core.moves import moved
from gpupack.core.store.locks import held
from gpupack.core.store.records import atomic_file


def _code(data: bytes) -> types.CodeType:
    """The code object back from its marshal bytes (named by reference in the pickle, so it must stay importable)."""
    code = marshal.loads(data)
    if not isinstance(code, types.CodeType):  # only this module's reducer writes these bytes
        raise TypeError(f"expected marshalled code, got {type(code).__name__}")
    return code


def dump_to(obj: Any, f: IO[bytes]) -> None:
    """Pickle ``obj`` to ``f`` as cloudpickle would, but code objects reduced by marshal, keeping their file name."""
    import cloudpickle

    base: Mapping[Any, Any] = cloudpickle.Pickler.dispatch_table
    code_reducer = {types.CodeType: lambda code: (_code, (marshal.dumps(code),))}
    pickler = type("CodeKeepingPickler", (cloudpickle.Pickler,),
                   {"dispatch_table": ChainMap(code_reducer, base)})  # type: ignore[arg-type]
    pickler(f).dump(obj)


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    dump_to(obj, buf)
    return buf.getvalue()


def dump(obj: Any, path: Path) -> None:
    """Pickle ``obj`` to ``path`` atomically (a torn pickle must never be read back)."""
    with atomic_file(path, binary=True) as f:
        dump_to(obj, f)


class _Unpickler(pickle.Unpickler):
    """Plain pickle (cloudpickle's and this module's reducers are importable), old module paths read as they moved."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(moved(module), name)


def load(path: Path) -> Any:
    """What :func:`dump` wrote."""
    with open(path, "rb") as f:
        return _Unpickler(f).load()


# A stream of pickles in one file per job (file quotas): each entry a marker, a header and the pickle, appended under
# flock and fsynced. The marker lets a reader find the next whole entry past a torn one.
_MARK = b"\x93GPKRET\n"
_HEADER = struct.Struct("<qdQ")  # key (e.g. a Hydra job's number), when it was written, the pickle's length


def append(obj: Any, key: int, path: Path) -> None:
    """Append ``obj``, pickled, to the stream at ``path`` under ``key``, whole under the file's lock, fsynced; a failed
    write is cut off again, so no torn entry is left. A key's latest entry, in any file, is its value."""
    data = dumps(obj)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f, held(f.fileno(), path):
        start = f.seek(0, os.SEEK_END)
        try:
            f.write(_MARK + _HEADER.pack(key, time.time(), len(data)) + data)
            f.flush()
            os.fsync(f.fileno())
        except OSError:
            f.truncate(start)
            raise


def read_streams(paths: Iterable[Path]) -> dict[int, bytes]:
    """Each key's latest pickle in the streams at ``paths``; a torn entry is left out, reading on at the next marker."""
    latest: dict[int, tuple[float, bytes]] = {}
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        for key, written, pickled in _entries(data):
            if key not in latest or written >= latest[key][0]:
                latest[key] = (written, pickled)
    return {key: pickled for key, (_, pickled) in latest.items()}


def _entries(data: bytes) -> Iterator[tuple[int, float, bytes]]:
    """A stream's whole entries, each whole where a marker or the end follows; past a torn one, at the next marker."""
    at = data.find(_MARK)
    while at >= 0:
        body = at + len(_MARK)
        if body + _HEADER.size <= len(data):
            key, written, length = _HEADER.unpack_from(data, body)
            end = body + _HEADER.size + length
            if end == len(data) or (end < len(data) and data.startswith(_MARK, end)):
                yield key, written, data[body + _HEADER.size:end]
                at = end if end < len(data) else -1
                continue
        at = data.find(_MARK, at + 1)


def loads(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


def dump_indexed(pickles: Mapping[int, bytes], path: Path) -> dict[int, tuple[int, int]]:
    """Write ``pickles`` one after the other to ``path``, atomically; where each lies (offset, length)."""
    index: dict[int, tuple[int, int]] = {}
    with atomic_file(path, binary=True) as f:
        for key, data in pickles.items():
            index[key] = (f.tell(), len(data))
            f.write(data)
    return index


def read_at(path: Path, where: tuple[int, int]) -> Any:
    """The object pickled at ``where`` (offset, length: :func:`dump_indexed`'s) in ``path``."""
    offset, length = where
    with open(path, "rb") as f:
        f.seek(offset)
        return loads(f.read(length))
