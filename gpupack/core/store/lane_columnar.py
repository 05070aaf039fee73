"""A lane's columnar file (``lanes/<lane>.arrows``): the records its journal holds, as columns, so that collect reads a
lane of thousands of trainings as one file instead of a JSON line a record.

The lane's job writes it at its end (:func:`write_lane_columnar`) from its journal's whole lines, read under the
journal's lock, and says how many of the journal's bytes it covers. A reader (:func:`read_lane_columnar`) parses
what was folded after them from the journal: the journal stays the truth. A file that does not read, of another
schema, or whose journal no longer begins with the bytes it covers (:func:`gpupack.core.store.journal.fingerprint`)
is not used: the whole journal is read instead.

The file: four Arrow IPC streams (the training rows as :func:`gpupack.core.store.columnar.split_rows` makes them,
what each row's journal entry says beside it (:data:`_ENTRY`), the same two for pack records), then JSON: the shared
values, the homes and the bytes covered. Each record is there once, as readers of the journal count it.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence, cast

import numpy as np
import pyarrow as pa

from gpupack.core.store.columnar import (
    JSON_PREFIX,
    STRING,
    ColumnarReader,
    Rows,
    layout_columns,
    record_row,
    split_rows,
    stream_bytes,
    typed_arrays,
)
from gpupack.core.store.journal import (
    PACK,
    TRAINING,
    JournalEntry,
    fingerprint,
    held_journal,
    home_of,
    identity,
    journal_entries,
)
from gpupack.core.store.records import SCHEMA_VERSION, atomic_file
from gpupack.core.store.rundir import RunDir

# What a row's journal entry says beside its record: the second stream's columns.
_ENTRY = pa.schema([pa.field("folded_at", pa.float64()), pa.field("seq", pa.int64()),
                    pa.field("same", pa.int64()), pa.field("later", pa.int64()), pa.field("home", STRING)],
                   metadata={b"gpupack.schema": str(SCHEMA_VERSION).encode()})


@dataclass
class Entry:
    """A journal record as collect orders and counts it: its flat row, fold time, identity and home."""

    kind: str
    row: dict[str, object]
    folded_at: float
    seq: int
    same: int
    home: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.home, str(self.row.get("training_id")))


def entries_of(journal: Sequence[JournalEntry], where: str, warnings: list[str]) -> list[Entry]:
    """A journal's entries as :class:`Entry`; a record this gpupack does not read is left out with a warning."""
    out = []
    for e in journal:
        rec = e["record"]
        kind = PACK if e.get("kind") == PACK else TRAINING
        row = record_row(rec, kind, f"{where}: {rec.get('pack_id')}/{rec.get('training_id', '')}".rstrip("/"),
                         warnings)
        if row is not None:
            out.append(Entry(kind, row, float(e["folded_at"]), int(e["seq"]), identity(rec),
                             home_of(rec) if kind == TRAINING else str(rec.get("pack_id"))))
    return out


def once(entries: Sequence[Entry], seen: set[int] | None = None) -> list[Entry]:
    """Each record once, the first time it was folded (``seen``: identities already counted, e.g. a folder's)."""
    seen = set() if seen is None else seen
    out = []
    for e in entries:
        if e.same not in seen:
            seen.add(e.same)
            out.append(e)
    return out


def later_counts(entries: Sequence[Entry]) -> list[int]:
    """For each entry (in the order folded), how many later entries are records of the same training (or pack)."""
    after: Counter[tuple[str, str]] = Counter()
    out = [0] * len(entries)
    for i in range(len(entries) - 1, -1, -1):
        key = entries[i].key
        out[i] = after[key]
        after[key] += 1
    return out


# ---------------- writing (the lane's job, at its end) ----------------

def write_lane_columnar(run: RunDir, lane: str) -> bool:
    """Write ``lane``'s columnar file from its journal, atomically; False (and no file: a stale one is removed) where
    the journal holds nothing or a record this gpupack does not read (collect then warns of it from the journal)."""
    path = run.lane_columnar(lane)
    if not run.journal(lane).is_file():
        return False
    journal, covers, seal = held_journal(run, lane)
    warnings: list[str] = []
    entries = once(entries_of(journal, str(run.journal(lane)), warnings))
    if warnings or not entries:
        path.unlink(missing_ok=True)
        return False
    trainings = [e for e in entries if e.kind == TRAINING]
    packs = [e for e in entries if e.kind == PACK]
    training_rows, pack_rows = split_rows([e.row for e in trainings]), split_rows([e.row for e in packs])
    tail = {"rows": training_rows.rows, "shared": training_rows.shared, "pack_rows": pack_rows.rows,
            "pack_shared": pack_rows.shared, "covers": covers, "seal": seal,
            "homes": sorted({e.home for e in trainings})}
    with atomic_file(path, binary=True) as f:
        f.write(b"".join([stream_bytes(training_rows.batch), stream_bytes(_beside(trainings)),
                          stream_bytes(pack_rows.batch), stream_bytes(_beside(packs)), json.dumps(tail).encode()]))
    return True


