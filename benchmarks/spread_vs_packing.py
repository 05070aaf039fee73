"""One training spread over k devices beside N trainings packed on one device: DDP (torch) and MirroredStrategy (Keras).

    .venv/bin/python benchmarks/spread_vs_packing.py            # full: both spread sweeps (~3 min here)
    .venv/bin/python benchmarks/spread_vs_packing.py --quick    # tiny sizes: checks the script works (~1 min)
    .venv/bin/python benchmarks/spread_vs_packing.py --report runs/benchmarks/spread_vs_packing/<stamp>   # re-print

What it runs (local default backend, this machine), one after the other, each into its own run directory:

    python -m gpupack +sweep=mnist_spread     run_dir=OUT/ddp        # DDP (gloo) over k=1,2 + process N=1,2
    python -m gpupack +sweep=mnist_tf_spread  run_dir=OUT/mirrored   # MirroredStrategy over k=1,2 + process N=1,2

(--quick adds packing.repeats=1 sweep.fixed.train_samples=2048 sweep.fixed.val_samples=500 sweep.fixed.epochs=1.)

What it measures, from each run's summary.json (its ``layouts``, written by gpupack's collector): for every layout, the
device-seconds per training (packed: the pack's wall / N; spread: k x the job's wall), as a ratio to N=1 packing
(= 1.00: what a user gets from one training per device, the way most small trainings run) and to the best layout;
one training's own wall (start to end); what DDP all-reduced per step. The user's alternative to packing, spreading
one training over more devices, is the spread rows. On this machine k CPU processes or logical CPU devices stand in
for k GPUs and share 2 cores: the figures compare the mechanisms' overheads, not GPUs.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PYTHON, bench_main, fmt, ratio, read_json, run_sweep, say, table, write_json  # noqa: E402

SWEEPS = {"ddp": "mnist_spread", "mirrored": "mnist_tf_spread"}
QUICK = ["packing.repeats=1", "sweep.fixed.train_samples=2048", "sweep.fixed.val_samples=500", "sweep.fixed.epochs=1"]


def run(out: Path, quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {"quick": quick, "runs": {}}
    for name, sweep in SWEEPS.items():
        argv = [PYTHON, "-m", "gpupack", f"+sweep={sweep}", f"run_dir={out / name}"] + (QUICK if quick else [])
        results["runs"][name] = run_sweep(argv, out, name)
    write_json(out / "results.json", results)
    return results


def report(out: Path) -> None:
    results = read_json(out / "results.json")
    label = " (--quick check, not a measurement)" if results.get("quick") else ""
    for name in SWEEPS:
        summary_path = Path(results["runs"][name]["run_dir"]) / "summary.json"
        if not summary_path.exists():
            say(f"{name}: no summary.json in {summary_path.parent} (the sweep failed: see {out / (name + '.log')})")
            continue
        summary = read_json(summary_path)
        layouts = summary.get("layouts") or []
        n1 = next((r["device_s_per_training"] for r in layouts if r["answer"] == "packing" and r["factor"] == 1), None)
        best = min((r["device_s_per_training"] for r in layouts if r.get("usable")), default=None)
        rows = [[r["layout"], fmt(r["devices_per_training"], 3), r["packs"], fmt(r["wall_s"]),
                 fmt(r["device_s_per_training"]), fmt(ratio(r["device_s_per_training"], n1)),
                 fmt(ratio(r["device_s_per_training"], best)),
                 fmt(r["allreduce_bytes_per_step"] / 2**20, 3) if r.get("allreduce_bytes_per_step") else "-",
                 "*" if r.get("best") else ""] for r in layouts]
        say("")
        say(table(["layout", "devices/training", "packs", "one training s", "device-s/training",
                   "device time vs N=1", "vs best", "MiB all-reduced/step", "best"], rows,
                  title=f"{name}: {SWEEPS[name]}{label}   [device time vs N=1 packing = 1.00; lower is better]"))
        for line in summary.get("verdicts") or []:
            say(line)
    say(f"\nrecords and logs: {out}")


def main() -> None:
    bench_main("spread_vs_packing", __doc__, "tiny sizes, to check that the script works", run, report)


if __name__ == "__main__":
    main()
