"""The same 32 MNIST-MLP trainings on SLURM: hydra-submitit-launcher vs gpupack (CLI and Hydra launcher).

    export SLURM_CONF=/tmp/gpupack-slurm/etc/slurm.conf        # the local cluster (scripts/local_slurm.sh); default
    .venv/bin/python benchmarks/vs_submitit.py                 # full: 32 trainings, 1 round (~4-6 min here)
    .venv/bin/python benchmarks/vs_submitit.py --rounds 3      # 3 rounds, tools alternated, medians printed
    .venv/bin/python benchmarks/vs_submitit.py --quick         # 8 trainings of 2000 samples (~1 min)
    .venv/bin/python benchmarks/vs_submitit.py --report runs/benchmarks/vs_submitit/<stamp>   # re-print

32 trainings of the MNIST MLP (784-128-10, SGD lr 0.05 momentum 0.9, batch 128, train_samples=10000, epochs=1,
2000 validation images, seeds 0..31) on the local slurmctld, partition p100 (one node: 8 CPUs, 16000 MB, 2 GPUs
gpu:p100:2, the GPUs fake, all three nodes sharing this machine's 2 real cores). Five tools, run in this order in
each round (--rounds K alternates them K times), each from the repository root:

(i) submitit: hydra-submitit-launcher with examples/hydra_app.py, one job per training, each 1 GPU, 1 CPU, 2 GB,
    2 jobs at once:
      python examples/hydra_app.py -m hydra/launcher=submitit_slurm hydra.launcher.partition=p100
        hydra.launcher.gres=gpu:p100:1 hydra.launcher.cpus_per_task=1 hydra.launcher.mem_gb=2
        hydra.launcher.timeout_min=10 hydra.launcher.array_parallelism=2
        "hydra.launcher.setup=['export OMP_NUM_THREADS=1']" hydra.sweep.dir=DIR
        lr=0.05 batch_size=128 epochs=1 train_samples=10000 'seed=range(0,32)'
    OMP_NUM_THREADS=1: this cluster runs TaskPlugin=task/none, so nothing binds a job to its one CPU and torch would
    start 2 threads per job (2 jobs x 2 threads on 2 cores); on a real cluster the job's cgroup gives torch one core.
    gpupack gives each training 1 thread here too (cores // N).
(ii) gpupack N=4 and gpupack N=8: gpupack's CLI, 32 trainings (the grid is the 32 seeds, lr and batch size fixed),
    forked from one preloaded server per pack:
      python -m gpupack +sweep=mnist_pack cluster=slurm partitions=[p100] cluster.poll_s=0.5
        cluster.cpus_per_training=0.5 cluster.mem_gb_per_training=0.75 cluster.timeout_min=10
        packing.factors=[N] packing.repeats=1 packing.process.start=fork sweep.grid.lr=[0.05]
        sweep.grid.batch_size=[128]
        'sweep.grid.seed=range(0,32)' sweep.fixed.train_samples=10000 sweep.fixed.epochs=1
        sweep.fixed.val_samples=2000 run_dir=DIR
    cpus_per_training=0.5, mem_gb_per_training=0.75: a pack of N=8 then asks ceil(8 x 0.5) = 4 CPUs and 6 GB, so two
    packs (8 CPUs, 12 GB) fit the node at once and the node's 2 GPUs bound how many run together, as they bound the
    2 submitit jobs. gpupack's defaults (1 CPU, 2 GB per training) would ask 8 CPUs and 16 GB for one pack of 8:
    more memory than the node's 16000 MB (refused), and even at 1.9 GB one pack would take all 8 CPUs.
(iii) launcher pack=4 defaults: gpupack's Hydra launcher with the same app and shares, nothing else said (its server
    preloads what the app's files import and learns what its jobs import); launcher pack=4 fork and launcher pack=4
    fresh: the same launcher, the same shares
    per job, its jobs forked from one server per pack that preloaded the app and torch (start=fork; the app imports
    torch inside its task function, so hydra.launcher.preload names it), or each a fresh interpreter (start=fresh):
      python examples/hydra_app.py -m hydra/launcher=gpupack_slurm hydra.launcher.pack=4 hydra.launcher.start=fork
        hydra.launcher.preload=[torch]
        hydra.launcher.partition=p100 hydra.launcher.gres=gpu:p100:1 hydra.launcher.poll_s=0.5
        hydra.launcher.cpus_per_task=0.5 hydra.launcher.mem_gb=0.75 hydra.launcher.timeout_min=10
        hydra.sweep.dir=DIR lr=0.05 batch_size=128 epochs=1 train_samples=10000 'seed=range(0,32)'
Every command runs with PYTHONPATH=examples (the submitit jobs unpickle hydra_app's main, which imports
examples/mnist_mlp.py; without it every submitit job fails with "No module named 'mnist_mlp'").

For each tool and round:
- wall s: the whole command, submission to return, as a user waits for it;
- GPU-s billed: the sum over its SLURM jobs of sacct ElapsedRaw x the GPU count in AllocTRES (gres/gpu=K);
  job ids from DIR/.submitit/<job>_<task>/ (submitit), DIR/jobs.json (gpupack CLI; earlier ids of a requeued pack
  included), DIR/.gpupack/launch_*/jobs.json (launcher). slurmdbd lags a few seconds behind a job's end: the script
  waits until sacct lists every job in a final state (at most --sacct-wait s) before reading it. ElapsedRaw is whole
  seconds, so short jobs round;
- trainings done: Hydra job logs DIR/<k>/hydra_app.log that hold the app's "val_accuracy=" line (submitit,
  launcher), or training records with status completed (CLI);
- start-up s: the median of the trainings' timings.startup_s in gpupack's records. CLI (fork): the forked
  training's process start to its first step (the server's preload is in the pack's time, not here). Launcher: the
  job process's start to the Hydra job function's start (the app's own torch import is inside the job function, so
  it is not in this figure). submitit records none: "-".
The table shows each figure (median over rounds, min-max in brackets with --rounds > 1) and the wall and GPU-s
ratios against hydra-submitit-launcher (< 1: less than submitit). Before each tool the script waits (at most
--idle-wait s) for the partition to have no running or pending job; if other jobs (another user's tests) are
there all the same, the row is marked "busy" and its figures are disturbed. Everything stays in OUT
(default runs/benchmarks/vs_submitit/<date>_<time>/): per round and tool the run/sweep folder and the command's log.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
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
    fmt,
    load_run,
    median,
    out_dir,
    parser,
    ratio,
    read_json,
    run_logged,
    say,
    table,
    tail,
    write_json,
)

TOOLS = ("submitit", "gpupack N=4", "gpupack N=8", "launcher pack=4 defaults", "launcher pack=4 fork",
         "launcher pack=4 fresh")
SLUG = {"submitit": "submitit", "gpupack N=4": "gpupack_n4", "gpupack N=8": "gpupack_n8",
        "launcher pack=4 defaults": "launcher_p4_defaults", "launcher pack=4 fork": "launcher_p4_fork",
        "launcher pack=4 fresh": "launcher_p4_fresh"}
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
          "SUSPENDED", "RESIZING", "STAGE_OUT", "SIGNALING"}
CPUS_PER_TRAINING = 0.5
MEM_GB_PER_TRAINING = 0.75
LR, BATCH = 0.05, 128


# ---------------- the commands ----------------

def command(tool: str, folder: Path, n_trainings: int, train_samples: int, partition: str) -> list[str]:
    app = [PYTHON, "examples/hydra_app.py", "-m"]
    app_args = [f"hydra.sweep.dir={folder}", f"lr={LR}", f"batch_size={BATCH}", "epochs=1",
                f"train_samples={train_samples}", f"seed=range(0,{n_trainings})"]
    if tool == "submitit":
        return app + ["hydra/launcher=submitit_slurm", f"hydra.launcher.partition={partition}",
                      f"hydra.launcher.gres=gpu:{partition}:1", "hydra.launcher.cpus_per_task=1",
                      "hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=10",
                      "hydra.launcher.array_parallelism=2", "hydra.launcher.setup=['export OMP_NUM_THREADS=1']"
                      ] + app_args
    if tool.startswith("launcher pack=4"):
        return app + ["hydra/launcher=gpupack_slurm", "hydra.launcher.pack=4", f"hydra.launcher.partition={partition}",
                      *([] if tool.endswith("defaults") else [f"hydra.launcher.start={tool.split()[-1]}"]),
                      *(["hydra.launcher.preload=[torch]"] if tool.endswith("fork") else []),
                      f"hydra.launcher.gres=gpu:{partition}:1", "hydra.launcher.poll_s=0.5",
                      f"hydra.launcher.cpus_per_task={CPUS_PER_TRAINING}",
                      f"hydra.launcher.mem_gb={MEM_GB_PER_TRAINING}", "hydra.launcher.timeout_min=10"] + app_args
    n = {"gpupack N=4": 4, "gpupack N=8": 8}[tool]
    return [PYTHON, "-m", "gpupack", "+sweep=mnist_pack", "cluster=slurm", f"partitions=[{partition}]",
            "cluster.poll_s=0.5", f"cluster.cpus_per_training={CPUS_PER_TRAINING}",
            f"cluster.mem_gb_per_training={MEM_GB_PER_TRAINING}", "cluster.timeout_min=10", f"packing.factors=[{n}]",
            "packing.repeats=1", "packing.process.start=fork", f"sweep.grid.lr=[{LR}]",
            f"sweep.grid.batch_size=[{BATCH}]",
            f"sweep.grid.seed=range(0,{n_trainings})", f"sweep.fixed.train_samples={train_samples}",
            "sweep.fixed.epochs=1", "sweep.fixed.val_samples=2000", f"run_dir={folder}"]


# ---------------- SLURM ----------------

def slurm(args: list[str]) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def queue_jobs(partition: str) -> list[str]:
    return [line.strip() for line in slurm(["squeue", "-h", "-p", partition, "-o", "%i %T %j"]).splitlines()
            if line.strip()]


def wait_idle(partition: str, limit_s: float) -> list[str]:
    """Wait until the partition holds no job (at most limit_s); return what is still there."""
    deadline = time.time() + limit_s
    jobs = queue_jobs(partition)
    if jobs:
        say(f"  waiting for {partition} to be idle ({len(jobs)} job(s) there: {', '.join(jobs[:3])} ...)")
    while jobs and time.time() < deadline:
        time.sleep(2)
        jobs = queue_jobs(partition)
    return jobs


def gpus_of(tres: str) -> int:
    untyped = re.search(r"gres/gpu=(\d+)", tres)
    if untyped:
        return int(untyped.group(1))
    typed = [int(k) for k in re.findall(r"gres/gpu:[^=,]+=(\d+)", tres)]
    return max(typed) if typed else 0


def sacct_jobs(job_ids: list[str], limit_s: float) -> tuple[list[dict[str, Any]], bool]:
    """sacct's row of every job, once each is listed in a final state (slurmdbd lags); (rows, all final)."""
    deadline = time.time() + limit_s
    while True:
        out = slurm(["sacct", "-X", "-P", "-n", "-j", ",".join(job_ids),
                     "--format=JobID,State,ElapsedRaw,AllocTRES"])
        rows = {}
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) >= 4 and parts[0] in job_ids:
                rows[parts[0]] = {"job_id": parts[0], "state": parts[1].split(" ")[0],
                                  "elapsed_s": int(parts[2] or 0), "gpus": gpus_of(parts[3]), "tres": parts[3]}
        final = len(rows) == len(job_ids) and all(r["state"] not in ACTIVE for r in rows.values())
        if final or time.time() > deadline:
            return [rows[j] for j in job_ids if j in rows], final
        time.sleep(2)


