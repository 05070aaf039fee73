"""A lane's journal: the ended packs of a lane folded into a few files, so a run of thousands of trainings keeps a
handful of files per job on the cluster's shared filesystem (the Alliance's file quotas) instead of five per training.

A pack runs in its folder as any pack does. When it has ended, :func:`fold_pack` appends its records, earlier
attempts' included, to ``lanes/<lane>.jsonl`` (one JSON line each), its completed trainings' output to
``lanes/<lane>.log`` and its failed trainings' whole logs to ``lanes/<lane>.failed/``; fsynced, then the folder is
removed. A streaming lane folds each training as it ends (:func:`fold_trainings`), keyed by its home (the lane the
plan dealt it to), its claim dropped too (:mod:`gpupack.core.store.claims`).

Readers (:class:`RunRecords`) see a pack's folder where it has one, else the journal's latest record. A job killed
mid-fold leaves the folder and perhaps some lines: the next fold appends them again, and a record read twice counts
once. A torn last line is left unread; the next writer, under the lane's lock, cuts it off into
``lanes/<lane>.torn`` (:func:`cut_torn`); a pack record lost so is rebuilt from its trainings' records by the lane's
next run (:func:`rebuild_pack`), and a training whose line was lost runs again.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Collection, Final, Iterator, Mapping, TypedDict

from gpupack.core.plan import refit_parent
from gpupack.core.store.locks import held
from gpupack.core.store.records import (
    COMPLETED,
    SKIPPED_MEMORY,
    Logs,
    PackRecord,
    TrainingRecord,
    is_pack_record,
    is_training_record,
    make_dirs,
    read_pack,
    read_training,
)
from gpupack.core.store.rundir import ATTEMPTS, PACK_RECORD, TRAININGS, RunDir

TRAINING, PACK = "training", "pack"  # what a journal line holds
LOGS: Final = "logs"  # a folded record's field: where each of its logs is kept (:func:`kept_log`)

Record = TrainingRecord | PackRecord  # what a journal line holds: its ``kind`` says which


class JournalEntry(TypedDict):
    """One line of a lane's journal: a record, its kind, and when and in what order it was folded."""

    kind: str
    folded_at: float
    seq: int
    record: Record


# ---------------- folding (inside the job) ----------------

def fold_pack(run: RunDir, pack_id: str, lane: str, clock: Callable[[], float] = time.time) -> int:
    """Fold the ended pack ``pack_id`` into ``lane``'s journal and remove its folder; how many records it folded."""
    folder = run.pack_dir(pack_id)
    if not folder.is_dir():
        return 0
    folded = _fold(run, lane, clock,
                   lambda log: [*_earlier_attempts(folder), *_current(run, folder, pack_id, lane, log)])
    shutil.rmtree(folder)  # packs/ itself stays: another lane, here or on another node, may be making its pack's
    return len(folded)      # folder in it at this moment


def fold_trainings(run: RunDir, pack_id: str, training_ids: Collection[str], lane: str,
                   clock: Callable[[], float] = time.time) -> list[TrainingRecord]:
    """Fold the ended trainings ``training_ids`` of streaming pack ``pack_id``, then remove their files; the records."""
    folder = run.pack_dir(pack_id)
    folded = _fold(run, lane, clock, lambda log: list(_trainings(run, folder, pack_id, lane, log, training_ids)))
    recs = [rec for _, rec in folded if is_training_record(rec)]
    for rec in recs:
        tid = str(rec["training_id"])
        for path in (run.training_record(pack_id, tid), run.log(pack_id, tid, "out"), run.log(pack_id, tid, "err")):
            path.unlink(missing_ok=True)
    return recs


def append_records(run: RunDir, lane: str, records: Collection[TrainingRecord],
                   clock: Callable[[], float] = time.time) -> None:
    """Append amended training records to ``lane``'s journal (e.g. an OOM SLURM told): the latest record is current."""
    _fold(run, lane, clock, lambda log: [(TRAINING, rec.copy()) for rec in records])


def _fold(run: RunDir, lane: str, clock: Callable[[], float],
          lines_of: Callable[[IO[bytes]], list[tuple[str, Record]]]) -> list[tuple[str, Record]]:
    """Append ``lines_of``'s lines to ``lane``'s journal, fsynced, copying logs into the lane's log; the lines."""
    make_dirs(run.lanes)
    with _lane_lock(run, lane) as (journal, log):
        lines = lines_of(log)
        folded_at = clock()
        for seq, (kind, rec) in enumerate(lines):
            journal.write(json.dumps({"kind": kind, "folded_at": folded_at, "seq": seq, "record": rec}) + "\n")
        log.flush()
        os.fsync(log.fileno())  # the log before the lines that point into it
        journal.flush()
        os.fsync(journal.fileno())
        if log.tell() == 0:  # no output to keep (so far): no empty file
            run.lane_log(lane).unlink()
    return lines


