"""A sweep larger than the site's limits, on the local slurmctld: gpupack's lanes against a job array of one task per
training (what a user writes by hand, or with submitit's map_array).

    .venv/bin/python benchmarks/cluster_scale.py            # full: 2,000 trainings, N=8 (~5 min here)
    .venv/bin/python benchmarks/cluster_scale.py --quick    # 200 trainings (~1 min)
    .venv/bin/python benchmarks/cluster_scale.py --report runs/benchmarks/cluster_scale/<stamp>   # re-print

Needs the local cluster (scripts/local_slurm.sh start) and root. The site's limits are lowered for the run, as a real
site's are (scripts/local_slurm.sh limits): MaxArraySize=50 and MaxSubmitJobs=20 for this user; they are put back
after. The trainings are a program that ends at once (the `command` workload running /bin/true), so the figures are
gpupack's own overhead and its jobs, not training:

    gpupack:  python -m gpupack +sweep=command sweep.fixed.argv=[/bin/true,{i}] sweep.grid.i=range(0,T)
              packing.factors=[8] packing.repeats=1 cluster=slurm partitions=[p100] cluster.cpus_per_training=0.25
              cluster.mem_gb_per_training=0.25
              (whole packs in lanes, as a measurement of N runs; and again with packing.stream=on packing.jobs=20,
              a production run: 20 streaming lanes of 8 slots drain the trainings)
    by hand:  submitit's map_array of T tasks (one job per training), the same program

For each: whether it ran to its end, the jobs SLURM saw (sacct), trainings completed (each once?), files left in
its folder (and per training), wall time. Then a dry run of 100,000 trainings: how long planning takes, and the
jobs and files it forecasts. A 2-core machine under three slurmd nodes: compare within one run.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import DEFAULT_SLURM_CONF, PYTHON, REPO, bench_main, fmt, read_json, say, table, write_json  # noqa: E402
from dry_run_scale import time_dry  # noqa: E402

from gpupack.core.store.journal import read_folded  # noqa: E402
from gpupack.core.store.rundir import RunDir  # noqa: E402

MAX_ARRAY_SIZE, MAX_SUBMIT_JOBS, N = 50, 20, 8


def _env() -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": os.environ.get("SLURM_CONF", DEFAULT_SLURM_CONF)}


def _limits(*numbers: int) -> None:
    subprocess.run([str(REPO / "scripts" / "local_slurm.sh"), "limits", *map(str, numbers)], env=_env(), check=True,
                   capture_output=True, timeout=120)


def _jobs_since(since: str, name: str) -> int:
    """Jobs (array tasks each) SLURM recorded since ``since`` whose name starts with ``name``."""
    out = subprocess.run(["sacct", "-X", "-n", "-a", "-P", "-S", since, "-o", "JobID,JobName"],
                         capture_output=True, text=True, env=_env()).stdout
    return sum(1 for line in out.splitlines() if line.partition("|")[2].startswith(name))


def _files(folder: Path) -> int:
    return sum(1 for p in folder.rglob("*") if p.is_file())


def _inodes(folder: Path) -> int:
    """Files and folders below ``folder`` and itself: what a file-count quota counts."""
    return 1 + sum(1 for _ in folder.rglob("*"))


def gpupack_run(out: Path, trainings: int, stream: bool = False) -> dict[str, Any]:
    name = "gpupack_stream" if stream else "gpupack"
    run_dir = out / name
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    argv = [PYTHON, "-m", "gpupack", "+sweep=command", "sweep.fixed.argv=[/bin/true,\"{i}\"]",
            f"sweep.grid.i=range(0,{trainings})", f"packing.factors=[{N}]", "packing.repeats=1", "cluster=slurm",
            "partitions=[p100]", "cluster.poll_s=1", "cluster.cpus_per_training=0.25",
            "cluster.mem_gb_per_training=0.25", f"run_dir={run_dir}"]
    if stream:
        argv += ["packing.stream=on", f"packing.jobs={MAX_SUBMIT_JOBS}"]
    say(f"running gpupack: {trainings} trainings at N={N}" + (" in streaming lanes" if stream else ""))
    began = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(), cwd=REPO, timeout=3600)
    wall = time.time() - began
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    folded = read_folded(RunDir(run_dir))  # what the lanes folded, every record each kept (earlier attempts too)
    recs = [read_json(p) for p in run_dir.glob("packs/*/trainings/*.json")] + \
        [r for history in folded.trainings.values() for r in history]
    once = Counter(r["training_id"] for r in recs)
    return {"rc": proc.returncode, "wall_s": wall, "jobs": _jobs_since(since, "gpupack-"), "trainings": trainings,
            "completed": sum(r["status"] == "completed" for r in recs), "ran_twice": sum(c > 1 for c in once.values()),
            "files": _files(run_dir), "packs": len(list(run_dir.glob("packs/*/pack.json"))) + len(folded.packs),
            "submitit_files": _files(run_dir / "submitit"), "lane_files": _files(run_dir / "lanes"),
            "inodes": _inodes(run_dir), "lanes": len(list(run_dir.glob("lanes/*.jsonl")))}


def default_sweep(out: Path) -> dict[str, Any]:
    """The README's main command (the default sweep, on this machine): its run directory's files per training."""
    run_dir = out / "default"
    say("running the default sweep (python -m gpupack +sweep=mnist_pack)")
    proc = subprocess.run([PYTHON, "-m", "gpupack", "+sweep=mnist_pack", f"run_dir={run_dir}"], capture_output=True,
                          text=True, cwd=REPO, timeout=1800, env={k: v for k, v in os.environ.items()
                                                                  if k != "SLURM_CONF"})
    (out / "default.log").write_text(proc.stdout + proc.stderr)
    trainings = sum(len(p["trainings"]) for p in read_json(run_dir / "plan.json")["packs"])
    return {"rc": proc.returncode, "trainings": trainings, "files": _files(run_dir), "inodes": _inodes(run_dir)}


def by_hand(out: Path, trainings: int) -> dict[str, Any]:
    """submitit's map_array of one task per training: SLURM refuses an array past MaxArraySize."""
    import submitit

    folder = out / "by_hand"
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    os.environ["SLURM_CONF"] = _env()["SLURM_CONF"]
    executor = submitit.SlurmExecutor(folder=str(folder))
    executor.update_parameters(time=10, partition="p100", gpus_per_node="p100:1", cpus_per_task=1, mem="1G",
                               array_parallelism=MAX_SUBMIT_JOBS)
    say(f"running by hand: submitit map_array of {trainings} tasks")
    began = time.time()
    error, completed = "", 0
    try:
        jobs = executor.map_array(subprocess.call, [["/bin/true", str(i)] for i in range(trainings)])
        completed = sum(j.result() == 0 for j in jobs)
    except Exception as err:  # what the user sees
        error = str(err).strip().splitlines()[-1][:160]
    return {"wall_s": time.time() - began, "jobs": _jobs_since(since, "submitit"), "trainings": trainings,
            "completed": completed,
            "error": error, "files": _files(folder) if folder.exists() else 0}