# ---------------- what each tool left ----------------

def job_ids_of(tool: str, folder: Path) -> list[str]:
    if tool == "submitit":
        names = [p.name for p in (folder / ".submitit").glob("*") if p.is_dir()]
        tasks = sorted(n for n in names if re.fullmatch(r"\d+_\d+", n))
        return tasks or sorted(n for n in names if re.fullmatch(r"\d+", n))
    files = [folder / "jobs.json"] if tool.startswith("gpupack") else sorted(folder.glob(".gpupack/launch_*/jobs.json"))
    ids: list[str] = []
    for f in files:
        if f.exists():
            for entry in read_json(f).values():
                entry = entry if isinstance(entry, dict) else {"job_id": entry}
                ids += [str(j) for j in entry.get("history", [])] + [str(entry["job_id"])]
    return list(dict.fromkeys(ids))


def trainings_of(tool: str, folder: Path) -> tuple[int, float | None]:
    """(trainings completed, median start-up s or None)."""
    if tool.startswith("gpupack"):
        _, trainings = load_run(folder)
        done = sum(t.get("status") == "completed" for t in trainings)
        return done, median((t.get("timings") or {}).get("startup_s") for t in trainings)
    done = sum("val_accuracy=" in log.read_text(errors="replace") for log in folder.glob("*/hydra_app.log"))
    if tool == "submitit":
        return done, None
    startups = []
    for run_dir in sorted(folder.glob(".gpupack/launch_*")):
        startups += [(t.get("timings") or {}).get("startup_s") for t in load_run(run_dir)[1]]
    return done, median(startups)


