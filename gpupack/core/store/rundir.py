"""The run directory: one place for the layout, so no module builds a path of its own.

    RUN_DIR/
      config.yaml                              the resolved config as run (the cluster's options included)
      plan.json                                trainings and packs, with ids
      packs/<pack_id>/pack.json                the pack record
      packs/<pack_id>/trainings/<id>.json      one training record per training
      packs/<pack_id>/trainings.arrows         the pack's records as one columnar file (gpupack.core.store.columnar)
      packs/<pack_id>/logs/<id>.out|.err       each training's output
      (the trainings' specs and results in flight live in the job's node-local space: PackContext.work)
      packs/<pack_id>/attempts/<k>/            records of earlier attempts (a resumed pack moves them there)
      packs/<pack_id>/.lock                    held by the packer running the pack
      lanes/<lane>.jsonl                       a lane's journal: its ended packs' or trainings' records, folded
      lanes/<lane>.log                         their completed trainings' output (gpupack.core.store.journal)
      lanes/<lane>.arrows                      the journal's records as columns (gpupack.core.store.lane_columnar)
      lanes/<lane>.failed/<pack>.<id>.out|err  their failed trainings' whole logs (.<k>.out|err: a later failure's)
      claims/<queue>/<id>.claim                which streaming lane holds a training (gpupack.core.store.claims)
      jobs.json                                pack id → submitted job id (SLURM), for status and resume
      search/study.log, study.json             search=optuna: the study (Optuna journal) and its head
      search/study.torn                        a torn last line of it, cut and kept (journal.cut_torn)
      submitit/                                submitit's files of each job (array), named by its id
      summary.csv  summary.json                written by collect
      cleared_oom.json                         the OOMs a user cleared (python -m gpupack clear-oom)
      rank.json                                what collect ranks by (gpupack.core.store.rank_choice)
      .lock                                    held while a sweep runs in the directory
      auto.json  probe/nNN/  run/              packing.factors=auto: the probe, its steps, the grid at the best N
      again/NN/                                packing.remeasure: the disturbed rounds measured again
      hydra_launch.pkl  returns/<job>.pkls     a Hydra launch (MULTIRUN_DIR/.gpupack/launch_<first job>/): the
      hydra_configs.pkls                       pickled launcher, its jobs' JobReturns and its job configs

Collect, walking thousands of packs as ``str`` folders, joins the same names (:data:`PACK_RECORD`, ...) itself.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpupack.core.store.locks import Hold, try_hold
from gpupack.errors import ConfigError, RunDirError

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

PLAN = "plan.json"
PACK_RECORD = "pack.json"  # packs/<pack_id>/pack.json
TRAININGS = "trainings"  # packs/<pack_id>/trainings/<id>.json
COLUMNAR = "trainings.arrows"  # packs/<pack_id>/trainings.arrows
ATTEMPTS = "attempts"  # packs/<pack_id>/attempts/<k>/
LOCK = ".lock"  # RUN_DIR/.lock and packs/<pack_id>/.lock
PROBE, RUN = "probe", "run"  # packing.factors=auto: RUN_DIR/probe/nNN/ and RUN_DIR/run/
AGAIN = "again"  # packing.remeasure: RUN_DIR/again/NN/, the rounds measured under load measured again
LAUNCH = "launch_"  # a Hydra launch's run directory: MULTIRUN_DIR/.gpupack/launch_<first job number>[.k]


def check_name(key: str, value: str) -> str:
    """Names that become path parts must stay inside the run directory: no '/', '..', NUL or spaces."""
    if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value) or ".." in value:
        raise ConfigError(key, value, "is not a safe name for a path",
                          "use letters, digits, '_', '-' and '.', starting with a letter or digit")
    return value


# Files per training (record, stdout, stderr), pack (record, lock, columnar file, fork server's log), job (submitit's
# call, result, stdout, stderr), run (config, plan, lock, summary, parquet, report, plots...) and folding lane
# (journal, log, columnar file; its job's stdout and stderr are then one file): the dry run's file forecast.
FILES_PER_TRAINING, FILES_PER_PACK, FILES_PER_JOB, FILES_PER_RUN, FILES_PER_LANE = 3, 4, 4, 13, 3


def files_forecast(trainings: int, packs: int, jobs: int, folded: bool) -> int:
    """About how many files a run leaves, all trainings completed; ``folded``: its jobs fold into journals. Pure."""
    if folded:
        return (FILES_PER_JOB - 1 + FILES_PER_LANE) * jobs + FILES_PER_RUN
    return FILES_PER_TRAINING * trainings + FILES_PER_PACK * packs + FILES_PER_JOB * jobs + FILES_PER_RUN


class _UnderRoot:
    """A path under the run directory, as an attribute of :class:`RunDir`: ``RunDir(root).<it>`` is ``root/<parts>``."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __get__(self, run: RunDir, owner: object = None) -> Path:
        return run.root.joinpath(*self.parts)


