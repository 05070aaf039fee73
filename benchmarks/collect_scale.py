"""How long collect takes for 1,000,000 trainings, from a run directory on disk (issue 31: load + aggregate <= 2 s,
the whole ``python -m gpupack collect RUN_DIR --no-plots`` <= 5 s).

    .venv/bin/python benchmarks/collect_scale.py [--trainings N] [--factors 16,34] [--layout lanes|packs]
                                                 [--lanes K] [--repeat K] [--cli] [--cold] [--out DIR] [--keep]

1. Writes a run directory as gpupack's jobs leave it: 4 partitions x 2 modes x N in --factors (default 16 and 34: a
   million trainings are run packed, at the N a probe chose), the trainings spread evenly, records with every field
   gpupack.core.store.records writes (params, timings, a 16-point throughput curve...).
   - ``--layout lanes`` (the default, a cluster's): the packs dealt to --lanes lanes (1,000: the Alliance's jobs a
     user) that folded them: each lane's journal (a JSON line a record), its log, and its columnar file
     (lanes/<lane>.arrows) written by gpupack's own writer (gpupack.core.store.lane_columnar) as the lane's end does;
     two lanes were killed before their end (no columnar file: collect parses their journals), and one lane's journal
     had an OOM amended after its file (a later record of one training).
   - ``--layout packs`` (the local backend's): a folder a pack, its pack.json and its trainings' columnar file
     (packs/<id>/trainings.arrows); the first 2 packs of each (partition, mode, N) with JSON training records only,
     and one resumed pack whose first attempt sits under attempts/1/.
   Not timed (about 4 minutes for 1,000,000 in lanes); the run is synced to disk before any clock starts.
2. Times what ``python -m gpupack collect`` does before it prints, end to end from disk (a warm page cache):
   load_records (the run directory → flat frames) and aggregate_records (time per training, best N with its
   bootstrap, RGU cost, best hyperparameters, knobs). --repeat K: K times, the median counts. With --cli, also the
   whole ``python -m gpupack collect RUN_DIR --no-plots`` in a fresh process (imports, the tables, summary.csv/json
   and a 1,000,000-row trainings.parquet, written while the records are aggregated).
   With --cold, the CLI again, --repeat times, with the page cache emptied before each (root on Linux): a run read
   a while after it was written, or copied off a cluster, comes from disk (this machine pages out what was not
   touched for a minute).
3. Checks that the records loaded are the ones written (rows, packs, earlier attempts, the OOMs at p100's largest N
   that rule it out).

The run directory goes under runs/benchmarks/collect_scale/<date>_<time>/run (``--out DIR`` for elsewhere); it is
removed at the end unless --keep.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import PYTHON, REPO, out_dir  # noqa: E402

from gpupack.core.store.columnar import COLUMNAR, columnar_bytes, flatten, flatten_pack  # noqa: E402
from gpupack.core.store.lane_columnar import write_lane_columnar  # noqa: E402
from gpupack.core.store.records import pack_record, training_record  # noqa: E402
from gpupack.core.store.rundir import RunDir  # noqa: E402
from gpupack.results.analysis.aggregate import aggregate_records  # noqa: E402
from gpupack.results.analysis.load import load_records  # noqa: E402

FACTORS = [16, 34]
PARTITIONS = {"p100": "P100-12gb", "v100": "V100-16gb", "a100": "A100-40gb", "h100": "H100-80gb"}
MODES = ["process", "tf_logical"]
WEIGHTS = {"P100-12gb": 1.0, "V100-16gb": 2.2, "A100-40gb": 4.0, "H100-80gb": 12.2}
JSON_ONLY_PACKS = 2  # packs layout: per group's first packs: JSON training records, no columnar file
PACKS, LANES_LAYOUT = "packs", "lanes"
LANES = 1000  # lanes layout: the packs dealt to this many lanes (the Alliance's 1,000 jobs a user)
KILLED_LANES = 2  # lanes layout: lanes killed before their end: no columnar file, their journals parsed
OOM_PARTITION = "p100"  # two OOMs there at the largest N: that N must drop out of its best-N choice


def _sorted(value: Any) -> Any:
    """Keys in the order a record read back from its JSON has them (records are written with sort_keys)."""
    return {k: _sorted(value[k]) for k in sorted(value)} if isinstance(value, dict) else value


def training(pack_id: str, tid: str, partition: str, mode: str, factor: int, status: str, index: int,
             draw: np.ndarray) -> dict[str, Any]:
    """One training record with every field the job body writes (gpupack.job.records.build_training_record); ``draw``:
    start-up, loop, samples/s, accuracy, loss, RSS and GPU memory."""
    startup, loop, rate, accuracy, loss, rss, gpu_mem = (float(x) for x in draw)
    return _sorted(training_record(
        sweep="scale", pack_id=pack_id, training_id=tid, workload="mnist_torch",
        params={"lr": [0.1, 0.03, 0.01][index % 3], "batch_size": [64, 128, 256][index // 3 % 3], "seed": index},
        grid_index=index // 5, reseed=0, mode=mode, factor=factor, partition=partition, concurrent=factor,
        probe=False, gpu_type="Tesla V100-SXM2-16GB", device="cuda", device_name="Tesla V100-SXM2-16GB",
        gpu_model=PARTITIONS[partition], threads=1, status=status, exit_code=0 if status == "completed" else 1,
        signal=None, error=None if status == "completed" else "CUDA out of memory", started_at=0.0,
        ended_at=startup + loop, wall_s=startup + loop,
        timings={"startup_s": startup, "loop_s": loop, "split": True},
        throughput={"samples": 60000, "samples_per_s": rate, "curve": [[0.5 * k, rate] for k in range(1, 17)]},
        metrics={"val_accuracy": accuracy, "train_loss": loss}, memory={"peak_rss_mb": rss, "peak_gpu_mem_mb": gpu_mem},
        knobs={"batch_size": 128, "amp": False}, loader_setting="bs128", data="MNIST 60000/10000",
        host="node1", timed_out=False, start="fork", cpus=[index % 2]))


def pack(pack_id: str, partition: str, mode: str, factor: int, wall: float, tids: list[str],
         statuses: list[str]) -> dict[str, Any]:
    """One pack record with the fields gpupack.job.records.write_pack_record writes."""
    return _sorted(pack_record(
        pack_id=pack_id, mode=mode, factor=factor, partition=partition, probe=False,
        gpu_type="Tesla V100-SXM2-16GB", device="cuda", device_name="Tesla V100-SXM2-16GB", device_note="",
        gpu_model=PARTITIONS[partition], gpu_memory_total_mb=16384.0, concurrent=factor, complete=True,
        training_ids=tids, n_completed=statuses.count("completed"),
        n_failed=factor - statuses.count("completed"), n_oom=statuses.count("oom"), started_at=0.0, ended_at=wall,
        wall_s=wall, written_at=wall, cores=8, threads_per_training=1, host="node1", job_id="1234_5",
        workload="mnist_torch", cuda_visible_devices="0", slurm_job_gpus="0", slurm_partition=partition,
        sampler={"source": "nvml", "gpu_util_mean": 80.0, "gpu_mem_used_peak_mb": 9000.0,
                 "per_training": {t: {"peak_rss_mb": 900.0} for t in tids}}))


def _write(path: Path, data: bytes) -> None:
    """The files as the jobs leave them, without the jobs' fsync per file (the setup only; it is not timed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@dataclass(frozen=True)