# ---------------- run, report ----------------

def run(out: Path, args: argparse.Namespace, n_trainings: int, train_samples: int) -> None:
    env = {"PYTHONPATH": os.pathsep.join([str(REPO / "examples")] + ([os.environ["PYTHONPATH"]]
                                                                       if os.environ.get("PYTHONPATH") else []))}
    results: dict[str, Any] = {"quick": args.quick, "trainings": n_trainings, "train_samples": train_samples,
                               "partition": args.partition, "rounds": args.rounds, "runs": []}
    for r in range(1, args.rounds + 1):
        for tool in [t for t in TOOLS if not args.tools or SLUG[t] in args.tools]:
            folder = out / f"round{r}" / SLUG[tool]
            argv = command(tool, folder, n_trainings, train_samples, args.partition)
            busy = wait_idle(args.partition, args.idle_wait)
            say(f"round {r}: {tool}" + (f"  (partition busy: {len(busy)} other job(s))" if busy else ""))
            log = out / f"round{r}" / f"{SLUG[tool]}.log"
            rc, wall = run_logged(argv, log, env=env, timeout=args.command_timeout)
            say(f"  exit {rc} after {wall:.1f} s (output: {log})")
            if rc != 0:
                say(tail(log))
            ids = job_ids_of(tool, folder)
            jobs, final = sacct_jobs(ids, args.sacct_wait) if ids else ([], False)
            if ids and not final:
                say(f"  warning: after {args.sacct_wait:.0f} s sacct lists {len(jobs)} of {len(ids)} job(s) in a "
                    "final state; GPU-s counts what it lists")
            done, startup = trainings_of(tool, folder)
            gpu_s = sum(j["elapsed_s"] * j["gpus"] for j in jobs)
            say(f"  {len(ids)} job(s), {gpu_s} GPU-s billed, {done}/{n_trainings} trainings done")
            results["runs"].append({"round": r, "tool": tool, "argv": argv[1:], "rc": rc, "wall_s": wall,
                                    "folder": str(folder), "job_ids": ids, "jobs": jobs, "sacct_final": final,
                                    "gpu_s": gpu_s, "trainings_done": done, "startup_median_s": startup,
                                    "busy": busy})
            write_json(out / "results.json", results)