@dataclass(frozen=True)
class RunDir:
    root: Path

    @staticmethod
    def below(folder: Path, depth: int = 3) -> list[Path]:
        """The run directories (folders holding a plan.json) up to ``depth`` levels beneath ``folder``, sorted."""
        return sorted({p.parent for k in range(1, depth + 1) for p in folder.glob("/".join(["*"] * k) + "/" + PLAN)})

    def siblings(self) -> list[RunDir]:
        """The other run directories in this one's parent, newest plan first. A stat each, nothing read."""
        try:
            with os.scandir(self.root.parent) as entries:
                names = [e.name for e in entries if e.name != self.root.name and e.is_dir()]
        except OSError:
            return []
        found = []
        for name in names:
            try:
                found.append((os.stat(self.root.parent / name / PLAN).st_mtime, name))
            except OSError:
                continue
        return [RunDir(self.root.parent / name) for _, name in sorted(found, reverse=True)]

    @staticmethod
    def launch_name(first_job: int) -> str:
        """The name of a Hydra launch's run directory, in its records_dir (MULTIRUN_DIR/.gpupack/)."""
        return f"{LAUNCH}{first_job:06d}"

    @property
    def sweep_root(self) -> Path:
        """The sweep this run is part of: a Hydra launch's records_dir (the launches of one multirun add up to its
        sweep), ROOT for ROOT/again/NN/, else its own."""
        if self.root.parent.name == AGAIN and RunDir(self.root.parent.parent).plan.exists():
            return self.root.parent.parent
        return self.root.parent if self.root.name.startswith(LAUNCH) else self.root

    @property
    def auto_root(self) -> Path | None:
        """The packing.factors=auto sweep this run is a step (ROOT/probe/nNN/) or the run (ROOT/run/) of; else None."""
        if self.root.parent.name == PROBE:
            return self.root.parent.parent
        if self.root.name == RUN and (self.root.parent / PROBE).is_dir():
            return self.root.parent
        return None

    # ---------------- the run's own files ----------------

    config = _UnderRoot("config.yaml")
    plan = _UnderRoot(PLAN)
    lanes = _UnderRoot("lanes")

    def journal(self, lane: str) -> Path:
        return self.lanes / f"{check_name('lane', lane)}.jsonl"

    def lane_columnar(self, lane: str) -> Path:
        return self.lanes / f"{check_name('lane', lane)}.arrows"

    def torn_lines(self, lane: str) -> Path:
        """Where a lane's journal keeps the torn last lines it was cut back from: never lost, never read as records."""
        return self.lanes / f"{check_name('lane', lane)}.torn"

    def lane_log(self, lane: str) -> Path:
        return self.lanes / f"{check_name('lane', lane)}.log"

    def failed_log(self, lane: str, pack_id: str, training_id: str, stream: str, copy: int = 1) -> Path:
        """A failed training's whole log as its lane folded it; ``copy`` k > 1: its k-th failure's in that lane."""
        again = f".{int(copy)}" if copy > 1 else ""
        return (self.lanes / f"{check_name('lane', lane)}.failed"
                / f"{check_name('pack_id', pack_id)}.{check_name('training_id', training_id)}{again}.{stream}")

    def claims(self, queue: str) -> Path:
        return self.root / "claims" / check_name("stream", queue)

    jobs = _UnderRoot("jobs.json")
    study = _UnderRoot("search", "study.log")
    # submitit's folder: one for every job (no %A folder per array: submitit makes that after sbatch returns, and
    # SLURM fails a job it starts in between)
    submitit_folder = _UnderRoot("submitit")

    summary_csv = _UnderRoot("summary.csv")
    summary_json = _UnderRoot("summary.json")
    cleared_oom = _UnderRoot("cleared_oom.json")
    rank_choice = _UnderRoot("rank.json")
    lock = _UnderRoot(LOCK)

    def holds_only_lock(self) -> bool:
        """True when the directory is missing, empty, or holds nothing but a lock left behind."""
        return not self.root.exists() or all(p.name == LOCK for p in self.root.iterdir())

    # ---------------- packing.factors=auto ----------------

    auto_record = _UnderRoot("auto.json")

    def probe_step(self, factor: int) -> RunDir:
        return RunDir(self.root / PROBE / f"n{factor:02d}")

    def probe_steps(self) -> list[Path]:
        """The probe's steps that planned a run, in N order."""
        return sorted(p.parent for p in (self.root / PROBE).glob("n*/" + PLAN))

    @property
    def auto_run(self) -> RunDir:
        return RunDir(self.root / RUN)

    # ---------------- rounds measured again (packing.remeasure) ----------------

    def again(self, k: int) -> RunDir:
        """The k-th measurement again of this run's disturbed rounds."""
        return RunDir(self.root / AGAIN / f"{k:02d}")

    def agains(self) -> list[Path]:
        """Its rounds measured again that planned a run, in order."""
        return sorted(p.parent for p in (self.root / AGAIN).glob("[0-9]*/" + PLAN))

    # ---------------- a Hydra launch ----------------

    hydra_payload = _UnderRoot("hydra_launch.pkl")
    hydra_configs = _UnderRoot("hydra_configs.pkls")

    def hydra_returns(self, job_id: str | None) -> Path:
        """The JobReturns of the Hydra jobs one gpupack job ran, appended as each ended, keyed by job number."""
        return self.root / "returns" / f"{check_name('job_id', job_id or 'here')}.pkls"

    hydra_returns_dir = _UnderRoot("returns")

    # ---------------- packs ----------------

    packs = _UnderRoot("packs")

    def pack_dirs(self) -> list[str]:
        """Every packs/<pack_id>/ folder, in name order, as ``str``."""
        try:
            with os.scandir(self.packs) as entries:
                return [e.path for e in sorted(entries, key=lambda e: e.name) if e.is_dir()]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def pack_dir(self, pack_id: str) -> Path:
        return self.packs / check_name("pack_id", pack_id)

    def pack_records(self) -> list[Path]:
        """Every packs/<pack_id>/pack.json written so far (this attempt's)."""
        return list(self.packs.glob(f"*/{PACK_RECORD}"))

    def training_records(self) -> list[Path]:
        """Every packs/<pack_id>/trainings/<id>.json written so far (each training's latest)."""
        return list(self.packs.glob(f"*/{TRAININGS}/*.json"))

    def pack_record(self, pack_id: str) -> Path:
        return self.pack_dir(pack_id) / PACK_RECORD

    def pack_lock(self, pack_id: str) -> Path:
        return self.pack_dir(pack_id) / LOCK

    def trainings(self, pack_id: str) -> Path:
        return self.pack_dir(pack_id) / TRAININGS

    def training_record(self, pack_id: str, training_id: str) -> Path:
        return self.trainings(pack_id) / f"{check_name('training_id', training_id)}.json"

    def columnar(self, pack_id: str) -> Path:
        return self.pack_dir(pack_id) / COLUMNAR

    def attempts(self, pack_id: str) -> Path:
        return self.pack_dir(pack_id) / ATTEMPTS

    def attempt_record(self, pack_id: str, attempt: int, record: Path) -> Path:
        """Where the record ``record`` of an earlier attempt ``attempt`` (1, 2...) is kept."""
        return self.attempts(pack_id) / str(int(attempt)) / record.name

    def log(self, pack_id: str, training_id: str, stream: str) -> Path:
        return self.pack_dir(pack_id) / "logs" / f"{check_name('training_id', training_id)}.{stream}"

    def work(self, pack_id: str, training_id: str, what: str) -> Path:
        """A spec or result in the pack's folder: where a pack context built outside a job body keeps them."""
        return self.pack_dir(pack_id) / "work" / f"{check_name('training_id', training_id)}.{what}.json"


