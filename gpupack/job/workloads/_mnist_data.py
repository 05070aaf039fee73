"""Read MNIST from a data path: the standard IDX files (gzipped or not) or one ``mnist.npz``. Nothing is downloaded
(compute nodes have no internet): with no data path, the copy shipped in ``data/mnist`` is used."""
from __future__ import annotations

import functools
import gzip
import struct
from pathlib import Path

import numpy as np

from gpupack.errors import DataError
from gpupack.job.workloads._images import ImageSet

SHIPPED_DIR = Path(__file__).resolve().parent / "data" / "mnist"
IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
NPZ_NAME = "mnist.npz"  # keras.datasets.mnist's layout: x_train, y_train, x_test, y_test
_MAGIC = {2051: 3, 2049: 1}  # IDX magic numbers of uint8 images (3 dims) and labels (1 dim)


def resolve_dir(data_dir: str | None) -> Path:
    return SHIPPED_DIR if data_dir in (None, "") else Path(str(data_dir)).expanduser()


def find_files(directory: Path, key: str = "data_dir") -> dict[str, Path] | Path:
    """The IDX files (each plain or .gz) or the npz in ``directory``; a DataError names what is missing."""
    if not directory.is_dir():
        raise DataError(key, str(directory), "the directory does not exist",
                        "point it at a folder holding the MNIST IDX files or mnist.npz, or leave it "
                        "null to use the copy shipped with gpupack")
    npz = directory / NPZ_NAME
    found: dict[str, Path] = {}
    for field, stem in IDX_FILES.items():
        for candidate in (directory / stem, directory / f"{stem}.gz"):
            if candidate.is_file():
                found[field] = candidate
                break
    if len(found) == len(IDX_FILES):
        return found
    if npz.is_file():
        return npz
    missing = [IDX_FILES[f] + "[.gz]" for f in IDX_FILES if f not in found]
    raise DataError(key, str(directory), f"MNIST files missing: {', '.join(missing)}",
                    f"stage the four IDX files or {NPZ_NAME} there")


def read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    magic = struct.unpack(">I", raw[:4])[0]
    if magic not in _MAGIC:
        raise DataError("data_dir", str(path), f"not an IDX uint8 file (magic {magic})",
                        "use the standard MNIST files")
    ndim = _MAGIC[magic]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError("data_dir", str(path), "truncated IDX file", "copy the file again")
    out: np.ndarray = data.reshape(dims).copy()  # writable: torch.from_numpy warns on read-only buffers
    return out


@functools.lru_cache(maxsize=4)  # read once per process: the fork server's copy is shared by every forked training
def load(data_dir: str | None) -> ImageSet:
    directory = resolve_dir(data_dir)
    files = find_files(directory)
    if isinstance(files, Path):
        with np.load(files) as z:
            arrays = {k: np.asarray(z[k], dtype=np.uint8) for k in IDX_FILES}
        source = str(files)
    else:
        arrays = {k: read_idx(p) for k, p in files.items()}
        source = str(directory)
    kind = "shipped copy" if directory == SHIPPED_DIR else "data path"
    n_train, n_test = len(arrays["y_train"]), len(arrays["y_test"])
    return ImageSet(**arrays, source=f"MNIST ({kind}: {source}; {n_train} train, {n_test} test)")
