"""Fused vs process: time per training of the MNIST MLP at N = 2, 4, 8, 16, both modes in one sweep.

    .venv/bin/python benchmarks/fused_vs_process.py            # full (~4-6 min here)
    .venv/bin/python benchmarks/fused_vs_process.py --quick    # N = 2, 4, small data: checks the script works

What it runs (local default backend), one sweep, both modes measured side by side by gpupack itself:

    python -m gpupack +sweep=mnist_pack packing.modes=[process,fused] packing.factors=[1,2,4,8,16]
        packing.repeats=2 sweep.grid.lr=[0.02,0.05,0.1,0.2] sweep.grid.batch_size=[128] sweep.grid.seed=[0,1,2,3]
        sweep.fixed.train_samples=10000 sweep.fixed.epochs=1 sweep.fixed.val_samples=2000

process starts each training forked from the pack's preloaded server (packing.process.start=auto); fused trains the N
models of a pack as one batched model (torch.func) in one process. Both count their start-up (server preload, the
shared process's start) in the pack's wall time. It prints time per training for each (mode, N), fused/process at
each N, and each mode's best N with the ratio of the two bests (the issue's goal: fused best <= 1/3 of process best).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PYTHON, fmt, out_dir, parser, ratio, read_json, run_logged, say, table, tail, write_json  # noqa: E402

FULL = ["packing.factors=[1,2,4,8,16]", "packing.repeats=2", "sweep.grid.lr=[0.02,0.05,0.1,0.2]",
        "sweep.grid.batch_size=[128]", "sweep.grid.seed=[0,1,2,3]", "sweep.fixed.train_samples=10000",
        "sweep.fixed.epochs=1", "sweep.fixed.val_samples=2000"]
QUICK = ["packing.factors=[1,2,4]", "packing.repeats=1", "sweep.grid.lr=[0.05,0.1]", "sweep.grid.batch_size=[128]",
         "sweep.grid.seed=[0]", "sweep.fixed.train_samples=2000", "sweep.fixed.epochs=1", "sweep.fixed.val_samples=500"]


def report(run_dir: Path) -> str:
    summary = read_json(run_dir / "summary.json")
    by = {(g["mode"], int(g["factor"])): g for g in summary["groups"]}
    factors = sorted({n for _, n in by})
    rows = []
    for n in factors:
        p, f = by.get(("process", n), {}), by.get(("fused", n), {})
        rows.append([n, fmt(p.get("time_per_training_s")), fmt(f.get("time_per_training_s")),
                     fmt(ratio(f.get("time_per_training_s"), p.get("time_per_training_s"))),
                     fmt(p.get("startup_s")), fmt(f.get("startup_s")), p.get("failed", "-"), f.get("failed", "-")])
    best = {b["mode"]: b for b in summary["best"]}
    bp, bf = best.get("process", {}), best.get("fused", {})
    lines = [table(["N", "process s/training", "fused s/training", "fused/process", "process start-up s",
                    "fused start-up s", "process failed", "fused failed"], rows,
                   title="Time per training (pack wall / N, median over packs)"),
             f"best process: N={bp.get('factor')} {fmt(bp.get('time_per_training_s'))} s; best fused: "
             f"N={bf.get('factor')} {fmt(bf.get('time_per_training_s'))} s; fused best / process best = "
             f"{fmt(ratio(bf.get('time_per_training_s'), bp.get('time_per_training_s')))} (goal <= 0.33)"]
    return "\n".join(lines)


def main() -> int:
    args = parser("fused_vs_process", __doc__, "tiny sizes: checks the script works").parse_args()
    if args.report:
        print(report(Path(args.report) / "run"))
        return 0
    out = out_dir("fused_vs_process", args.out)
    argv = [PYTHON, "-m", "gpupack", "+sweep=mnist_pack", "packing.modes=[process,fused]",
            *(QUICK if args.quick else FULL), f"run_dir={out / 'run'}"]
    say("running: " + " ".join(argv[1:]))
    code, wall = run_logged(argv, out / "sweep.log")
    if code != 0:
        print(tail(out / "sweep.log"), file=sys.stderr)
        return code
    text = report(out / "run")
    (out / "report.txt").write_text(text + "\n")
    write_json(out / "results.json", {"argv": argv[1:], "wall_s": wall})
    print(f"{text}\n(sweep wall {wall:.0f} s; run directory {out / 'run'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