def _beside(entries: Sequence[Entry]) -> pa.RecordBatch:
    values: tuple[Sequence[object], ...] = ([e.folded_at for e in entries], [e.seq for e in entries],
                                            [e.same for e in entries], later_counts(entries), [e.home for e in entries])
    arrays = typed_arrays({f.name: (f.type, v) for f, v in zip(_ENTRY, values)}, len(entries))
    return pa.RecordBatch.from_arrays(arrays, schema=_ENTRY)


# ---------------- reading (collect) ----------------

@dataclass
class Part:
    """Rows of one kind a lane's file holds (``rows``: None where none), and beside each what its journal entry said."""

    kind: str
    rows: Rows | None
    beside: pa.RecordBatch

    def entries(self, mask: np.ndarray | None = None) -> list[Entry]:
        """The rows where ``mask`` is True (None: all), as :class:`Entry` (the rows a reader weighs one by one)."""
        if self.rows is None or (mask is not None and not mask.any()):
            return []
        picked = pa.array(mask if mask is not None else np.ones(self.rows.rows, dtype=bool))
        shared = dict(zip(layout_columns(self.rows.layout)[1], self.rows.shared))
        beside = self.beside.filter(picked).to_pydict()
        batch = self.rows.batch
        varying = batch.filter(picked).to_pylist() if batch.num_columns else [{}] * len(beside["seq"])
        return [Entry(self.kind, _decoded({**shared, **row}), beside["folded_at"][i], beside["seq"][i],
                      beside["same"][i], beside["home"][i]) for i, row in enumerate(varying)]

    def column(self, name: str) -> pa.Array:
        """The rows' column ``name``, or what their entries say (``home``...); a shared one repeated, else all null."""
        if name in self.beside.schema.names:
            return self.beside.column(name)
        rows = self.rows
        if rows is None:
            return pa.nulls(0)
        if name in rows.batch.schema.names:
            return rows.batch.column(name)
        shared = dict(zip(layout_columns(rows.layout)[1], rows.shared))
        return pa.array([shared.get(name)] * rows.rows)

    def without(self, mask: np.ndarray) -> Rows | None:
        """The rows where ``mask`` is False (no copy where it is False everywhere)."""
        if self.rows is None or mask.all():
            return None
        if not mask.any():
            return self.rows
        keep, batch = ~mask, self.rows.batch
        return Rows(batch.filter(pa.array(keep)) if batch.num_columns else batch, int(keep.sum()), self.rows.shared)


@dataclass
class LaneColumns:
    """A lane's columnar file as read: its training and pack rows, their homes and the journal bytes it covers."""

    trainings: Part
    packs: Part
    homes: set[str] = field(default_factory=set)
    covers: int = 0


def _decoded(row: dict[str, object]) -> dict[str, object]:
    """A row of a columnar batch as :func:`gpupack.core.store.columnar.record_row` gives it: JSON text decoded."""
    for name in [n for n in row if n.startswith(JSON_PREFIX)]:
        text = cast("str | None", row.pop(name))  # a column of JSON text (columnar.json_array)
        row[name[len(JSON_PREFIX):]] = None if text is None else json.loads(text)
    return row


def read_lane_columnar(run: RunDir, lane: str, reader: ColumnarReader) -> LaneColumns | None:
    """``lane``'s columnar file where it reads and is current; else None: its journal is read instead."""
    try:
        with pa.memory_map(str(run.lane_columnar(lane))) as f:  # its columns read where they lie, no copy
            data = f.read_buffer()
        end, batches = 0, []
        for _ in range(4):  # trainings, beside them, packs, beside them
            batch, end = reader.batch(data, end)
            if batch is None:
                return None
            batches.append(batch)
        tail = json.loads(data.slice(end).to_pybytes())
        counts = (int(tail["rows"]), int(tail["pack_rows"]))
        if (batches[1].num_rows, batches[3].num_rows) != counts or not _sealed(run, lane, int(tail["covers"]),
                                                                               str(tail["seal"])):
            return None
        trainings = Rows(batches[0], counts[0], list(tail["shared"])) if counts[0] else None
        packs = Rows(batches[2], counts[1], list(tail["pack_shared"])) if counts[1] else None
        return LaneColumns(Part(TRAINING, trainings, batches[1]), Part(PACK, packs, batches[3]), set(tail["homes"]),
                           int(tail["covers"]))
    except (OSError, ValueError, KeyError, TypeError, EOFError, pa.ArrowException):
        return None


def _sealed(run: RunDir, lane: str, covers: int, seal: str) -> bool:
    """The journal still begins with the bytes the file covers (its lines were only appended to since)."""
    journal = run.journal(lane)
    if journal.stat().st_size < covers:  # replaced by a shorter one
        return False
    expected = fingerprint(journal, covers)
    return expected == seal or (seal.rpartition("@")[0] == expected)  # appended to since: its time moved on


def tail_entries(run: RunDir, lane: str, covers: int, warnings: list[str]) -> list[Entry]:
    """What ``lane``'s journal holds past ``covers`` bytes (all of it from 0), as :class:`Entry`."""
    journal, _ = journal_entries(run.journal(lane), covers)
    return entries_of(journal, str(run.journal(lane)), warnings)
