"""Start spread and memory per training for N = 1, 4, 16, 34 trainings per pack, fresh vs fork start.

    .venv/bin/python benchmarks/start_spread.py            # full: N = 1, 4, 16, 34 (~3-5 min here)
    .venv/bin/python benchmarks/start_spread.py --quick    # N = 1, 4: checks the script works (~25 s)
    .venv/bin/python benchmarks/start_spread.py --report runs/benchmarks/start_spread/<stamp>   # re-print

One pack per (N, start), each its own sweep on the local default backend, for N in --factors and start in
(fresh, fork), in that order:

    python -m gpupack +sweep=mnist_pack packing.factors=[N] packing.repeats=1 packing.process.start=START \
        sweep.grid.lr=[0.1] sweep.grid.batch_size=[128] sweep.grid.seed='range(0,N)' \
        sweep.fixed.train_samples=2000 sweep.fixed.epochs=1 sweep.fixed.val_samples=500 \
        packing.sample_interval_s=0.2 run_dir=OUT/nN-START

From the records of that one pack (OUT/nN-START/packs/<pack_id>/):

- start spread = the last training's timings.loop_start - the pack's started_at: how long the pack takes until
  its N-th training is in its training loop. With fork, the pack's clock starts before the server's preload
  (torch, the workload, the data), so the preload is in the spread, as it is in the pack's wall time;
- memory: the pack sampler's per-training peak RSS (pack.json sampler.per_training.<tid>.peak_rss_mb) summed over
  the N trainings = the pack's total, and that total / N = MB per training. RSS counts shared pages in full, so for
  forked trainings (which share the server's torch and data pages copy-on-write) the sum overstates the memory the
  pack really holds; the figure is what the sampler records, not a PSS/USS measurement;
- the sampler samples every packing.sample_interval_s (here 0.2 s, --sample-interval; gpupack's default is 1 s).
  A training that ends between two samples is never seen; its peak_rss_mb then reads 0.0. Such trainings are
  counted in the "unsampled" columns and left in the sum as 0, so a pack with unsampled trainings understates.
  The "self MB" column is, for comparison, the median of the trainings' own peak RSS (training record
  memory.peak_rss_mb, measured by the training itself, so always present).

The table puts fresh and fork side by side per N, with the spread ratio fresh / fork (how many times sooner the
last training of a pack of N starts training with fork). N=34 fresh starts 34 Python interpreters at once, each
importing torch: about 34 x 0.4 GB of RSS on this machine. Run directories, logs and results.json stay in OUT
(default runs/benchmarks/start_spread/<date>_<time>/).
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PYTHON, fmt, load_run, out_dir, parser, ratio, read_json, run_sweep, say, table, write_json  # noqa: E402

STARTS = ("fresh", "fork")
FULL_FACTORS = [1, 4, 16, 34]
QUICK_FACTORS = [1, 4]


def sweep_argv(n: int, start: str, run_dir: Path, sample_interval: float) -> list[str]:
    return [PYTHON, "-m", "gpupack", "+sweep=mnist_pack", f"packing.factors=[{n}]", "packing.repeats=1",
            f"packing.process.start={start}", "sweep.grid.lr=[0.1]", "sweep.grid.batch_size=[128]",
            f"sweep.grid.seed=range(0,{n})", "sweep.fixed.train_samples=2000", "sweep.fixed.epochs=1",
            "sweep.fixed.val_samples=500", f"packing.sample_interval_s={sample_interval}", f"run_dir={run_dir}"]


def run(out: Path, factors: list[int], sample_interval: float, quick: bool) -> None:
    results: dict[str, Any] = {"quick": quick, "factors": factors, "sample_interval_s": sample_interval, "runs": {}}
    for n in factors:
        for start in STARTS:
            key = f"n{n}-{start}"
            argv = sweep_argv(n, start, out / key, sample_interval)
            results["runs"][key] = {**run_sweep(argv, out, key, label=f"N={n} start={start}"), "n": n, "start": start}
            write_json(out / "results.json", results)


def measure(run_dir: Path) -> dict[str, Any] | None:
    packs, trainings = load_run(run_dir)
    if len(packs) != 1:
        return None
    pack = packs[0]
    ts = [t for t in trainings if t.get("pack_id") == pack["pack_id"]]
    loop_starts = [t["timings"]["loop_start"] for t in ts if (t.get("timings") or {}).get("loop_start")]
    per = (pack.get("sampler") or {}).get("per_training") or {}
    peaks = [float(per.get(tid, {}).get("peak_rss_mb") or 0.0) for tid in pack["training_ids"]]
    own = [float((t.get("memory") or {}).get("peak_rss_mb")) for t in ts
           if (t.get("memory") or {}).get("peak_rss_mb") is not None]
    n = int(pack["factor"])
    return {
        "n": n, "wall_s": pack["wall_s"], "completed": sum(t.get("status") == "completed" for t in ts),
        "spread_s": (max(loop_starts) - pack["started_at"]) if len(loop_starts) == n else None,
        "first_loop_s": (min(loop_starts) - pack["started_at"]) if loop_starts else None,
        "rss_total_mb": sum(peaks), "rss_per_training_mb": sum(peaks) / n,
        "unsampled": sum(p <= 0 for p in peaks), "self_rss_median_mb": statistics.median(own) if own else None,
        "sampler_overhead": (pack.get("sampler") or {}).get("overhead_fraction"),
    }


def report(out: Path) -> None:
    results = read_json(out / "results.json")
    rows = []
    for n in results["factors"]:
        m: dict[str, dict[str, Any] | None] = {}
        for start in STARTS:
            r = results["runs"].get(f"n{n}-{start}")
            m[start] = measure(Path(r["run_dir"])) if r else None
        fr, fk = m["fresh"] or {}, m["fork"] or {}

        rows.append([
            n, fmt(fr.get("spread_s")), fmt(fk.get("spread_s")), fmt(ratio(fr.get("spread_s"), fk.get("spread_s"))),
            fmt(fr.get("rss_per_training_mb"), 0), fmt(fk.get("rss_per_training_mb"), 0),
            fmt(fr.get("rss_total_mb"), 0), fmt(fk.get("rss_total_mb"), 0),
            f"{fr.get('unsampled', '-')}/{fk.get('unsampled', '-')}",
            f"{fmt(fr.get('self_rss_median_mb'), 0)}/{fmt(fk.get('self_rss_median_mb'), 0)}",
            f"{fmt(fr.get('wall_s'), 1)}/{fmt(fk.get('wall_s'), 1)}",
            f"{fr.get('completed', '-')}/{fk.get('completed', '-')}",
        ])
    label = " (--quick check, not a measurement)" if results.get("quick") else ""
    say("")
    say(table(["N", "spread s fresh", "spread s fork", "spread fresh/fork", "MB/training fresh",
               "MB/training fork", "pack MB fresh", "pack MB fork", "unsampled fr/fk", "self MB fr/fk",
               "pack wall s fr/fk", "completed fr/fk"], rows,
              title=f"Start spread (last loop_start - pack started_at) and sampler peak RSS, fresh vs fork{label}"))
    say(f"\nMB = sum of the sampler's per-training peak RSS (pack total) and that / N; sampler interval "
        f"{results['sample_interval_s']} s; 'unsampled' trainings read 0 MB in the sum (see the docstring).")
    say(f"records and logs: {out}")


def main() -> None:
    ap = parser("start_spread", __doc__, "N = 1, 4 only, to check that the script works")
    ap.add_argument("--factors", type=lambda s: [int(x) for x in s.split(",")],
                    help="comma-separated N (default 1,4,16,34; --quick: 1,4)")
    ap.add_argument("--sample-interval", type=float, default=0.2,
                    help="packing.sample_interval_s of every sweep (default 0.2)")
    args = ap.parse_args()
    if args.report:
        report(Path(args.report))
        return
    factors = args.factors or (QUICK_FACTORS if args.quick else FULL_FACTORS)
    out = out_dir("start_spread", args.out)
    run(out, factors, args.sample_interval, args.quick)
    report(out)


if __name__ == "__main__":
    main()