@contextmanager
def _lane_lock(run: RunDir, lane: str) -> Iterator[tuple[IO[str], IO[bytes]]]:
    """The lane's journal and log, held (flock on the journal) against any other writer of the lane. The log is
    opened under the lock: a writer that found it empty removes it."""
    with open(run.journal(lane), "a", encoding="utf-8") as journal, held(journal.fileno(), run.journal(lane)):
        torn = cut_torn(run.journal(lane), run.torn_lines(lane))  # before its first line: that line then stays whole
        if torn:
            print(f"gpupack: warning: lane {lane}: the last line of {run.journal(lane)} was torn (a writer killed "
                  f"mid-append): cut back to its last whole line, the {torn} torn bytes kept in "
                  f"{run.torn_lines(lane)}", file=sys.stderr)
        with open(run.lane_log(lane), "ab") as log:
            yield journal, log


REPAIR_CHUNK = 1 << 16  # a torn line is read back this much at a time (a pack's line with its samples runs long)


def cut_torn(path: Path, aside_path: Path) -> int:
    """Cut the append-only file ``path`` back to its last whole line, the torn bytes past it first appended to
    ``aside_path`` and fsynced; how many bytes were cut (0: none torn). Called under the file's lock only: every
    append is then whole, so what follows the last newline is torn, not being written."""
    with open(path, "r+b") as f:
        size = end = f.seek(0, os.SEEK_END)
        cut: int | None = size if size == 0 else None
        while cut is None and end > 0:
            start = max(0, end - REPAIR_CHUNK)
            f.seek(start)
            at = f.read(end - start).rfind(b"\n")
            cut = None if at < 0 else start + at + 1
            end = start
        cut = cut or 0  # no newline at all: the journal's one line is torn
        if cut == size:
            return 0
        f.seek(cut)
        torn = f.read()
        with open(aside_path, "ab") as aside:
            aside.write(torn + b"\n")
            aside.flush()
            os.fsync(aside.fileno())
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    return len(torn)


def _read(path: Path) -> tuple[str, Record] | None:
    """The record at ``path`` (a pack's by its file name) with its kind; None where none reads."""
    rec = read_pack(path) if path.name == PACK_RECORD else read_training(path)
    return None if rec is None else (PACK if path.name == PACK_RECORD else TRAINING, rec)


def _earlier_attempts(folder: Path) -> list[tuple[str, Record]]:
    """Records a resumed pack moved under attempts/<k>/, oldest attempt first."""
    attempts = folder / ATTEMPTS
    ks = sorted(int(d.name) for d in attempts.iterdir() if d.name.isdigit()) if attempts.is_dir() else []
    return [found for k in ks for path in sorted((attempts / str(k)).glob("*.json")) if (found := _read(path))]


def _current(run: RunDir, folder: Path, pack_id: str, lane: str, log: IO[bytes]) -> list[tuple[str, Record]]:
    """The pack's latest records with where their logs are kept; the pack record last, with the pack's own logs."""
    found = _trainings(run, folder, pack_id, lane, log)
    trainings = {str(rec["training_id"]) for _, rec in found}
    out: list[tuple[str, Record]] = [*found]
    pack = read_pack(folder / PACK_RECORD)
    if pack is not None:
        own = sorted(p for p in (folder / "logs").glob("*.*") if p.stem not in trainings and _has_output(p))
        out.append((PACK, {**pack, LOGS: {p.name: _append_file(run, lane, log, p) for p in own}}))
    return out


def _trainings(run: RunDir, folder: Path, pack_id: str, lane: str, log: IO[bytes],
               only: Collection[str] | None = None) -> list[tuple[str, TrainingRecord]]:
    """The training records in the pack's folder (``only``: of these trainings), each with where its logs are kept:
    a completed training's in the lane's log, a failed one's in a file of its own."""
    paths = sorted((folder / TRAININGS).glob("*.json")) if only is None else \
        [run.training_record(pack_id, tid) for tid in sorted(only)]
    out: list[tuple[str, TrainingRecord]] = []
    for path in paths:
        rec = read_training(path)
        if rec is None:
            continue
        tid, done = rec["training_id"], rec.get("status") == COMPLETED
        out.append((TRAINING, {**rec, LOGS: {
            s: _append_file(run, lane, log, run.log(pack_id, tid, s)) if done else _copy_log(run, lane, pack_id, tid, s)
            for s in ("out", "err") if _has_output(run.log(pack_id, tid, s))}}))
    return out


