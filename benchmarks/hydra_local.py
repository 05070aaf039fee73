"""A Hydra multirun on this machine: Hydra's own basic launcher against gpupack's launcher at its defaults.

    .venv/bin/python benchmarks/hydra_local.py            # full: 40 + 16 MNIST + 40 CPU-bound jobs (~4 min)
    .venv/bin/python benchmarks/hydra_local.py --quick    # 8, 4 and 8 jobs: checks the script works
    .venv/bin/python benchmarks/hydra_local.py --report runs/benchmarks/hydra_local/<stamp>   # re-print

Three apps, each run by both launchers, one after the other, from the repository root:

(a) one-second jobs: tests/hydra_app/app.py, whose task sleeps 1 s and imports nothing heavy, 40 jobs
    (``lr=range(1,41) sleep_s=1``): what a job's slot costs around its work (Hydra's job machinery, the start);
(b) MNIST jobs: examples/hydra_app.py, an app that imports torch inside its task function (as most apps do), 16
    jobs of the MNIST MLP on 2,000 samples (``seed=range(0,16)``): what the framework import costs each job;
(c) CPU-bound one-second jobs: the app of (a) burning 1 s of the CPU instead of sleeping (``sleep_s=0 burn_s=1``),
    40 jobs: the machinery a job pays under contention (issue 53, item 4). Four such jobs on this machine's 2 cores
    take 2 s of wall each, so 40 CPU-seconds on 2 cores are 20 s at the least: about 0.45 x the basic launcher's
    wall here is the floor of any launcher, whatever its overhead.

    basic:   python APP -m ARGS                                                  (Hydra's default launcher)
    gpupack: python APP -m hydra/launcher=gpupack_local hydra.launcher.pack=4 ARGS   (nothing else set)

The basic launcher runs the jobs one after another in its own process (each job's imports stay warm for the next);
gpupack's runs 4 at a time, each forked from a server that preloaded the app and learns what its jobs import.
From gpupack's records: a job's time in its slot (its fork to its end, as the pack saw it) against its task's own
time (the job function), median over jobs. The issue's goals (31): (a) wall <= 0.35 x basic (4 slots: 0.25 x is
the floor) and slot - task <= 0.3 s.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PYTHON, REPO, bench_main, fmt, median, ratio, read_json, run_logged, say, table, write_json  # noqa: E402,E501

APPS = {
    "one-second jobs": (REPO / "tests" / "hydra_app" / "app.py", ["sleep_s=1"], "lr=range(1,{n})", (40, 8)),
    "MNIST jobs (torch imported in the task)": (
        REPO / "examples" / "hydra_app.py", ["lr=0.05", "batch_size=128", "epochs=1", "train_samples=2000"],
        "seed=range(0,{n})", (16, 4)),
    "CPU-bound one-second jobs": (REPO / "tests" / "hydra_app" / "app.py", ["sleep_s=0", "burn_s=1"], "lr=range(1,{n})",
                                  (40, 8)),
}
LAUNCHERS = {"basic": [], "gpupack": ["hydra/launcher=gpupack_local", "hydra.launcher.pack=4"]}


def run(out: Path, quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {"quick": quick, "runs": {}}
    for a, (app, args, sweep, sizes) in enumerate(APPS.values()):
        jobs = sizes[1] if quick else sizes[0]
        for launcher, chosen in LAUNCHERS.items():
            key = f"app{a}-{launcher}"
            argv = [PYTHON, str(app), "-m", *chosen, *args, sweep.format(n=jobs + (1 if "lr" in sweep else 0)),
                    f"hydra.sweep.dir={out / key}"]
            say(f"running: {app.name} ({jobs} jobs), {launcher} launcher")
            rc, wall = run_logged(argv, out / f"{key}.log", env={"PYTHONPATH": str(REPO / "examples")})
            say(f"  exit {rc} after {wall:.1f} s")
            results["runs"][key] = {"app": str(app), "jobs": jobs, "launcher": launcher, "rc": rc, "wall_s": wall,
                                    "argv": argv[1:], "sweep_dir": str(out / key)}
    write_json(out / "results.json", results)
    return results


def slots(sweep_dir: Path) -> dict[str, Any]:
    """gpupack's records of one multirun: jobs completed, median slot and task seconds, median slot - task."""
    recs = [read_json(p) for p in sweep_dir.glob(".gpupack/*/packs/*/trainings/*.json")]
    done = [r for r in recs if r.get("status") == "completed"]
    slot = [float(r["wall_s"]) for r in done]
    task = [float(r["timings"]["loop_s"]) for r in done]
    return {"done": len(done), "slot_s": median(slot), "task_s": median(task),
            "around_s": median([s - t for s, t in zip(slot, task)]),
            "startup_s": median([float(r["timings"]["startup_s"]) for r in done])}


def report(out: Path) -> None:
    res = read_json(out / "results.json")
    rows = []
    for a, name in enumerate(APPS):
        basic, ours = res["runs"][f"app{a}-basic"], res["runs"][f"app{a}-gpupack"]
        s = slots(Path(ours["sweep_dir"]))
        rows.append([f"{name}, {ours['jobs']} jobs", fmt(basic["wall_s"], 1), fmt(ours["wall_s"], 1),
                     fmt(ratio(ours["wall_s"], basic["wall_s"])), f"{s['done']}/{ours['jobs']}",
                     fmt(s["slot_s"]), fmt(s["task_s"]), fmt(s["around_s"]), fmt(s["startup_s"]),
                     "ok" if basic["rc"] == ours["rc"] == 0 else f"exit {basic['rc']}/{ours['rc']}"])
    print(table(["app", "basic wall s", "gpupack wall s", "gpupack/basic", "done", "slot s", "task s",
                 "slot - task s", "start-up s", "exit"], rows,
                title="Hydra multirun on this machine: basic launcher vs gpupack_local pack=4 (medians over jobs)"))


def main() -> None:
    bench_main("hydra_local", __doc__, "8, 4 and 8 jobs, to check that the script works", run, report)


if __name__ == "__main__":
    main()