def dry_run(out: Path) -> dict[str, Any]:
    """The dry run of 100,000 trainings (benchmarks/dry_run_scale.py's command sweep, once)."""
    return time_dry("command", out)


def run(out: Path, quick: bool) -> None:
    trainings = 200 if quick else 2000
    _limits(MAX_ARRAY_SIZE, MAX_SUBMIT_JOBS)
    try:
        results = {"trainings": trainings, "max_array_size": MAX_ARRAY_SIZE, "max_submit_jobs": MAX_SUBMIT_JOBS,
                   "gpupack": gpupack_run(out, trainings), "stream": gpupack_run(out, trainings, stream=True),
                   "by_hand": by_hand(out, trainings), "dry": dry_run(out)}
    finally:
        _limits()
    results["default"] = default_sweep(out)
    write_json(out / "results.json", results)


def report(out: Path) -> None:
    r = read_json(out / "results.json")
    h, d = r["by_hand"], r["dry"]
    ours = [(label, r[key]) for label, key in (("lanes of whole packs", "gpupack"), ("streaming lanes", "stream"))
            if key in r]  # results written before streaming lanes were measured have the first only
    rows = [[f"gpupack ({label})", "yes" if g["rc"] == 0 else f"no (exit {g['rc']})", g["jobs"],
             f"{g['completed']}/{g['trainings']}", g["ran_twice"], g["files"], fmt(g["files"] / g["trainings"], 3),
             fmt(g["wall_s"], 1)] for label, g in ours]
    rows.append(["a task per training (submitit)", "yes" if not h["error"] else "no", h["jobs"],
                 f"{h['completed']}/{h['trainings']}", "-", h["files"], fmt(h["files"] / h["trainings"]),
                 fmt(h["wall_s"], 1)])
    say(table(["", "ran to its end", "jobs (sacct)", "completed", "run twice", "files", "files/training", "wall s"],
              rows, f"{r['trainings']} trainings, MaxArraySize={r['max_array_size']}, MaxSubmitJobs="
                    f"{r['max_submit_jobs']}, N={N}"))
    if h["error"]:
        say(f"a task per training: {h['error']}")
    for label, g in ours:
        say(f"gpupack's files ({label}): {g['submitit_files']} of submitit's (3 a job: its call, result and log; a "
            f"folder an array), {g['lane_files']} in lanes/ (the lanes' journals, columnar files and logs, and failed "
            f"trainings' logs), {g['files'] - g['submitit_files'] - g['lane_files']} of the "
            f"run's own; with its folders, {g.get('inodes', '?')} entries "
            f"({fmt(g.get('inodes', 0) / g['trainings'], 3)} per training), what a file-count quota counts")
    say(f"dry run of 100,000 trainings: {fmt(d['wall_s'], 1)} s; {d['jobs_line']}; {d['files_line']}")
    if "default" in r:
        df = r["default"]
        say(f"the default sweep (python -m gpupack +sweep=mnist_pack, local backend: its packs in one lane, not "
            f"folded): {df['files']} "
            f"files for {df['trainings']} trainings, {fmt(df['files'] / max(1, df['trainings']))} per training"
            + ("" if df["rc"] == 0 else f" (exit {df['rc']})"))


if __name__ == "__main__":
    bench_main("cluster_scale", __doc__ or "", "200 trainings instead of 2,000", run, report)
