"""The README's main command, this tree against an earlier one, side by side on this machine.

    .venv/bin/python benchmarks/main_sweep.py                       # against 4f121c5 (issue 31's baseline), 2 rounds
    .venv/bin/python benchmarks/main_sweep.py --baseline REV --rounds 3
    .venv/bin/python benchmarks/main_sweep.py --report runs/benchmarks/main_sweep/<stamp>   # re-print

Runs `python -m gpupack +sweep=mnist_pack` (22 trainings, N = 1…4, the local backend) with this tree and with the
baseline's (a git worktree of REV, put first on PYTHONPATH), alternating, rounds × 2 runs in all: what a new user's
first command costs. For each run: its wall time (the process, start to end), and from its pack records the
whole-pack slot occupancy at each N (Σ training wall / (N × pack wall), over the N's packs) as each tree measures a
pack's wall: the baseline from the moment the pack was handed to its mode (its fork server's preload inside), this
tree from its first training's start (a lane's packs share one preloaded server). Timings on 2 shared cores move by
±30 % between runs: read the ratios of one round.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PYTHON, REPO, fmt, load_run, out_dir, read_json, say, table, write_json  # noqa: E402

BASELINE = "4f121c5"  # main when issue 31 was filed: the README's command took 68.1 s here
COMMAND = ["-m", "gpupack", "+sweep=mnist_pack"]


def occupancy(run_dir: Path) -> dict[int, float]:
    """Whole-pack slot occupancy at each N: Σ training wall / (N × pack wall) over the N's packs."""
    packs, trainings = load_run(run_dir)
    busy: dict[int, float] = defaultdict(float)
    slots: dict[int, float] = defaultdict(float)
    for t in trainings:
        busy[int(t["factor"])] += float(t["ended_at"]) - float(t["started_at"])
    for p in packs:
        slots[int(p["factor"])] += int(p["factor"]) * float(p["wall_s"])
    return {n: busy[n] / slots[n] for n in sorted(slots) if slots[n] > 0}


def one_run(out: Path, label: str, tree: Path, key: str) -> dict[str, Any]:
    """One run of the command with ``tree``'s gpupack, from ``tree`` (``python -m`` puts the working folder first
    on sys.path), no SLURM in its environment: the local backend, as a new user's first run."""
    run_dir = out / key
    env = {**{k: v for k, v in os.environ.items() if k != "SLURM_CONF"}, "PYTHONPATH": str(tree)}
    say(f"running {label}: python {' '.join(COMMAND)} (from {tree})")
    with open(out / f"{key}.log", "w") as log:
        began = time.perf_counter()
        rc = subprocess.run([PYTHON, *COMMAND, f"run_dir={run_dir}"], cwd=tree, env=env, stdout=log,
                            stderr=subprocess.STDOUT, timeout=1800).returncode
        wall = time.perf_counter() - began
    say(f"  exit {rc} after {wall:.1f} s")
    return {"rc": rc, "wall_s": wall, "occupancy": occupancy(run_dir) if rc == 0 else {}}


def run(out: Path, baseline: str, rounds: int) -> None:
    tree = out / "baseline_tree"
    subprocess.run(["git", "worktree", "add", "-f", "--detach", str(tree), baseline], cwd=REPO, check=True,
                   capture_output=True)
    try:
        results: dict[str, Any] = {"baseline": baseline, "head": _head(), "rounds": []}
        for i in range(rounds):
            results["rounds"].append({"baseline": one_run(out, f"{baseline} (round {i + 1})", tree, f"base_{i}"),
                                      "head": one_run(out, f"this tree (round {i + 1})", REPO, f"head_{i}")})
            write_json(out / "results.json", results)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)


def _head() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()


def report(out: Path) -> None:
    r = read_json(out / "results.json")
    ns = sorted({int(n) for rnd in r["rounds"] for side in rnd.values() for n in side["occupancy"]})
    rows = []
    for i, rnd in enumerate(r["rounds"]):
        b, h = rnd["baseline"], rnd["head"]
        for label, side in ((r["baseline"], b), (f"{r['head']} (this tree)", h)):
            rows.append([f"{i + 1}", label, fmt(side["wall_s"], 1),
                         fmt(h["wall_s"] / b["wall_s"]) if side is h and b["wall_s"] else "1.00",
                         *[fmt(side["occupancy"].get(str(n)), 2) for n in ns]])
    total_b = sum(rnd["baseline"]["wall_s"] for rnd in r["rounds"])
    total_h = sum(rnd["head"]["wall_s"] for rnd in r["rounds"])
    say(table(["round", "tree", "wall s", "× baseline", *[f"occupancy N={n}" for n in ns]], rows,
              "python -m gpupack +sweep=mnist_pack (22 trainings, local backend), side by side"))
    say(f"all rounds: {fmt(total_h, 1)} s against {fmt(total_b, 1)} s = {fmt(total_h / total_b)}× the baseline")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--baseline", default=BASELINE, help=f"the git revision to compare with (default {BASELINE})")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternating (default 2)")
    ap.add_argument("--out", help="output folder (default runs/benchmarks/main_sweep/<date>_<time>)")
    ap.add_argument("--report", metavar="OUT", help="re-print an earlier run's table; runs nothing")
    args = ap.parse_args()
    if args.report:
        report(Path(args.report))
        return
    out = out_dir("main_sweep", args.out)
    run(out, args.baseline, args.rounds)
    report(out)


if __name__ == "__main__":
    main()
