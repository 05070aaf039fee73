"""Issue 42, item 2: a write the file system refuses (no space, quota, read-only, permission) while a run or collect
writes its run directory is one line naming the path, what failed, the free space and the fix, never a traceback;
what finished is kept, and the same command resumes once space is freed.

Each guarantee twice: with the fault injected at the one seam that writes records and collect's files
(gpupack.core.store.records.atomic_file), which any CI can run, and on a real 3 MB file system (tmpfs), which needs the
right to mount and is skipped with the reason where it has none."""
from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from gpupack import sweep
from gpupack.cli import main
from gpupack.core.store import records
from gpupack.core.store.records import write_json_atomic
from gpupack.core.store.storage import failure_line, fault_of, storage_error, write_fault
from gpupack.core.types import FAILED, PackResult, PackState
from gpupack.errors import NO_PERMISSION, NO_SPACE, OUT_OF_QUOTA, READ_ONLY, StorageError, human_bytes
from gpupack.submit import job_failure, progress_state
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parent.parent
SEARCHPATH = f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]"
# 8 trainings, a pack each, each pack about half a second on the fake workload
EIGHT = [SEARCHPATH, "+sweep=probe_pack", "sweep.grid.seed=[0,1,2,3]", "packing.factors=[1]",
         "sweep.fixed.sleep_s=0.03"]


# ---------------- the pure rules ----------------

@pytest.mark.parametrize("err, why", [
    (OSError(errno.ENOSPC, "No space left on device"), NO_SPACE),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), OUT_OF_QUOTA),
    (OSError(errno.EROFS, "Read-only file system"), READ_ONLY),
    (PermissionError(errno.EACCES, "Permission denied"), NO_PERMISSION),
    (PermissionError(errno.EPERM, "Operation not permitted"), NO_PERMISSION),
    (OSError(28, "Error writing bytes to file. Detail: [errno 28] No space left on device"), NO_SPACE),  # pyarrow's
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), None),  # a bug or a fault of its own: not ours
    (OSError(errno.EIO, "Input/output error"), None),
    (OSError("no errno"), None),
    (ValueError("not an OSError"), None),
])
def test_which_errors_are_storage_faults(err, why):
    assert fault_of(err) == why


@pytest.mark.parametrize("why, free, holds", [
    (NO_SPACE, 0, ["/r/x.json: no space left on device (0 B free there)", "HINT: free space on its file system"]),
    (NO_SPACE, 12 * 1024, ["(12.0 KiB free there)"]),
    (OUT_OF_QUOTA, 3 * 2**30, ["out of quota (3.0 GiB free there)", "HINT: free space within your quota"]),
    (READ_ONLY, None, ["/r/x.json: read-only file system. HINT: remount its file system read-write"]),
    (NO_PERMISSION, None, ["/r/x.json: permission denied. HINT: give yourself write permission"]),
])
def test_a_storage_error_names_the_path_the_fault_the_free_space_and_the_fix(why, free, holds):
    err = StorageError("/r/x.json", why, free)
    line = str(err)
    assert "\n" not in line and all(h in line for h in holds), line
    assert line.endswith("keeping every record already written")  # the job's: it does not know the command
    again = str(err.again("python -m gpupack +sweep=s run_dir=/r"))
    assert again == line + ": python -m gpupack +sweep=s run_dir=/r"


@pytest.mark.parametrize("n, said", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (5 * 2**20, "5.0 MiB")])
def test_human_bytes(n, said):
    assert human_bytes(n) == said


def test_a_storage_error_names_the_file_else_the_place_given(tmp_path):
    named = storage_error(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "a.json")), tmp_path)
    bare = storage_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert named is not None and named.path == str(tmp_path / "a.json") and named.free_bytes is not None
    assert bare is not None and bare.path == str(tmp_path)
    assert storage_error(OSError(errno.EROFS, "Read-only"), tmp_path).free_bytes is None  # type: ignore[union-attr]
    assert storage_error(OSError(errno.EIO, "I/O"), tmp_path) is None


TRACEBACK = """Job (task=0) failed during processing with trace:
----------------------
Traceback (most recent call last):
  File "/x/gpupack/core/records.py", line 103, in atomic_file
OSError: [Errno 28] No space left on device: '/r/packs/p/pack.json'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/gpupack/submit/__init__.py", line 80, in __call__
gpupack.errors.StorageError: /r/packs/p/pack.json: no space left on device (0 B free there). HINT: free space
----------------------
You can check full logs with 'job.stderr(0)' and 'job.stdout(0)'or at paths:"""


