"""The best N on a quiet machine and on a busy one (a CPU hog on every core for the run's first seconds), for this
gpupack and, with --before, another checkout of it, side by side.

    .venv/bin/python benchmarks/busy_machine.py                          # the default sweep, quiet and busy
    .venv/bin/python benchmarks/busy_machine.py --before /path/to/older/checkout   # and an older gpupack beside it
    .venv/bin/python benchmarks/busy_machine.py --sweep 'packing.factors=[1,2]' --sweep packing.repeats=4
    .venv/bin/python benchmarks/busy_machine.py --quick                  # tiny sizes: checks the script works
    .venv/bin/python benchmarks/busy_machine.py --report runs/benchmarks/busy_machine/<stamp>      # re-print

What it runs (local default backend), for each checkout (this one, then --before's, each with PYTHONPATH set to its
folder and the command run from there, so its own gpupack runs), one after the other:

    python -m gpupack +sweep=mnist_pack [--sweep ...] run_dir=OUT/<checkout>-quiet
    python -m gpupack +sweep=mnist_pack [--sweep ...] run_dir=OUT/<checkout>-busy   # a hog on each core, first --hog-s

The hog is one `python -c "while True: pass"` a core, started with the sweep and killed after --hog-s seconds
(default 25): another user's job on a shared node, that ends during the run. What it reads, from each run's
summary.json: the best N and its gain over N=1 (trainings per hour, paired within rounds where the run has rounds),
whether that gain passes what the device can give (the run's own bound: min(N, cores) on a CPU; N x for a gpupack
before it), and what the run said of it (the best line or why it names none, the drift check, the packs measured under
foreign load), and the command's wall. A gain above the bound is impossible: the machine changed during the run, or
the reference was set up to lose. Compare figures of one run of this script side by side: a 2-core machine shared
with others moves by +-30 %.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PYTHON, checkouts, fmt, out_dir, read_json, say, table, tail, write_json  # noqa: E402

QUICK = ["packing.factors=[1,2]", "packing.repeats=2", "sweep.fixed.train_samples=2000", "sweep.fixed.epochs=1",
         "sweep.fixed.val_samples=500"]


def hogged(argv: list[str], log: Path, env: dict[str, str], hog_s: float, cwd: Path) -> int:
    """Run argv from ``cwd`` (``python -m`` imports gpupack from there first) with a CPU hog on every core for its
    first ``hog_s`` seconds (0: none); its exit status."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)] \
        if hog_s > 0 else []
    started = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + " ".join(argv) + (f"   # with {len(hogs)} hog(s) for {hog_s:g} s" if hogs else "") + "\n")
        f.flush()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if hogs and time.monotonic() - started >= hog_s:
                for h in hogs:
                    h.kill()
                    h.wait()
                hogs = []
            time.sleep(0.2)
    for h in hogs:
        h.kill()
        h.wait()
    return proc.returncode


def run(out: Path, trees: dict[str, Path], sweep: list[str], hog_s: float) -> dict[str, Any]:
    results: dict[str, Any] = {"sweep": sweep, "hog_s": hog_s, "runs": {}}
    for name, source in trees.items():
        env = {**os.environ, "PYTHONPATH": str(source)}
        for load, seconds in (("quiet", 0.0), ("busy", hog_s)):
            key = f"{name}-{load}"
            argv = [PYTHON, "-m", "gpupack", "+sweep=mnist_pack", *sweep, f"run_dir={out / key}"]
            say(f"running {key}: {' '.join(argv[1:])}" + (f" (hog on every core for {seconds:g} s)" if seconds else ""))
            t0 = time.monotonic()
            rc = hogged(argv, out / f"{key}.log", env, seconds, source)
            say(f"  exit {rc} after {time.monotonic() - t0:.0f} s")
            if rc != 0:
                say(tail(out / f"{key}.log"))
            results["runs"][key] = {"checkout": str(source), "load": load, "rc": rc, "run_dir": str(out / key),
                                    "wall_s": time.monotonic() - t0}
    write_json(out / "results.json", results)
    return results


def _said(summary: dict[str, Any]) -> list[str]:
    """What the run said of its answer: the best lines, the drift checks, the packs measured under load."""
    lines = list(summary.get("best_lines") or []) + list(summary.get("no_answer_lines") or [])
    lines += [f"drift: {d['change']:+.0%} ({d['pack_id']})" for d in summary.get("drift") or []]
    lines += list(summary.get("disturbance_lines") or [])
    return lines


def _bound(best: dict[str, Any]) -> float:
    """The gain bound the run's summary says (the device's: min(N, cores) on a CPU), else N / the reference's N (a
    gpupack before the device's bound)."""
    bound = best.get("gain_bound")
    return float(bound) if bound is not None else int(best["factor"]) / float(best.get("gain_ref") or 1)


def report(out: Path) -> None:
    results = read_json(out / "results.json")
    rows, said = [], []
    for key, entry in results["runs"].items():
        path = Path(entry["run_dir"]) / "summary.json"
        wall = f"{entry['wall_s']:.0f} s" if entry.get("wall_s") is not None else "-"
        if not path.exists():
            rows.append([key, "-", "-", "-", "-", "no summary", wall])
            continue
        summary = read_json(path)
        groups = summary.get("groups") or []
        named = summary.get("best") or []
        withheld = [g for g in groups if g.get("withheld")]
        for best in named + withheld:
            n = int(best["factor"])
            gain = best.get("gain", best.get("speedup_vs_n1"))  # a gpupack before rounds says speedup_vs_n1
            bound = _bound(best)
            answer = str(n) if best in named else f"none ({n}?)"
            rows.append([key, answer, fmt(gain) + ("x" if gain is not None else ""), f"{bound:g}x",
                         "yes" if gain is not None and gain > bound else "no",
                         "paired" if best.get("paired") else "medians", wall])
        said += [f"{key}: {line}" for line in _said(summary)]
    say(table(["run", "best N", "gain vs N=1", "bound", "above bound", "how", "wall"], rows,
              title=f"Best N, quiet and with a hog on every core for the first {results['hog_s']:g} s "
                    f"(+sweep=mnist_pack {' '.join(results['sweep'])})"))
    for line in said:
        say(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks that the script works")
    ap.add_argument("--out", help="output folder (default runs/benchmarks/busy_machine/<date>_<time>)")
    ap.add_argument("--report", metavar="OUT", help="re-print the table of an earlier run's folder; runs nothing")
    ap.add_argument("--before", metavar="DIR", help="another gpupack checkout, run beside this one")
    ap.add_argument("--sweep", action="append", default=[], help="an override of the sweep (repeatable)")
    ap.add_argument("--hog-s", type=float, default=25.0, help="seconds the hog runs from the sweep's start")
    args = ap.parse_args()
    if args.report:
        report(Path(args.report))
        return
    out = out_dir("busy_machine", args.out)
    run(out, checkouts(args.before), (QUICK if args.quick else []) + args.sweep, args.hog_s)
    report(out)


if __name__ == "__main__":
    main()
