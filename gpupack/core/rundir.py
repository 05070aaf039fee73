"""The run directory: one place for the layout, so no module builds a path of its own.

    RUN_DIR/
      config.yaml                              the resolved config as run
      plan.json                                trainings and packs, with ids
      packs/<pack_id>/pack.json                the pack record
      packs/<pack_id>/trainings/<id>.json      one training record per training
      packs/<pack_id>/logs/<id>.out|.err       each training's output
      packs/<pack_id>/work/                    worker specs and results in flight
      jobs.json                                pack id → submitted job id (SLURM), for status and resume
      submitit/                                submitit's job folders
      summary.csv  summary.json                written by collect
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpupack.errors import ConfigError

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def check_name(key: str, value: str) -> str:
    """Names that become path parts must stay inside the run directory: no '/', '..', NUL or spaces."""
    if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value) or ".." in value:
        raise ConfigError(key, value, "is not a safe name for a path",
                          "use letters, digits, '_', '-' and '.', starting with a letter or digit")
    return value


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs.json"

    @property
    def submitit(self) -> Path:
        return self.root / "submitit"

    @property
    def summary_csv(self) -> Path:
        return self.root / "summary.csv"

    @property
    def summary_json(self) -> Path:
        return self.root / "summary.json"

    def pack_dir(self, pack_id: str) -> Path:
        return self.root / "packs" / check_name("pack_id", pack_id)

    def pack_record(self, pack_id: str) -> Path:
        return self.pack_dir(pack_id) / "pack.json"

    def training_record(self, pack_id: str, training_id: str) -> Path:
        return self.pack_dir(pack_id) / "trainings" / f"{check_name('training_id', training_id)}.json"

    def log(self, pack_id: str, training_id: str, stream: str) -> Path:
        return self.pack_dir(pack_id) / "logs" / f"{check_name('training_id', training_id)}.{stream}"

    def work(self, pack_id: str, training_id: str, what: str) -> Path:
        return self.pack_dir(pack_id) / "work" / f"{check_name('training_id', training_id)}.{what}.json"


class RunLock:
    """An exclusive lock on a run directory, so two sweeps never write into the same one at once."""

    def __init__(self, run: RunDir) -> None:
        self.path = run.root / ".lock"
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        import fcntl
        import os

        from gpupack.errors import RunDirError

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o664)  # masked by the umask: records.file_mode()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirError(f"run_dir={str(self.path.parent)!r}: another gpupack sweep is running in it. "
                              "HINT: wait for it, or choose another run_dir=...") from None
        except OSError as err:  # a file system without flock (Lustre mounted without -o flock): go on unlocked
            import sys

            print(f"gpupack: warning: cannot lock {self.path} ({err.strerror}); do not start two sweeps in this "
                  "run directory at once", file=sys.stderr)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        import os

        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
