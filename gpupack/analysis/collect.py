"""Collect: records → time per training per (workload, partition, GPU type, mode, N) → the best N → cost.

Records in, frames out: this module reads records (never job objects), so it works on a run in progress, on a run
copied off a cluster and on several runs at once, and it prints nothing. :mod:`gpupack.report` renders and writes
what it computes; the CLI (``python -m gpupack collect RUN_DIR ...``, or ``-m gpupack.collect``) and
:mod:`gpupack.sweep` own the arguments, the writing and the printing.

Each pack's job also writes its trainings' flat rows into one columnar file (``packs/<id>/trainings.arrows``, see
:func:`write_columnar`), so a run is read one file per pack rather than one JSON file per training; a pack without
one, or whose file is older than its records (a resumed pack), is read from its JSON records, with the same result.
Aggregation is pure pandas on flat columns (benchmarks/collect_scale.py: 1,000,000 trainings from disk).
"""
from __future__ import annotations

import gc
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.json as pa_json
from omegaconf import OmegaConf

from gpupack.analysis.choose import choose, tie_label
from gpupack.core.records import COMPLETED, OOM, SCHEMA_VERSION, atomic_file, read_json
from gpupack.core.rundir import RunDir

GROUP = ["workload", "partition", "gpu_type", "mode"]
# Nested record fields the tables need, flattened to columns at load: column → (field, key).
FLAT = {
    "startup_s": ("timings", "startup_s"), "loop_s": ("timings", "loop_s"),
    "timing_split": ("timings", "split"),  # False: a program that never marked its first step (command workload)
    "samples": ("throughput", "samples"), "samples_per_s": ("throughput", "samples_per_s"),
    "curve": ("throughput", "curve"),
    "val_accuracy": ("metrics", "val_accuracy"), "train_loss": ("metrics", "train_loss"),
    "peak_rss_mb": ("memory", "peak_rss_mb"), "peak_gpu_mem_mb": ("memory", "peak_gpu_mem_mb"),
    # one training spread over k devices: what its strategy measured (gpupack/spread/)
    "allreduce_bytes_per_step": ("spread", "allreduce_bytes_per_step"),
    "allreduce_s_per_step": ("spread", "allreduce_s_per_step"), "replicas": ("spread", "replicas"),
}
NESTED = {"timings", "throughput", "metrics", "memory", "spread"}
# Pack record: the sampler's summary, flattened (its raw samples stay in pack.json).
PACK_FLAT = ("source", "note", "gpu_util_mean", "gpu_util_max", "gpu_mem_used_peak_mb", "gpu_mem_total_mb",
             "cpu_percent_mean", "overhead_cpu_s", "overhead_fraction")
CLEARED_OOM = "cleared_oom.json"  # RUN_DIR/cleared_oom.json: OOMs the user cleared (python -m gpupack clear-oom)
LOADER_BOUND_FRACTION = 0.9  # training throughput at >= 90 % of the loader's own: loader-bound, not GPU-bound
SEED_NAMES = ("seed",)  # hyperparameters that repeat a grid point rather than make a new one

# packs/<id>/trainings.arrows: an Arrow IPC stream of one batch, the columns that vary between the pack's trainings
# (pyarrow.ipc.open_stream reads it), then JSON: the pack record's flat row, the number of trainings, and the value of
# each column every training of the pack shares (its sweep, partition, device...: one value, not N). Written by the
# pack's job (write_columnar); read by load_records.
COLUMNAR = "trainings.arrows"
JSON_PREFIX = "json:"  # a column of lists, dicts or mixed types: JSON text under this prefix in the columnar file
# Kept as JSON text after load, decoded where read: a million curves or hyperparameter sets take seconds to decode one
# by one; one plot draws curves, and best_hyperparameters and knob_table parse theirs in bulk (json_columns).
TEXT_COLUMNS = ("curve", "params", "knobs", "cpus")
_META_SCHEMA = b"gpupack.schema"
_META_COLUMNS = b"gpupack.columns"  # every column of the rows, in order
_META_SHARED = b"gpupack.shared"  # the columns all rows share one value of: in the JSON after the stream
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the end of an Arrow IPC stream
# The Arrow type of each field of gpupack's training records, whatever the values of one pack (a pack without an
# error has a null one): packs then share one layout, parsed once and joined without promotion.
# Text is large_string: what pandas' str columns hold, so a million rows convert without a cast.
_S, _F, _I, _B = pa.large_string(), pa.float64(), pa.int64(), pa.bool_()
KNOWN_TYPES: dict[str, pa.DataType] = {
    **{k: _S for k in ("kind", "sweep", "pack_id", "training_id", "workload", "mode", "partition", "gpu_type",
                       "device", "device_name", "gpu_model", "status", "error", "loader_setting", "data", "host",
                       "start", "phase", "strategy")},
    **{k: _I for k in ("schema", "grid_index", "reseed", "factor", "concurrent", "threads", "exit_code", "signal",
                       "samples", "devices", "replicas")},
    **{k: _F for k in ("started_at", "ended_at", "wall_s", "startup_s", "loop_s", "samples_per_s", "val_accuracy",
                       "train_loss", "peak_rss_mb", "peak_gpu_mem_mb", "memory_limit_mb", "allreduce_bytes_per_step",
                       "allreduce_s_per_step")},
    **{k: _B for k in ("probe", "timing_split", "timed_out")},
}
# A local test SLURM cluster (scripts/local_slurm.sh with conf/cluster/slurm.yaml): its partitions are one host.
LOCAL_TEST_CLUSTER = ("slurm", frozenset({"p100", "v100", "a100"}))


