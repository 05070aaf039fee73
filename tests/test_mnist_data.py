"""MNIST from a data path: IDX (plain or gz) or mnist.npz; the shipped copy is the real 70,000 digits."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from gpupack.errors import DataError
from gpupack.job.workloads import _mnist_data


def _write_idx(path, array, gz):
    magic = 2051 if array.ndim == 3 else 2049
    raw = struct.pack(">I", magic) + struct.pack(">" + "I" * array.ndim, *array.shape) + array.tobytes()
    (gzip.open if gz else open)(path, "wb").write(raw)


@pytest.mark.parametrize("gz", [True, False])
def test_reads_idx_files_from_a_data_path(tmp_path, gz):
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.integers(0, 255, (7, 28, 28), dtype=np.uint8), "y_train": np.arange(7, dtype=np.uint8),
              "x_test": rng.integers(0, 255, (3, 28, 28), dtype=np.uint8), "y_test": np.arange(3, dtype=np.uint8)}
    for key, stem in _mnist_data.IDX_FILES.items():
        _write_idx(tmp_path / (stem + (".gz" if gz else "")), arrays[key], gz)
    data = _mnist_data.load(str(tmp_path))
    for key, value in arrays.items():
        assert np.array_equal(getattr(data, key), value)
    assert "data path" in data.source and "7 train, 3 test" in data.source


def test_reads_npz(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((4, 28, 28), np.uint8), y_train=np.zeros(4, np.uint8),
             x_test=np.zeros((2, 28, 28), np.uint8), y_test=np.zeros(2, np.uint8))
    assert "4 train, 2 test" in _mnist_data.load(str(tmp_path)).source


def test_missing_files_are_named(tmp_path):
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"")
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte"):
        _mnist_data.load(str(tmp_path))
    with pytest.raises(DataError, match="does not exist"):
        _mnist_data.load(str(tmp_path / "nope"))


def test_truncated_file_is_refused(tmp_path):
    _write_idx(tmp_path / "x", np.zeros((5, 28, 28), np.uint8), False)
    (tmp_path / "x").write_bytes((tmp_path / "x").read_bytes()[:-10])
    with pytest.raises(DataError, match="truncated"):
        _mnist_data.read_idx(tmp_path / "x")


def test_shipped_copy_is_the_real_mnist():
    data = _mnist_data.load(None)
    assert data.x_train.shape == (60000, 28, 28) and data.x_test.shape == (10000, 28, 28)
    assert np.bincount(data.y_train).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert np.bincount(data.y_test).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert data.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