class Written:
    """What :func:`write_run` wrote: trainings and packs (each's latest record), how many packs (packs layout) or
    lanes (lanes layout) collect reads from JSON, the earlier attempts' training and pack records besides."""

    trainings: int
    packs: int
    from_json: int
    earlier_trainings: int
    earlier_packs: int
    layout: str

    def describe(self, factors: Sequence[int]) -> str:
        where = (f"{self.from_json} of them JSON-only, 1 resumed" if self.layout == PACKS else
                 f"dealt to lanes that folded them, {self.from_json} lanes without a columnar file, 1 OOM amended")
        return f"{self.trainings:,} in {self.packs:,} packs of N = {', '.join(map(str, factors))} ({where})"


def write_run(root: Path, n: int, seed: int = 0, json_twins: bool = False, factors: Sequence[int] = FACTORS,
              layout: str = PACKS, lanes: int = LANES) -> Written:
    """The run directory, and what it holds. ``layout``: ``packs``,
    a folder a pack (the local backend's), or ``lanes``, the packs dealt to ``lanes`` lanes that folded them (a
    cluster's). ``json_twins``: the columnar packs' training records as JSON too, as the jobs leave them (tests read
    the run both ways)."""
    rng = np.random.default_rng(seed)
    run = RunDir(root)
    groups = [(p, m, f) for p in PARTITIONS for m in MODES for f in factors]
    per_group = n // len(groups)
    trainings = json_only = 0
    means, spreads = np.array([4, 3, 20000, 0.95, 0.2, 900, 1500]), np.array([0.5, 0.3, 2000, 0.01, 0.02, 50, 50])
    made: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = []
    for partition, mode, factor in groups:
        ooms = 2 if (partition, factor) == (OOM_PARTITION, max(factors)) else 0
        for k in range(max(1, per_group // factor)):
            pack_id = f"{partition}-{mode}-n{factor:02d}-{k:05d}"
            tids = [f"{pack_id}-t{i:02d}" for i in range(factor)]
            statuses = ["oom" if k == 0 and i < ooms else "completed" for i in range(factor)]
            draws = rng.normal(means, spreads, size=(factor, len(means)))
            records = [training(pack_id, t, partition, mode, factor, s, trainings + i, d)
                       for i, (t, s, d) in enumerate(zip(tids, statuses, draws))]
            wall = 10.0 * (1 + 0.3 * rng.random()) * factor ** 0.6
            made.append((pack_id, records, pack(pack_id, partition, mode, factor, wall, tids, statuses)))
            json_only += k < JSON_ONLY_PACKS
            trainings += factor
    planned = [{"pack_id": pack_id} for pack_id, _, _ in sorted(made, key=lambda m: m[0])]
    _write(run.plan, json.dumps({"sweep": "scale", "grid_size": trainings, "packs": planned}).encode())  # what
    if layout == LANES_LAYOUT:                                       # collect reads of it: the grid, the packs planned
        return Written(trainings, len(made), _write_lanes(run, made, lanes), 1, 0, layout)
    for k, (pack_id, records, pack_rec) in enumerate(made):
        first_packs = int(pack_id.rsplit("-", 1)[1]) < JSON_ONLY_PACKS
        (run.pack_dir(pack_id) / "trainings").mkdir(parents=True)
        if first_packs or json_twins:
            for rec in records:
                _write(run.training_record(pack_id, rec["training_id"]), json.dumps(rec, indent=1).encode())
        _write(run.pack_record(pack_id), json.dumps(pack_rec, indent=1).encode())
        if not first_packs:  # after its pack.json, as the job writes it
            _write(run.pack_dir(pack_id) / COLUMNAR, columnar_bytes([flatten(r) for r in records],
                                                                   flatten_pack(pack_rec)))
    resumed = f"v100-process-n{factors[0]:02d}-00000"  # a JSON-only pack: its first attempt, kept under attempts/1/
    first = run.pack_dir(resumed) / "attempts" / "1"
    first.mkdir(parents=True)
    for path in sorted((run.pack_dir(resumed) / "trainings").glob("*.json"))[:1]:
        shutil.copy(path, first / path.name)
    shutil.copy(run.pack_record(resumed), first / "pack.json")
    return Written(trainings, len(made), json_only, 1, 1, layout)


def _write_lanes(run: RunDir, made: list[tuple[str, list[dict[str, Any]], dict[str, Any]]],
                 lanes: int) -> int:
    """The packs dealt to ``lanes`` lanes in turn, as lanes that fold leave them: each lane's journal (a line a
    record, each training's log kept in the lane's log), its log, and its columnar file, written at its end by
    gpupack's own writer. Two lanes were killed before their end (no columnar file: collect parses their journals),
    and one lane's journal had an OOM amended after its file was written (a later record of a training it holds).
    Returns how many lanes have no columnar file."""
    clock = 1.0e9
    names = [f"lane-{i:04d}" for i in range(min(lanes, len(made)))]
    run.lanes.mkdir(parents=True)
    for i, lane in enumerate(names):
        lines, offset = [], 0
        for pack_id, records, pack_rec in made[i::len(names)]:
            clock += 1.0
            for seq, rec in enumerate(records):
                logs = {"out": {"file": f"lanes/{lane}.log", "offset": offset, "length": 120}}
                offset += 160
                lines.append({"kind": "training", "folded_at": clock, "seq": seq, "record": {**rec, "logs": logs}})
            lines.append({"kind": "pack", "folded_at": clock, "seq": len(records), "record": {**pack_rec, "logs": {}}})
        _write(run.journal(lane), "".join(json.dumps(e) + "\n" for e in lines).encode())
        _write(run.lane_log(lane), b"x" * offset)
        if i >= KILLED_LANES:
            write_lane_columnar(run, lane)
    amended = json.loads(run.journal(names[-1]).read_text().splitlines()[0])  # SLURM's OOM, told after the job
    amended_rec = {**amended["record"], "status": "oom", "error": "out of memory (SLURM)"}
    with open(run.journal(names[-1]), "a") as f:
        f.write(json.dumps({**amended, "folded_at": clock + 1.0, "seq": 0, "record": amended_rec}) + "\n")
    return KILLED_LANES


def time_collect(root: Path) -> tuple[dict[str, float], Any]:
    """One load + aggregate of the run directory, timed: what collect does before it prints."""
    t0 = time.perf_counter()
    records = load_records([root])
    t1 = time.perf_counter()
    c = aggregate_records(records, WEIGHTS, 1000)
    t2 = time.perf_counter()
    return {"load": t1 - t0, "aggregate": t2 - t1, "end_to_end": t2 - t0}, c


def drop_page_cache() -> bool:
    """Empty the kernel's page cache (root on Linux), as a run read long after it was written, or copied, finds it:
    its files read from disk again. False where it cannot."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def time_cli(root: Path, cold: bool = False) -> float:
    """The whole ``python -m gpupack collect RUN_DIR --no-plots`` in a fresh process; ``cold``: the page cache emptied
    first (the run's files, and gpupack's and its libraries' own, read from disk)."""
    if cold and not drop_page_cache():
        return math.nan
    t0 = time.perf_counter()
    proc = subprocess.run([PYTHON, "-m", "gpupack", "collect", str(root), "--no-plots"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trainings", type=int, default=1_000_000)
    ap.add_argument("--factors", type=lambda v: [int(x) for x in v.split(",")], default=FACTORS,
                    help=f"the packing factors N, comma-separated (default {','.join(map(str, FACTORS))})")
    ap.add_argument("--repeat", type=int, default=1, help="time load + aggregate this many times; the median counts")
    ap.add_argument("--out", help="output folder (default runs/benchmarks/collect_scale/<date>_<time>)")
    ap.add_argument("--layout", choices=[LANES_LAYOUT, PACKS], default=LANES_LAYOUT,
                    help="lanes (default): the packs folded by --lanes lanes, each lane's journal and columnar file, "
                         "as on a cluster; packs: a folder and columnar file a pack, as the local backend leaves them")
    ap.add_argument("--lanes", type=int, default=LANES, help=f"lanes layout: how many lanes (default {LANES})")
    ap.add_argument("--cli", action="store_true", help="also time python -m gpupack collect RUN_DIR --no-plots")
    ap.add_argument("--cold", action="store_true",
                    help="also time the CLI with the page cache emptied before each run (root on Linux)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    args = ap.parse_args(argv)
    root = out_dir("collect_scale", args.out) / "run"
    if root.exists():
        sys.exit(f"{root} exists: remove it, or give another --out")
    t0 = time.perf_counter()
    # Written by a process of its own, which gives its gigabytes of records back when it ends: collect then runs as
    # a user's does, on a machine not busy reclaiming the writer's memory (in this process, load took 3 s, not 1).
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as writer:
        w = writer.submit(write_run, root, args.trainings, factors=args.factors, layout=args.layout,
                          lanes=args.lanes).result()
    os.sync()  # the run's gigabytes on disk before the clock starts: collect reads a run written long before
    written = time.perf_counter() - t0
    runs: list[dict[str, float]] = []
    c: Any = None
    for _ in range(max(1, args.repeat)):
        c = None  # the last collect's million rows go before the next one loads, as in a process of its own
        gc.collect()
        timing, c = time_collect(root)
        runs.append(timing)
    assert len(c.records.latest()) == w.trainings and len(c.records.trainings) == w.trainings + w.earlier_trainings
    assert len(c.records.packs) == w.packs + w.earlier_packs
    chosen = {(r.partition, r.mode): int(r.factor) for r in c.best.itertuples()}
    assert all(chosen.get((OOM_PARTITION, m)) != max(args.factors) for m in MODES)  # its OOMs rule that N out
    timings = {k: statistics.median(t[k] for t in runs) for k in ("load", "aggregate", "end_to_end")}
    timings["write"] = written
    print(f"training records: {w.describe(args.factors)}, groups: {len(c.summary)}")
    print(f"write the run directory:      {written:6.2f} s (not part of collect)")
    print(f"load_records (from disk):     {timings['load']:6.2f} s")
    print(f"aggregate_records:            {timings['aggregate']:6.2f} s")
    totals = ", ".join(f"{t['end_to_end']:.2f}" for t in runs)
    each = f"  (median of {totals})" if len(runs) > 1 else ""
    print(f"load + aggregate, end to end: {timings['end_to_end']:6.2f} s{each}  (issue 31: <= 2 s for 1,000,000)")
    if args.cli:
        clis = [time_cli(root) for _ in range(max(1, args.repeat))]
        timings["cli"] = statistics.median(clis)
        each = f" (median of {', '.join(f'{t:.2f}' for t in clis)})" if len(clis) > 1 else ""
        print(f"python -m gpupack collect RUN_DIR --no-plots: {timings['cli']:5.2f} s{each} (a fresh process: imports, "
              "the tables, summary.csv/json and trainings.parquet included; issue 31: <= 5 s)")
    if args.cold:
        colds = [time_cli(root, cold=True) for _ in range(max(1, args.repeat))]
        timings["cli_cold"] = statistics.median(colds)
        print(f"the same, the page cache emptied before each: {timings['cli_cold']:5.2f} s (median of "
              f"{', '.join(f'{t:.2f}' for t in colds)})" if not math.isnan(timings["cli_cold"]) else
              "the same, cold: not timed (emptying the page cache needs root on Linux)")
    columns = ["partition", "mode", "factor", "time_per_training_s", "rgu_hours_per_training"]
    print(c.cost[columns].to_string(index=False))
    if not args.keep:
        shutil.rmtree(root)
    return timings


if __name__ == "__main__":
    main()
