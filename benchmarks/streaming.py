"""Whole packs against streaming on a sweep of unequal trainings: makespan and how busy the device was.

    .venv/bin/python benchmarks/streaming.py            # full: 12 MNIST trainings, N=2 and N=4 (~3 min here)
    .venv/bin/python benchmarks/streaming.py --quick    # tiny sizes: checks the script works (~40 s)
    .venv/bin/python benchmarks/streaming.py --report runs/benchmarks/streaming/<stamp>   # re-print

A sweep mixes lengths as real sweeps do: 12 MNIST-MLP trainings, lr [0.05, 0.1, 0.2] x batch_size [64, 128] x
epochs [1, 4], 20,000 samples (--quick: 2,000 and epochs [1, 2]). For N = 2 and 4, on the local backend (this
machine: one device slot, so K = 1 job at a time), one after the other:

    whole packs:  python -m gpupack +sweep=mnist_pack packing.factors=[N] packing.repeats=1 packing.stream=off ...
    streaming:    python -m gpupack +sweep=mnist_pack packing.factors=[N] packing.stream=on ...

Whole packs is what gpupack (and any pack-per-job tool) did before: 12/N packs, each its own job, each waiting for
its slowest training and each preloading torch and the data again. Streaming is one job of N slots, each slot taking
the next training as it frees. From the records of each run:

- Σ wall: the trainings' own walls added up (the work; the same trainings either way);
- makespan: the first job's start (its preload included) to the last training's end;
- ideal: Σ wall / (K x N), every slot busy all the time, no preload;
- occupancy: Σ wall / (N x K x span), span = the first training's start to the last one's end (1.00: no slot ever
  idle between them);
- makespan / (ideal + one preload), where one preload = the first job's start to its first training's start: the
  issue's goal is occupancy >= 0.97 and this <= 1.05;
- command s: the whole command as a user waits for it (collect and the report included).

Then the same for a Hydra multirun of 6 jobs of unequal length through gpupack's launcher (tests/hydra_app/app.py,
jobs that sleep 0.5 s or 3 s: lr=0.1,0.2,0.3 x sleep_s=0.5,3), hydra.launcher.pack=2, stream=off (whole packs)
and stream=on, with the idle slot-seconds: Σ over pack jobs of (slots x job wall) less Σ job wall.

The run directories, each command's output and results.json stay in OUT (default
runs/benchmarks/streaming/<date>_<time>/). A 2-core machine is noisy: compare within one run.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PYTHON, bench_main, fmt, load_run, ratio, read_json, run_sweep, say, table, write_json  # noqa: E402

HOWS = {"whole packs": "off", "streaming": "on"}
FACTORS = (2, 4)
GRID = ["~sweep.fixed.epochs", "sweep.grid.lr=[0.05,0.1,0.2]", "sweep.grid.batch_size=[64,128]"]
FULL = [*GRID, "+sweep.grid.epochs=[1,4]", "sweep.fixed.train_samples=20000", "sweep.fixed.val_samples=2000"]
QUICK = [*GRID, "+sweep.grid.epochs=[1,2]", "sweep.fixed.train_samples=2000", "sweep.fixed.val_samples=500"]


def run(out: Path, quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {"quick": quick, "runs": {}}
    for n in FACTORS:
        for how, stream in HOWS.items():
            key = f"n{n}-{stream}"
            argv = [PYTHON, "-m", "gpupack", "+sweep=mnist_pack", f"packing.factors=[{n}]", "packing.repeats=1",
                    f"packing.stream={stream}", "packing.process.start=fork", f"run_dir={out / key}",
                    *(QUICK if quick else FULL)]
            results["runs"][key] = {**run_sweep(argv, out, key, f"{how}, N={n}"), "n": n, "how": how}
    app = Path(__file__).resolve().parent.parent / "tests" / "hydra_app" / "app.py"
    for how, stream in HOWS.items():
        key = f"launcher-{stream}"
        argv = [PYTHON, str(app), "-m", "hydra/launcher=gpupack_local", "hydra.launcher.pack=2",
                f"hydra.launcher.stream={stream}", "lr=0.1,0.2,0.3", "sleep_s=0.5,3", f"hydra.sweep.dir={out / key}"]
        results["launcher"] = {**results.get("launcher", {}), how: run_sweep(argv, out, key, f"launcher, {how}")}
    write_json(out / "results.json", results)
    return results


def idle(sweep_dir: Path) -> dict[str, Any]:
    """A launch's pack jobs: how many, Σ slot-seconds, Σ busy and the idle slot-seconds between."""
    packs = [read_json(p) for p in sweep_dir.glob(".gpupack/*/packs/*/pack.json")]
    slot_s = sum(float(p.get("slots") or p["factor"]) * float(p["wall_s"]) for p in packs)
    busy = sum(float(p.get("busy_s") or 0) for p in packs)
    return {"jobs": len(packs), "done": sum(int(p["n_completed"]) for p in packs), "slot_s": slot_s, "busy_s": busy,
            "idle_s": slot_s - busy}