def spread(values: list[float], digits: int) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    mid = fmt(float(median(vals)), digits)
    return mid if len(vals) == 1 else f"{mid} ({min(vals):.{digits}f}-{max(vals):.{digits}f})"


def report(out: Path) -> None:
    results = read_json(out / "results.json")
    runs = results["runs"]
    by_tool = {tool: [r for r in runs if r["tool"] == tool] for tool in TOOLS}
    base_wall = median(r["wall_s"] for r in by_tool["submitit"])
    base_gpu = median(r["gpu_s"] for r in by_tool["submitit"])
    rows = []
    for tool in TOOLS:
        rs = by_tool[tool]
        if not rs:
            continue
        wall, gpu = median(r["wall_s"] for r in rs), median(r["gpu_s"] for r in rs)
        flags = []
        if any(r["rc"] != 0 for r in rs):
            flags.append("exit!=0")
        if any(not r["sacct_final"] for r in rs):
            flags.append("sacct incomplete")
        if any(r["busy"] for r in rs):
            flags.append("busy")
        rows.append([tool, spread([r["wall_s"] for r in rs], 1), fmt(ratio(wall, base_wall)),
                     spread([float(r["gpu_s"]) for r in rs], 0), fmt(ratio(gpu, base_gpu)),
                     spread([float(len(r["job_ids"])) for r in rs], 0),
                     "/".join(str(r["trainings_done"]) for r in rs) + f" of {results['trainings']}",
                     spread([r["startup_median_s"] for r in rs], 2), " ".join(flags) or "ok"])
    label = " (--quick check, not a measurement)" if results.get("quick") else ""
    say("")
    say(table(["tool", "wall s", "wall / submitit", "GPU-s billed", "GPU-s / submitit", "jobs",
               "trainings done", "start-up s (median)", "notes"], rows,
              title=f"{results['trainings']} MNIST-MLP trainings (train_samples={results['train_samples']}, "
                    f"epochs=1) on {results['partition']}, {results['rounds']} round(s){label}"))
    say("\nwall = the whole command; GPU-s = sum of sacct ElapsedRaw x gres/gpu over its jobs; medians over rounds "
        "(min-max); trainings done per round.")
    say(f"records and logs: {out}")