def holder_line() -> str:
    """What a lock file says of its holder: ``pid host since`` (since: local time, to the second)."""
    return f"{os.getpid()} {socket.gethostname()} {_dt.datetime.now().isoformat(timespec='seconds')}\n"


@dataclass(frozen=True)
class Holder:
    """A lock file's holder as its first line says, and the jobs holding the lock with it (:meth:`RunLock.add_job`)."""

    pid: int
    host: str
    since: str | None = None  # a lock written before gpupack said since when has none
    jobs: tuple[int, ...] = ()

    @staticmethod
    def parse(text: str) -> Holder | None:
        """The holder ``text`` names; None where its first line is no holder line (empty, torn). Pure."""
        lines = text.splitlines()
        words = lines[0].split() if lines else []
        if not 1 <= len(words) <= 3 or not words[0].isdigit():
            return None
        jobs = tuple(int(w[1]) for w in (line.split() for line in lines[1:])
                     if len(w) == 2 and w[0] == "job" and w[1].isdigit())
        return Holder(int(words[0]), words[1] if len(words) > 1 else "", words[2] if len(words) == 3 else None, jobs)

    def said(self) -> str:
        """``pid 123 on host, since 2024-05-01T12:00:00``."""
        return f"pid {self.pid} on {self.host or 'a host not said'}" + (f", since {self.since}" if self.since else "")


