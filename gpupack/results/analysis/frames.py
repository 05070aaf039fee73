"""Frame assembly: the rows of many packs (:class:`gpupack.core.store.columnar.Rows`, one piece a pack) as one frame,
joined in Arrow layout by layout and converted to pandas once: a million trainings load in a second
(benchmarks/collect_scale.py). The columns no table reads (:data:`DETACHED`) stay in Arrow beside the frame."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from gpupack.core.plan import RENAMED
from gpupack.core.store.columnar import JSON_PREFIX, STRING, Rows, column, json_array, layout_columns, same

# Arrow's allocator for a frame of a million rows: jemalloc where the wheel has it, else the system's. Arrow's default
# here, mimalloc, gives the gigabyte a load joins back to the system and takes it anew, page by page: a million
# trainings collected in 7 s instead of 5 (benchmarks/collect_scale.py --cli, BENCHMARKS.md).
try:
    POOL = pa.jemalloc_memory_pool()
except (NotImplementedError, pa.ArrowException):
    POOL = pa.system_memory_pool()

# Kept as JSON text after load, decoded where read: a million curves or hyperparameter sets take seconds to decode one
# by one, and the tables parse theirs in bulk (tables.json_columns).
TEXT_COLUMNS = ("curve", "params", "knobs", "cpus", "metrics", "logs", "training_ids", "sampler_peak_rss_by_training")
# Kept beside the frame, in Arrow (Records.with_detached joins them to the rows that need them): the throughput curve
# (a third of a run's bytes) and where the logs are, which no table reads. Left in the chunks they were read in they
# cost nothing until read; in the frame, every filter would copy them.
DETACHED = ("curve", "logs")
TRAINING_ID = "training_id"  # kept beside them too, as read (no copy): what tells a row's values are its own


@dataclass
class RowsByPack:
    """Rows as read, one piece per pack (or per run's earlier attempts), in path order."""

    rows: list[Rows] = field(default_factory=list)
    run_dirs: list[str] = field(default_factory=list)
    attempts: list[Sequence[int] | int] = field(default_factory=list)  # one for the piece, or one a row

    def add(self, rows: Rows, run_dir: str, attempts: Sequence[int] | int) -> None:
        if rows.rows:
            self.rows.append(rows)
            self.run_dirs.append(run_dir)
            self.attempts.append(attempts)

    def frame(self, detached: Sequence[str] = ()) -> tuple[pd.DataFrame, pa.Table]:
        """The rows as one frame (its index: each row's position), and the columns ``detached`` apart."""
        if not self.rows:
            return pd.DataFrame(), pa.table({})
        runs, where = np.unique(np.array(self.run_dirs, dtype=object), return_inverse=True)
        lengths = [r.rows for r in self.rows]
        run_dir = pa.DictionaryArray.from_arrays(np.repeat(where.astype(np.int32), lengths), list(runs))
        attempt = np.repeat(np.array([a if isinstance(a, int) else 0 for a in self.attempts], np.int64), lengths)
        for start, each in zip(np.cumsum([0, *lengths[:-1]]), self.attempts):
            if not isinstance(each, int):  # earlier attempts: one a row
                attempt[start:start + len(each)] = each
        # Every column in Arrow, then one conversion: pandas gets its columns of one type as one block (a column
        # added after would make it join them at its first filter: a copy of every number column, half a second).
        table = renamed(assemble(self.rows))
        table = table.append_column("run_dir", run_dir.cast(STRING)).append_column("attempt", pa.array(attempt))
        texts = {c: name for c in table.column_names if c.startswith(JSON_PREFIX)
                 and (name := c.removeprefix(JSON_PREFIX)) in TEXT_COLUMNS and name not in table.column_names}
        table = table.rename_columns([texts.get(c, c) for c in table.column_names])  # kept as text (TEXT_COLUMNS)
        table, apart = _detach(table, detached)
        return decode_json(one_chunk(table).to_pandas(memory_pool=POOL)), apart


def renamed(table: pa.Table) -> pa.Table:
    """``table`` with columns an earlier gpupack named otherwise (plan.RENAMED) under their names now."""
    for old, new in RENAMED.items():
        if old not in table.column_names:
            continue
        was = table.column(old)
        now = pc.coalesce(table.column(new), was.cast(table.column(new).type)) if new in table.column_names else was
        table = table.drop_columns([c for c in (old, new) if c in table.column_names]).append_column(new, now)
    return table


def one_chunk(table: pa.Table) -> pa.Table:
    """``table`` with each text column in one chunk (pandas keeps text in Arrow, whose take joins a chunked column's
    chunks first: every filter would), joined column by column, faster than Table.combine_chunks. Number columns
    (Arrow's primitive types) are left as they are: pandas copies them into its blocks whatever their chunks."""
    return pa.table([c if c.num_chunks == 1 or pa.types.is_primitive(c.type) else c.combine_chunks(memory_pool=POOL)
                     for c in table.columns], schema=table.schema)


def _detach(table: pa.Table, names: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """(``table`` without the columns ``names``, those columns as text, chunked as they are). A column whose packs
    held it as JSON text in some and as a scalar in others (two columns, ``json:<name>`` and ``<name>``) is one text
    column: the JSON where there is, else the scalar as JSON."""
    apart: dict[str, pa.ChunkedArray] = {}
    if names and TRAINING_ID in table.column_names:
        apart[TRAINING_ID] = table.column(TRAINING_ID)
    for name in names:
        found = [c for c in (JSON_PREFIX + name, name) if c in table.column_names]
        if not found:
            continue
        columns = [table.column(c) for c in found]
        columns = [c if c.type == STRING else c.cast(STRING) for c in columns]
        apart[name] = columns[0] if len(columns) == 1 else pc.coalesce(*columns)
        table = table.drop_columns(found)
    return table, pa.table(apart) if len(apart) > (TRAINING_ID in apart) else pa.table({})


def take_rows(column: pa.ChunkedArray, positions: np.ndarray) -> pa.ChunkedArray:
    """The values of ``column`` at ``positions``, chunk by chunk: Arrow's take on a chunked column joins every chunk
    first (the curves of a million trainings, to read the few a plot draws)."""
    if len(positions) == len(column) and np.array_equal(positions, np.arange(len(column))):
        return column
    order = np.argsort(positions, kind="stable")
    ordered = np.asarray(positions)[order]
    bounds = np.cumsum([0, *(len(c) for c in column.chunks)])
    which = np.searchsorted(bounds, ordered, side="right") - 1
    cuts = np.flatnonzero(np.diff(which)) + 1
    pieces = [column.chunk(int(which[run[0]])).take(pa.array(ordered[run] - bounds[which[run[0]]]))
              for run in np.split(np.arange(len(ordered)), cuts) if len(run)]
    taken = pa.chunked_array(pieces, column.type)
    return taken.take(pa.array(np.argsort(order)))  # back in the order asked (a few values: one small join)


def assemble(pieces: list[Rows]) -> pa.Table:
    """One table of every piece's rows, in order: the pieces of each layout joined at once (their varying columns
    concatenated, each shared column made from one value per piece), then the layouts, conformed to one schema."""
    layouts: list[pa.Schema] = []  # each distinct layout, once
    layout_of = np.empty(len(pieces), dtype=np.int64)
    last = -1
    for i, piece in enumerate(pieces):
        schema = piece.layout
        if last < 0 or not schema.equals(layouts[last], check_metadata=True):  # mostly the one before's: one test
            last = next((k for k, known in enumerate(layouts) if known.equals(schema, check_metadata=True)),
                        len(layouts))
            if last == len(layouts):
                layouts.append(schema)
        layout_of[i] = last
    tables = [_layout_table(layout, [p for p, k in zip(pieces, layout_of) if k == i])
              for i, layout in enumerate(layouts)]
    if len(tables) > 1:
        return _in_order(_conformed(tables), layout_of, np.array([p.rows for p in pieces]))
    return tables[0]


def _layout_table(layout: pa.Schema, pieces: list[Rows]) -> pa.Table:
    """The rows of pieces of one layout: varying columns a chunk a piece, shared ones repeated."""
    names, shared = layout_columns(layout)
    plain = layout.remove_metadata()
    varying = pa.Table.from_batches([p.batch for p in pieces], plain)
    # Chunked as read (a lane's memory-mapped file): joined once, at the end, for the columns the frame holds
    columns = dict(zip(plain.names, varying.columns))
    owner = np.repeat(np.arange(len(pieces)), [p.rows for p in pieces])
    for name, values in zip(shared, zip(*(p.shared for p in pieces))):  # one tuple of values a shared column
        column_name, array = column(name, list(values))
        # one value in every piece (the sweep, the host...): repeated, no index to follow
        columns[column_name] = (pa.repeat(array[0], len(owner)) if same(values)
                                else pc.take(array, pa.array(owner), memory_pool=POOL))
    ordered = [c for name in names for c in (name, JSON_PREFIX + name) if c in columns]
    return pa.table([columns[c] for c in ordered], names=ordered)


def _in_order(tables: list[pa.Table], layout_of: np.ndarray, lengths: np.ndarray) -> pa.Table:
    """The rows of the layouts' tables back in the order of the pieces: each run of pieces of one layout is one slice
    of its table, a chunk of the result (runs are long: the packs of a run mostly share one layout)."""
    starts = np.concatenate([[0], np.flatnonzero(np.diff(layout_of)) + 1])
    offsets = [0] * len(tables)
    slices = []
    for start, n in zip(starts, np.add.reduceat(lengths, starts)):
        k = layout_of[start]
        slices.append(tables[k].slice(offsets[k], n))
        offsets[k] += n
    return pa.concat_tables(slices)


def _conformed(tables: list[pa.Table]) -> list[pa.Table]:
    """Tables of different layouts under one schema: int and float of different packs widen to float, as pandas
    does with mixed rows; a missing column is null; a column typed one way in one table and another way in another
    is JSON text in both (what mixed types are in one pack)."""
    try:
        schema = pa.unify_schemas([t.schema for t in tables], promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        tables = _as_json(tables)
        schema = pa.unify_schemas([t.schema for t in tables], promote_options="permissive")
    return [pa.table([_cast(t.column(f.name), f.type) if f.name in t.column_names else pa.nulls(t.num_rows, f.type)
                      for f in schema], schema=schema) for t in tables]


def _cast(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    return column if column.type == kind else column.cast(kind)


def _as_json(tables: list[pa.Table]) -> list[pa.Table]:
    """Every column whose types conflict across tables, as JSON text in each."""
    types: dict[str, set[pa.DataType]] = {}
    for t in tables:
        for f in t.schema:
            if not pa.types.is_null(f.type):
                types.setdefault(f.name, set()).add(f.type)
    numeric = {pa.int64(), pa.float64()}
    conflicting = {name for name, ts in types.items() if len(ts) > 1 and not ts <= numeric}
    return [pa.table({JSON_PREFIX + n if n in conflicting else n:
                      json_array(t.column(n).to_pylist()) if n in conflicting else t.column(n)
                      for n in t.column_names}) for t in tables]


def _decode(text: pd.Series) -> np.ndarray:
    """JSON text → Python values, each distinct text decoded once (such values repeat: a field of one setting)."""
    codes, uniques = pd.factorize(text)
    values = np.empty(len(uniques) + 1, dtype=object)  # the last slot: None, for missing text (code -1)
    for i, u in enumerate(uniques):
        values[i] = json.loads(u)
    return np.asarray(values[codes])


def decode_json(frame: pd.DataFrame) -> pd.DataFrame:
    """``json:<name>`` columns back to ``<name>`` (decoded, but :data:`TEXT_COLUMNS`), merged."""
    for col in [c for c in frame.columns if c.startswith(JSON_PREFIX)]:
        name = col[len(JSON_PREFIX):]
        text = frame.pop(col)
        values = text.to_numpy(dtype=object, na_value=None) if name in TEXT_COLUMNS else _decode(text)
        if name in frame:
            values = np.where(text.isna().to_numpy(), frame[name].to_numpy(dtype=object, na_value=None), values)
        frame[name] = values
    return frame