def main() -> None:
    ap = parser("vs_submitit", __doc__, "8 trainings of 2000 samples, to check the script works")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the tools, alternated (default 1)")
    ap.add_argument("--tools", nargs="+", choices=list(SLUG.values()), help="run only these (default: all)")
    ap.add_argument("--trainings", type=int, help="trainings per tool (default 32; --quick: 8)")
    ap.add_argument("--partition", default="p100", help="SLURM partition with typed GPUs (default p100)")
    ap.add_argument("--idle-wait", type=float, default=300, help="seconds to wait for an idle partition")
    ap.add_argument("--sacct-wait", type=float, default=120, help="seconds to wait for sacct to list every job")
    ap.add_argument("--command-timeout", type=float, default=1800, help="seconds one tool's command may take")
    args = ap.parse_args()
    if args.report:
        report(Path(args.report))
        return
    os.environ.setdefault("SLURM_CONF", DEFAULT_SLURM_CONF)
    launcher = importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher")  # what gpupack is weighed against
    if "submitit" in (args.tools or SLUG.values()) and launcher is None:  # not a dependency of gpupack's
        sys.exit("vs_submitit: hydra-submitit-launcher is not installed here, so its row would only fail. HINT: "
                 ".venv/bin/pip install --no-deps --target /tmp/hsl_site hydra-submitit-launcher==1.2.0, then "
                 "PYTHONPATH=/tmp/hsl_site .venv/bin/python benchmarks/vs_submitit.py (kept out of gpupack's "
                 "environment), or leave it out: --tools gpupack_n4 ...")
    n_trainings = args.trainings or (8 if args.quick else 32)
    train_samples = 2000 if args.quick else 10000
    out = out_dir("vs_submitit", args.out)
    run(out, args, n_trainings, train_samples)
    report(out)


if __name__ == "__main__":
    main()