@dataclass
class Records:
    """Every record read, flat. ``trainings``: a row per training record, the latest (``attempt`` 0) and each earlier
    attempt's; nested fields lifted to columns (:data:`FLAT`); lists and dicts as Python values, but those of
    :data:`TEXT_COLUMNS`, kept as their JSON text. ``packs``: a row per pack record, the sampler's summary lifted."""

    trainings: pd.DataFrame
    packs: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # planned packs with no pack record yet
    # Trainings in each sweep's grid: one entry per run, or per Hydra multirun (its launches, launch_*, add up).
    grid_sizes: dict[str, int] = field(default_factory=dict)
    rgu: dict[str, float] = field(default_factory=dict)  # the RGU table the first run was configured with
    cleared: list[dict[str, Any]] = field(default_factory=list)  # OOMs a user cleared, per run directory
    runs: list[str] = field(default_factory=list)  # the run directories read
    planned: int = 0  # packs in the runs' plans
    clusters: dict[str, tuple[str, str, frozenset[str]]] = field(default_factory=dict)  # run → name, backend, parts

    def latest(self) -> pd.DataFrame:
        """Each training's latest record (earlier attempts, kept under attempts/, left out)."""
        t = self.trainings
        return t[t["attempt"] == 0] if not t.empty and "attempt" in t else t


def flatten(rec: dict[str, Any]) -> dict[str, Any]:
    """A training record as one flat row: nested fields the tables use lifted to columns."""
    row = {k: v for k, v in rec.items() if k not in NESTED}
    for col, (outer, inner) in FLAT.items():
        row[col] = (rec.get(outer) or {}).get(inner)
    return row


def flatten_pack(rec: dict[str, Any]) -> dict[str, Any]:
    row = {k: v for k, v in rec.items() if k != "sampler"}
    sampled = rec.get("sampler") or {}
    for key in PACK_FLAT:
        row[f"sampler_{key}"] = sampled.get(key)
    # The sampler's peak RSS of each training's process: what a program that reports nothing itself is known by.
    row["sampler_peak_rss_by_training"] = {tid: t.get("peak_rss_mb") for tid, t in
                                           (sampled.get("per_training") or {}).items()}
    return row


def _read_all(paths: Iterable[Path], kind: str, warnings: list[str]) -> list[dict[str, Any]]:
    """Flat rows of the records of one kind at ``paths``; what cannot be read is skipped with a warning."""
    rows = []
    for path in paths:
        try:
            rec = read_json(path)
        except (OSError, ValueError) as err:
            warnings.append(f"skipped {path}: unreadable or torn ({err.__class__.__name__})")
            continue
        if rec.get("kind") != kind:
            warnings.append(f"skipped {path}: not a {kind} record")
        elif rec.get("schema") != SCHEMA_VERSION:
            warnings.append(f"skipped {path}: record schema {rec.get('schema')!r}, this gpupack reads schema "
                            f"{SCHEMA_VERSION} (collect it with the gpupack version that wrote it)")
        else:
            rows.append(flatten(rec) if kind == "training" else flatten_pack(rec))
    return rows


# ---------------- the columnar file of a pack ----------------

def _arrow_type(values: Sequence[Any]) -> pa.DataType | None:
    """The Arrow type that holds ``values`` as they are; None for lists, dicts or mixed types (kept as JSON)."""
    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return pa.null()
    if kinds == {bool}:
        return pa.bool_()
    if kinds == {int}:
        return pa.int64()
    if kinds <= {int, float}:
        return pa.float64()
    if kinds == {str}:
        return _S
    return None


def _json_array(values: Sequence[Any]) -> pa.Array:
    return pa.array([None if v is None else json.dumps(v) for v in values], _S)


def _column(name: str, values: list[Any]) -> tuple[str, pa.Array]:
    """One column: the field's known type where the values fit it as they are (never a float cut to an int, a bool
    made a number), else their own type, else JSON text."""
    kind, known = _arrow_type(values), KNOWN_TYPES.get(name)
    if known is not None and (kind in (known, pa.null()) or (known == _F and kind == _I)):
        kind = known
    if kind is not None:
        try:
            return name, pa.array(values, kind)
        except (pa.ArrowException, OverflowError):  # an int beyond 64 bits: JSON keeps it whole
            pass
    return JSON_PREFIX + name, _json_array(values)


def _same(values: Sequence[Any]) -> bool:
    """Every value equal, and of one type (1, 1.0 and True are == in Python, not in a column)."""
    first = values[0]
    return all(type(v) is type(first) and v == first for v in values[1:])


@dataclass
class Rows:
    """Flat rows as columns: ``batch`` holds the columns that vary between rows (typed, lists and dicts as JSON text
    under ``json:<name>``), ``shared`` the one value of each column all rows share. Its schema's metadata names
    every column in order and which are shared: what the rows' layout is, the same for every pack alike."""

    batch: pa.RecordBatch
    rows: int
    shared: list[Any]

    @property
    def layout(self) -> pa.Schema:
        return self.batch.schema


def split_rows(rows: Sequence[Mapping[str, Any]]) -> Rows:
    """The one way rows become columns, whether they come from a pack's columnar file or from its JSON records, so
    both give the same frame."""
    names = list(dict.fromkeys(key for row in rows for key in row))
    values = {name: [row.get(name) for row in rows] for name in names}
    shared = [name for name in names if rows and _same(values[name])]
    varying = dict(_column(name, values[name]) for name in names if name not in shared)
    meta = {_META_SCHEMA: str(SCHEMA_VERSION), _META_COLUMNS: json.dumps(names), _META_SHARED: json.dumps(shared)}
    schema = pa.schema([pa.field(name, array.type) for name, array in varying.items()], metadata=meta)
    batch = pa.RecordBatch.from_arrays(list(varying.values()), schema=schema)
    return Rows(batch, len(rows), [values[name][0] for name in shared])


