"""The columnar file of a pack: its trainings' flat rows in one file (``packs/<id>/trainings.arrows``).

The pack's job writes it (:func:`write_columnar`), :mod:`gpupack.results.analysis` reads it (:class:`ColumnarReader`),
and both make the same flat rows (:func:`flatten`, :func:`split_rows`), so a pack read from its file or from its JSON
records gives the same frame.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence, TypedDict, cast

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.json as arrow_json

from gpupack.core.store.records import SCHEMA_VERSION, PackRecord, atomic_file, is_pack_record, read_json
from gpupack.core.store.rundir import COLUMNAR, PACK_RECORD, TRAININGS, RunDir

# Nested record fields the tables need, flattened to columns at load: column → (field, key).
FLAT = {
    "startup_s": ("timings", "startup_s"), "loop_s": ("timings", "loop_s"),
    "timing_split": ("timings", "split"),  # False: a program that never marked its first step (command workload)
    "samples": ("throughput", "samples"), "samples_per_s": ("throughput", "samples_per_s"),
    "curve": ("throughput", "curve"),
    "val_accuracy": ("metrics", "val_accuracy"), "train_loss": ("metrics", "train_loss"),
    "peak_rss_mb": ("memory", "peak_rss_mb"), "peak_gpu_mem_mb": ("memory", "peak_gpu_mem_mb"),
    # one training spread over k devices: what its strategy measured (gpupack/job/spread/)
    "allreduce_bytes_per_step": ("spread", "allreduce_bytes_per_step"),
    "allreduce_s_per_step": ("spread", "allreduce_s_per_step"), "replicas": ("spread", "replicas"),
}
NESTED = {"timings", "throughput", "metrics", "memory", "spread"}
# Pack record: the sampler's summary, flattened (its raw samples stay in pack.json).
PACK_FLAT = ("source", "note", "gpu_util_mean", "gpu_util_max", "gpu_mem_used_peak_mb", "gpu_mem_total_mb",
             "cpu_percent_mean", "overhead_cpu_s", "overhead_fraction",
             # the load from outside the job while the pack ran (gpupack.job.runtime.foreign): analysis.disturbance
             "foreign_cpu_cores_mean", "foreign_cpu_cores_max", "foreign_measured_s", "host_cores", "job_cores",
             "foreign_gpu_procs_max", "foreign_gpu_mem_mb_max")

# The file: an Arrow IPC stream of one batch, the columns that vary between the pack's trainings, then JSON: the pack
# record's flat row, the number of trainings, and the one value of each column every training shares (ColumnarTail).
JSON_PREFIX = "json:"  # a column of lists, dicts or mixed types: JSON text under this prefix in the columnar file
_META_SCHEMA = b"gpupack.schema"
_META_COLUMNS = b"gpupack.columns"  # every column of the rows, in order
_META_SHARED = b"gpupack.shared"  # the columns all rows share one value of: in the JSON after the stream
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the end of an Arrow IPC stream
# The Arrow type of each field of gpupack's training records, whatever one pack's values (a null error): packs then
# share one layout, parsed once and joined without promotion. Text is large_string, as pandas' str columns hold it.
STRING = _S = pa.large_string()
_F, _I, _B = pa.float64(), pa.int64(), pa.bool_()
INT64 = (-(2 ** 63), 2 ** 63 - 1)
FLOAT_EXACT = 2 ** 53  # the largest int every int up to which a double holds exactly
KNOWN_TYPES: dict[str, pa.DataType] = {
    **{k: _S for k in ("kind", "sweep", "pack_id", "training_id", "workload", "mode", "partition", "gpu_type",
                       "device", "device_name", "gpu_model", "status", "error", "loader_setting", "data", "host",
                       "start", "phase", "strategy", "reference_of")},
    **{k: _I for k in ("schema", "grid_index", "reseed", "repeat", "factor", "concurrent", "threads", "exit_code",
                       "signal", "samples", "devices", "replicas", "round",
                       "threads_set")},
    **{k: _F for k in ("started_at", "ended_at", "wall_s", "startup_s", "loop_s", "samples_per_s", "val_accuracy",
                       "train_loss", "peak_rss_mb", "peak_gpu_mem_mb", "memory_limit_mb", "allreduce_bytes_per_step",
                       "allreduce_s_per_step")},
    **{k: _B for k in ("loader_alone", "timing_split", "timed_out")},
}


def flatten(rec: Mapping[str, object]) -> dict[str, object]:
    """A training record as one flat row: nested fields the tables use lifted to columns."""
    row = {k: v for k, v in rec.items() if k not in NESTED}
    for col, (outer, inner) in FLAT.items():
        row[col] = cast("Mapping[str, object]", rec.get(outer) or {}).get(inner)  # a JSON object, or null
    row["metrics"] = rec.get("metrics") or {}  # every metric it reported, by name: collect ranks by any of them
    return row


def flatten_pack(rec: PackRecord) -> dict[str, object]:
    row: dict[str, object] = {k: v for k, v in rec.items() if k != "sampler"}
    sampled = rec.get("sampler") or {}
    for key in PACK_FLAT:
        row[f"sampler_{key}"] = sampled.get(key)
    # The sampler's peak RSS of each training's process: what a program that reports nothing itself is known by.
    row["sampler_peak_rss_by_training"] = {tid: t.get("peak_rss_mb") for tid, t in
                                           (sampled.get("per_training") or {}).items()}
    return row


def read_records(paths: Iterable[Path], kind: str, warnings: list[str]) -> list[dict[str, object]]:
    """Flat rows of the records of one kind at ``paths``; what cannot be read is skipped with a warning."""
    rows = []
    for path in paths:
        try:
            rec = read_json(path)
        except (OSError, ValueError) as err:
            warnings.append(f"skipped {path}: unreadable or torn ({err.__class__.__name__})")
            continue
        row = record_row(rec, kind, str(path), warnings)
        if row is not None:
            rows.append(row)
    return rows


def record_row(rec: Mapping[str, object], kind: str, where: str, warnings: list[str]) -> dict[str, object] | None:
    """One record's flat row, or None (with a warning naming ``where``): not a record of ``kind`` this gpupack reads."""
    if rec.get("kind") != kind:
        warnings.append(f"skipped {where}: not a {kind} record")
    elif rec.get("schema") != SCHEMA_VERSION:
        warnings.append(f"skipped {where}: record schema {rec.get('schema')!r}, this gpupack reads schema "
                        f"{SCHEMA_VERSION} (collect it with the gpupack version that wrote it)")
    elif kind == "training":
        return flatten(rec)
    elif is_pack_record(rec):
        return flatten_pack(rec)
    else:
        warnings.append(f"skipped {where}: a pack record that names no pack")
    return None


