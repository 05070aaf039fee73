"""How long collect's aggregation takes for many training records (issue: 1,000,000 in <= 5 s).

    .venv/bin/python benchmarks/collect_scale.py [N_TRAININGS]

Generates N training records and their pack records as collect holds them after loading (flat rows), in
4 partitions x 2 modes x 7 packing factors (1, 3, 5, 8, 13, 21, 34), then times each aggregation step.
Loading from disk is not included: a million JSON files is a file-system benchmark, not collect's.
"""
from __future__ import annotations

import sys
import time

import numpy as np
import pandas as pd

from gpupack.collect import best_factors, best_hyperparameters, summarize
from gpupack.rgu import cost_table

FACTORS = [1, 3, 5, 8, 13, 21, 34]
PARTITIONS = {"p100": "P100-12gb", "v100": "V100-16gb", "a100": "A100-40gb", "h100": "H100-80gb"}
MODES = ["process", "tf_logical"]
WEIGHTS = {"P100-12gb": 1.0, "V100-16gb": 2.2, "A100-40gb": 4.0, "H100-80gb": 12.2}


def make_records(n: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    groups = [(p, m, f) for p in PARTITIONS for m in MODES for f in FACTORS]
    per_group = n // len(groups)
    rows_p, rows_m, rows_f, pack_ids = [], [], [], []
    packs = []
    for p, m, f in groups:
        n_packs = max(1, per_group // f)
        for k in range(n_packs):
            pid = f"{p}-{m}-n{f:02d}-{k:05d}"
            packs.append((pid, p, m, f, 10.0 * (1 + 0.3 * rng.random()) * f ** 0.6))
        idx = np.arange(per_group)
        pack_ids.append(np.array([f"{p}-{m}-n{f:02d}-{k:05d}" for k in (idx // f) % n_packs]))
        rows_p.append(np.full(per_group, p))
        rows_m.append(np.full(per_group, m))
        rows_f.append(np.full(per_group, f))
    total = per_group * len(groups)
    # one OOM in every (p100, *, N=34) group: that N must drop out of the best-N choice there
    all_p, all_f = np.concatenate(rows_p), np.concatenate(rows_f)
    status = np.full(total, "completed", dtype=object)
    status[np.flatnonzero((all_p == "p100") & (all_f == 34))[:2]] = "oom"
    lrs = rng.choice([0.1, 0.03, 0.01], total)
    trainings = pd.DataFrame({
        "training_id": [f"w-{i:07d}" for i in range(total)],
        "pack_id": np.concatenate(pack_ids), "workload": "mnist_torch",
        "partition": all_p, "mode": np.concatenate(rows_m), "factor": all_f,
        "gpu_type": "cpu", "gpu_model": [PARTITIONS[p] for p in all_p], "status": status,
        "startup_s": rng.normal(4, 0.5, total), "loop_s": rng.normal(3, 0.3, total),
        "samples": np.full(total, 60000), "samples_per_s": rng.normal(20000, 2000, total),
        "val_accuracy": rng.normal(0.95, 0.01, total),
        "params": [{"lr": float(lr), "seed": int(i % 5)} for i, lr in enumerate(lrs)],
    })
    pack_frame = pd.DataFrame(packs, columns=["pack_id", "partition", "mode", "factor", "wall_s"])
    pack_frame["gpu_type"] = "cpu"
    pack_frame["complete"] = True
    return trainings, pack_frame


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    t0 = time.perf_counter()
    trainings, packs = make_records(n)
    t1 = time.perf_counter()
    summary = summarize(trainings, packs)
    t2 = time.perf_counter()
    overall = best_factors(summary, by=("workload", "partition", "gpu_type"))
    best_factors(summary)
    cost = cost_table(overall, WEIGHTS, 1000)
    t3 = time.perf_counter()
    hyper = best_hyperparameters(trainings)
    t4 = time.perf_counter()
    print(f"training records: {len(trainings):,}  pack records: {len(packs):,}  groups: {len(summary)}")
    print(f"generate records:            {t1 - t0:6.2f} s (not part of collect)")
    print(f"summarize (time per training, speedup, throughput, failures): {t2 - t1:6.2f} s")
    print(f"best N per group + RGU cost: {t3 - t2:6.2f} s")
    print(f"best hyperparameters:        {t4 - t3:6.2f} s")
    print(f"aggregation in all:          {t4 - t1:6.2f} s  (target <= 5 s for 1,000,000 records)")
    print(cost[["partition", "mode", "factor", "time_per_training_s", "rgu_hours_per_training"]].to_string(index=False))
    print(f"best hyperparameters: {hyper.iloc[0].to_dict()}")


if __name__ == "__main__":
    main()
