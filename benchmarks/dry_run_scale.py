"""How long a dry run of 100,000 trainings takes (checks, plan, the SLURM request and its forecast), for this gpupack
and, with --before, another checkout of it, side by side.

    .venv/bin/python benchmarks/dry_run_scale.py                          # this checkout (~30 s)
    .venv/bin/python benchmarks/dry_run_scale.py --before /tmp/before     # and an older one beside it
    .venv/bin/python benchmarks/dry_run_scale.py --report runs/benchmarks/dry_run_scale/<stamp>   # re-print

Two sweeps of 100,000 trainings, each a dry run on the local slurmctld's p100 partition (scripts/local_slurm.sh
start; nothing is submitted), at N=8:
    command:  python -m gpupack +sweep=command sweep.fixed.argv=[/bin/true,"{i}"] sweep.grid.i=range(0,100000) ...
              (one long axis that the check reads: its argv renders {i})
    mnist:    python -m gpupack +sweep=mnist_pack sweep.grid.lr=[1,000 values] sweep.grid.seed=range(0,100) ...
              (axes the check does not read: its model and data folder are fixed)
Each is run --repeats times (default 3) per checkout; the table shows the median wall and the ratio to --before's.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import (  # noqa: E402
    DEFAULT_SLURM_CONF,
    PYTHON,
    REPO,
    checkouts,
    fmt,
    median,
    out_dir,
    parser,
    read_json,
    say,
    table,
    write_json,
)

TRAININGS = 100_000
LRS = ",".join(f"{0.00001 * (i + 1):.5f}" for i in range(1000))
SWEEPS = {
    "command": ["+sweep=command", "sweep.fixed.argv=[/bin/true,\"{i}\"]", f"sweep.grid.i=range(0,{TRAININGS})",
                "cluster.cpus_per_training=0.25", "cluster.mem_gb_per_training=0.25"],
    "mnist": ["+sweep=mnist_pack", f"sweep.grid.lr=[{LRS}]", "sweep.grid.seed=range(0,100)",
              "sweep.grid.batch_size=[64]", "cluster.mem_gb_per_training=1"],
}


def dry_argv(sweep: str, run_dir: Path) -> list[str]:
    """The dry run of ``sweep`` (a key of SWEEPS) at N=8 on the local cluster's p100 partition."""
    return [PYTHON, "-m", "gpupack", *SWEEPS[sweep], "packing.factors=[8]", "packing.repeats=1", "cluster=slurm",
            "partitions=[p100]", f"run_dir={run_dir}", "dry_run=true"]


def time_dry(sweep: str, out: Path, checkout: Path = REPO, name: str = "this") -> dict[str, Any]:
    """One dry run from ``checkout`` (its gpupack on PYTHONPATH): exit status, wall, the jobs and files it forecast."""
    env = {**os.environ, "SLURM_CONF": os.environ.get("SLURM_CONF", DEFAULT_SLURM_CONF),
           "PYTHONPATH": str(checkout)}
    began = time.time()
    proc = subprocess.run(dry_argv(sweep, out / f"{name}-{sweep}"), capture_output=True, text=True, env=env,
                          cwd=checkout, timeout=900)
    wall = time.time() - began
    (out / f"{name}-{sweep}.log").write_text(proc.stdout + proc.stderr)
    text = " ".join(proc.stdout.split())  # the terminal's line breaks undone
    jobs = text.split(" jobs: ", 1)[-1].split(" files: ", 1)[0]
    files = text.split(" files: ", 1)[-1].split(" per training", 1)[0]
    return {"rc": proc.returncode, "wall_s": wall, "jobs_line": f"jobs: {jobs}", "files_line": f"files: {files} "
            "per training)"}


def run(out: Path, trees: dict[str, Path], repeats: int) -> None:
    results: dict[str, Any] = {"checkouts": {k: str(v) for k, v in trees.items()}, "runs": {}}
    for sweep in SWEEPS:
        for _ in range(repeats):  # interleaved, so a slower minute falls on both
            for name, checkout in trees.items():
                say(f"dry run of {TRAININGS:,} trainings ({sweep}) with {name} ({checkout})")
                r = time_dry(sweep, out, checkout, name)
                results["runs"].setdefault(f"{name}/{sweep}", []).append(r)
                say(f"  exit {r['rc']} after {r['wall_s']:.1f} s")
    write_json(out / "results.json", results)


def report(out: Path) -> None:
    r = read_json(out / "results.json")
    names = list(r["checkouts"])
    rows = []
    for sweep in SWEEPS:
        walls = {n: median(x["wall_s"] for x in r["runs"].get(f"{n}/{sweep}", []) if x["rc"] == 0) for n in names}
        ok = {n: all(x["rc"] == 0 for x in r["runs"].get(f"{n}/{sweep}", [])) for n in names}
        ratio = walls["this"] / walls["before"] if "before" in walls and walls["before"] and walls["this"] else None
        rows.append([sweep, *(fmt(walls[n], 1) + ("" if ok[n] else " (failed)") for n in names), fmt(ratio, 2)])
    say(table(["sweep", *(f"{n} s" for n in names), "this / before"], rows,
              f"dry run of {TRAININGS:,} trainings, median of {len(next(iter(r['runs'].values())))} "
              f"({', '.join(f'{n}: {p}' for n, p in r['checkouts'].items())})"))


def main() -> None:
    ap = parser("dry_run_scale", __doc__ or "", "one run per checkout instead of 3")
    ap.add_argument("--before", metavar="DIR", help="another gpupack checkout, run beside this one")
    args = ap.parse_args()
    if args.report:
        report(Path(args.report))
        return
    out = out_dir("dry_run_scale", args.out)
    run(out, checkouts(args.before), 1 if args.quick else 3)
    report(out)


if __name__ == "__main__":
    main()