def _has_output(path: Path) -> bool:
    """A log with something in it: an empty one is kept as nothing (its record then names no log)."""
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _append_file(run: RunDir, lane: str, log: IO[bytes], path: Path) -> Logs:
    """``path``'s bytes appended to the lane's log after a header naming it; where they are."""
    log.write(f"==> {path.parent.parent.name}/{path.name} <==\n".encode())
    offset = log.tell()
    with open(path, "rb") as f:
        shutil.copyfileobj(f, log)
    length = log.tell() - offset
    log.write(b"\n")
    return {"file": str(run.lane_log(lane).relative_to(run.root)), "offset": offset, "length": length}


def _copy_log(run: RunDir, lane: str, pack_id: str, tid: str, stream: str) -> Logs:
    """A failed training's log, whole, in a file of its own (a later failure's in another)."""
    copy = 1
    while (target := run.failed_log(lane, pack_id, tid, stream, copy)).exists():  # under the lane's lock
        copy += 1
    make_dirs(target.parent)
    shutil.copyfile(run.log(pack_id, tid, stream), target)
    with open(target, "rb") as f:
        os.fsync(f.fileno())
    return {"file": str(target.relative_to(run.root)), "offset": 0, "length": target.stat().st_size}


# ---------------- reading ----------------

@dataclass
class Folded:
    """What the run's journals hold: each training's and pack's records, oldest first, each counted once."""

    trainings: dict[tuple[str, str], list[TrainingRecord]] = field(default_factory=dict)
    packs: dict[str, list[PackRecord]] = field(default_factory=dict)


def read_folded(run: RunDir, folders: Collection[str] = ()) -> Folded:
    """Every journal of the run, in the order its records were folded. ``folders``: the packs that have a folder; a
    record one of them still holds (a fold cut off before it removed the folder) is the folder's, not read here."""
    entries = folded_order([e for path in (sorted(run.lanes.glob("*.jsonl")) if run.lanes.is_dir() else [])
                            for e in journal_entries(path)[0]])
    out = Folded()
    folded = {str(e["record"].get("pack_id")) for e in entries}
    seen = {identity(rec) for pack_id in folded.intersection(folders) for rec in folder_records(run, pack_id)}
    for e in entries:
        rec = e["record"]
        same = identity(rec)
        if same in seen:  # folded again after a job was killed between its journal and removing the folder
            continue
        seen.add(same)
        if e["kind"] == PACK and is_pack_record(rec):
            out.packs.setdefault(rec["pack_id"], []).append(rec)
        elif e["kind"] != PACK and is_training_record(rec):
            out.trainings.setdefault((home_of(rec), rec["training_id"]), []).append(rec)
    return out


def make_journals(run: RunDir, lanes: Collection[str]) -> None:
    """Make the empty journals of streaming lanes before their jobs start: NFS's close-to-open consistency holds for
    opening a file that exists by name (:class:`CompletedTail`), where a listing may be cached."""
    if lanes:
        make_dirs(run.lanes)
    for lane in lanes:
        with open(run.journal(lane), "a", encoding="utf-8"):
            pass


class CompletedTail:
    """The (home pack, training id) the journals of ``lanes`` record as completed; each :meth:`refresh` reads only what
    was appended since, opening each journal anew by name so that NFS shows another node's appends."""

    def __init__(self, run: RunDir, lanes: Collection[str]) -> None:
        self.paths = [run.journal(lane) for lane in sorted(lanes)]
        self.done: set[tuple[str, str]] = set()
        self._offsets: dict[Path, int] = {}

    def refresh(self) -> set[tuple[str, str]]:
        for path in self.paths:
            try:  # a line being written (or torn) waits for its end
                entries, self._offsets[path] = journal_entries(path, self._offsets.get(path, 0))
            except FileNotFoundError:  # a lane that has folded nothing yet (a run submitted before journals were made)
                continue
            for entry in entries:
                rec = entry.get("record") or {}
                if entry.get("kind") == TRAINING and is_training_record(rec) and rec["status"] == COMPLETED:
                    self.done.add((home_of(rec), rec["training_id"]))
        return self.done