def _pack_rows(pack_dir: Path, warnings: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, pack rows) of one pack from its JSON records, in path order."""
    trainings = _read_all(sorted((pack_dir / "trainings").glob("*.json")), "training", warnings)
    pack_json = pack_dir / "pack.json"
    return trainings, _read_all([pack_json] if pack_json.exists() else [], "pack", warnings)


def write_columnar(run: RunDir, pack_id: str) -> Path | None:
    """Write the pack's training rows and its pack record's row into ``packs/<id>/trainings.arrows``, atomically.

    The job body calls it once the pack record is written. Written only when every record of the pack reads
    cleanly, so collect's warnings about a bad record come from the JSON, as without the file. Returns the path, or
    None when nothing was written."""
    pack_dir = run.pack_dir(pack_id)
    warnings: list[str] = []
    trainings, packs = _pack_rows(pack_dir, warnings)
    if warnings or len(packs) != 1:
        return None
    return write_rows(pack_dir / COLUMNAR, trainings, packs[0])


def write_rows(path: Path, trainings: Sequence[Mapping[str, Any]], pack_row: Mapping[str, Any]) -> Path:
    """Flat training rows and their pack's flat row as one columnar file at ``path``, atomically."""
    with atomic_file(path, binary=True) as f:
        f.write(columnar_bytes(trainings, pack_row))
    return path


def columnar_bytes(trainings: Sequence[Mapping[str, Any]], pack_row: Mapping[str, Any]) -> bytes:
    """What a columnar file holds: the varying columns of the training rows as an Arrow IPC stream of one batch, then
    JSON: the pack row (one row: its JSON reads faster than a batch of its own), the rows, the shared values."""
    rows = split_rows(trainings)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, rows.layout) as writer:
        writer.write_batch(rows.batch)
    tail = {"pack": pack_row, "rows": rows.rows, "shared": rows.shared}
    return sink.getvalue().to_pybytes() + json.dumps(tail).encode()


def _changed_after(path: str, stamp_ns: int) -> bool:
    try:
        return os.stat(path).st_mtime_ns > stamp_ns
    except FileNotFoundError:
        return True


class ColumnarReader:
    """Reads packs' columnar files, parsing each distinct layout once (the packs of a run share a few)."""

    def __init__(self) -> None:
        self.layouts: dict[bytes, pa.Schema | None] = {}

    def read(self, pack_dir: str) -> tuple[Rows, dict[str, Any]] | None:
        """(training rows, pack row) of a pack; None where it has no columnar file, where its records changed after
        the file was written (a resumed pack: its trainings/ folder or pack.json is newer, or pack.json was moved
        aside), or where the file is unreadable or of another schema — its JSON records say the same, and are read
        instead."""
        path = f"{pack_dir}/{COLUMNAR}"
        try:
            stamp = os.stat(path).st_mtime_ns
            if _changed_after(f"{pack_dir}/trainings", stamp) or _changed_after(f"{pack_dir}/pack.json", stamp):
                return None
            with open(path, "rb", buffering=0) as f:
                data = f.read()
            source = pa.BufferReader(data)
            message = ipc.read_message(source)
            layout = self._layout(data[:source.tell()], message)
            if layout is None:
                return None
            batch = ipc.read_record_batch(ipc.read_message(source), layout)
            end = source.tell()
            if data[end:end + len(_EOS)] != _EOS:  # one batch, as columnar_bytes writes it
                return None
            tail = json.loads(data[end + len(_EOS):])
            return Rows(batch, int(tail["rows"]), list(tail["shared"])), tail["pack"]
        except (OSError, ValueError, KeyError, TypeError, EOFError, pa.ArrowException):
            return None

    def _layout(self, key: bytes, message: ipc.Message) -> pa.Schema | None:
        if key not in self.layouts:
            schema = ipc.read_schema(message)
            fits = (schema.metadata or {}).get(_META_SCHEMA) == str(SCHEMA_VERSION).encode()
            self.layouts[key] = schema if fits else None
        return self.layouts[key]


# ---------------- loading ----------------

@dataclass
class _Pieces:
    """Rows as read, one piece per pack (or per run's earlier attempts), in path order."""

    rows: list[Rows] = field(default_factory=list)
    run_dirs: list[str] = field(default_factory=list)
    attempts: list[Sequence[int] | int] = field(default_factory=list)  # one for the piece, or one a row

    def add(self, rows: Rows, run_dir: str, attempts: Sequence[int] | int) -> None:
        if rows.rows:
            self.rows.append(rows)
            self.run_dirs.append(run_dir)
            self.attempts.append(attempts)

    def frame(self) -> pd.DataFrame:
        if not self.rows:
            return pd.DataFrame()
        runs, where = np.unique(np.array(self.run_dirs, dtype=object), return_inverse=True)
        lengths = [r.rows for r in self.rows]
        run_dir = pa.DictionaryArray.from_arrays(np.repeat(where.astype(np.int32), lengths), list(runs))
        frame = _decode_json(_assemble(self.rows).to_pandas())
        frame["run_dir"] = run_dir.cast(_S).to_pandas()  # built in Arrow: a million Python strs cost
        attempt = np.repeat(np.array([a if isinstance(a, int) else 0 for a in self.attempts], np.int64), lengths)
        for start, each in zip(np.cumsum([0, *lengths[:-1]]), self.attempts):
            if not isinstance(each, int):  # earlier attempts: one a row
                attempt[start:start + len(each)] = each
        frame["attempt"] = attempt
        return frame


def _assemble(pieces: list[Rows]) -> pa.Table:
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
    """The rows of pieces of one layout, one chunk a column (what pandas filters fast, and slices at no cost): varying
    columns joined, shared ones repeated from one value a piece."""
    meta = layout.metadata or {}
    names, shared = json.loads(meta[_META_COLUMNS]), json.loads(meta[_META_SHARED])
    plain = layout.remove_metadata()
    varying = pa.Table.from_batches([p.batch for p in pieces], plain).combine_chunks()
    columns = dict(zip(plain.names, varying.columns))
    owner = np.repeat(np.arange(len(pieces)), [p.rows for p in pieces])
    for name, values in zip(shared, zip(*(p.shared for p in pieces))):  # one tuple of values a shared column
        column_name, array = _column(name, list(values))
        # one value in every piece (the sweep, the host...): repeated, no index to follow
        columns[column_name] = pa.repeat(array[0], len(owner)) if _same(values) else array.take(owner)
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
    return [_conform(t, schema) for t in tables]


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    n = table.num_rows
    names = set(table.column_names)
    columns = [_cast(table.column(f.name), f.type) if f.name in names else pa.nulls(n, f.type) for f in schema]
    return pa.table(columns, schema=schema)


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
                      _json_array(t.column(n).to_pylist()) if n in conflicting else t.column(n)
                      for n in t.column_names}) for t in tables]