# ---------------- rows as columns, and the file ----------------

# The Arrow type that holds values of these Python types (None left out) as they are; any other set is JSON.
_ARROW_TYPES = {frozenset(): pa.null(), frozenset({bool}): _B, frozenset({int}): _I, frozenset({float}): _F,
                frozenset({int, float}): _F, frozenset({str}): _S}


def json_texts(values: Sequence[object]) -> list[str | None]:
    """A JSON-text column's values (lists, dicts, mixed types, ints a number column cannot hold)."""
    return [None if v is None else json.dumps(v) for v in values]


def json_array(values: Sequence[object]) -> pa.Array:
    return pa.array(json_texts(values), _S)


def column_type(name: str, values: Sequence[object]) -> pa.DataType | None:
    """A column's type: the field's known type where the values fit it as they are (never a float cut to an int, a
    bool made a number), else their own type, else None: JSON text."""
    kind = _ARROW_TYPES.get(frozenset(type(v) for v in values if v is not None))  # None: JSON
    known = KNOWN_TYPES.get(name)
    if known is not None and (kind in (known, pa.null()) or (known == _F and kind == _I)):
        kind = known
    ints = [v for v in values if isinstance(v, int)]  # what Arrow refuses in its type is JSON, kept whole:
    if kind == _I and not all(INT64[0] <= v <= INT64[1] for v in ints):  # an int beyond 64 bits
        return None
    if kind == _F and any(abs(v) > FLOAT_EXACT for v in ints):  # an int a double cannot hold exactly
        return None
    return kind


