"""Read CIFAR-10 from the standard python batches (``data_batch_1`` … ``data_batch_5``, ``test_batch``).

No PyPI package ships the CIFAR-10 images, and compute nodes have no internet: users stage the
``cifar-10-batches-py`` folder (the tarball from the CIFAR-10 page, unpacked) and point ``data_dir`` at it.
"""
from __future__ import annotations

import functools

import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpupack.errors import DataError

TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
TEST = "test_batch"
SUBDIR = "cifar-10-batches-py"


@dataclass(frozen=True)
class Cifar10:
    x_train: np.ndarray  # uint8 (n, 32, 32, 3)
    y_train: np.ndarray  # uint8 (n,)
    x_test: np.ndarray
    y_test: np.ndarray
    source: str


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


def _read(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # CHW rows → NHWC images
    return np.ascontiguousarray(images), np.asarray(batch[b"labels"], dtype=np.uint8)


@functools.lru_cache(maxsize=4)  # read once per process: the fork server's copy is shared by every forked training
def load(data_dir: str | None) -> Cifar10:
    folder = find_dir(data_dir)
    parts = [_read(folder / name) for name in TRAIN]
    x_test, y_test = _read(folder / TEST)
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    return Cifar10(x_train, y_train, x_test, y_test,
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