def busy_refusal(root: Path, holder: Holder | None, alive: Callable[[int], bool], here: str) -> RunDirError:
    """Why a run directory whose lock is held refuses a second command, in one line: the gpupack holding it, or, it
    gone, the local pack jobs still holding it. ``alive``: whether a pid of this host runs. Pure."""
    where = f"run_dir={str(root)!r}"
    if holder is not None and holder.host == here and not alive(holder.pid):
        jobs = [pid for pid in holder.jobs if alive(pid)]
        if jobs:
            return RunDirError(
                f"{where}: the pack jobs of an earlier gpupack ({holder.said()}, no longer running) still run in it: "
                f"pid {', '.join(map(str, jobs))}. HINT: wait for them to end (python -m gpupack watch {root}), then "
                "run the same command again: it resumes with what they recorded")
    who = f" ({holder.said()})" if holder is not None else ""
    stop = f" (or stop it: kill {holder.pid})" if holder is not None and holder.host == here else ""
    return RunDirError(f"{where}: another gpupack sweep is running in it{who}. HINT: wait for it to end{stop}, or "
                       "choose another run_dir=...")


class HeldLocks:
    """Which locks a process of this host holds, without taking one: Linux's lock table, read once (the dead hold no
    flock); elsewhere, whether the pid its holder line names runs (a reused pid reads as live)."""

    def __init__(self, proc_locks: Path = Path("/proc/locks")) -> None:
        try:
            table = proc_locks.read_text()
        except OSError:  # not Linux
            self.inodes: set[str] | None = None
            return
        # e.g. "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234567 0 EOF": the device and inode are the 6th field
        self.inodes = {f[5].rsplit(":", 1)[-1] for f in (line.split() for line in table.splitlines())
                       if len(f) > 5 and f[1] == "FLOCK"}

    def holds(self, lock: Path) -> bool:
        return self.holder(lock) is not None

    def holder(self, lock: Path) -> Holder | None:
        """Who holds ``lock``, where a process of this host does (its holder line names this host); else None."""
        try:
            holder = Holder.parse(lock.read_text())
            inode = lock.stat().st_ino
        except OSError:
            return None
        if holder is None or holder.host != socket.gethostname():
            return None
        held = _alive(holder.pid) if self.inodes is None else str(inode) in self.inodes
        return holder if held else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _holder_of(fd: int) -> Holder | None:
    """The holder line of a lock another holds, read for up to a second (a winner writes it just after locking)."""
    for _ in range(20):
        holder = Holder.parse(os.pread(fd, 4096, 0).decode(errors="replace"))
        if holder is not None:
            return holder
        time.sleep(0.05)
    return None


class RunLock:
    """An exclusive lock on a run directory, so two sweeps never write into it at once (:func:`busy_refusal`).

    The local backend's pack jobs hold it too (:meth:`add_job`): a CLI killed by SIGKILL leaves them running, and a
    new command must be refused while any runs (a lane holds no pack lock between its packs). A SLURM job does not:
    it outlives its command by design, and the next command resumes beside it (Submitter.active_packs)."""

    def __init__(self, run: RunDir) -> None:
        self.path = run.lock
        self._fd: int | None = None
        self._locked = False

    @property
    def fd(self) -> int | None:
        """The locked descriptor, for a local job's controller to inherit (None: not held, or not lockable here)."""
        return self._fd if self._locked else None

    def add_job(self, pid: int) -> None:
        """Say below the holder line that the job ``pid`` holds the lock with this command (it inherited it)."""
        if self._fd is not None:
            os.write(self._fd, f"job {pid}\n".encode())

    def __enter__(self) -> "RunLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o664)  # masked by the umask: records.file_mode()
        got = try_hold(fd, self.path, "do not start two sweeps in this run directory at once")
        if got is Hold.BUSY:
            try:
                holder = _holder_of(fd)
            finally:
                os.close(fd)
            raise busy_refusal(self.path.parent, holder, _alive, socket.gethostname())
        self._locked = got is Hold.HELD  # unlockable: no descriptor for the jobs to inherit
        os.ftruncate(fd, 0)
        os.write(fd, holder_line().encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
