"""Read CIFAR-10 from the standard python batches, which users stage (``cifar-10-batches-py``, from the CIFAR-10
page) and point ``data_dir`` at: no package ships them, and compute nodes have no internet."""
from __future__ import annotations

import functools
import pickle
from pathlib import Path

import numpy as np

from gpupack.errors import DataError
from gpupack.job.workloads._images import ImageSet

TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
TEST = "test_batch"
SUBDIR = "cifar-10-batches-py"


def find_dir(data_dir: str | None, key: str = "data_dir") -> Path:
    """The folder holding the batches (data_dir itself or its cifar-10-batches-py); DataError names the files."""
    expected = ", ".join(TRAIN + [TEST])
    if data_dir in (None, ""):
        raise DataError(key, data_dir, f"CIFAR-10 is not shipped with gpupack (expected {expected})",
                        f"stage {SUBDIR} from the CIFAR-10 page and set sweep.fixed.data_dir=/path/to/{SUBDIR}")
    root = Path(str(data_dir)).expanduser()
    for candidate in (root, root / SUBDIR):
        if all((candidate / name).is_file() for name in TRAIN + [TEST]):
            return candidate
    missing = [n for n in TRAIN + [TEST] if not (root / n).is_file() and not (root / SUBDIR / n).is_file()]
    raise DataError(key, str(root), f"CIFAR-10 python batches missing: {', '.join(missing)}",
                    f"stage {SUBDIR} (data_batch_1..5, test_batch) there")


# What a CIFAR-10 batch holds besides dicts, lists, bytes and ints: numpy arrays (_reconstruct + ndarray + dtype, or
# _frombuffer). Nothing else is looked up, so a pickle in a shared folder cannot name os.system and run it.
_ALLOWED = frozenset({
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
})
_CONVERT_HINT = (f"use the {SUBDIR} files from the CIFAR-10 page, or convert your data once to dicts of b'data' (a "
                 "uint8 numpy array, n x 3072) and b'labels' (a list of ints) pickled with numpy arrays only")


class _Refused(pickle.UnpicklingError):
    """A pickle named something a CIFAR-10 batch never holds."""

    def __init__(self, module: str, name: str) -> None:
        self.what = f"{module}.{name}"
        super().__init__(self.what)


def _latin1(text: str, encoding: str = "latin1") -> bytes:
    """Python 3's protocol 2 writes bytes as _codecs.encode(text, 'latin1'): that call alone, never another codec."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused("_codecs", f"encode(..., {encoding!r})")
    return text.encode("latin1")


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) == ("_codecs", "encode"):
            return _latin1
        if (module, name) not in _ALLOWED:
            raise _Refused(module, name)
        return super().find_class(module, name)


def _read(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The batch at ``path``, unpickled with only what a CIFAR-10 batch holds; DataError names the file otherwise."""
    try:
        with open(path, "rb") as f:
            batch = _BatchUnpickler(f, encoding="bytes").load()
    except _Refused as err:
        raise DataError("sweep.fixed.data_dir", str(path), f"the pickle names {err.what}, which no CIFAR-10 batch "
                        "holds: refused without running it", _CONVERT_HINT) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise DataError("sweep.fixed.data_dir", str(path), f"not a CIFAR-10 python batch ({err})",
                        _CONVERT_HINT) from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DataError("sweep.fixed.data_dir", str(path), "not a CIFAR-10 python batch (no dict of b'data' and "
                        "b'labels')", _CONVERT_HINT)
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # CHW rows → NHWC images
    return np.ascontiguousarray(images), np.asarray(batch[b"labels"], dtype=np.uint8)


@functools.lru_cache(maxsize=4)  # read once per process: the fork server's copy is shared by every forked training
def load(data_dir: str | None) -> ImageSet:
    folder = find_dir(data_dir)
    parts = [_read(folder / name) for name in TRAIN]
    x_test, y_test = _read(folder / TEST)
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    return ImageSet(x_train, y_train, x_test, y_test,
                   source=f"CIFAR-10 (data path: {folder}; {len(y_train)} train, {len(y_test)} test)")


def write_batches(folder: Path, n_per_batch: int, seed: int = 0) -> Path:
    """Small random files in the real format, for tests and dry runs (not CIFAR-10's images)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name in TRAIN + [TEST]:
        batch = {b"data": rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, n_per_batch)], b"batch_label": name.encode()}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
    return folder
