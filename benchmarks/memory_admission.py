"""Slots admitted by memory (packing.admission) against none, on a streaming sweep that mixes two memory sizes.

    .venv/bin/python benchmarks/memory_admission.py            # 16 trainings, N=4 (~40 s here)
    .venv/bin/python benchmarks/memory_admission.py --quick    # 8 trainings, shorter holds (~25 s)
    .venv/bin/python benchmarks/memory_admission.py --report runs/benchmarks/memory_admission/<stamp>   # re-print

The sweep: tests/fake_workloads.py's probe holding real host memory (every page touched) for a time that grows with
it, as a larger model's training is longer: 8 small trainings of 40 MB (0.4 s) and 8 large of 300 MB (3 s), seeds
0-7 in the grid's order (small, large, small, large, ...); --quick: seeds 0-3, half the hold times. They share a
programmed device of 800 MB on this machine's host memory (``hold_device``: the memory the trainings hold together;
an allocation that would pass 800 MB fails with MemoryError, which gpupack records as ``oom``, as a GPU's allocator
fails one past its memory). One streaming job of N=4 slots, ``packing.host_memory_mb=800`` (the lane's budget), one
after the other:

    calib:  the two settings once each (N=1): the earlier records admission takes each setting's peak from
    off:    python -m gpupack ... packing.factors=[4] packing.stream=on packing.admission=off
    on:     python -m gpupack ... packing.factors=[4] packing.stream=on packing.admission=on

From each run's records: trainings completed and ended oom; the most large ones that ran at once; collect's slot
occupancy (Σ training wall / (N x span), every training, oom ones included: ``summary.json``'s occupancy row) and
the same for the completed trainings alone (the slots' useful work); the lane's admission figures (trainings started
past a head that did not fit, looks that found nothing fitting); the command's wall. A 2-core machine is noisy:
compare within one run.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PYTHON, REPO, bench_main, fmt, load_run, read_json, run_sweep, say, table, write_json  # noqa: E402

SMALL_MB, LARGE_MB, DEVICE_MB, SLOTS = 40, 300, 800, 4
HOWS = ("off", "on")


def argv(out: Path, key: str, seeds: int, admission: str, factor: int, hold_s_per_100mb: float) -> list[str]:
    return [PYTHON, "-m", "gpupack", f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack",
            "~sweep.grid.lr", f"+sweep.grid.seed=[{','.join(map(str, range(seeds)))}]",
            f"+sweep.grid.hold_mb=[{SMALL_MB},{LARGE_MB}]", "sweep.fixed.steps=1", "sweep.fixed.sleep_s=0",
            f"+sweep.fixed.hold_s_per_100mb={hold_s_per_100mb}",
            f"+sweep.fixed.hold_device={out / 'device'}:{DEVICE_MB}",
            f"packing.factors=[{factor}]", "packing.stream=on", "packing.jobs=1", f"packing.host_memory_mb={DEVICE_MB}",
            f"packing.admission={admission}", f"run_dir={out / 'runs' / key}"]


def run(out: Path, quick: bool) -> dict[str, Any]:
    seeds, hold = (4, 0.5) if quick else (8, 1.0)
    results: dict[str, Any] = {"quick": quick, "trainings": 2 * seeds, "runs": {}}
    # the settings' earlier records: a sibling run directory under out/runs/, as runs/<sweep>/ holds them
    run_sweep(argv(out, "calib", 1, "off", 1, hold), out, "calib", "each setting once (earlier records)")
    for how in HOWS:
        ran = run_sweep(argv(out, how, seeds, how, SLOTS, hold), out, how, f"admission {how}")
        results["runs"][how] = {**ran, "run_dir": str(out / "runs" / how)}  # exit 1 without: trainings ended oom
    write_json(out / "results.json", results)
    return results


def at_once(trainings: list[dict[str, Any]], mb: float) -> int:
    """The most trainings of ``mb`` that ran at the same time."""
    spans = [(float(t["started_at"]), float(t["ended_at"])) for t in trainings if t["params"]["hold_mb"] == mb]
    return max((sum(s <= start < e for s, e in spans) for start, _ in spans), default=0)


def measure(run_dir: Path) -> dict[str, Any]:
    packs, trainings = load_run(run_dir)
    if not packs or not trainings:
        return {}
    (occupancy,) = read_json(run_dir / "summary.json")["occupancy"]
    done = [t for t in trainings if t["status"] == "completed"]
    span = max(float(t["ended_at"]) for t in trainings) - min(float(t["started_at"]) for t in trainings)
    useful = sum(float(t["ended_at"]) - float(t["started_at"]) for t in done) / (SLOTS * span)
    admission = packs[0].get("admission") or {}
    return {"completed": len(done), "oom": sum(t["status"] == "oom" for t in trainings),
            "large_at_once": at_once(trainings, LARGE_MB), "occupancy": occupancy["slot_occupancy"],
            "useful": useful, "span_s": span, "passed_over": admission.get("passed_over"),
            "waits": admission.get("waits")}


def report(out: Path) -> None:
    results = read_json(out / "results.json")
    n = results["trainings"]
    rows = []
    for how, entry in results["runs"].items():
        m = measure(Path(entry["run_dir"]))
        rows.append([f"admission {how}", f"{m.get('completed', 0)}/{n}", m.get("oom", "-"), m.get("large_at_once", "-"),
                     fmt(m.get("occupancy")), fmt(m.get("useful")), fmt(m.get("span_s"), 1),
                     fmt(m.get("passed_over")), fmt(m.get("waits")), fmt(entry["wall_s"], 1)])
    label = " (--quick check, not a measurement)" if results.get("quick") else ""
    say("")
    say(table(["run", "completed", "oom", "large at once", "slot occupancy", "completed occupancy", "span s",
               "passed over", "waits", "command s"], rows,
              title=f"{n // 2} x {SMALL_MB} MB and {n // 2} x {LARGE_MB} MB trainings, N={SLOTS}, a {DEVICE_MB} MB "
                    f"budget{label}"))
    say(f"\nrecords and logs: {out}")


def main() -> None:
    bench_main("memory_admission", __doc__, "8 trainings, shorter holds: checks that the script works", run, report)


if __name__ == "__main__":
    main()
