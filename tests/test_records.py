"""Records: atomic write/read round trip, and what a reader does with torn files."""
from __future__ import annotations

import json
import os
import stat

import pytest

from gpupack.core.store.records import (
    SCHEMA_VERSION,
    is_completed,
    pack_record,
    read_json,
    read_pack,
    training_record,
    write_json_atomic,
)


def test_round_trip_with_schema_and_odd_values(tmp_path):
    rec = training_record(training_id="w-1", status="completed", params={"tag": "a'b\"c;$(x)\nü"}, wall_s=1.5)
    path = tmp_path / "deep" / "w-1.json"
    write_json_atomic(path, rec)
    back = read_json(path)
    assert back == rec
    assert back["schema"] == SCHEMA_VERSION and back["kind"] == "training"
    assert pack_record(pack_id="p")["kind"] == "pack"


def test_write_leaves_no_temp_file_and_is_not_world_writable(tmp_path):
    path = tmp_path / "r.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    assert not os.stat(path).st_mode & stat.S_IWOTH
    assert read_json(path) == {"a": 2}


def test_failed_serialisation_keeps_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    write_json_atomic(path, {"a": 1})

    class Boom:
        def __str__(self):
            raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        write_json_atomic(path, {"a": Boom()})
    assert read_json(path) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.mark.parametrize(
    "content, expected",
    [
        (json.dumps({"training_id": "t", "status": "completed"}), True),
        (json.dumps({"training_id": "t", "status": "failed"}), False),
        (json.dumps({"status": "completed"}), False),  # not a training's record: it names no training
        (json.dumps({"training_id": 7, "status": "completed"}), False),  # its id not text: not as gpupack writes it
        (json.dumps({"training_id": "t", "status": ["completed"]}), False),
        ('{"status": "compl', False),  # torn
        ("[1, 2]", False),  # foreign
        (None, False),  # missing
    ],
)
def test_is_completed(tmp_path, content, expected):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)
    assert is_completed(path) is expected


@pytest.mark.parametrize("content, read", [
    ({"pack_id": "p", "factor": 2}, True),
    ({"factor": 2}, False),  # names no pack
    ({"pack_id": 3}, False),  # its id not text
])
def test_a_pack_record_read_from_disk_is_checked_before_it_is_typed(tmp_path, content, read):
    path = tmp_path / "pack.json"
    path.write_text(json.dumps(content))
    assert (read_pack(path) == content) is read and (read_pack(path) is None) is not read


def test_a_reader_polling_while_records_are_rewritten_never_sees_half_a_record(tmp_path):
    """atomic_file (records, fork results, Hydra JobReturns): a reader in another process, polling while a writer
    rewrites one large record again and again, always reads a whole one."""
    import multiprocessing

    path = tmp_path / "rec.json"
    write_json_atomic(path, {"i": -1, "pad": "x" * 200_000})
    stop = multiprocessing.Event()
    torn = multiprocessing.Value("i", 0)
    reads = multiprocessing.Value("i", 0)

    def reader() -> None:
        while not stop.is_set():
            try:
                read_json(path)
                reads.value += 1
            except ValueError:
                torn.value += 1

    proc = multiprocessing.Process(target=reader)
    proc.start()
    for i in range(300):
        write_json_atomic(path, {"i": i, "pad": "x" * 200_000})
    stop.set()
    proc.join(30)
    assert reads.value > 0 and torn.value == 0


@pytest.mark.parametrize("rec, kind, row, said", [
    ({"kind": "pack", "schema": SCHEMA_VERSION, "pack_id": "p", "factor": 2}, "pack", True, None),
    ({"kind": "pack", "schema": SCHEMA_VERSION, "factor": 2}, "pack", False, "a pack record that names no pack"),
    ({"kind": "training", "schema": SCHEMA_VERSION, "training_id": "t"}, "pack", False, "not a pack record"),
    ({"kind": "pack", "schema": 99, "pack_id": "p"}, "pack", False, "record schema 99"),
])
def test_collect_takes_a_row_only_from_a_record_of_the_kind_it_reads(rec, kind, row, said):
    from gpupack.core.store.columnar import record_row

    warnings: list[str] = []
    assert (record_row(rec, kind, "here", warnings) is not None) is row
    assert warnings == ([] if said is None else [w for w in warnings if said in w and "here" in w])
    assert len(warnings) == (0 if said is None else 1)