def measure(run_dir: Path, n: int) -> dict[str, Any]:
    """Makespan, occupancy and the rest from one run's records (the latest attempt of each)."""
    packs, trainings = load_run(run_dir)
    if not packs or not trainings:
        return {}
    done = [t for t in trainings if t["status"] == "completed"]
    first_start = min(float(p["started_at"]) for p in packs)
    first_training = min(float(t["started_at"]) for t in trainings)
    last_end = max(float(t["ended_at"]) for t in trainings)
    jobs_at_once = 1  # the local backend on a CPU machine: one device slot
    work = sum(float(t["ended_at"]) - float(t["started_at"]) for t in trainings)
    span = last_end - first_training
    ideal = work / (jobs_at_once * n)
    first_pack = min(packs, key=lambda p: float(p["started_at"]))
    preload = min(float(t["started_at"]) for t in trainings if t["pack_id"] == first_pack["pack_id"]) \
        - float(first_pack["started_at"])
    makespan = last_end - first_start
    return {"trainings": len(trainings), "completed": len(done), "jobs": len(packs), "work_s": work,
            "makespan_s": makespan, "ideal_s": ideal, "preload_s": preload, "occupancy": work / (n * span),
            "vs_ideal": makespan / (ideal + preload),
            "slot_occupancy": sum(float(p.get("busy_s") or 0) for p in packs)
            / sum(float(p.get("slots") or n) * float(p["wall_s"]) for p in packs)}


def report(out: Path) -> None:
    results = read_json(out / "results.json")
    rows = []
    by: dict[tuple[int, str], dict[str, Any]] = {}
    for entry in results["runs"].values():
        m = measure(Path(entry["run_dir"]), entry["n"])
        by[(entry["n"], entry["how"])] = {**m, "wall_s": entry["wall_s"]}
        rows.append([f"N={entry['n']} {entry['how']}", m.get("jobs", "-"), f"{m.get('completed', 0)}/12",
                     fmt(m.get("work_s"), 1), fmt(m.get("makespan_s"), 1), fmt(m.get("ideal_s"), 1),
                     fmt(m.get("preload_s"), 1), fmt(m.get("occupancy")), fmt(m.get("slot_occupancy")),
                     fmt(m.get("vs_ideal")), fmt(entry["wall_s"], 1)])
    label = " (--quick check, not a measurement)" if results.get("quick") else ""
    say("")
    say(table(["run", "jobs", "done", "Σ wall s", "makespan s", "ideal s", "preload s", "occupancy",
               "slot occupancy", "makespan/(ideal+preload)", "command s"], rows,
              title=f"Whole packs against streaming, 12 unequal trainings{label}"))
    say("")
    ratios = []
    for n in FACTORS:
        whole, streamed = by.get((n, "whole packs"), {}), by.get((n, "streaming"), {})
        ratios.append([f"N={n}", fmt(ratio(streamed.get("makespan_s"), whole.get("makespan_s"))),
                       fmt(ratio(streamed.get("wall_s"), whole.get("wall_s"))),
                       fmt(ratio(streamed.get("occupancy"), whole.get("occupancy")))])
    say(table(["N", "makespan streaming / whole", "command streaming / whole", "occupancy streaming / whole"],
              ratios, title="Streaming as a multiple of whole packs (below 1: faster; occupancy above 1: busier)"))
    launcher = results.get("launcher", {})
    if launcher:
        lrows, figures = [], {}
        for how, entry in launcher.items():
            figures[how] = {**idle(Path(entry["run_dir"])), "wall_s": entry["wall_s"]}
            m = figures[how]
            lrows.append([how, m["jobs"], f"{m['done']}/6", fmt(m["busy_s"], 1), fmt(m["slot_s"], 1),
                          fmt(m["idle_s"], 1), fmt(m["wall_s"], 1)])
        say("")
        say(table(["launcher, pack=2", "pack jobs", "done", "Σ job wall s", "slot-s", "idle slot-s", "command s"],
                  lrows, title="A Hydra multirun of 6 unequal jobs through gpupack's launcher"))
        whole, streamed = figures.get("whole packs", {}), figures.get("streaming", {})
        say(f"streaming / whole packs: idle slot-s {fmt(ratio(streamed.get('idle_s'), whole.get('idle_s')))}, "
            f"command {fmt(ratio(streamed.get('wall_s'), whole.get('wall_s')))}")
    say(f"\nrecords and logs: {out}")


def main() -> None:
    bench_main("streaming", __doc__, "tiny sizes, to check that the script works", run, report)


if __name__ == "__main__":
    main()