@pytest.mark.parametrize("text, line", [
    (TRACEBACK, "/r/packs/p/pack.json: no space left on device (0 B free there). HINT: free space"),
    ("gpupack.errors.RunDirError: pack 'p' of run_dir='/r' is already being run (pid 7 on h holds /r/.lock). HINT: x",
     "pack 'p' of run_dir='/r' is already being run (pid 7 on h holds /r/.lock). HINT: x"),
    ("Traceback ...\nRuntimeError: something else", None),
    ("", None),
])
def test_the_line_a_gpupack_error_ended_a_job_with(text, line):
    assert failure_line(text) == line


def test_a_jobs_failure_is_its_gpupack_line_else_the_run_dirs_fault_else_its_tail(tmp_path, monkeypatch):
    from gpupack.core.store.rundir import RunDir

    run = RunDir(tmp_path)
    assert job_failure(TRACEBACK, run).startswith("/r/packs/p/pack.json: no space left on device")
    silent = "Job 12 (task: 0) with path /r/x_result.pkl\nhas not produced any output (state: FINISHED)"
    assert job_failure(silent, run) == silent  # the run directory takes writes: nothing more to say
    import gpupack.submit

    monkeypatch.setattr(gpupack.submit, "write_fault", lambda folder: StorageError(str(folder), NO_SPACE, 0))
    assert job_failure(silent, run) == f"{tmp_path}: no space left on device (0 B free there). HINT: free space on " \
        "its file system (df -h, du -sh), then run the same command again; it resumes where it stopped, keeping " \
        "every record already written"
    assert job_failure("x" * 3000, run) == "x" * 2000  # an unknown failure: its tail, as before


def test_a_failed_jobs_progress_state_carries_its_reason_and_still_reads_failed():
    state = progress_state(PackResult("p", "local", "1", ok=False, error="/r: no space left on device. HINT: h"))
    assert state == FAILED and isinstance(state, PackState) and state.why == "/r: no space left on device. HINT: h"
    assert f"{state:7s}" == "failed " and {state: 1}["failed"] == 1  # a two-argument callback sees "failed"
    assert progress_state(PackResult("p", "local", "1", ok=True, record={"n_failed": 0})) == "done"


def test_the_progress_line_of_a_failed_pack_shows_its_reason():
    from rich.console import Console

    from gpupack.cli.show import ProgressView
    from gpupack.core.plan import make_plan

    pack = make_plan(sweep="t", workload="tests.fake_workloads", grid={"lr": [0.1]}, fixed={}, factors=[1],
                     modes=["process"], partitions=["local"], repeats=1).packs[0]
    console = Console(record=True, force_terminal=False, width=80)
    view = ProgressView(console, [pack])
    view(pack, PackState(FAILED, "/r/x.json: no space left on device (0 B free there). HINT: free space"))
    out = console.export_text()
    assert out.count("\n") == 1 and "failed" in out and "— /r/x.json: no space left on device (0 B free" in out


# ---------------- the seam: gpupack.core.store.records.atomic_file ----------------

