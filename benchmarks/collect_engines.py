"""Which engine should collect's million-row reductions run on? pandas, polars, DuckDB and pyarrow.compute, side by
side on the same frame (issue 31: "your measured choice, named in BENCHMARKS.md with the alternatives' figures").

    .venv/bin/pip install polars duckdb     # for this benchmark only: gpupack does not depend on them
    .venv/bin/python benchmarks/collect_engines.py [--run RUN_DIR | --trainings N] [--repeat K]

Loads a run directory's records as collect does (``--run``, e.g. one collect_scale.py --keep left; else writes a
lanes-layout run of ``--trainings`` with benchmarks/collect_scale.py, 1,000,000 by default), then times, in each
engine, the two reductions over every training row that summarize does (per (workload, partition, GPU type, mode, N):
attempts, completed, the greatest peak RSS, the exact medians of start-up, loop and samples/s; per pack: the samples
of its trainings), from the same columns, best of K. The engine's own conversion from the frame (pandas → Arrow →
polars or DuckDB, zero-copy where it can) is timed with it. pyarrow.compute has no exact median in a grouped
aggregation: its figure is for an approximate one (a t-digest), so it cannot stand in for the others as it is.
An engine that is not installed is left out of the table, with a note.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpupack.results.analysis.load import load_records  # noqa: E402

KEYS = ["workload", "partition", "gpu_type", "mode", "factor"]
COLUMNS = [*KEYS, "status", "pack_id", "training_id", "startup_s", "loop_s", "samples_per_s", "peak_rss_mb", "samples"]


def with_pandas(t: pd.DataFrame) -> Any:
    d = t[COLUMNS].assign(ok=t["status"] == "completed")
    per_group = d.groupby(KEYS).agg(attempts=("ok", "size"), ok=("ok", "sum"), rss=("peak_rss_mb", "max"),
                                    startup=("startup_s", "median"), loop=("loop_s", "median"),
                                    rate=("samples_per_s", "median"))
    return per_group, d.groupby("pack_id", sort=False)["samples"].sum()


def with_polars(t: pd.DataFrame) -> Any:
    import polars as pl

    d = pl.from_arrow(pa.Table.from_pandas(t[COLUMNS], preserve_index=False))
    assert isinstance(d, pl.DataFrame)
    per_group = d.group_by(KEYS).agg(pl.len().alias("attempts"), (pl.col("status") == "completed").sum().alias("ok"),
                                     pl.col("peak_rss_mb").max(), pl.col("startup_s").median(),
                                     pl.col("loop_s").median(), pl.col("samples_per_s").median())
    return per_group, d.group_by("pack_id").agg(pl.col("samples").sum())


def with_duckdb(t: pd.DataFrame) -> Any:
    import duckdb

    con = duckdb.connect()
    con.register("t", pa.Table.from_pandas(t[COLUMNS], preserve_index=False))
    per_group = con.sql("select workload, partition, gpu_type, mode, factor, count(*), "
                        "sum((status = 'completed')::int), max(peak_rss_mb), median(startup_s), median(loop_s), "
                        "median(samples_per_s) from t group by all").to_arrow_table()
    return per_group, con.sql("select pack_id, sum(samples) from t group by pack_id").to_arrow_table()


def with_pyarrow(t: pd.DataFrame) -> Any:
    d = pa.Table.from_pandas(t[COLUMNS], preserve_index=False)
    d = d.append_column("ok", pc.equal(d["status"], "completed"))
    per_group = d.group_by(KEYS).aggregate([("ok", "count"), ("ok", "sum"), ("peak_rss_mb", "max"),
                                             ("startup_s", "approximate_median"), ("loop_s", "approximate_median"),
                                             ("samples_per_s", "approximate_median")])
    return per_group, d.group_by("pack_id").aggregate([("samples", "sum")])


ENGINES: dict[str, tuple[Callable[[pd.DataFrame], Any], str]] = {
    "pandas": (with_pandas, "exact medians"),
    "polars": (with_polars, "exact medians"),
    "duckdb": (with_duckdb, "exact medians"),
    "pyarrow.compute": (with_pyarrow, "approximate medians (t-digest): not a substitute as it is"),
}


def best_of(f: Callable[[pd.DataFrame], Any], t: pd.DataFrame, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f(t)
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="a run directory to read (default: write one with collect_scale.py)")
    ap.add_argument("--trainings", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="collect_engines.") as tmp:
        root = args.run
        if root is None:
            import collect_scale

            root = Path(tmp) / "run"
            collect_scale.write_run(root, args.trainings, layout=collect_scale.LANES_LAYOUT,
                                    lanes=max(1, args.trainings // 1000))
        t = load_records([root]).trainings
    print(f"{len(t):,} training rows; each engine's time is the best of {args.repeat}, its conversion included")
    print(f"{'engine':16} {'seconds':>8} {'x pandas':>9}  note")
    out: dict[str, float] = {}
    for name, (f, note) in ENGINES.items():
        try:
            out[name] = best_of(f, t, args.repeat)
        except ImportError as err:
            print(f"{name:16} {'-':>8} {'-':>9}  not installed ({err.name}): pip install {name}")
            continue
        print(f"{name:16} {out[name]:8.3f} {out[name] / out['pandas']:9.2f}  {note}")
    return out


if __name__ == "__main__":
    main()