def column(name: str, values: list[object]) -> tuple[str, pa.Array]:
    """One column (:func:`column_type`), named ``json:<name>`` where it is JSON text."""
    kind = column_type(name, values)
    # values its type should hold and Arrow refuses: JSON keeps them
    with contextlib.suppress(pa.ArrowException, OverflowError):
        if kind is not None:
            return name, pa.array(values, kind)
    return JSON_PREFIX + name, json_array(values)


Columns = Mapping[str, tuple[pa.DataType, Sequence[object]]]  # a column's name → (its type, its values)


def typed_arrays(columns: Columns, rows: int) -> list[pa.Array]:
    """Each column's values as one array of its type: through Arrow's JSON reader where pandas is not imported
    (``pa.array`` imports it: apache/arrow#34994, 0.4 s a job), else the faster ``pa.array``; the same arrays."""
    if "pandas" not in sys.modules:
        read = _json_arrays(columns, rows)
        if read is not None:
            return read
    return [pa.array(list(values), kind) for kind, values in columns.values()]


def _json_arrays(columns: Columns, rows: int) -> list[pa.Array] | None:
    """:func:`typed_arrays` through Arrow's JSON reader (floats by repr, NaN included); None where it refuses them."""
    if not columns or not rows:
        return [pa.nulls(0, kind) for kind, _ in columns.values()]
    names = list(columns)
    text = "".join(json.dumps(dict(zip(names, row))) + "\n" for row in zip(*(v for _, v in columns.values())))
    schema = pa.schema([(name, kind) for name, (kind, _) in columns.items()])
    try:
        table = arrow_json.read_json(
            io.BytesIO(text.encode()), read_options=arrow_json.ReadOptions(use_threads=False, block_size=len(text) + 1),
            parse_options=arrow_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error"))
    except (pa.ArrowException, UnicodeEncodeError, OverflowError):  # OverflowError: a text of 2 GiB, past its block
        return None
    return [table.column(name).combine_chunks() for name in names]


def same(values: Sequence[object]) -> bool:
    """Every value equal, and of one type (1, 1.0 and True are == in Python, not in a column)."""
    first = values[0]
    return all(type(v) is type(first) and v == first for v in values[1:])


@dataclass
class Rows:
    """Flat rows as columns: ``batch`` the varying ones (lists and dicts as JSON text under ``json:<name>``), ``shared``
    the one value of each column all rows share; the schema's metadata names every column in order and which."""

    batch: pa.RecordBatch
    rows: int
    shared: list[object]

    @property
    def layout(self) -> pa.Schema:
        return self.batch.schema


def layout_columns(layout: pa.Schema) -> tuple[list[str], list[str]]:
    """(every column of the rows, in order; the columns all rows share one value of) of a :attr:`Rows.layout`."""
    meta = layout.metadata or {}
    return json.loads(meta[_META_COLUMNS]), json.loads(meta[_META_SHARED])


def split_rows(rows: Sequence[Mapping[str, object]]) -> Rows:
    """The one way rows become columns, from a pack's columnar file or its JSON records alike."""
    names = list(dict.fromkeys(key for row in rows for key in row))
    values = {name: [row.get(name) for row in rows] for name in names}
    shared = [name for name in names if rows and same(values[name])]
    typed: dict[str, tuple[pa.DataType, Sequence[object]]] = {}
    for name in (n for n in names if n not in shared):
        kind = column_type(name, values[name])
        if kind is None:
            typed[JSON_PREFIX + name] = (_S, json_texts(values[name]))
        else:
            typed[name] = (kind, values[name])
    arrays = typed_arrays(typed, len(rows))
    meta = {_META_SCHEMA: str(SCHEMA_VERSION), _META_COLUMNS: json.dumps(names), _META_SHARED: json.dumps(shared)}
    schema = pa.schema([pa.field(name, array.type) for name, array in zip(typed, arrays)], metadata=meta)
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    return Rows(batch, len(rows), [values[name][0] for name in shared])


def pack_rows(pack_dir: Path, warnings: list[str]) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """(training rows, pack rows) of one pack from its JSON records, in path order."""
    trainings = read_records(sorted((pack_dir / TRAININGS).glob("*.json")), "training", warnings)
    pack_json = pack_dir / PACK_RECORD
    return trainings, read_records([pack_json] if pack_json.exists() else [], "pack", warnings)


def write_columnar(run: RunDir, pack_id: str) -> Path | None:
    """Write the pack's rows into its columnar file, atomically, once its record is written, only where every record
    reads cleanly (collect's warnings then come from the JSON); the path, or None."""
    warnings: list[str] = []
    trainings, packs = pack_rows(run.pack_dir(pack_id), warnings)
    if warnings or len(packs) != 1:
        return None
    with atomic_file(run.columnar(pack_id), binary=True) as f:
        f.write(columnar_bytes(trainings, packs[0]))
    return run.columnar(pack_id)


class ColumnarTail(TypedDict):
    """The JSON after a columnar file's batch (:func:`columnar_bytes`)."""
    pack: dict[str, object]  # the pack's flat row
    rows: int
    shared: list[object]  # the values every row shares (Rows.shared)


def columnar_bytes(trainings: Sequence[Mapping[str, object]], pack_row: dict[str, object]) -> bytes:
    """A columnar file: the rows' varying columns as one Arrow IPC batch, then JSON (the pack row reads faster so)."""
    rows = split_rows(trainings)
    tail: ColumnarTail = {"pack": pack_row, "rows": rows.rows, "shared": rows.shared}
    return stream_bytes(rows.batch) + json.dumps(tail).encode()


def stream_bytes(batch: pa.RecordBatch) -> bytes:
    """One batch as an Arrow IPC stream (its schema, the batch, the end)."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def _changed_after(path: str, stamp_ns: int) -> bool:
    try:
        return os.stat(path).st_mtime_ns > stamp_ns
    except FileNotFoundError:
        return True


class ColumnarReader:
    """Reads packs' columnar files, parsing each distinct layout once (the packs of a run share a few)."""

    def __init__(self) -> None:
        self.layouts: dict[bytes, pa.Schema | None] = {}

    def read(self, pack_dir: str) -> tuple[Rows, dict[str, object]] | None:
        """(training rows, pack row) of a pack; None where it has no columnar file, its records changed since (a resumed
        pack), or the file is unreadable or of another schema: its JSON records are read instead."""
        path = f"{pack_dir}/{COLUMNAR}"
        try:
            stamp = os.stat(path).st_mtime_ns
            if _changed_after(f"{pack_dir}/{TRAININGS}", stamp) or _changed_after(f"{pack_dir}/{PACK_RECORD}", stamp):
                return None
            with open(path, "rb", buffering=0) as f:
                data = f.read()
            read = self.parse(data)
            return None if read is None else (read[0], read[1]["pack"])
        except (OSError, ValueError, KeyError, TypeError, EOFError, pa.ArrowException):
            return None

    def parse(self, data: bytes) -> tuple[Rows, ColumnarTail] | None:
        """(the rows, the JSON after them) of a columnar file's bytes; None: another schema. A torn file raises."""
        batch, end = self.batch(data, 0)
        if batch is None:
            return None
        tail = json.loads(data[end:])  # as columnar_bytes wrote it; a tail of another shape raises: read() reads JSON
        checked: ColumnarTail = {"pack": dict(tail["pack"]), "rows": int(tail["rows"]), "shared": list(tail["shared"])}
        return Rows(batch, checked["rows"], checked["shared"]), checked

    def batch(self, data: bytes | pa.Buffer, start: int) -> tuple[pa.RecordBatch | None, int]:
        """The one batch of the IPC stream at byte ``start`` of ``data`` (None: of another schema) and the byte after
        the stream's end. From a buffer (a memory-mapped file) the batch's columns are the buffer's bytes."""
        source = pa.BufferReader(data)
        source.seek(start)
        message = ipc.read_message(source)
        layout = self._layout(bytes(data[start:source.tell()]), message)
        if layout is None:
            return None, 0
        batch = ipc.read_record_batch(ipc.read_message(source), layout)
        end = source.tell()
        if bytes(data[end:end + len(_EOS)]) != _EOS:  # one batch, as columnar_bytes writes it
            raise ValueError("not one batch")
        return batch, end + len(_EOS)

    def _layout(self, key: bytes, message: ipc.Message) -> pa.Schema | None:
        if key not in self.layouts:
            schema = ipc.read_schema(message)
            fits = (schema.metadata or {}).get(_META_SCHEMA) == str(SCHEMA_VERSION).encode()
            self.layouts[key] = schema if fits else None
        return self.layouts[key]
