"""benchmarks/collect_scale.py works, at a small size: it writes a run directory in the columnar layout (plus JSON-only
packs and a resumed pack), and collect reads every record of it back from disk, columnar or not."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd

from gpupack.analysis.load import load_records
from gpupack.core.columnar import ColumnarReader
from gpupack.core.rundir import COLUMNAR

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "collect_scale.py"


def _bench():
    spec = importlib.util.spec_from_file_location("collect_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["collect_scale"] = module
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_times_load_and_aggregate_from_disk(tmp_path, capsys):
    timings = _bench().main(["--trainings", "3000", "--factors", "1,4,8", "--repeat", "2", "--out", str(tmp_path),
                             "--keep"])
    assert set(timings) == {"write", "load", "aggregate", "end_to_end"}
    assert 0 < timings["load"] < timings["end_to_end"]
    out = capsys.readouterr().out
    assert "load + aggregate, end to end:" in out and "JSON-only" in out
    run = tmp_path / "run"
    packs = sorted(p for p in (run / "packs").iterdir())
    reader = ColumnarReader()
    columnar = [p for p in packs if reader.read(str(p)) is not None]
    json_only = [p for p in packs if not (p / COLUMNAR).exists()]
    assert columnar and json_only and len(columnar) + len(json_only) == len(packs)
    assert all(any((p / "trainings").glob("*.json")) for p in json_only)


def test_the_benchmark_writes_what_the_jobs_write(tmp_path):
    """Its columnar files hold what collect reads from the same records' JSON: the figure is collect's real path."""
    n, n_packs, _ = _bench().write_run(tmp_path / "run", 600, json_twins=True)
    columnar = load_records([tmp_path / "run"])
    assert len(columnar.latest()) == n and len(columnar.packs) == n_packs + 1  # and the resumed pack's first attempt
    assert columnar.planned == n_packs and columnar.pending == []
    from_json = load_records([tmp_path / "run"], columnar=False)
    pd.testing.assert_frame_equal(columnar.trainings, from_json.trainings)
    pd.testing.assert_frame_equal(columnar.packs, from_json.packs)