def _decode(text: pd.Series) -> np.ndarray:
    """JSON text → Python values, each distinct text decoded once (such values repeat: a field of one setting)."""
    codes, uniques = pd.factorize(text)
    values = np.empty(len(uniques) + 1, dtype=object)  # the last slot: None, for missing text (code -1)
    for i, u in enumerate(uniques):
        values[i] = json.loads(u)
    return values[codes]


def _decode_json(frame: pd.DataFrame) -> pd.DataFrame:
    """``json:<name>`` columns back to ``<name>`` (decoded, but for :data:`TEXT_COLUMNS`), merged with a plain
    ``<name>`` column of packs where that column held scalars."""
    for col in [c for c in frame.columns if c.startswith(JSON_PREFIX)]:
        name = col[len(JSON_PREFIX):]
        text = frame.pop(col)
        if name in TEXT_COLUMNS and name not in frame:
            frame[name] = text
            continue
        values = text.to_numpy(dtype=object, na_value=None) if name in TEXT_COLUMNS else _decode(text)
        if name in frame:
            values = np.where(text.isna().to_numpy(), frame[name].to_numpy(dtype=object, na_value=None), values)
        frame[name] = values
    return frame


def _pack_dirs(run: RunDir) -> list[str]:
    try:
        with os.scandir(run.root / "packs") as entries:
            return [e.path for e in sorted(entries, key=lambda e: e.name) if e.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _attempt_records(pack_dirs: Sequence[str]) -> list[Path]:
    """packs/*/attempts/*/*.json in path order, as sorted(glob) gives them, at one stat a pack without attempts."""
    out = []
    for pack_dir in pack_dirs:
        try:
            with os.scandir(f"{pack_dir}/attempts") as entries:
                attempts = sorted(e.name for e in entries if e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            continue
        for attempt in attempts:
            out += sorted(Path(pack_dir, "attempts", attempt).glob("*.json"))
    return out


def _attempt_of(path: Path) -> int:
    return int(path.parent.name) if path.parent.name.isdigit() else 0


def _read_attempts(run: RunDir, pack_dirs: Sequence[str], trainings: _Pieces, packs: list[dict[str, Any]],
                   warnings: list[str]) -> None:
    """Earlier attempts' records (packs/<id>/attempts/<k>/), from their JSON: a resumed pack moves them there, and
    they still count (an OOM there makes its N infeasible; a pack whose N trainings all ran together there is still
    a timing)."""
    rows: list[dict[str, Any]] = []
    attempts: list[int] = []
    for path in _attempt_records(pack_dirs):
        attempt = _attempt_of(path) or 1
        if path.name == "pack.json":
            packs += [{**row, "run_dir": str(run.root), "attempt": attempt}
                      for row in _read_all([path], "pack", warnings)]
        else:
            read = _read_all([path], "training", warnings)
            rows += read
            attempts += [attempt] * len(read)
    trainings.add(split_rows(rows), str(run.root), attempts)


def read_cleared(run: RunDir) -> list[dict[str, Any]]:
    """The OOMs a user cleared (``gpupack clear-oom``): entries {partition, mode, factor, cleared_at}, None = any."""
    path = run.root / CLEARED_OOM
    rec = read_json(path) if path.exists() else {}
    return list(rec.get("cleared", []))


def cleared_mask(rows: pd.DataFrame, cleared: Sequence[Mapping[str, Any]]) -> pd.Series:
    """True for each OOM record a user cleared: it matches an entry and ended before the entry was written."""
    out = pd.Series(False, index=rows.index)
    if not cleared or rows.empty:
        return out
    ended = pd.to_numeric(rows.get("ended_at"), errors="coerce").fillna(0)
    for entry in cleared:
        match = (rows["run_dir"] == entry["run_dir"]) & (ended <= float(entry["cleared_at"]))
        for key in ("partition", "mode", "factor"):
            if entry.get(key) is not None:
                match &= rows[key] == entry[key]
        out |= match
    return out


def _read_run(run: RunDir, trainings: _Pieces, packs: list[dict[str, Any]], warnings: list[str],
              reader: ColumnarReader | None) -> set[str]:
    """One run's training rows (into ``trainings``) and pack rows (into ``packs``): the latest records pack by pack,
    from the columnar file where it is current, else from the JSON records; then every earlier attempt's, from
    JSON. Returns the packs with a pack record (pack.json)."""
    root = str(run.root)
    pack_dirs = _pack_dirs(run)
    recorded = set()
    for pack_dir in pack_dirs:
        read = reader.read(pack_dir) if reader is not None else None
        if read is not None:  # current: its pack.json is there
            rows, pack_rows = read[0], [read[1]]
        else:
            training_rows, pack_rows = _pack_rows(Path(pack_dir), warnings)
            rows = split_rows(training_rows)
        if read is not None or os.path.exists(f"{pack_dir}/pack.json"):
            recorded.add(os.path.basename(pack_dir))
        trainings.add(rows, root, 0)
        packs += [{**row, "run_dir": root, "attempt": 0} for row in pack_rows]
    _read_attempts(run, pack_dirs, trainings, packs, warnings)
    return recorded


def _read_plan_and_config(run: RunDir, out: Records, recorded: set[str]) -> None:
    """The run's plan (grid size, packs still without a record: ``recorded`` are those with one), the OOMs cleared,
    and from its config the RGU table and the cluster."""
    out.cleared += [{**entry, "run_dir": str(run.root)} for entry in read_cleared(run)]
    if run.plan.exists():
        plan = read_json(run.plan)
        sweep_key = str(run.root.parent if run.root.name.startswith("launch_") else run.root)
        out.grid_sizes[sweep_key] = out.grid_sizes.get(sweep_key, 0) + int(plan.get("grid_size", 0))
        out.planned += len(plan["packs"])
        out.pending += [f"{run.root}:{p['pack_id']}" for p in plan["packs"] if p["pack_id"] not in recorded]
    if run.config.exists():
        cfg = OmegaConf.load(run.config)
        rgu = cfg.get("rgu")
        if rgu is not None and "models" in rgu and not out.rgu:
            out.rgu = dict(rgu.models)
        cluster = cfg.get("cluster") or {}
        out.clusters[str(run.root)] = (str(cluster.get("name")), str(cluster.get("backend")),
                                       frozenset(cluster.get("partitions") or ()))


def load_records(run_dirs: Sequence[Path], columnar: bool = True) -> Records:
    """Every record of the runs, as flat frames. ``columnar=False`` reads the JSON records only (what the columnar
    files hold is the same: tests compare the two)."""
    out = Records(pd.DataFrame(), pd.DataFrame())
    trainings, packs = _Pieces(), []
    reader = ColumnarReader() if columnar else None
    collecting = gc.isenabled()
    gc.disable()  # a million rows allocate millions of objects, none cyclic: the collector would scan them often
    try:
        for root in run_dirs:
            run = RunDir(Path(root))
            out.runs.append(str(run.root))
            recorded = _read_run(run, trainings, packs, out.warnings, reader)
            _read_plan_and_config(run, out, recorded)
        out.trainings, out.packs = trainings.frame(), pd.DataFrame(packs)
    finally:
        if collecting:
            gc.enable()
    return out


def shared_host(records: Records) -> str | None:
    """The host every pack ran on, where that means the packs shared its cores: packs of different partitions on
    one host, or the local test SLURM cluster (its partitions are one machine). None otherwise."""
    packs = records.packs
    if packs.empty or "host" not in packs:
        return None
    hosts = packs["host"].dropna().unique()
    if len(hosts) != 1:
        return None
    partitions = set(packs["partition"].dropna()) if "partition" in packs else set()
    test_cluster = any((name, parts) == LOCAL_TEST_CLUSTER and backend == "slurm"
                       for name, backend, parts in records.clusters.values())
    return str(hosts[0]) if len(partitions) > 1 or test_cluster else None


def _first(series: pd.Series) -> Any:
    values = series.dropna()
    return values.iloc[0] if len(values) else None


def summarize(trainings: pd.DataFrame, packs: pd.DataFrame, cleared: Sequence[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """One row per (workload, partition, GPU type, mode, N).

    Time per training = pack wall / N, over packs whose N trainings all ran together (in any attempt); median,
    spread and a bootstrap interval over those packs (:mod:`gpupack.analysis.choose`). Every attempt of a training counts:
    ``failed`` counts attempts that did not complete, ``oom`` those that ran out of memory (unless the user cleared
    them), ``unfinished`` the trainings whose latest record is not completed.
    """
    if trainings.empty or packs.empty:
        return pd.DataFrame()
    trainings = _only(trainings, SUMMARY_INPUTS)  # each filter below copies every column it keeps: keep few
    bounds = loader_bounds(trainings)
    trainings, packs = _not_probes(trainings), _not_probes(packs)
    if trainings.empty or packs.empty:
        return pd.DataFrame()
    t = trainings.copy()
    if "attempt" not in t:
        t["attempt"] = 0
    t["ok"] = t["status"] == COMPLETED
    t["oom_cleared"] = (t["status"] == OOM) & cleared_mask(t, cleared)
    t["is_oom"] = (t["status"] == OOM) & ~t["oom_cleared"]
    t["unfinished"] = (t["attempt"] == 0) & ~t["ok"]
    for col in ("startup_s", "loop_s", "samples", "samples_per_s", "val_accuracy", "peak_rss_mb", "peak_gpu_mem_mb"):
        t[col] = pd.to_numeric(t.get(col), errors="coerce")
    t["peak_rss_mb"] = t["peak_rss_mb"].fillna(_sampled_rss(t, packs))
    if "gpu_model" not in t:
        t["gpu_model"] = None
    keys = GROUP + ["factor"]
    timed = timed_packs(t, packs)
    per_pack = timed.groupby(keys).agg(
        packs=("pack_id", "count"),
        time_per_training_s=("time_per_training_s", "median"),
        tpt_min_s=("time_per_training_s", "min"),
        tpt_max_s=("time_per_training_s", "max"),
        pack_samples_per_s=("pack_samples_per_s", "median"),
        gpu_util_mean=("sampler_gpu_util_mean", "mean"),
        cpu_percent_mean=("sampler_cpu_percent_mean", "mean"),
        gpu_mem_peak_mb=("sampler_gpu_mem_used_peak_mb", "max"),
    )
    latest = t[t["attempt"] == 0]
    per_training = t.groupby(keys, dropna=False).agg(
        attempts=("training_id", "count"),
        failed=("ok", lambda s: int((~s).sum())),
        unfinished=("unfinished", "sum"),
        oom=("is_oom", "sum"),
        oom_cleared=("oom_cleared", "sum"),
        peak_rss_mb=("peak_rss_mb", "max"),
    ).join(latest.groupby(keys, dropna=False).agg(
        trainings=("training_id", "count"),
        startup_s=("startup_s", "median"),
        loop_s=("loop_s", "median"),
        samples_per_s=("samples_per_s", "median"),
        gpu_model=("gpu_model", _first),
    ), how="left")
    out = per_pack.join(per_training, how="outer").reset_index()
    for col in ("failed", "unfinished", "oom", "oom_cleared", "attempts", "trainings"):
        out[col] = out[col].fillna(0).astype(int)  # an OOM (counted apart) makes N infeasible on this device
    out["trainings_per_hour"] = 3600.0 / out["time_per_training_s"]
    base = out[out["factor"] == 1].set_index(GROUP)["time_per_training_s"]
    base_of = pd.Series([base.get(tuple(k), math.nan) for k in out[GROUP].itertuples(index=False)], index=out.index)
    out["speedup_vs_n1"] = base_of / out["time_per_training_s"]
    out["loader_bound_samples_per_s"] = [bounds.get(p, math.nan) for p in out["partition"]]
    out["loader_bound"] = out["samples_per_s"] >= LOADER_BOUND_FRACTION * out["loader_bound_samples_per_s"]
    out = out.sort_values(keys).reset_index(drop=True)
    return with_choices(out, timed)


# The training columns summarize reads (what cleared_mask, loader_bounds and timed_packs read included).
SUMMARY_INPUTS = (*GROUP, "factor", "attempt", "status", "probe", "run_dir", "ended_at", "training_id", "pack_id",
                  "gpu_model", "startup_s", "loop_s", "samples", "samples_per_s", "val_accuracy", "peak_rss_mb",
                  "peak_gpu_mem_mb")


def _only(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    return frame[[c for c in columns if c in frame]]


def timed_packs(t: pd.DataFrame, packs: pd.DataFrame) -> pd.DataFrame:
    """The packs that time a training: its N trainings ran together and at least one completed (a pack whose every
    training failed at once says nothing of how long a training takes). One row per pack and attempt."""
    completed = pd.to_numeric(packs.get("n_completed", pd.Series(1, index=packs.index)), errors="coerce").fillna(1)
    timed = packs[packs["complete"].astype(bool) & (completed > 0)].copy()
    if "attempt" not in timed:
        timed["attempt"] = 0
    for col in ("wall_s", "factor", "sampler_gpu_util_mean", "sampler_cpu_percent_mean",
                "sampler_gpu_mem_used_peak_mb"):
        timed[col] = pd.to_numeric(timed.get(col), errors="coerce")
    timed["time_per_training_s"] = timed["wall_s"] / timed["factor"]
    latest = pd.DataFrame({"samples": t["samples"].where(t["attempt"] == 0), "workload": t["workload"]})
    per_pack = latest.groupby(t["pack_id"], sort=False).agg(samples=("samples", "sum"), workload=("workload", "first"))
    pack_samples = per_pack["samples"].replace(0, math.nan)  # none reported: unknown, not 0
    samples = pd.to_numeric(timed["pack_id"].map(pack_samples), errors="coerce").where(timed["attempt"] == 0)
    timed["pack_samples_per_s"] = samples / timed["wall_s"]  # an earlier attempt's samples are not told apart: unknown
    timed["workload"] = timed["pack_id"].map(per_pack["workload"])
    return timed


def _timed_packs_of(trainings: pd.DataFrame, packs: pd.DataFrame) -> pd.DataFrame:
    """The timed packs of records as loaded (probes left out), each with its time per training."""
    t, packs = _not_probes(trainings), _not_probes(packs)
    if t.empty or packs.empty:
        return pd.DataFrame(columns=["time_per_training_s"])
    t = t.assign(samples=pd.to_numeric(t.get("samples"), errors="coerce"),
                 attempt=t["attempt"] if "attempt" in t else 0)
    return timed_packs(t, packs).dropna(subset=["time_per_training_s"])


def pack_times(records: Records) -> dict[str, dict[int, list[float]]]:
    """Per partition and N, the time per training of each timed pack (what :mod:`gpupack.analysis.choose` weighs)."""
    timed = _timed_packs_of(records.trainings, records.packs)
    out: dict[str, dict[int, list[float]]] = {}
    if timed.empty:
        return out
    for (partition, n), values in timed.groupby(["partition", "factor"])["time_per_training_s"]:
        out.setdefault(str(partition), {})[int(n)] = [float(v) for v in values]
    return out


def packing_times(trainings: pd.DataFrame, packs: pd.DataFrame) -> dict[tuple[Any, ...], list[float]]:
    """Each (workload, partition, GPU type, mode, N)'s time per training of every timed pack."""
    timed = _timed_packs_of(trainings, packs)
    if timed.empty:
        return {}
    return {tuple(k): [float(v) for v in values]
            for k, values in timed.groupby(GROUP + ["factor"])["time_per_training_s"]}


def split_phase(frame: pd.DataFrame, phase: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows not of ``phase``, rows of it): a packing.factors=auto run's grid at the best N is shown apart from the
    probe that chose it."""
    if frame.empty or "phase" not in frame:
        return frame, frame.iloc[0:0]
    of = frame["phase"] == phase
    return frame[~of], frame[of]


def with_choices(summary: pd.DataFrame, timed: pd.DataFrame) -> pd.DataFrame:
    """The noise-aware choice per (workload, partition, GPU type, mode) (:func:`gpupack.analysis.choose.choose`), as columns:
    the bootstrap interval of each N's median, whether N is within noise of the lowest, which N is chosen, and the
    group's verdict (ties, rule, provisional, repeats that would settle it)."""
    out = summary.copy()
    for col, default in (("tpt_ci_low_s", math.nan), ("tpt_ci_high_s", math.nan), ("within_noise", False),
                         ("chosen", False), ("infeasible", False), ("ties", None), ("tie_rule", None),
                         ("provisional", None), ("repeats_needed", None), ("choice_method", None)):
        out[col] = default
    out["infeasible"] = (out["oom"] > 0)
    times = timed.dropna(subset=["time_per_training_s"]).groupby(GROUP + ["factor"])["time_per_training_s"].apply(list)
    for key, idx in out.groupby(GROUP, dropna=False).groups.items():
        group = out.loc[idx]
        blocked = set(group.loc[(group["oom"] > 0) | (group["unfinished"] > 0), "factor"].astype(int))
        by_n = {int(n): times.get((*key, n), []) for n in group["factor"]}
        by_n = {n: v for n, v in by_n.items() if v}
        choice = choose(by_n, infeasible=blocked)
        for i, r in group.iterrows():
            interval = choice.intervals.get(int(r["factor"]))
            if interval is not None:
                out.loc[i, ["tpt_ci_low_s", "tpt_ci_high_s"]] = [interval.low, interval.high]
            out.loc[i, "within_noise"] = int(r["factor"]) in choice.ties
            out.loc[i, "chosen"] = choice.best is not None and int(r["factor"]) == choice.best
        out.loc[idx, "ties"] = tie_label(choice.ties, sorted(by_n)) if len(choice.ties) > 1 else None
        out.loc[idx, "tie_rule"] = choice.rule
        out.loc[idx, "provisional"] = choice.provisional
        out.loc[idx, "repeats_needed"] = choice.repeats_needed
        out.loc[idx, "choice_method"] = choice.method
    return out


def _sampled_rss(t: pd.DataFrame, packs: pd.DataFrame) -> pd.Series:
    """Each training's peak RSS as the pack's sampler saw it (by training id), for trainings that report none."""
    peaks: dict[str, Any] = {}
    if t["peak_rss_mb"].isna().any():
        for by_training in packs.get("sampler_peak_rss_by_training", pd.Series(dtype=object)).dropna():
            peaks.update(by_training)
    return pd.to_numeric(t["training_id"].map(peaks), errors="coerce")


def _not_probes(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[~frame["probe"].fillna(False).astype(bool)] if "probe" in frame else frame


def _probes(frame: pd.DataFrame) -> pd.DataFrame:
    if "probe" not in frame:
        return frame.iloc[0:0]
    return frame[frame["probe"].fillna(False).astype(bool) & (frame["status"] == COMPLETED)]


def loader_bounds(trainings: pd.DataFrame) -> dict[str, float]:
    """The data loader's own samples/s per partition (median over its loader-only probes)."""
    probes = _probes(trainings)
    if probes.empty:
        return {}
    return pd.to_numeric(probes["samples_per_s"], errors="coerce").groupby(probes["partition"]).median().to_dict()


def knob_table(trainings: pd.DataFrame) -> pd.DataFrame:
    """Throughput per setting of the workload's knobs (batch size, AMP, loader workers, pinned memory) and N,
    with the loader-only bound of the same input-pipeline setting beside it."""
    if trainings.empty or "knobs" not in trainings:
        return pd.DataFrame()
    trainings = _only(trainings, ("workload", "partition", "factor", "status", "probe", "knobs", "loader_setting",
                                  "samples_per_s"))
    t = _not_probes(trainings)
    t = t[(t["status"] == COMPLETED) & _has_object(t["knobs"])]
    if t.empty:
        return pd.DataFrame()
    knobs = json_columns(t["knobs"])
    varying = [c for c in knobs.columns if _nunique(knobs[c]) > 1]
    if not varying and _probes(trainings).empty:
        return pd.DataFrame()  # no knob varied and no loader bound: nothing the main table does not say
    varying = varying or list(knobs.columns)
    frame = knobs[varying].astype(str).assign(
        workload=t["workload"], partition=t["partition"], factor=t["factor"], loader_setting=t.get("loader_setting"),
        samples_per_s=pd.to_numeric(t["samples_per_s"], errors="coerce"))
    keys = ["workload", "partition"] + varying + ["factor"]
    out = frame.groupby(keys, dropna=False).agg(samples_per_s=("samples_per_s", "median"),
                                               trainings=("samples_per_s", "count"),
                                               loader_setting=("loader_setting", _first)).reset_index()
    probes = _probes(trainings)
    bound = {}
    if not probes.empty and "loader_setting" in probes:
        rates = pd.to_numeric(probes["samples_per_s"], errors="coerce")
        bound = rates.groupby([probes["partition"], probes["loader_setting"]]).median().to_dict()
    out["loader_bound_samples_per_s"] = [bound.get((p, s), math.nan)
                                         for p, s in zip(out["partition"], out["loader_setting"])]
    out["loader_bound"] = out["samples_per_s"] >= LOADER_BOUND_FRACTION * out["loader_bound_samples_per_s"]
    return out.drop(columns=["loader_setting"])


def _has_object(values: pd.Series) -> pd.Series:
    """True where a value is a non-empty JSON object (text) or dict."""
    if values.dtype != object:
        return values.notna() & ~values.isin(["{}", "null"])
    return values.map(lambda v: bool(v) and (isinstance(v, dict) or (isinstance(v, str) and v not in ("{}", "null"))))


def best_factors(summary: pd.DataFrame, by: Sequence[str] = tuple(GROUP)) -> pd.DataFrame:
    """Per (workload, partition, GPU type, mode): the N the noise-aware choice picked (see :func:`with_choices`).
    With ``by`` leaving mode out: among each mode's chosen N, the one with the lowest time per training."""
    if summary.empty:
        return summary
    chosen = summary[summary["chosen"].astype(bool)]
    if chosen.empty or list(by) == GROUP:
        return chosen.reset_index(drop=True)
    idx = chosen.groupby(list(by))["time_per_training_s"].idxmin()
    return chosen.loc[idx].reset_index(drop=True)


def json_columns(text: pd.Series) -> pd.DataFrame:
    """JSON objects (text, as the frame holds params and knobs; or dicts), one column per name, aligned with
    ``text``: parsed at once by Arrow's JSON reader, or, where it cannot type them as Python would (a name of
    mixed types, nested values, dates), each distinct text by Python's json."""
    if text.dtype == object:  # dicts (a frame built by hand): as the text the columnar files hold
        text = text.map(lambda v: v if isinstance(v, str) or v is None else json.dumps(v))
    try:
        return _arrow_json(text)
    except (pa.ArrowException, ValueError):
        codes, uniques = pd.factorize(text)
        distinct = pd.DataFrame([json.loads(t) for t in uniques])
        if (codes < 0).any():  # rows without an object: a row of None (object columns, so ints stay ints)
            distinct = pd.concat([distinct.astype(object), pd.DataFrame({c: [None] for c in distinct.columns})])
            codes = np.where(codes < 0, len(uniques), codes)
        return distinct.iloc[codes].set_axis(text.index)


def _arrow_json(text: pd.Series) -> pd.DataFrame:
    """One JSON object a line, all in one buffer (joined in Arrow, no Python str per row), read by Arrow."""
    texts = pa.array(text, type=_S, from_pandas=True)
    texts = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    lines = pc.binary_join_element_wise(pc.fill_null(texts, "{}"), pa.scalar("", _S), pa.scalar("\n", _S))
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset:lines.offset + len(lines) + 1]
    table = pa_json.read_json(pa.BufferReader(lines.buffers()[2].slice(offsets[0], offsets[-1] - offsets[0])))
    if table.num_rows != len(text) or not all(pa.types.is_primitive(f.type) or pa.types.is_string(f.type)
                                              for f in table.schema) or any(pa.types.is_temporal(f.type)
                                                                            for f in table.schema):
        raise ValueError("not one flat object a line of numbers, text and booleans")
    return table.to_pandas().set_axis(text.index)


def best_hyperparameters(trainings: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """Grid points ranked by validation accuracy, averaged over every completed run of them. Empty where there is
    no grid to rank: one grid point, or only the seed varies (ranking seeds would pass noise off as a choice)."""
    if trainings.empty:
        return pd.DataFrame()
    t = _not_probes(_only(trainings, ("workload", "training_id", "status", "probe", "val_accuracy", "params")))
    t = t[(t["status"] == COMPLETED)].copy()
    t["val_accuracy"] = pd.to_numeric(t["val_accuracy"], errors="coerce")
    t = t[t["val_accuracy"].notna()]
    if t.empty:
        return pd.DataFrame()
    params = json_columns(t["params"])
    keys = sorted(k for k in params.columns if k not in SEED_NAMES and _nunique(params[k]) > 1)
    if not keys:
        return pd.DataFrame()
    frame = pd.DataFrame({k: _groupable(params[k]) for k in keys}).assign(
        workload=t["workload"], val_accuracy=t["val_accuracy"], training_id=t["training_id"])
    ranked = frame.groupby(["workload"] + keys, dropna=False).agg(
        val_accuracy=("val_accuracy", "mean"), runs=("val_accuracy", "count"),
        trainings=("training_id", "nunique"))
    best = ranked.sort_values("val_accuracy", ascending=False).head(top).reset_index()
    for k in keys:  # as text, the way the value reads (0.1, 128, adam)
        best[k] = [str(v.item() if isinstance(v, np.generic) else v) for v in best[k]]
    return best


def _groupable(col: pd.Series) -> pd.Series:
    """Values to group by: lists and dicts (unhashable) as their text."""
    return col.astype(str) if col.dtype == object and col.map(lambda v: isinstance(v, (list, dict, np.ndarray))).any() \
        else col


def _nunique(col: pd.Series) -> int:
    try:
        return int(col.nunique(dropna=False))
    except TypeError:  # unhashable values (lists): compare their text
        return int(col.astype(str).nunique(dropna=False))


@dataclass
class Collected:
    records: Records
    summary: pd.DataFrame
    best: pd.DataFrame  # per (workload, partition, GPU type, mode)
    best_overall: pd.DataFrame  # per (workload, partition, GPU type): the best (mode, N)
    hyper: pd.DataFrame
    cost: pd.DataFrame
    sweep_trainings: int
    knobs: pd.DataFrame = field(default_factory=pd.DataFrame)
    # packing.factors=auto: the grid run at the best N, apart from the probe (the main summary) that chose it.
    production: pd.DataFrame = field(default_factory=pd.DataFrame)
    auto_lines: list[str] = field(default_factory=list)  # what the probe did and why it stopped (auto.json)
    # spread.devices: one training on k devices (gpupack/analysis/layouts.py), and every layout beside packing's with verdicts
    spread: pd.DataFrame = field(default_factory=pd.DataFrame)
    layouts: pd.DataFrame = field(default_factory=pd.DataFrame)
    verdicts: list[str] = field(default_factory=list)


def aggregate_records(records: Records, weights: Mapping[str, float] | None = None,
                      sweep_trainings: int | None = None) -> Collected:
    """Everything collect shows and writes, computed from loaded records. Pure."""
    from gpupack.analysis.layouts import compare, split_spread, spread_summary, training_walls, verdicts
    from gpupack.core.rgu import cost_table

    packing_t, spread_t = split_spread(records.trainings)  # one training on k devices: apart, then beside
    packing_p, spread_p = split_spread(records.packs)
    probe_t, run_t = split_phase(packing_t, "run")
    probe_p, run_p = split_phase(packing_p, "run")
    summary = summarize(probe_t, probe_p, records.cleared)
    production = summarize(run_t, run_p, records.cleared) if not run_t.empty else pd.DataFrame()
    best = best_factors(summary)
    overall = best_factors(summary, by=("workload", "partition", "gpu_type"))
    n = sweep_trainings or max(records.grid_sizes.values(), default=0) or int(records.trainings["training_id"].nunique()
                                                                 if not records.trainings.empty else 0)
    weights = weights if weights is not None else records.rgu
    cost = cost_table(overall, weights, n)
    spread = spread_summary(spread_t, spread_p)
    layouts = (compare(summary, spread, packing_times(probe_t, probe_p), weights, training_walls(probe_t))
               if not spread.empty else pd.DataFrame())
    # Hyperparameters and knobs are ranked over packed trainings: a spread one repeats an N=1 training on k devices
    return Collected(records, summary, best, overall, best_hyperparameters(packing_t), cost, n,
                     knob_table(packing_t), production, spread=spread, layouts=layouts, verdicts=verdicts(layouts))


def aggregate(run_dirs: Sequence[Path], weights: Mapping[str, float] | None = None,
              sweep_trainings: int | None = None) -> Collected:
    """Load the runs' records and aggregate them (:func:`aggregate_records`). Reads only."""
    return aggregate_records(load_records(run_dirs), weights, sweep_trainings)
