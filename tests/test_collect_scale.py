"""benchmarks/collect_scale.py works, at a small size: it writes a run directory in the columnar layout (plus JSON-only
packs and a resumed pack), and collect reads every record of it back from disk, columnar or not."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

from gpupack.core.store.columnar import ColumnarReader
from gpupack.core.store.rundir import COLUMNAR, RunDir
from gpupack.results.analysis.load import load_records

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "collect_scale.py"


def _bench():
    spec = importlib.util.spec_from_file_location("collect_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["collect_scale"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_benchmark_times_load_and_aggregate_from_disk(tmp_path, capsys):
    timings = _bench().main(["--trainings", "3000", "--factors", "1,4,8", "--repeat", "2", "--out", str(tmp_path),
                             "--keep", "--layout", "packs"])
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
    written = _bench().write_run(tmp_path / "run", 600, json_twins=True)
    n, n_packs = written.trainings, written.packs
    columnar = load_records([tmp_path / "run"])
    assert len(columnar.latest()) == n and len(columnar.packs) == n_packs + 1  # and the resumed pack's first attempt
    assert columnar.planned == n_packs and columnar.pending == []
    from_json = load_records([tmp_path / "run"], columnar=False)
    pd.testing.assert_frame_equal(columnar.trainings, from_json.trainings)
    pd.testing.assert_frame_equal(columnar.packs, from_json.packs)


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in one order: a lane's columnar file gives its rows lane by lane, its journal in the order folded."""
    keys = [c for c in ("training_id", "pack_id", "attempt") if c in frame]
    return frame.sort_values(keys).reset_index(drop=True)


@pytest.mark.slow
def test_the_lanes_layout_is_read_from_the_lanes_columnar_files_as_from_their_journals(tmp_path, monkeypatch):
    """The default layout: packs dealt to lanes that folded them. Collect reads each lane's columnar file for the
    journal bytes it covers and parses only what was folded after (an OOM amended) and the journals of lanes killed
    before their end; what it reads is what the journals say."""
    bench = _bench()
    written = bench.write_run(tmp_path / "run", 2000, factors=[4, 8], layout="lanes", lanes=12)
    run = RunDir(tmp_path / "run")
    assert written.from_json == 2 and len(list(run.lanes.glob("*.arrows"))) == 10 and not run.packs.exists()
    import gpupack.core.store.lane_columnar as lane_columnar

    starts = {}
    real = lane_columnar.journal_entries
    monkeypatch.setattr(lane_columnar, "journal_entries",
                        lambda path, start=0: starts.setdefault(path.stem, start) is not None and real(path, start))
    columnar = load_records([run.root])
    assert sum(start > 0 for start in starts.values()) == 10  # each file's lane: only the bytes after what it covers
    assert len(columnar.latest()) == written.trainings and len(columnar.trainings) == written.trainings + 1
    amended = columnar.trainings[columnar.trainings["status"] == "oom"]
    assert set(amended["attempt"]) == {0} and (amended["error"] == "out of memory (SLURM)").sum() == 1
    monkeypatch.undo()
    from_json = load_records([run.root], columnar=False)
    pd.testing.assert_frame_equal(_sorted(columnar.trainings), _sorted(from_json.trainings), check_like=True)
    pd.testing.assert_frame_equal(_sorted(columnar.packs), _sorted(from_json.packs), check_like=True)
    assert columnar.pending == [] and columnar.planned == written.packs


def test_the_engines_benchmark_times_the_same_reductions_in_each_engine_it_finds(tmp_path, capsys):
    """benchmarks/collect_engines.py: pandas (what collect runs on) and every other engine installed, on one frame;
    the ones not installed are named, not timed."""
    spec = importlib.util.spec_from_file_location("collect_engines", SCRIPT.parent / "collect_engines.py")
    engines = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engines)
    bench = _bench()
    bench.write_run(tmp_path / "run", 800, factors=[4], layout="lanes", lanes=4)
    timings = engines.main(["--run", str(tmp_path / "run"), "--repeat", "1"])
    assert "pandas" in timings and "pyarrow.compute" in timings
    out = capsys.readouterr().out
    assert all(name in out for name in engines.ENGINES)  # timed, or named as not installed
    t = load_records([tmp_path / "run"]).trainings
    pandas_groups, _ = engines.with_pandas(t)
    assert len(pandas_groups) == t.groupby(engines.KEYS).ngroups == 8  # 4 partitions x 2 modes at N=4


@pytest.mark.slow
def test_curves_and_logs_stay_beside_the_frame_where_they_lie_and_reach_the_rows_and_the_parquet(tmp_path):
    """The columns no table reads (the throughput curve, a third of a run's bytes, and where each log is kept) are not
    copied into the frame: they stay in the lanes' memory-mapped chunks (Records.detached), and reach the rows that need
    them (a plot's pack, a failure's log) and trainings.parquet, each row its own values. The frame's text columns
    are one chunk each: a filter of a chunked one would join its chunks first."""
    bench = _bench()
    bench.write_run(tmp_path / "run", 2000, factors=[4, 8], layout="lanes", lanes=12)
    columnar = load_records([tmp_path / "run"])
    t = columnar.trainings
    assert not {"curve", "logs"} & set(t.columns)
    assert set(columnar.detached.column_names) == {"curve", "logs", "training_id"}  # the ids: what checks a row's own
    assert columnar.detached.num_rows == len(t) and columnar.detached.column("curve").num_chunks >= 10  # not joined
    assert all(t[c].array.__arrow_array__().num_chunks == 1 for c in ("training_id", "pack_id", "status"))
    from_json = load_records([tmp_path / "run"], columnar=False)
    expected = from_json.with_detached(from_json.trainings).set_index(["training_id", "attempt"])[["curve", "logs"]]
    scattered = t.iloc[list(range(len(t) - 1, -1, -7))]  # rows of every lane, last first
    got = columnar.with_detached(scattered).set_index(["training_id", "attempt"])[["curve", "logs"]]
    assert got["curve"].notna().all() and got["logs"].notna().all()
    pd.testing.assert_frame_equal(got, expected.loc[got.index])
    with pytest.raises(ValueError, match="index is not each row's position"):  # a frame reordered, index reset
        columnar.with_detached(t.sort_values("training_id", ascending=False).reset_index(drop=True))
    with pytest.raises(ValueError, match="index is not each row's position"):
        columnar.with_detached(t.iloc[::-1].reset_index(drop=True).iloc[:10])
    from gpupack.results.report.files import write_trainings

    written = pd.read_parquet(write_trainings(columnar, tmp_path / "out")).set_index(["training_id", "attempt"])
    assert len(written) == len(t)
    pd.testing.assert_frame_equal(written[["curve", "logs"]].astype(object), expected.loc[written.index],
                                  check_dtype=False)
