"""The packing gain on the default sweep, fresh start vs fork start side by side.

    .venv/bin/python benchmarks/packing_gain.py            # full: the default sweep, twice (~6-8 min here)
    .venv/bin/python benchmarks/packing_gain.py --quick    # tiny sizes: checks the script works (~20 s)
    .venv/bin/python benchmarks/packing_gain.py --report runs/benchmarks/packing_gain/<stamp>   # re-print

What it runs (local default backend, this machine), one after the other, each into its own run directory:

    python -m gpupack +sweep=mnist_pack packing.process.start=fresh run_dir=OUT/fresh
    python -m gpupack +sweep=mnist_pack packing.process.start=fork  run_dir=OUT/fork

(--quick adds packing.factors=[1,2] packing.repeats=1 sweep.grid.lr=[0.1] sweep.grid.batch_size=[128]
sweep.fixed.train_samples=2000 sweep.fixed.epochs=1 sweep.fixed.val_samples=500.)

What it measures, from each run's summary.json (written by gpupack's collector):

- time per training (pack wall time / N, median over the packs of that N, min-max in brackets) for every N, for
  both starts. fresh = a new Python interpreter per training (each imports torch and reads MNIST); fork = each
  training forked from one server per pack that preloaded torch, the workload and the data (the preload counts in
  the pack's wall time);
- the gain of each (start, N) against N=1 with fresh start (= 1.00; higher is better: N=1 fresh time / this
  time) and fork's speedup over fresh at the same N;
- the best (mode, N) the collector names for each start, and its gain against N=1 fresh and against N=1 of the
  same start.

The run directories, each command's output (OUT/<start>.log) and results.json stay in OUT
(default runs/benchmarks/packing_gain/<date>_<time>/). On a noisy 2-core machine time per training moves by
about +-30 % between runs (README): compare figures of one run, side by side, rather than across runs.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PYTHON, bench_main, fmt, ratio, read_json, run_sweep, say, table, write_json  # noqa: E402

STARTS = ("fresh", "fork")
QUICK = ["packing.factors=[1,2]", "packing.repeats=1", "sweep.grid.lr=[0.1]", "sweep.grid.batch_size=[128]",
         "sweep.fixed.train_samples=2000", "sweep.fixed.epochs=1", "sweep.fixed.val_samples=500"]


def run(out: Path, quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {"quick": quick, "runs": {}}
    for start in STARTS:
        argv = [PYTHON, "-m", "gpupack", "+sweep=mnist_pack", f"packing.process.start={start}",
                f"run_dir={out / start}"]
        argv += QUICK if quick else []
        results["runs"][start] = run_sweep(argv, out, start)
    write_json(out / "results.json", results)
    return results


def report(out: Path) -> None:
    results = read_json(out / "results.json")
    groups: dict[str, dict[int, dict[str, Any]]] = {}
    best: dict[str, dict[str, Any]] = {}
    for start in STARTS:
        summary_path = Path(results["runs"][start]["run_dir"]) / "summary.json"
        if not summary_path.exists():
            say(f"{start}: no summary.json in {summary_path.parent} (the sweep failed: see {out / (start + '.log')})")
            groups[start] = {}
            continue
        summary = read_json(summary_path)
        # the default sweep has one mode (process); keep the mode in the key anyway
        groups[start] = {int(g["factor"]): g for g in summary["groups"] if g.get("time_per_training_s") is not None}
        if summary.get("best_overall"):
            best[start] = summary["best_overall"][0]
    base = groups.get("fresh", {}).get(1, {}).get("time_per_training_s")

    def cell(g: dict[str, Any] | None) -> str:
        if not g:
            return "-"
        flag = f" FAILED {g['failed']}" if g.get("failed") else ""
        return (f"{g['time_per_training_s']:.2f} ({g['tpt_min_s']:.2f}-{g['tpt_max_s']:.2f}) x{g['packs']}"
                f"{flag}")

    rows = []
    for n in sorted(set(groups.get("fresh", {})) | set(groups.get("fork", {}))):
        fr, fk = groups.get("fresh", {}).get(n), groups.get("fork", {}).get(n)
        t_fr = fr["time_per_training_s"] if fr else None
        t_fk = fk["time_per_training_s"] if fk else None
        rows.append([n, cell(fr), cell(fk), fmt(ratio(base, t_fr)), fmt(ratio(base, t_fk)), fmt(ratio(t_fr, t_fk)),
                     fmt(fr.get("startup_s") if fr else None), fmt(fk.get("startup_s") if fk else None)])
    label = " (--quick check, not a measurement)" if results.get("quick") else ""
    say("")
    say(table(["N", "fresh s/training (min-max) xpacks", "fork s/training (min-max) xpacks",
               "fresh gain", "fork gain", "fork/fresh speedup", "start-up s fresh", "start-up s fork"], rows,
              title=f"Time per training by N, fresh vs fork start{label}   [gain = N=1 fresh s/training / this; "
                    "N=1 fresh = 1.00]"))
    say("")
    brows = []
    for start in STARTS:
        b = best.get(start)
        if not b:
            brows.append([start, "-", "-", "-", "-", "-"])
            continue
        own_base = groups[start].get(1, {}).get("time_per_training_s")
        brows.append([start, f"{b['mode']}, N={int(b['factor'])}", fmt(b["time_per_training_s"]),
                      fmt(ratio(base, b["time_per_training_s"])), fmt(ratio(own_base, b["time_per_training_s"])),
                      fmt(results["runs"][start]["wall_s"], 1)])
    say(table(["start", "best (mode, N) by collector", "s/training", "gain vs N=1 fresh",
               "gain vs N=1 same start", "sweep wall s"], brows, title="Best (mode, N) the collector names"))
    if "fresh" in best and "fork" in best:
        gain = ratio(best["fresh"]["time_per_training_s"], best["fork"]["time_per_training_s"])
        say(f"\nbest fork vs best fresh: {fmt(gain)}x the trainings per hour")
    say(f"\nrecords and logs: {out}")


def main() -> None:
    bench_main("packing_gain", __doc__, "tiny sizes, to check that the script works", run, report)


if __name__ == "__main__":
    main()