class FullAfter:
    """os.fsync of atomic_file failing with ENOSPC from the ``k``-th call on, as a disk that fills; ``under``: only
    for files there (the run directory: a job's node-local work folder is another disk); ``free()`` makes room."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, k: int, under: Path | None = None) -> None:
        self.k, self.calls, self.full = k, 0, True
        real = os.fsync

        def fsync(fd: int) -> None:
            if under is not None and not os.readlink(f"/proc/self/fd/{fd}").startswith(str(under)):
                return real(fd)
            self.calls += 1
            if self.full and self.calls >= self.k:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(fd)

        monkeypatch.setattr(records.os, "fsync", fsync)

    def free(self) -> None:
        self.full = False


@pytest.mark.parametrize("binary", [False, True])
def test_an_atomic_write_on_a_full_disk_leaves_the_old_file_and_no_litter(tmp_path, monkeypatch, binary):
    path = tmp_path / "rec.json"
    write_json_atomic(path, {"old": 1})
    FullAfter(monkeypatch, 1)
    with pytest.raises(OSError) as caught:
        with records.atomic_file(path, binary=binary) as f:
            f.write(b"{}" if binary else "{}")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)  # said where it struck
    assert json.loads(path.read_text()) == {"old": 1} and sorted(os.listdir(tmp_path)) == ["rec.json"]


def test_a_full_disk_in_a_pack_job_ends_it_with_one_line_that_says_so(tmp_path, monkeypatch):
    """The job side (gpupack.submit.PackJob, as every backend runs it): the pack's records fail to be written, and
    the job ends with a StorageError, whose one line is the pack's failure as progress shows it."""
    from gpupack.core.plan import make_plan
    from gpupack.core.store.rundir import RunDir
    from gpupack.core.types import PackSettings
    from gpupack.submit import PackJob
    from tests.fakes import FakeSubmitter

    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload="tests.fake_workloads", grid={"lr": [0.1, 0.2]}, fixed={"steps": 3},
                     factors=[2], modes=["process"], partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    FullAfter(monkeypatch, 1, under=run.root)
    with pytest.raises(StorageError) as caught:
        PackJob(FakeSubmitter)(str(run.root), plan.packs[0].pack_id, PackSettings(device="cpu"))
    line = str(caught.value)
    assert "\n" not in line and "no space left on device" in line and str(run.root) in line
    assert not list(run.root.rglob("*.tmp"))


@pytest.mark.slow
def test_a_full_disk_mid_run_is_one_line_and_the_same_command_resumes(tmp_path, monkeypatch, capsys):
    """The whole flow in this process (the fake backend runs each pack through the job body here), the disk full
    from the 6th atomic write on: the CLI says one line and exits non-zero; once freed, the same command runs the
    rest, each training once, and collect reads all 8."""
    from tests.fakes import FakeConfig, use_fake_submitter

    use_fake_submitter(monkeypatch, config=FakeConfig(default_partitions=["cpu"]))
    run_dir = tmp_path / "run"
    command = EIGHT + ["packing.device=cpu", "partitions=[cpu]", f"run_dir={run_dir}"]
    disk = FullAfter(monkeypatch, 6, under=run_dir)
    code = main(command)
    out, err = capsys.readouterr()
    assert code != 0 and "Traceback" not in out + err
    lines = [line for line in err.strip().splitlines() if not line.startswith("gpupack sampler:")]  # in-process jobs'
    assert len(lines) == 1 and lines[0].startswith("gpupack: error: ") and "no space left on device" in lines[0]
    assert "then run the same command again; it resumes where it stopped, keeping every record already written: " \
        "python -m gpupack " in lines[0] and lines[0].endswith(f"run_dir={run_dir}")
    before = completed_records(run_dir)
    assert 0 < len(before) < 8  # it filled mid-run, and what finished was kept
    disk.free()
    assert main(command) == 0
    capsys.readouterr()
    assert_each_training_once(run_dir, 8)
    collected, _ = sweep.collect([run_dir], plots=False)
    assert collected.records.plan_counts().done and len(collected.records.trainings) == 8


@pytest.mark.slow
def test_collect_on_a_full_disk_is_one_line_and_writes_no_half_file(tmp_path, monkeypatch, capsys):
    from tests.fakes import FakeConfig, use_fake_submitter

    use_fake_submitter(monkeypatch, config=FakeConfig(default_partitions=["cpu"]))
    run_dir = tmp_path / "run"
    assert main(EIGHT + ["packing.device=cpu", "partitions=[cpu]", f"run_dir={run_dir}"]) == 0
    for name in ("trainings.parquet", "summary.csv", "summary.json"):
        (run_dir / name).unlink()
    capsys.readouterr()
    FullAfter(monkeypatch, 1)
    code = main(["collect", str(run_dir), "--no-plots"])
    out, err = capsys.readouterr()
    assert code != 0 and "Traceback" not in out + err and len(err.strip().splitlines()) == 1
    assert "no space left on device" in err and f"python -m gpupack collect {run_dir} --no-plots" in err
    assert not [p for p in os.listdir(run_dir) if p.endswith(".tmp") or p.startswith("summary")
                or p == "trainings.parquet"]


# ---------------- a real full file system ----------------