def journal_entries(path: Path, start: int = 0) -> tuple[list[JournalEntry], int]:
    """A journal's whole lines from byte ``start`` on, in fold order, and where they end (a line in writing, or torn,
    is left for later): the one way a journal is read."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    whole = data.rfind(b"\n") + 1
    entries: list[JournalEntry] = []
    for line in data[:whole].splitlines():
        with suppress(json.JSONDecodeError):  # a line that is no JSON (torn, then ended by the next fold): skipped
            entries.append(json.loads(line))
    return folded_order(entries), start + whole


def held_journal(run: RunDir, lane: str) -> tuple[list[JournalEntry], int, str]:
    """:func:`journal_entries` of ``lane``'s whole journal, read under its lock, and its :func:`fingerprint`."""
    with open(run.journal(lane), "rb") as f, held(f.fileno(), run.journal(lane), shared=True):
        entries, end = journal_entries(run.journal(lane))
        return entries, end, fingerprint(run.journal(lane), end)


FINGERPRINT_BYTES = 4096


def fingerprint(path: Path, end: int) -> str:
    """What stays of a journal's first ``end`` bytes while lines are only appended: their first and last
    :data:`FINGERPRINT_BYTES`, hashed, and, where the file ends there, its modification time. Two small reads."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        digest.update(f.read(min(end, FINGERPRINT_BYTES)))
        f.seek(max(0, end - FINGERPRINT_BYTES))
        digest.update(f.read(min(end, FINGERPRINT_BYTES)))
        stat = os.fstat(f.fileno())
    stamp = f"@{stat.st_mtime_ns}" if stat.st_size == end else ""
    return f"{end}:{digest.hexdigest()}{stamp}"


def folded_order(entries: list[JournalEntry]) -> list[JournalEntry]:
    """Entries in the order they were folded (a fold's lines share its time, in their sequence)."""
    return sorted(entries, key=lambda e: (float(e["folded_at"]), int(e["seq"])))


def lane_trainings(run: RunDir, lane: str) -> dict[str, TrainingRecord]:
    """The latest record of each training ``lane``'s journal holds (training id → record): one journal read."""
    path = run.journal(lane)
    entries = journal_entries(path)[0] if path.is_file() else []
    return {rec["training_id"]: rec for e in entries
            if e.get("kind") == TRAINING and is_training_record(rec := e["record"])}


def identity(rec: Mapping[str, object]) -> int:
    """A record's identity, as a signed 64-bit number (a column of a lane's columnar file): the same record folded
    twice, or folded and still in its folder, is one."""
    same = json.dumps({k: v for k, v in rec.items() if k != LOGS}, sort_keys=True)
    return int.from_bytes(hashlib.blake2b(same.encode(), digest_size=8).digest(), "little", signed=True)


def folder_records(run: RunDir, pack_id: str) -> Iterator[Record]:
    """Every record the pack's folder holds: its trainings', its own, its earlier attempts'."""
    folder = run.pack_dir(pack_id)
    for path in [*folder.glob(f"{TRAININGS}/*.json"), folder / PACK_RECORD, *folder.glob(f"{ATTEMPTS}/*/*.json")]:
        if (found := _read(path)) is not None:
            yield found[1]


class RunRecords:
    """A run's records as readers see them: a pack's folder where it has one, else its lane's journal (read once, on
    first need); :meth:`ran` and :meth:`current` follow a pack skipped for memory to its refit packs."""

    def __init__(self, run: RunDir, folded: Folded | None = None) -> None:
        self.run = run
        self._folded = folded
        self._folders: dict[str, bool] = {}  # a folded pack's: whether it had a folder again when first asked
        self._refits: dict[str, list[str]] | None = None  # plan pack -> its refit packs, read once on first need
        self._ran_in: set[str] | None = None  # the packs a folded training's latest record ran in

    @property
    def folded(self) -> Folded:
        if self._folded is None:
            self._folded = read_folded(self.run)
        return self._folded

    def training(self, pack_id: str, training_id: str) -> TrainingRecord | None:
        history = self.folded.trainings.get((pack_id, training_id))
        if not history or self._has_folder(pack_id):  # a folded pack without a folder: no open per training
            rec = read_training(self.run.training_record(pack_id, training_id))  # (a stat each, on Lustre)
            if rec is not None:
                return rec
        return history[-1] if history else None

    def _has_folder(self, pack_id: str) -> bool:
        if pack_id not in self._folders:
            self._folders[pack_id] = self.run.pack_dir(pack_id).is_dir()
        return self._folders[pack_id]

    def completed(self, pack_id: str, training_id: str) -> bool:
        rec = self.training(pack_id, training_id)
        return rec is not None and rec.get("status") == COMPLETED

    def pack(self, pack_id: str) -> PackRecord | None:
        rec = read_pack(self.run.pack_record(pack_id))
        if rec is not None:
            return rec
        history = self.folded.packs.get(pack_id)
        return history[-1] if history else None

    def refits(self, pack_id: str) -> list[str]:
        """The refit packs that ran trainings of plan pack ``pack_id`` (in folders, or folded), in name order."""
        if self._refits is None:
            names = {os.path.basename(d) for d in self.run.pack_dirs()} | set(self.folded.packs) \
                | {home for home, _ in self.folded.trainings}
            self._refits = {}
            for name in sorted(names):
                parent = refit_parent(name)
                if parent is not None:
                    self._refits.setdefault(parent, []).append(name)
        return self._refits.get(pack_id, [])

    def ran(self, pack_id: str, training_id: str) -> bool:
        """The training completed in its plan pack, or in a refit pack of it (its plan pack skipped for memory)."""
        status = (self.training(pack_id, training_id) or {}).get("status")
        # only a training skipped for memory may have run in a refit pack: the others never list the pack folders
        return status == COMPLETED or (status == SKIPPED_MEMORY and any(self.completed(r, training_id)
                                                                        for r in self.refits(pack_id)))

    def current(self, pack_id: str, training_id: str) -> TrainingRecord | None:
        """The training's record that says where it stands: its plan pack's, or its latest refit pack's."""
        rec = self.training(pack_id, training_id)
        if rec is None or rec.get("status") != SKIPPED_MEMORY:  # only a skipped one may have run elsewhere
            return rec
        later = [r for refit in self.refits(pack_id) if (r := self.training(refit, training_id)) is not None]
        return max(later, key=lambda r: float(r.get("started_at") or 0)) if later else rec

    def started(self, pack_id: str) -> bool:
        """The pack's job body began: its folder exists, or it was folded (its record, or a training run in it)."""
        if self._ran_in is None:
            self._ran_in = {str(h[-1].get("pack_id")) for h in self.folded.trainings.values()}
        return self.run.pack_dir(pack_id).is_dir() or pack_id in self.folded.packs or pack_id in self._ran_in


def home_of(rec: Mapping[str, object]) -> str:
    """The pack whose folder holds a training's logs: its home where a streaming lane ran it, else its pack."""
    home = rec.get("home")
    return home if isinstance(home, str) and home else str(rec["pack_id"])


def _kept(rec: Mapping[str, object], stream: str) -> Logs | None:
    """Where a folded record says its log ``stream`` is kept (its ``logs``: a dict, or its JSON text in a frame)."""
    logs = rec.get(LOGS)
    if isinstance(logs, str):
        logs = json.loads(logs)
    kept = logs.get(stream) if isinstance(logs, Mapping) else None
    return {"file": str(kept["file"]), "offset": int(kept["offset"]), "length": int(kept["length"])} \
        if isinstance(kept, Mapping) else None


@dataclass(frozen=True)
class KeptLog:
    """Where a training's log is kept: a file of its own or a stretch of its lane's log."""

    path: Path
    offset: int = 0
    length: int = -1  # -1: to the end of the file

    def read(self) -> str:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return f.read(self.length).decode(errors="replace")

    def __str__(self) -> str:
        return str(self.path) if not self.offset else f"{self.path} (at byte {self.offset})"


def kept_log(run_root: Path | str, rec: Mapping[str, object], stream: str) -> KeptLog | None:
    """A training's log (``stream``: out or err), in its pack's folder or where a fold put it; None: none kept."""
    run = RunDir(Path(str(run_root)))
    for pack_id in dict.fromkeys((home_of(rec), str(rec.get("pack_id") or home_of(rec)))):  # a folding lane writes
        path = run.log(pack_id, str(rec["training_id"]), stream)                         # its own folder
        if path.is_file():
            return KeptLog(path)
    kept = _kept(rec, stream)
    return KeptLog(run.root / kept["file"], kept["offset"], kept["length"]) if kept else None


def log_where(run_root: Path | str, rec: Mapping[str, object], stream: str) -> str:
    """Where a user finds a training's log, for a message: where it is kept, else where its pack would write it."""
    kept = kept_log(run_root, rec, stream)
    return str(kept) if kept else str(RunDir(Path(str(run_root))).log(home_of(rec), str(rec["training_id"]), stream))
