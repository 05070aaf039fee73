"""Issue 14: file modes without flipping the umask (records, logs, folders), CIFAR-10 batches read without running
what a pickle names, and RGU weights that must be > 0."""
from __future__ import annotations

import os
import pickle
import stat
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from gpupack.cli import main
from gpupack.core.cost.rgu import check_weights
from gpupack.core.plan import make_plan
from gpupack.core.store import records
from gpupack.core.store.records import atomic_file, make_dirs, open_log, read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.errors import ConfigError
from gpupack.job.body import run_pack
from gpupack.job.workloads import _cifar10_data


def _proc_umask() -> int:
    """The process umask as the kernel reports it, read without changing it."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    pytest.skip("no Umask line in /proc/self/status (Linux < 4.7)")


@pytest.fixture
def umask(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], None]]:
    """Set the process umask for one test (records reads it again, as a process starting under it would)."""
    real_umask = os.umask  # the test may patch os.umask: restore through the real one
    old = real_umask(0o022)
    real_umask(old)

    def set_to(value: int) -> None:
        real_umask(value)
        monkeypatch.setattr(records, "_umask", None)

    yield set_to
    real_umask(old)


# ---------------- the umask is read, never flipped ----------------

def test_writers_in_threads_never_change_the_umask(tmp_path, umask, monkeypatch):
    """tf_logical writes N results from N threads: no write may call os.umask (a flip to 0 and back is a race that
    leaves files and the process umask wrong), and a watcher reading the kernel's umask never sees it change."""
    umask(0o077)
    records.file_mode()  # read once, at the start, as a pack does before its threads
    calls: list[int] = []
    real = os.umask
    monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or real(mask))
    seen: set[int] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.add(_proc_umask())

    def write(k: int) -> None:
        for i in range(40):
            write_json_atomic(tmp_path / f"t{k}" / f"{i}.json", {"k": k, "i": i})

    watcher = threading.Thread(target=watch)
    watcher.start()
    writers = [threading.Thread(target=write, args=(k,)) for k in range(8)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    watcher.join()
    assert calls == [] and seen == {0o077}
    modes = {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.glob("t*/*.json")}
    assert modes == {0o600} and len(list(tmp_path.glob("t*/*.json"))) == 320
    assert {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.glob("t*")} == {0o700}


def test_the_umask_is_read_from_the_kernel_and_once(umask, monkeypatch):
    umask(0o027)
    monkeypatch.setattr(os, "umask", lambda mask: pytest.fail("os.umask was called"))
    assert records.umask() == 0o027
    assert records.file_mode() == 0o640 and records.dir_mode() == 0o750


@pytest.mark.parametrize("given, file_mode, dir_mode", [(0o000, 0o664, 0o775), (0o002, 0o664, 0o775),
                                                        (0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_modes_follow_the_umask_but_are_never_world_writable(umask, given, file_mode, dir_mode):
    umask(given)
    assert (records.file_mode(), records.dir_mode()) == (file_mode, dir_mode)


def test_without_proc_the_umask_is_read_once_under_a_lock(umask, monkeypatch):
    """Where /proc cannot say: one os.umask round trip (through 0o077, never 0), at the first call only."""
    umask(0o022)
    real_open = open

    def no_proc(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == "/proc/self/status":
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_proc)
    calls: list[int] = []
    real = os.umask
    monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or real(mask))
    threads = [threading.Thread(target=records.file_mode) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert records.file_mode() == 0o644
    assert calls == [0o077, 0o022] and _proc_umask() == 0o022


# ---------------- under umask 000 nothing gpupack writes is world-writable ----------------

def _world_writable(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in [root, *root.rglob("*")] if p.stat().st_mode & stat.S_IWOTH]


def test_records_logs_and_folders_are_not_world_writable_under_umask_000(tmp_path, umask):
    umask(0o000)
    write_json_atomic(tmp_path / "a" / "b" / "r.json", {"a": 1})
    with atomic_file(tmp_path / "c" / "blob", binary=True) as f:
        f.write(b"x")
    make_dirs(tmp_path / "d" / "e" / "f")
    with open_log(tmp_path / "g" / "h" / "x.err") as f:
        f.write(b"out")
    with open_log(tmp_path / "g" / "h" / "x.err", append=True) as f:
        f.write(b" more")
    assert (tmp_path / "g" / "h" / "x.err").read_bytes() == b"out more"
    assert _world_writable(tmp_path) == []
    assert stat.S_IMODE((tmp_path / "a" / "b" / "r.json").stat().st_mode) == 0o664
    assert stat.S_IMODE((tmp_path / "d" / "e").stat().st_mode) == 0o775


@pytest.mark.parametrize("fixed", [{"steps": 3, "sleep_s": 0.0},  # forked from the pack's fork server
                                   {"steps": 3, "sleep_s": 0.0, "preload_fail": True}])  # fresh interpreters
def test_a_pack_under_umask_000_writes_nothing_world_writable(tmp_path, umask, fixed):
    """A real pack (records, logs, work files, their folders, the fork server's log) under umask 000."""
    umask(0o000)
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload="tests.fake_workloads", grid={"tag": ["a", "b"]}, fixed=fixed,
                     factors=[2], modes=["process"], partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    pack = plan.packs[0]
    run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))  # nothing to do: no attempts/ folder
    logs = list((run.pack_dir(pack.pack_id) / "logs").iterdir())
    assert {p.suffix for p in logs} >= {".out", ".err"}
    assert read_json(run.pack_record(pack.pack_id))["n_completed"] == 2
    assert _world_writable(run.root) == []


# ---------------- CIFAR-10 batches: no code runs from a pickle ----------------

class _Touch:
    """A pickle that runs a shell command when it is loaded."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.target}",)


def _staged(tmp_path: Path) -> Path:
    return _cifar10_data.write_batches(tmp_path / _cifar10_data.SUBDIR, 10)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_real_format_batch_loads(tmp_path, protocol):
    folder = _staged(tmp_path)
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (7, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 10, 7)]
    # As the CIFAR-10 page's files hold them (bytes keys, a filename list), written at each pickle protocol.
    batch = {b"batch_label": b"training batch 1 of 5", b"labels": labels, b"data": data,
             b"filenames": [f"img_{i}.png".encode() for i in range(7)]}
    with open(folder / "data_batch_1", "wb") as f:
        pickle.dump(batch, f, protocol=protocol)
    _cifar10_data.load.cache_clear()
    loaded = _cifar10_data.load(str(folder))
    assert loaded.x_train.shape == (47, 32, 32, 3) and loaded.y_train[:7].tolist() == labels
    assert np.array_equal(loaded.x_train[0], data[0].reshape(3, 32, 32).transpose(1, 2, 0))


def test_a_malicious_batch_is_refused_and_runs_nothing(tmp_path):
    folder = _staged(tmp_path)
    target = tmp_path / "pwned"
    with open(folder / "data_batch_2", "wb") as f:
        pickle.dump({b"data": _Touch(target), b"labels": []}, f)
    _cifar10_data.load.cache_clear()
    with pytest.raises(ConfigError) as err:
        _cifar10_data.load(str(folder))
    message = str(err.value)
    assert str(folder / "data_batch_2") in message and "system" in message and "HINT: " in message
    assert len(message.splitlines()) == 1
    assert not target.exists()


class _Rot13:
    """What Python 3's protocol 2 writes for bytes (_codecs.encode), but through another codec."""

    def __reduce__(self) -> tuple[Any, ...]:
        import codecs

        return codecs.encode, ("abc", "rot13")


def test_only_the_latin1_call_of_codecs_encode_is_admitted(tmp_path):
    folder = _staged(tmp_path)
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({b"data": _Rot13(), b"labels": []}, f, protocol=2)
    _cifar10_data.load.cache_clear()
    with pytest.raises(ConfigError, match=r"data_batch_3'.*_codecs.encode\(\.\.\., 'rot13'\).*HINT: "):
        _cifar10_data.load(str(folder))


@pytest.mark.parametrize("content", [b"not a pickle", pickle.dumps([1, 2, 3]), pickle.dumps({b"data": 1})])
def test_a_batch_that_is_not_cifar_is_a_data_error(tmp_path, content):
    folder = _staged(tmp_path)
    (folder / "test_batch").write_bytes(content)
    _cifar10_data.load.cache_clear()
    with pytest.raises(ConfigError, match=r"test_batch'.*not a CIFAR-10 python batch.*HINT: "):
        _cifar10_data.load(str(folder))


# ---------------- RGU weights ----------------

@pytest.mark.parametrize("weight, shown", [(-1.0, "-1"), (0.0, "0"), (float("nan"), "nan"), ("x", "'x'"),
                                           (True, "True")])
def test_rgu_weights_must_be_positive_numbers(weight, shown):
    with pytest.raises(ConfigError, match=rf"^rgu.models.V100-16gb={shown}: .* > 0.*HINT: "):
        check_weights({"P100-12gb": 1.0, "V100-16gb": weight})
    assert check_weights({"P100-12gb": 1, "V100-16gb": 2.2}) == {"P100-12gb": 1.0, "V100-16gb": 2.2}


@pytest.mark.parametrize("override", ["rgu.models.V100-16gb=-1", "rgu.models.V100-16gb=0"])
def test_a_bad_rgu_weight_is_refused_before_anything_runs(tmp_path, capsys, override):
    code = main(["+sweep=mnist_pack", override, f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{override}: " in err and "HINT: " in err, err
    assert not (tmp_path / "run").exists()