def completed_records(run_dir: Path) -> list[dict]:
    """Every training record of the run, earlier attempts' included, that says completed."""
    found = [json.loads(p.read_text()) for p in run_dir.glob("packs/*/trainings/*.json")]
    found += [json.loads(p.read_text()) for p in run_dir.glob("packs/*/attempts/*/trainings/*.json")]
    return [r for r in found if r["status"] == "completed"]


def assert_each_training_once(run_dir: Path, n: int) -> None:
    ids = [r["training_id"] for r in completed_records(run_dir)]
    assert len(ids) == len(set(ids)) == n, sorted(ids)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs of its own, unmounted after the test; skipped where this user cannot mount one."""
    where = tmp_path / "fs"
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {made.stderr.strip() or made.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(folder: Path) -> Path:
    """A ballast file taking every byte left on ``folder``'s file system."""
    ballast = folder / f"ballast-{uuid.uuid4().hex[:6]}"
    with open(ballast, "wb", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    f.write(bytes(chunk))
            except OSError as err:
                assert err.errno == errno.ENOSPC
    return ballast


def test_write_json_atomic_on_a_full_file_system_keeps_the_old_record_and_leaves_no_litter(small_fs):
    path = small_fs / "rec.json"
    write_json_atomic(path, {"old": 1})
    ballast = fill(small_fs)
    with pytest.raises(OSError) as caught:
        write_json_atomic(path, {"new": "x" * 20000})
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert json.loads(path.read_text()) == {"old": 1}
    assert sorted(os.listdir(small_fs)) == sorted(["rec.json", ballast.name])
    fault = write_fault(small_fs)
    assert fault is not None and fault.why == NO_SPACE and fault.path == str(small_fs) and fault.free_bytes == 0
    ballast.unlink()
    assert write_fault(small_fs) is None


@pytest.mark.slow
def test_a_run_whose_file_system_fills_mid_run_says_one_line_and_resumes_once_freed(small_fs, subprocess_env):
    """Outside in, on the local backend: the 3 MB file system is filled once the first pack has its record; the
    run ends with one line and a non-zero exit, no traceback, the failed pack's progress line says why; after the
    ballast is freed the same command completes the rest, each training once, and collect reads all 8."""
    run_dir = small_fs / "run"
    command = [sys.executable, "-m", "gpupack", *EIGHT, f"run_dir={run_dir}"]
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env,
                           cwd=REPO)
    try:
        assert wait_for(lambda: any(run_dir.glob("packs/*/pack.json")) or cli.poll() is not None, 120, 0.02)
        ballast = fill(small_fs)
        out, err = cli.communicate(timeout=300)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode != 0, out + err
    assert "Traceback" not in out + err, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpupack: error: ") and "no space left on device" in lines[0], err
    assert "free there" in lines[0] and str(run_dir) in lines[0] and "python -m gpupack" in lines[0]
    failed = [line for line in out.splitlines() if re.search(r"\] \S+ failed +\(", line)]  # its state: failed
    assert failed and all("no space left on device" in line for line in failed), out
    kept = len(completed_records(run_dir))
    assert 1 <= kept < 8
    assert not list(run_dir.rglob(".*.tmp"))

    ballast.unlink()
    again = subprocess.run(command, capture_output=True, text=True, env=subprocess_env, cwd=REPO, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert_each_training_once(run_dir, 8)
    collected = subprocess.run([sys.executable, "-m", "gpupack", "collect", str(run_dir), "--no-plots"],
                               capture_output=True, text=True, env=subprocess_env, cwd=REPO, timeout=300)
    assert collected.returncode == 0 and "done: 8 of 8 trainings" in collected.stdout, collected.stdout


def test_a_full_disk_as_the_run_opens_is_one_line(tmp_path, monkeypatch, capsys):
    """Full at the run's first write (config.yaml), before any job: the run's own side says it the same way."""
    from tests.fakes import FakeConfig, use_fake_submitter

    use_fake_submitter(monkeypatch, config=FakeConfig(default_partitions=["cpu"]))
    run_dir = tmp_path / "run"
    FullAfter(monkeypatch, 1, under=run_dir)
    code = main(EIGHT + ["packing.device=cpu", "partitions=[cpu]", f"run_dir={run_dir}"])
    out, err = capsys.readouterr()
    assert code != 0 and "Traceback" not in out + err and len(err.strip().splitlines()) == 1
    assert err.startswith(f"gpupack: error: {run_dir / 'config.yaml'}: no space left on device (")
    assert not completed_records(run_dir)
