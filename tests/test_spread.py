"""One training spread over k devices beside packing: the plan, the job requests, the comparison and its verdict (pure,
table-driven), and real runs on this machine and on the local slurmctld (k gloo processes standing in for k GPUs)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pandas as pd
import pytest

from gpupack.core.plan import Plan, make_plan
from gpupack.results.analysis.layouts import compare, split_spread, spread_summary, verdicts
from gpupack.submit.local import spread_gpus, take_slots
from gpupack.submit.slurm import sbatch_parameters
from tests.doc_commands import pasted

REPO = Path(__file__).resolve().parent.parent


# ---------------- the plan ----------------

def _plan(**kw):
    args = dict(sweep="s", workload="w", grid={"lr": [0.1, 0.2]}, fixed={"seed": 0}, factors=[1, 2], modes=["process"],
                partitions=["p100"], repeats=3, spread_layouts=[("ddp", "ddp-gloo")], spread_devices=[1, 2])
    return make_plan(**{**args, **kw})


def test_spread_packs_hold_one_training_over_k_devices_of_the_same_trainings_as_n1():
    plan = _plan()
    spread = [p for p in plan.packs if p.spread]
    assert {(p.devices, len(p.trainings), p.factor, p.mode) for p in spread} == {(1, 1, 1, "ddp-gloo"),
                                                                                 (2, 1, 1, "ddp-gloo")}
    assert sorted(p.pack_id for p in spread if p.devices == 2) == [f"p100-ddp-gloo-k02-{i:03d}" for i in range(3)]
    n1 = {t.training_id for p in plan.packs if not p.spread and p.factor == 1 for t in p.trainings}
    assert {t.training_id for p in spread if p.devices == 2 for t in p.trainings} == n1  # the same trainings
    assert any("spread" in n for n in plan.notes)


def test_spread_repeats_are_their_own():
    assert sum(1 for p in _plan(spread_repeats=5).packs if p.devices == 2) == 5


def test_spread_packs_interleave_with_packing_by_k():
    plan = _plan()
    order = [p.pack_id for p in plan.packs]
    k2 = [i for i, p in enumerate(plan.packs) if p.devices == 2]
    assert k2[0] < len(order) / 2 < k2[-1]  # spread over the run, not bunched with k=1 or at one end


def test_a_plan_with_spread_packs_round_trips_and_a_plan_without_them_keeps_its_json():
    plan = _plan()
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    packing_only = _plan(spread_layouts=(), spread_devices=())
    assert all("devices" not in p and "spread" not in p for p in packing_only.to_json()["packs"])


# ---------------- what the job asks for ----------------

@pytest.mark.parametrize("request_form, devices, factor, gpus, cpus, mem, name", [
    ("gpus_per_node", 2, 1, ("gpus_per_node", "v100:2"), 2, "4096M", "gpupack-v100-k2"),
    ("gres", 4, 1, ("gres", "gpu:v100:4"), 4, "8192M", "gpupack-v100-k4"),
    ("gpus_per_node", 1, 3, ("gpus_per_node", "v100:1"), 3, "6144M", "gpupack-v100-n3"),
])
def test_a_spread_pack_asks_for_k_gpus_on_one_node_and_a_share_per_device(request_form, devices, factor, gpus, cpus,
                                                                          mem, name):
    cluster = NS(cpus_per_training=1.0, mem_gb_per_training=2.0, timeout_min=30, signal_delay_s=60,
                 array_parallelism=8, setup=[], additional_parameters={})
    part = NS(gpu="v100", request=request_form, slurm_partition=None, constraint=None)
    params = sbatch_parameters(cluster, "v100", part, factor, None, devices=devices)
    assert params[gpus[0]] == gpus[1] and params["nodes"] == 1 and params["ntasks_per_node"] == 1
    assert params["cpus_per_task"] == cpus and params["mem"] == mem and params["job_name"] == name


@pytest.mark.parametrize("devices, free, n_slots, n_gpus, taken, left, gpus", [
    (1, [[2], [3]], 4, 4, [[2]], [[3]], [2]),
    (2, [[0], [3]], 4, 4, [[0], [3]], [], [0, 3]),  # two GPU slots: two distinct GPUs
    (2, [[1], [1], [0]], 4, 2, [[1], [0]], [[1]], [0, 1]),  # slots repeat GPUs: never two of the same GPU
    (2, [[1], [1]], 4, 2, None, [[1], [1]], None),  # GPU 0 is busy: wait, do not share it
    (4, [[0], [1]], 2, 4, [[0], [1]], [], [0, 1, 2, 3]),  # fewer slots than k: all of them, then the first k GPUs
    (2, [[]], 1, 0, [[]], [], []),  # a CPU machine: the one slot; the k processes share its cores
])
def test_local_slots_of_a_spread_pack(devices, free, n_slots, n_gpus, taken, left, gpus):
    pack = NS(devices=devices)
    assert take_slots(pack, free, n_slots, n_gpus) == taken
    assert free == left
    if taken is not None:
        assert spread_gpus(pack, taken) == gpus


@pytest.mark.parametrize("slots, expected", [
    (1, [["n1-0", "n2-0", "n1-1", "n2-1"], ["k2-0"], ["s-0"]]),  # one slot: every whole pack in one lane, in order
    (2, [["n1-0", "n1-1"], ["n2-0", "n2-1"], ["k2-0"], ["s-0"]]),  # dealt to a lane a slot
    (8, [["n1-0"], ["n2-0"], ["n1-1"], ["n2-1"], ["k2-0"], ["s-0"]]),  # never a lane with no pack
])
def test_a_local_runs_whole_packs_go_in_a_lane_a_slot_and_the_rest_a_job_each(slots, expected):
    from gpupack.submit.local import local_lanes

    packs = [NS(pack_id=i, stream="q" if i.startswith("s") else None, devices=2 if i.startswith("k") else 1)
             for i in ["n1-0", "n2-0", "k2-0", "n1-1", "s-0", "n2-1"]]
    assert [[p.pack_id for p in lane] for lane in local_lanes(packs, slots)] == expected


# ---------------- the comparison and its verdict (pure) ----------------

def _packing_summary(times):
    return pd.DataFrame([{"workload": "w", "partition": "v100", "gpu_type": "Tesla V100", "mode": "process",
                          "factor": n, "time_per_training_s": t, "packs": 3, "oom": 0, "unfinished": 0,
                          "gpu_model": "V100-16gb", "samples_per_s": 100.0} for n, t in times.items()])


def _spread_records(walls):
    trainings, packs = [], []
    for k, values in walls.items():
        for i, w in enumerate(values):
            pid = f"v100-ddp-gloo-k{k:02d}-{i:03d}"
            common = {"workload": "w", "partition": "v100", "gpu_type": "Tesla V100", "mode": "ddp-gloo",
                      "devices": k, "strategy": "ddp", "pack_id": pid, "attempt": 0, "gpu_model": "V100-16gb"}
            trainings.append({**common, "training_id": f"t{i}", "status": "completed", "samples_per_s": 900.0,
                              "allreduce_bytes_per_step": 407080.0 if k > 1 else 0.0, "allreduce_s_per_step": 0.001})
            packs.append({**common, "wall_s": w, "n_completed": 1, "complete": True})
    return pd.DataFrame(trainings), pd.DataFrame(packs)


# The source study's V100 figures: one training on 1, 2, 4, 8 GPUs took 128, 164, 190, 229 s; packed, say 40 s a
# training at N=5.
SOURCE_WALLS = {1: [128.0, 127.0, 129.0], 2: [164.0, 163.0, 166.0], 4: [190.0, 191.0, 189.0], 8: [229.0, 230.0, 228.0]}


def test_the_source_study_verdict_packing_uses_a_device_hour_best():
    t, p = _spread_records(SOURCE_WALLS)
    spread = spread_summary(t, p)
    assert list(spread["devices"]) == [1, 2, 4, 8]
    assert list(spread["device_s_per_training"]) == [128.0, 328.0, 760.0, 1832.0]  # k x the median wall
    times = {(("w", "v100", "Tesla V100", "process", 5)): [40.0, 41.0, 39.0],
             (("w", "v100", "Tesla V100", "process", 1)): [128.0, 126.0, 130.0]}
    table = compare(_packing_summary({1: 128.0, 5: 40.0}), spread, times, {"V100-16gb": 2.2})
    assert list(table["devices_per_training"]) == [0.2, 1.0, 1.0, 2.0, 4.0, 8.0]
    best = table[table["best"]]
    assert list(best["layout"]) == ["process N=5"]
    assert math.isclose(best["rgu_hours_per_1000"].iloc[0], 40.0 / 3600 * 2.2 * 1000)
    (line,) = verdicts(table)
    assert "a device-hour goes furthest with 5 trainings on one device (process N=5)" in line
    assert "The best spread, one training on 1 device (ddp-gloo k=1), spends 3.20x that" in line
    assert "RGU-hours" in line
    assert "Over more than one device the best is ddp-gloo k=2: 8.20x the best's device time (328 device-s)" in line


def test_when_spread_finishes_in_less_device_time_it_is_the_verdict():
    t, p = _spread_records({2: [4.0, 4.1, 3.9]})  # a training that scales: 2 x 4 s = 8 s of device time
    times = {("w", "v100", "Tesla V100", "process", 1): [10.0, 10.2, 9.8]}
    table = compare(_packing_summary({1: 10.0}), spread_summary(t, p), times, {})
    assert list(table.loc[table["best"], "layout"]) == ["ddp-gloo k=2"]
    (line,) = verdicts(table)
    assert line.startswith("w on v100 (Tesla V100): a device-hour goes furthest with one training on 2 devices")
    assert "The best packing, 1 training on one device (process N=1), spends 1.25x that" in line
    assert "RGU" not in line  # no weight known: no cost claimed


def test_within_noise_is_said_and_a_missing_answer_gives_no_verdict():
    t, p = _spread_records({2: [10.0, 30.0, 6.0]})  # device-s 20, 60, 12: overlaps packing's 14-22
    times = {("w", "v100", "Tesla V100", "process", 1): [22.0, 14.0, 18.0]}
    table = compare(_packing_summary({1: 18.0}), spread_summary(t, p), times, {})
    assert "within noise" in verdicts(table)[0]
    spread_only = compare(pd.DataFrame(), spread_summary(t, p), {}, {})
    assert not spread_only["best"].any()
    assert "no verdict yet: nothing usable measured for packing" in verdicts(spread_only)[0]


def test_a_failed_spread_training_is_never_the_verdict():
    t, p = _spread_records({2: [1.0]})  # fastest of all, but it failed
    t["status"] = "failed"
    times = {("w", "v100", "Tesla V100", "process", 1): [10.0]}
    table = compare(_packing_summary({1: 10.0}), spread_summary(t, p), times, {})
    assert not table["best"].any()
    assert "no verdict yet: nothing usable measured for spread" in verdicts(table)[0]


def test_split_spread_keeps_packing_rows_apart():
    frame = pd.DataFrame([{"strategy": None, "x": 1}, {"strategy": "ddp", "x": 2}])
    packing, spread = split_spread(frame)
    assert list(packing["x"]) == [1] and list(spread["x"]) == [2]
    assert split_spread(pd.DataFrame([{"x": 1}]))[1].empty


# ---------------- real runs ----------------

def gpupack(args, env=None, timeout=900):
    return subprocess.run([sys.executable, "-m", "gpupack", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in run_dir.glob("packs/*/trainings/*.json")]


SMALL = ["sweep.fixed.train_samples=2048", "sweep.fixed.val_samples=500", "sweep.grid.batch_size=[64]"]


@pytest.mark.slow
def test_mnist_spread_runs_ddp_beside_packing_in_one_table_with_a_verdict(tmp_path, subprocess_env):
    run_dir = tmp_path / "run"
    proc = gpupack([*pasted("python -m gpupack +sweep=mnist_spread"), *SMALL, "packing.repeats=2",
                    "packing.remeasure=0", f"run_dir={run_dir}"], subprocess_env)  # as the Mirrored test below
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = _records(run_dir)
    spread = [r for r in recs if r.get("strategy") == "ddp"]
    assert {r["devices"] for r in spread} == {1, 2} and all(r["status"] == "completed" for r in recs)
    k2 = [r for r in spread if r["devices"] == 2]
    assert all(r["spread"]["world"] == 2 and r["spread"]["allreduce_bytes_per_step"] > 0 for r in k2)
    assert "One training on k devices (spread) beside N trainings on one device" in proc.stdout
    assert "ddp-gloo k=2" in proc.stdout and "process N=2" in proc.stdout
    assert "a device-hour goes furthest with" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["verdicts"]) == 1 and {r["answer"] for r in summary["layouts"]} == {"packing", "spread"}
    assert (run_dir / "plots" / "spread_vs_packing.png").exists()


@pytest.mark.slow
def test_mnist_tf_spread_runs_mirrored_over_logical_cpus_beside_packing(tmp_path, subprocess_env):
    run_dir = tmp_path / "run"
    proc = gpupack([*pasted("python -m gpupack +sweep=mnist_tf_spread"), "sweep.fixed.train_samples=2048",
                    "sweep.fixed.val_samples=500", "packing.repeats=1", "packing.remeasure=0", f"run_dir={run_dir}"],
                   subprocess_env)  # a round the other worker disturbed is not measured again: twice TF's imports
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spread = [r for r in _records(run_dir) if r.get("strategy") == "mirrored"]
    assert {r["devices"] for r in spread} == {1, 2} and all(r["status"] == "completed" for r in spread)
    k2 = next(r for r in spread if r["devices"] == 2)
    assert k2["spread"]["replicas"] == 2 and len(k2["spread"]["replica_devices"]) == 2  # two logical CPU devices
    assert "mirrored k=2" in proc.stdout and "process N=2" in proc.stdout
    assert "a device-hour goes furthest with" in proc.stdout


@pytest.mark.slurm
@pytest.mark.slow
def test_ddp_k2_runs_as_a_two_gpu_job_on_the_local_slurmctld(tmp_path, slurm_env):
    from tests.conftest import wait_for
    from tests.test_slurm import sacct

    run_dir = tmp_path / "run"
    proc = gpupack(["+sweep=mnist_spread", *SMALL, "cluster=slurm", "partitions=[p100]", "packing.factors=[1]",
                    "packing.repeats=1", "spread.devices=[2]", f"run_dir={run_dir}"], slurm_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = json.loads((run_dir / "jobs.json").read_text())
    k2 = [j["job_id"] for p, j in jobs.items() if "-k02-" in p]
    assert len(k2) == 1
    assert wait_for(lambda: len(sacct(slurm_env, k2, "JobID")) == 1, timeout_s=60)
    ((_job, state, tres),) = sacct(slurm_env, k2, "JobID,State,AllocTRES")
    assert state == "COMPLETED" and "gres/gpu=2" in tres  # a real 2-GPU job
    pack = next(json.loads(p.read_text()) for p in run_dir.glob("packs/*-k02-*/pack.json"))
    assert pack["devices"] == 2 and len(pack["slurm_job_gpus"].split(",")) == 2
    (rec,) = [r for r in _records(run_dir) if r.get("devices") == 2]
    assert rec["status"] == "completed" and rec["spread"]["world"] == 2
    assert "a device-hour goes furthest with" in proc.stdout


# ---------------- records on disk → collect → the table (the real loader, no job run) ----------------

def _write_pack(root: Path, pack_id: str, mode: str, factor: int, walls: list[float], status: str = "completed",
                devices: int | None = None, pack_wall: float | None = None, t0: float = 1000.0) -> None:
    from gpupack.core.store.records import pack_record, training_record, write_json_atomic

    spread = {"devices": devices, "strategy": "ddp", "spread": {"allreduce_bytes_per_step": 407080.0,
                                                                "allreduce_s_per_step": 0.001}} if devices else {}
    common = dict(sweep="s", pack_id=pack_id, workload="w", mode=mode, factor=factor, partition="p100",
                  gpu_type="Tesla P100", gpu_model="P100-12gb", probe=False, **spread)
    recs = []
    for i, w in enumerate(walls):
        recs.append(training_record(**common, training_id=f"{pack_id}-t{i}", params={"seed": i}, grid_index=0,
                                    status=status, started_at=t0 + 0.5, ended_at=t0 + 0.5 + w, wall_s=w,
                                    throughput={"samples": 1000, "samples_per_s": 1000 / w}, metrics={},
                                    timings={"startup_s": 0.1, "loop_s": w - 0.1}))
        write_json_atomic(root / "packs" / pack_id / "trainings" / f"{pack_id}-t{i}.json", recs[-1])
    wall = pack_wall if pack_wall is not None else max(walls) + 0.5
    done = sum(status == "completed" for _ in walls)
    write_json_atomic(root / "packs" / pack_id / "pack.json", pack_record(
        **common, complete=True, n_completed=done, n_failed=len(walls) - done, n_oom=(len(walls) - done) * (
            status == "oom"), started_at=t0, ended_at=t0 + wall, wall_s=wall, concurrent=len(walls),
        training_ids=[r["training_id"] for r in recs]))


def _layout_run(tmp_path: Path, spread_status: str = "completed", oom: bool = True) -> Path:
    root = tmp_path / "run"
    for i in range(3):
        _write_pack(root, f"p100-process-n01-{i:03d}", "process", 1, [10.0], t0=1000.0 * i)
        _write_pack(root, f"p100-process-n04-{i:03d}", "process", 4, [12.0, 12.0, 12.0, 12.0], t0=1000.0 * i)
        if oom:
            _write_pack(root, f"p100-process-n08-{i:03d}", "process", 8, [1.0] * 8, status="oom", t0=1000.0 * i)
        # one training on 2 devices: 6 s of its own, 8 s of job (the pack's start-up included): 16 device-s
        _write_pack(root, f"p100-ddp-gloo-k02-{i:03d}", "ddp-gloo", 1, [6.0], status=spread_status, devices=2,
                    pack_wall=8.0, t0=1000.0 * i)
    return root


def test_collect_puts_spread_beside_packing_from_records_on_disk_with_an_all_oom_n(tmp_path):
    from gpupack.cli.show import make_console
    from gpupack.results.analysis.aggregate import aggregate
    from gpupack.results.report.terminal import render

    c = aggregate([_layout_run(tmp_path)], weights={"P100-12gb": 1.0})
    assert set(c.summary["factor"]) == {1, 4, 8}  # spread rows stay out of the packing table
    t = c.layouts.set_index("layout")
    assert t.loc["process N=4", "device_s_per_training"] == pytest.approx(12.5 / 4)  # pack wall / N
    assert t.loc["process N=4", "wall_s"] == pytest.approx(12.0)  # one training's own wall
    assert t.loc["ddp-gloo k=2", "device_s_per_training"] == pytest.approx(16.0)  # k x the job's wall
    assert t.loc["ddp-gloo k=2", "wall_s"] == pytest.approx(6.0)
    assert not t.loc["process N=8", "usable"] and t.loc["process N=8", "packs"] == 0  # every pack OOM'd
    assert list(c.layouts.loc[c.layouts["best"], "layout"]) == ["process N=4"]
    assert "one training takes 6 s there, 12 s with the best" in c.verdicts[0]
    console = make_console()
    with console.capture() as cap:
        render(c, console)
    out = cap.get()
    assert "ddp-gloo k=2" in out and "a device-hour goes furthest with 4 trainings on one device" in out


def test_a_run_whose_spread_trainings_failed_is_not_ok(tmp_path):
    from gpupack.results.analysis.aggregate import aggregate
    from gpupack.sweep import Outcome

    ok = Outcome(prepared=None, opened=None, collected=aggregate([_layout_run(tmp_path / "a", oom=False)]))
    failed = Outcome(prepared=None, opened=None, collected=aggregate([_layout_run(tmp_path / "b", "failed", False)]))
    assert ok.failed_trainings == 0 and ok.ok
    assert failed.failed_trainings == 3 and not failed.ok
