"""A best N the user can trust (issue 12): evidence kept across resume, order, caps, auto."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from gpupack import sweep
from gpupack.cli import main
from gpupack.results.report.terminal import render

REPO = Path(__file__).resolve().parents[1]
PROBE = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack"]


def _text(collected) -> str:
    console = Console(record=True, width=250)
    render(collected, console)
    return console.export_text()


@pytest.mark.slow
def test_an_oom_before_a_resume_still_makes_its_n_infeasible(tmp_path):
    """N=2 runs out of memory once; the resumed pack then completes. The OOM is still counted, N=2 is not chosen,
    until the user clears it."""
    run_dir = tmp_path / "run"
    overrides = PROBE + ["sweep.grid.lr=[0.1,0.2]", f"+sweep.fixed.oom_when_shared={tmp_path / 'gpu'}",
                         "packing.factors=[1,2]", "packing.repeats=1", f"run_dir={run_dir}"]
    first = sweep.run(sweep.prepare(overrides), plots=False)
    assert first.failed_trainings == 1
    again = sweep.run(sweep.prepare(overrides), plots=False)
    assert again.opened.resumed and [p.factor for p in again.opened.todo] == [2]
    assert again.failed_trainings == 0  # every training's latest record completed...
    s = again.collected.summary.set_index("factor")
    assert s.loc[2, "oom"] == 1 and s.loc[2, "attempts"] == 3 and s.loc[2, "failed"] == 1  # ...the OOM is kept
    assert s.loc[2, "infeasible"] and not s.loc[2, "chosen"]
    assert list(again.collected.best["factor"]) == [1]
    assert "1/3 (1 OOM: infeasible)" in _text(again.collected)

    assert main(["clear-oom", str(run_dir), "--factor", "2"]) == 0
    cleared, _ = sweep.collect([run_dir], plots=False)
    s = cleared.summary.set_index("factor")
    assert s.loc[2, "oom"] == 0 and s.loc[2, "oom_cleared"] == 1 and not s.loc[2, "infeasible"]
    assert (run_dir / "cleared_oom.json").exists() and any(run_dir.glob("packs/*/attempts/*/*.json"))  # kept


# ---------------- order: drift that lines up with N ----------------

import random  # noqa: E402

from gpupack.core.plan import make_plan  # noqa: E402
from gpupack.core.store.records import pack_record, training_record, write_json_atomic  # noqa: E402
from gpupack.core.store.rundir import RunDir  # noqa: E402
from gpupack.results.analysis.load import load_records  # noqa: E402
from gpupack.results.analysis.summary import BY_COPIES, BY_CORES, best_factors, gain_bounds, summarize  # noqa: E402,E501

TRUE_TPT = {1: 10.0, 2: 9.0, 3: 6.0, 4: 7.0}  # seconds per training on a quiet machine: N=3 is best


def _simulate(run: RunDir, order: str) -> list[int]:
    """Run the plan's packs in its order on a machine that gets 30 % faster for the last quarter of the run (a
    neighbour's job ends); write the records; return the chosen N."""
    plan = make_plan(sweep="s", workload="w", grid={"lr": [0.1]}, fixed={}, factors=list(TRUE_TPT),
                     modes=["process"], partitions=["local"], repeats=8, order=order)
    jitter = random.Random(0)
    for i, pack in enumerate(plan.packs):
        speed = 0.7 if i >= 0.75 * len(plan.packs) else 1.0
        wall = pack.factor * TRUE_TPT[pack.factor] * speed * (1 + 0.01 * jitter.uniform(-1, 1))
        for t in pack.trainings:
            write_json_atomic(run.training_record(pack.pack_id, t.training_id), training_record(
                pack_id=pack.pack_id, training_id=t.training_id, workload="w", params=dict(t.params), mode="process",
                factor=pack.factor, partition="local", gpu_type="cpu", status="completed", started_at=0.0,
                ended_at=wall))
        write_json_atomic(run.pack_record(pack.pack_id), pack_record(
            pack_id=pack.pack_id, mode="process", factor=pack.factor, partition="local", gpu_type="cpu", wall_s=wall,
            complete=True, concurrent=pack.factor, n_completed=pack.factor))
    rec = load_records([run.root])
    return list(best_factors(summarize(rec.trainings, rec.packs))["factor"])


@pytest.mark.parametrize("order, chosen", [("interleaved", [3]), ("by_factor", [4])])
def test_drift_lined_up_with_n_no_longer_changes_the_choice(tmp_path, order, chosen):
    """Interleaved, every N gets its share of the fast quarter and N=3 is chosen; run N by N (what gpupack did
    before), all N=4 packs land in the fast quarter and N=4 is wrongly chosen beyond noise."""
    assert _simulate(RunDir(tmp_path / order), order) == chosen


STEADY_TPT = {1: 10.0, 2: 9.0, 3: 9.6, 4: 11.0}  # N=2 best by 10 %: a gain a drift over the run can hide


def _programmed(run: RunDir, slowdown: float) -> object:
    """The default sweep's shape (4 grid points, N = 1-4, 4 packs each) run in the plan's order on a programmed
    device that gets ``slowdown`` slower with every pack it runs; the records as the job writes them (round, drift
    check); the summary."""
    from gpupack.job.records import order_fields

    plan = make_plan(sweep="s", workload="w", grid={"lr": [0.05, 0.1], "batch_size": [64, 128]}, fixed={},
                     factors=list(STEADY_TPT), modes=["process"], partitions=["local"], repeats=4)
    jitter = random.Random(1)
    clock = 0.0
    for i, pack in enumerate(plan.packs):
        wall = pack.factor * STEADY_TPT[pack.factor] * (1 + slowdown) ** i * (1 + 0.01 * jitter.uniform(-1, 1))
        for t in pack.trainings:
            write_json_atomic(run.training_record(pack.pack_id, t.training_id), training_record(
                pack_id=pack.pack_id, training_id=t.training_id, workload="w", params=dict(t.params), mode="process",
                factor=pack.factor, partition="local", gpu_type="cpu", status="completed", started_at=clock,
                ended_at=clock + wall, **order_fields(pack)))
        write_json_atomic(run.pack_record(pack.pack_id), pack_record(
            pack_id=pack.pack_id, mode="process", factor=pack.factor, partition="local", gpu_type="cpu", wall_s=wall,
            complete=True, concurrent=pack.factor, n_completed=pack.factor, started_at=clock, **order_fields(pack)))
        clock += wall
    return sweep.collect([run.root], plots=False)[0]


def test_a_device_that_slows_pack_by_pack_gets_the_answer_of_a_steady_one(tmp_path):
    """A device 3 % slower with every pack (50 % by the run's end), against a steady one: the same N, the gain said
    paired within rounds, and the drift check names the slowdown. Run all N=1 packs first (what measure_first did)
    and the drift flattens N=2's 10 % gain into N=1's."""
    steady = _programmed(RunDir(tmp_path / "steady"), 0.0)
    slowing = _programmed(RunDir(tmp_path / "slowing"), 0.03)
    assert list(steady.best["factor"]) == [2]
    assert list(slowing.best["factor"]) == list(steady.best["factor"])
    row = slowing.best.iloc[0]
    assert row["paired"] and row["gain_ref"] == 1 and row["gain"] == pytest.approx(10 / 9, rel=0.05)
    (drift,) = slowing.drift.itertuples()
    assert drift.change > 0.3 and "the machine got slower during the run" in _text(slowing)
    assert "steady within 10%" in _text(steady)


def test_a_tie_is_reported_as_a_tie_with_its_rule_and_a_provisional_answer_says_so(tmp_path):
    run = RunDir(tmp_path / "run")
    walls = {1: [10.0, 10.3, 9.7], 2: [12.0, 12.6, 11.4], 3: [18.3, 17.4, 18.9], 4: [40.0, 41.0, 39.0]}
    for n, ws in walls.items():
        for i, wall in enumerate(ws):
            pack_id = f"local-process-n{n:02d}-{i:03d}"
            for k in range(n):
                write_json_atomic(run.training_record(pack_id, f"t{n}-{i}-{k}"), training_record(
                    pack_id=pack_id, training_id=f"t{n}-{i}-{k}", workload="w", params={"seed": k}, mode="process",
                    factor=n, partition="local", gpu_type="cpu", status="completed", started_at=0.0, ended_at=wall))
            write_json_atomic(run.pack_record(pack_id), pack_record(
                pack_id=pack_id, mode="process", factor=n, partition="local", gpu_type="cpu", wall_s=wall,
                complete=True, concurrent=n, n_completed=n))
    collected, _ = sweep.collect([run.root], plots=False)
    s = collected.summary.set_index("factor")
    assert list(s["within_noise"]) == [False, True, True, False] and s.loc[2, "chosen"]  # 6.0 s vs 6.1 s: a tie
    text = _text(collected)
    assert "N=2–3 tie (within noise of the lowest median); picked by the rule: smallest N" in text
    assert "Best packing factor for w on local (cpu), mode process: N=2" in text
    assert "Provisional: 3 pack(s)" in text and "packs per N would settle it" in text
    assert "│ 2* │" in text and "│ 3~ │" in text and "│  1 │" in text  # N marks: chosen *, within noise ~


# ---------------- capacity caps, before anything runs ----------------

from gpupack.core.memory.figures import Figure, Measured, TrainingMemory, check_memory, estimate  # noqa: E402
from gpupack.core.types import Capacity  # noqa: E402
from gpupack.errors import ConfigError  # noqa: E402
from gpupack.submit.slurm import SlurmConfig, SlurmSubmitter  # noqa: E402
from gpupack.sweep.setup.cluster_facts import ClusterFacts, idle_gpu_warnings  # noqa: E402


def test_a_hundred_thousand_trainings_on_the_local_default_are_refused_in_one_line(tmp_path, capsys):
    code = main(["+sweep=mnist_pack", "packing.factors=[100000]", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "packing.factors[0]=100000" in err and "of host memory" in err and "lower N to at most" in err
    assert not (tmp_path / "run").exists()


def _write_training(run: RunDir, workload: str, params: dict, rss_mb: float) -> None:
    write_json_atomic(run.training_record("local-process-n01-000", "t0"), training_record(
        pack_id="local-process-n01-000", training_id="t0", workload=workload, params=params, status="completed",
        gpu_type="cpu", device="cpu", memory={"peak_rss_mb": rss_mb, "peak_gpu_mem_mb": None}))  # as a CPU job writes
    write_json_atomic(run.plan, {"schema": 1})


def test_memory_measured_in_an_earlier_run_of_the_same_setting_caps_n(tmp_path):
    """An earlier run (a sibling under runs/<sweep>/) measured 3 GB per training of this setting: N=8 (24 GB) no
    longer fits this machine's budget; a training of another setting, or nothing measured, does not cap it."""
    params = {"lr": 0.1, "steps": 20, "sleep_s": 0.02}
    overrides = PROBE + ["sweep.grid.lr=[0.1]", "packing.factors=[8]", "packing.memory_fraction=0.8",
                         f"run_dir={tmp_path / 'sweep' / 'new'}"]
    defaults = {k: v for k, v in sweep.prepare(overrides).spec.fixed.items()}
    _write_training(RunDir(tmp_path / "sweep" / "other"), "tests.fake_workloads",
                    {**defaults, **params, "lr": 0.5, "seed": 0}, rss_mb=3000)  # another setting
    assert sweep.prepare(overrides).spec.memory.host.measured is False
    _write_training(RunDir(tmp_path / "sweep" / "earlier"), "tests.fake_workloads",
                    {**defaults, **params, "seed": 7}, rss_mb=3000)  # same setting, another seed
    budget_gb = sweep.prepare(PROBE + ["packing.factors=[1]", f"run_dir={tmp_path / 'x'}"]).capacities[
        "local"].max_mem_mb * 0.8 / 1024
    if budget_gb >= 24:
        pytest.skip(f"this machine holds 8 x 3 GB in its budget ({budget_gb:.0f} GB)")
    with pytest.raises(ConfigError, match=r"packing.factors\[0\]=8: 8 trainings x 3000 MB \(the peak of 1 earlier"):
        sweep.prepare(overrides)


@pytest.mark.parametrize("gpu_mb, measured_gpu, n, refused", [
    (16384, None, 13, True),   # 13 x 1024 (default) > 80 % of 16 GB
    (16384, None, 12, False),
    (16384, 300.0, 34, False),  # measured 300 MB: the source's N=34 fits a V100-16gb
    (16384, 500.0, 34, True),
    (10240, 500.0, 16, False),  # an H100 1g.10gb slice: 8 GB budget
    (10240, 500.0, 17, True),
])
def test_gpu_memory_caps_n(gpu_mb, measured_gpu, n, refused):
    cap = {"v100": Capacity(has_gpu=True, gpu_memory_mb=gpu_mb, max_mem_mb=None)}
    memory = estimate(None, Measured(gpu_mb=measured_gpu, trainings=3, where="runs/x"))
    if refused:
        with pytest.raises(ConfigError, match=f"packing.factors\\[0\\]={n}: .* of GPU memory"):
            check_memory([n], cap, memory, 0.8, key=lambda i: f"packing.factors[{i}]")
    else:
        check_memory([n], cap, memory, 0.8, key=lambda i: f"packing.factors[{i}]")


def test_too_many_processes_are_refused():
    memory = TrainingMemory(host=Figure(1.0, "x"), gpu=Figure(1.0, "x"))
    with pytest.raises(ConfigError, match="may start 50 more"):
        check_memory([64], {"local": Capacity(max_processes=50)}, memory, 0.8, key=lambda i: "packing.factors[0]")


def _slurm(mem_gb=None):
    cluster = SlurmConfig(name="t", backend="slurm", partitions={}, cpus_per_training=1.0, mem_gb_per_training=mem_gb)
    return SlurmSubmitter(cluster, RunDir(Path("/nonexistent")))


@pytest.mark.parametrize("mem_gb, measured, mem_mb, why", [
    (None, None, 4 * 2048, "default"),
    (None, 640.0, 4 * 960, "measured peak 640 MB x 1.5"),
    (None, 100.0, 4 * 512, "measured peak 100 MB"),  # never below 512 MB a training
    (3.0, 640.0, 4 * 3072, "as set"),  # the user's setting wins
])
def test_slurm_requests_are_sized_from_the_measured_peak(mem_gb, measured, mem_mb, why):
    backend = _slurm(mem_gb)
    backend.measured_host_mb = None if measured is None else Figure(measured, "runs/x", measured=True)
    req = backend.request(4)
    assert req.mem_mb == mem_mb and why in req.mem_why


def test_a_request_that_leaves_a_nodes_gpus_idle_is_warned_about():
    """The issue's case: N=4 asking 8 GB on a 15.6 GB node with 2 GPUs leaves one GPU idle; sized from the measured
    0.64 GB peak it does not."""
    backend = _slurm()
    facts = ClusterFacts(partitions=("p100",), request=backend.request, capacities={
        "p100": Capacity(has_gpu=True, node_gpus=2, node_cpus=8, node_mem_mb=16000)})
    warned = idle_gpu_warnings([4], facts, None)
    assert len(warned) == 1 and "1 pack(s) fit per node and 1 GPU(s) sit idle" in warned[0]
    assert "cluster.mem_gb_per_training=2" in warned[0]
    assert idle_gpu_warnings([4], facts, Figure(640.0, "runs/x", measured=True)) == []


# ---------------- packing.factors=auto ----------------

from gpupack.sweep.flow.auto import verdict  # noqa: E402


@pytest.mark.parametrize("times, best, oom, unfinished, expected", [
    ({1: [10, 10.1], 2: [6, 6.1]}, 1, 0, 0, "climb"),
    ({1: [10, 10.1], 2: [9.8, 9.9]}, 1, 0, 0, "improves on N=1 by 2.0 % (< 5 %)"),  # a plateau
    ({1: [10, 10.1], 2: [11, 11.1]}, 1, 0, 0, "N=2 is slower than N=1"),
    ({1: [10, 10.1], 2: [7.0, 10.6]}, 1, 0, 0, "within noise"),  # 12 % better by the median, not beyond noise
    ({1: [10, 10.1], 2: [6, 6.1]}, 1, 1, 0, "N=2 ran out of memory (1 training(s))"),
    ({1: [10, 10.1], 2: [6, 6.1]}, 1, 0, 2, "N=2: 2 training(s) did not complete"),
    ({1: [10, 10.1]}, 1, 0, 0, "no pack of it finished"),
])
def test_each_reason_auto_stops_for(times, best, oom, unfinished, expected):
    assert expected in verdict(2, times, best, oom, unfinished, 0.05)


def test_auto_stops_where_its_n_was_skipped_for_memory():
    assert verdict(2, {1: [10, 10.1]}, 1, 0, 0, 0.05, skipped=4) == "N=2 was skipped for memory (4 training(s))"


AUTO = PROBE + ["packing.factors=auto", "sweep.fixed.steps=5", "sweep.fixed.sleep_s=0.01"]


def _auto(tmp_path, *extra):
    run_dir = tmp_path / "run"
    outcome = sweep.run(sweep.prepare(AUTO + [f"run_dir={run_dir}", *extra]), plots=False)
    return run_dir, outcome


@pytest.mark.slow
@pytest.mark.quiet
def test_auto_stops_on_a_plateau_and_runs_the_rest_of_the_grid_at_the_best_n(tmp_path):
    """A programmed device: a training takes 1 s alone or two at a time, 2.7 s three at a time (time per training
    0.5 s at N=2, 0.9 s at N=3), whatever the machine's load. The probe stops at N=3, says why, picks N=2, and the
    grid points it did not train run at that N, shown apart."""
    _plateau(tmp_path)


PLATEAU = ["sweep.grid.lr=[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0]", "+sweep.fixed.sleep_by_n='1:1.0,2:1.0,3:2.7'",
           "packing.auto.ladder=[1,2,3,4,8]", "packing.auto.repeats=2"]


def _plateau(tmp_path):
    run_dir, outcome = _auto(tmp_path, *PLATEAU)
    report = outcome.auto
    why = report.stopped["local"]
    assert "slower than" in why, why
    best = report.best["local"]
    assert best == 2 and [s.factor for s in report.steps] == [1, 2, 3]  # N=3 is slower: the climb stops there
    assert report.run_dir == str(run_dir / "run") and report.left and report.left > 0
    production = outcome.collected.production
    assert list(production["factor"].unique()) == [best] and int(production["unfinished"].sum()) == 0
    assert all(r["phase"] == "run" for r in map(read_json_file, (run_dir / "run").glob("packs/*/pack.json")))
    text = _text(outcome.collected)
    assert "probe (packing.factors=auto)" in text and "The rest of the grid at the best N" in text
    assert f"local: probe stopped — {why}. Best N: {best}." in text

    again, _ = sweep.collect([run_dir], plots=False)  # a later collect says the same
    assert f"local: probe stopped — {why}. Best N: {best}." in _text(again)
    resumed = sweep.run(sweep.prepare(AUTO + [f"run_dir={run_dir}", *PLATEAU]), plots=False)
    assert resumed.results == [] and resumed.auto.best == report.best  # nothing ran again; the same answer


def read_json_file(path):
    from gpupack.core.store.records import read_json

    return read_json(path)


@pytest.mark.slow
def test_auto_stops_at_an_oom_and_does_not_choose_that_n(tmp_path):
    run_dir, outcome = _auto(tmp_path, "sweep.grid.lr=[0.1,0.2,0.3]", f"+sweep.fixed.oom_when_shared={tmp_path / 'g'}",
                             "packing.auto.ladder=[1,2,3]", "packing.auto.repeats=2")
    assert outcome.auto.stopped["local"].startswith("N=2 ran out of memory")
    assert outcome.auto.best["local"] == 1 and [s.factor for s in outcome.auto.steps] == [1, 2]
    assert not (run_dir / "probe" / "n03").exists()  # N=3 was never tried


@pytest.mark.slow
def test_auto_stops_where_the_measured_memory_passes_the_budget(tmp_path):
    """By the stated 50 MB, N=2 would fit a 450 MB budget; the N=1 step measures ~300 MB a training (it allocates
    256 MB), so the probe stops before N=2 — for memory alone, whatever the timings (the first step always climbs)."""
    import psutil

    fraction = 450 / (psutil.virtual_memory().total / 2**20)  # a 450 MB budget on any machine
    run_dir, outcome = _auto(tmp_path, "sweep.grid.lr=[0.1]", "+sweep.fixed.allocate_gb=0.25",
                             "sweep.training_memory_mb=50", f"packing.memory_fraction={fraction:.6f}",
                             "packing.auto.ladder=[1,2,3]", "packing.auto.repeats=2")
    assert [s.factor for s in outcome.auto.steps] == [1]
    why = outcome.auto.stopped["local"]
    assert why.startswith("N=2 not tried: 2 trainings x ") and "the peak of" in why and "of host memory" in why, why
    peak = float(why.split("2 trainings x ")[1].split(" MB")[0])
    assert 256 < peak < 450 < 2 * peak  # the measured figure, not the stated 50 MB
    assert outcome.auto.best["local"] == 1


@pytest.mark.slow
def test_auto_forecasts_where_memory_stops_it_and_the_probe_decides(tmp_path):
    """Stated 4 GB a training, the climb would stop before N=8 on this budget; the N=1 step measures a few MB, and
    the probe goes on to N=8 (the first step always climbs, so no timing decides this). Whether it climbs past N=8
    is the timing's to say (packs measured under load are left out): only that memory does not stop it is asserted."""
    import psutil

    fraction = 3 * 4000 / (psutil.virtual_memory().total / 2**20)  # room for 3 stated trainings, not for 8
    overrides = AUTO + [f"run_dir={tmp_path / 'run'}", "sweep.training_memory_mb=4000",
                        f"packing.memory_fraction={min(fraction, 1.0):.6f}", "packing.auto.ladder=[1,8]",
                        "sweep.grid.lr=[0.1]", "packing.auto.repeats=2"]
    prepared = sweep.prepare(overrides)
    assert list(prepared.spec.auto.ladder) == [1, 8] and prepared.spec.auto.cut is None
    assert "stops before N=8" in prepared.spec.auto.memory_note
    assert not (tmp_path / "run").exists()
    outcome = sweep.run(prepared, plots=False)
    assert [s.factor for s in outcome.auto.steps] == [1, 8]  # measured figures replaced the stated one
    stopped = outcome.auto.stopped["local"]
    assert "memory" not in stopped and "not tried" not in stopped, stopped


@pytest.mark.slow
def test_status_of_an_auto_run_lists_its_probe_and_run_packs(tmp_path):
    run_dir, outcome = _auto(tmp_path, "sweep.grid.lr=[0.1,0.2,0.3,0.4,0.5]", "packing.auto.ladder=[1,2]",
                             "packing.auto.repeats=2")
    subs = [run_dir / "probe" / "n01", run_dir / "probe" / "n02", run_dir / "run"]
    assert outcome.auto.run_dir == str(subs[2]) and outcome.auto.left == 1  # the probe trained 4 of the 5 points
    expected = [p.pack_id for sub in subs for p in sweep.status(sub).packs]
    st = sweep.status(run_dir)
    # n02 holds N=1 again, measured beside N=2; each step's N=1 also at its 1-thread set-up (2 cores, 2 threads)
    assert sorted(p.pack_id for p in st.packs) == sorted(expected) and len(expected) == (2 + 2) + (2 + 2 + 2) + 1
    assert all(p.state == "done" for p in st.packs)


@pytest.mark.slow
@pytest.mark.quiet
def test_auto_with_wait_false_submits_one_step_a_call_and_the_same_command_goes_on(tmp_path, monkeypatch):
    """Issue 30, item 5: nothing waits on a login node. Each call submits the next step's jobs and returns; called
    again while they are queued it submits nothing; once they have ended it decides from their records and submits
    the next; the last call collects. Every pack runs once."""
    from tests.fakes import FakeConfig, FakeQueue, use_fake_submitter

    queue = FakeQueue()
    use_fake_submitter(monkeypatch, config=FakeConfig(default_partitions=["cpu"]), queue=queue)
    run_dir = tmp_path / "run"
    # a programmed device (1 s a pack alone or two at a time), so the best N does not hang on this machine's load
    command = AUTO + ["sweep.grid.lr=[0.1,0.2,0.3,0.4,0.5]", "packing.auto.ladder=[1,2]", "packing.auto.repeats=2",
                      "+sweep.fixed.sleep_by_n='1:1.0,2:1.0'", "packing.device=cpu", "wait=false", f"run_dir={run_dir}"]
    waited, ran = [], []
    for _ in range(6):
        outcome = sweep.run(sweep.prepare(command), plots=False)
        if outcome.auto.waiting is None:
            break
        waited.append((outcome.auto.waiting.rpartition("/")[2], len(outcome.submitted)))
        again = sweep.run(sweep.prepare(command), plots=False)  # called again while they are queued
        assert again.auto.waiting == outcome.auto.waiting and again.submitted == {}
        ran += queue.drain()
    # a step a call (N=1 at both its set-ups: the fake cpu partition has 16 cores); N=1 again beside N=2; the point left
    assert waited == [("n01", 4), ("n02", 6), ("run", 1)]
    assert len(ran) == len(set(ran)) == 11 and queue.waiting == {}
    assert outcome.auto.best == {"cpu": 2} and outcome.auto.run_dir == str(run_dir / "run")
    assert int(outcome.collected.production["unfinished"].sum()) == 0


def test_the_cli_says_what_an_auto_call_with_wait_false_submitted_and_what_to_do_next(tmp_path, monkeypatch, capsys):
    from gpupack.cli import main
    from tests.fakes import FakeConfig, FakeQueue, use_fake_submitter

    use_fake_submitter(monkeypatch, config=FakeConfig(default_partitions=["cpu"]), queue=FakeQueue())
    run_dir = tmp_path / "run"
    assert main(AUTO + ["sweep.grid.lr=[0.1,0.2,0.3]", "packing.auto.ladder=[1,2]", "packing.auto.repeats=2",
                        "packing.device=cpu", "wait=false", f"run_dir={run_dir}"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Submitted 4 pack job(s): queued-1, queued-2, queued-3, queued-4" in out, out  # N=1 at both set-ups
    assert (f"Waiting for the probe at N=1 in {run_dir}/probe/n01: run the same command again once its jobs have "
            f"ended (python -m gpupack watch {run_dir}/probe/n01)") in out, out


@pytest.mark.slow
def test_auto_with_wait_false_decides_a_step_whose_trainings_failed_and_never_submits_it_again(tmp_path, monkeypatch):
    """A failure or an OOM at a rung is how a climb often stops: the step is decided from its records, not run again
    on every call (it would wait for itself forever)."""
    from tests.fakes import FakeConfig, FakeQueue, use_fake_submitter

    queue = FakeQueue()
    use_fake_submitter(monkeypatch, config=FakeConfig(default_partitions=["cpu"]), queue=queue)
    command = AUTO + ["sweep.grid.lr=[0.1,0.2,0.3]", "packing.auto.ladder=[1,2]", "packing.auto.repeats=2",
                      "+sweep.fixed.fail=true", "packing.device=cpu", "wait=false", f"run_dir={tmp_path / 'run'}"]
    first = sweep.run(sweep.prepare(command), plots=False)
    assert first.auto.waiting and len(first.submitted) == 4  # N=1 at both its set-ups
    assert len(queue.drain()) == 4
    for _ in range(2):  # decided, and the same answer on any later call
        outcome = sweep.run(sweep.prepare(command), plots=False)
        assert outcome.auto.waiting is None and outcome.submitted == {}
        assert outcome.auto.best == {"cpu": None} and "did not complete" in outcome.auto.stopped["cpu"]
    assert queue.submitted == 4 and queue.waiting == {}


# ---------------- a gain above what N trainings can give ----------------

import pandas as pd  # noqa: E402

from gpupack.results.report.text import best_line, choice_lines  # noqa: E402


def _row(n, gain, ref=1, low=None, high=None, gpu="cpu", paired=True, **more):
    return pd.Series({"workload": "w", "partition": "local", "gpu_type": gpu, "mode": "process", "factor": n,
                      "time_per_training_s": 5.72, "gain": gain, "gain_ref": ref, "gain_low": low, "gain_high": high,
                      "gain_bound": n / ref, "gain_bound_by": BY_CORES if gpu == "cpu" else BY_COPIES,
                      "beyond_bound": gain > n / ref, "paired": paired, "gain_rounds": 4,
                      "cores": 2, "threads_by_n": "N=1: 2, N=2: 1", "provisional": False, "packs": 4, **more})


@pytest.mark.parametrize("row, said, not_said", [
    (_row(2, 7.41), ["N=2 — 5.72 s per training, 7.41x the trainings per hour of N=1 (paired within 4 rounds) — not to "
                     "be trusted: N=2's gain 7.41x exceeds the 2x that 2 trainings at once can give over one alone",
                     "so the machine changed during the run", "N=1 was set up worse than a training at N=2",
                     "on this CPU (2 cores), threads per training N=1: 2, N=2: 1",
                     "packing.threads_per_training=1"], ["within noise of the bound"]),
    (_row(2, 2.05, low=1.9, high=2.2), ["exceeds the 2x", "(its interval 1.90x–2.20x holds it: within noise of the "
                                        "bound)"], []),
    (_row(4, 2.5, ref=2), ["N=4's gain 2.50x exceeds the 2x that 4 trainings at once can give over N=2"], []),
    (_row(2, 1.9), ["1.90x the trainings per hour of N=1 (paired within 4 rounds).",
                    "On this CPU (2 cores): threads per training N=1: 2, N=2: 1."], ["exceeds", "not to be trusted"]),
    (_row(2, 7.41, gpu="H100", paired=False), ["(ratio of medians) — not to be trusted: N=2's gain 7.41x exceeds"],
     ["threads per training", "On this CPU"]),
])
def test_a_gain_above_n_times_is_never_the_answer_without_the_words_that_say_why(row, said, not_said):
    text = "\n".join([best_line(row), *choice_lines(row)])
    for words in said:
        assert words in text, (words, text)
    for words in not_said:
        assert words not in text, (words, text)


def _loaded_run(run: RunDir, rounds: list[dict[int, tuple[float, float]]], mode: str = "process") -> None:
    """Packs of each N in rounds on 2 cores; each (time per training, foreign cores) as its sampler measured them."""
    for r, by_n in enumerate(rounds):
        for n, (tpt, foreign) in by_n.items():
            pack_id = f"local-{mode}-n{n:02d}-{r:03d}"
            for k in range(n):
                write_json_atomic(run.training_record(pack_id, f"t{n}-{r}-{k}"), training_record(
                    pack_id=pack_id, training_id=f"t{n}-{r}-{k}", workload="w", params={"seed": k}, mode=mode,
                    factor=n, partition="local", gpu_type="cpu", status="completed", started_at=0.0,
                    ended_at=tpt * n, threads=max(1, 2 // n), round=r))
            write_json_atomic(run.pack_record(pack_id), pack_record(
                pack_id=pack_id, mode=mode, factor=n, partition="local", gpu_type="cpu", wall_s=tpt * n,
                complete=True, concurrent=n, n_completed=n, cores=2, round=r,
                sampler={"foreign_cpu_cores_mean": foreign, "job_cores": 2}))


@pytest.mark.parametrize("t1, t2, gain, beyond", [(30.0, 5.0, 6.0, True), (12.5, 5.0, 2.5, True),
                                                  (9.0, 5.0, 1.8, False)])
def test_the_summary_marks_a_gain_beyond_its_bound_and_the_table_says_so(tmp_path, t1, t2, gain, beyond):
    """N=1's packs ran while another job held the machine, N=2's after it ended: a gain of 6x or 2.5x at N=2 is
    marked beyond its 2x bound, in the table (!) and in the answer; 1.8x is not."""
    run = RunDir(tmp_path / "run")
    _loaded_run(run, [{1: (t1 * d, 0.0), 2: (t2 * d, 0.0)} for d in (1.0, 1.0, 1.02)])  # quiet as measured
    collected, _ = sweep.collect([run.root], plots=False)
    s = collected.summary.set_index("factor")
    assert s.loc[2, "beyond_bound"] == beyond and not s.loc[1, "beyond_bound"] and s.loc[2, "gain_bound"] == 2
    assert s.loc[2, "gain"] == pytest.approx(gain, rel=0.03) and s.loc[2, "threads"] == 1 and s.loc[1, "threads"] == 2
    text = _text(collected)
    said = [f"{gain:.2f}p!", "!: more than the device can give (min(N, cores)x a training alone on a CPU",
            f"N=2's gain {gain:.2f}x exceeds the 2x that 2 trainings at once can give over one alone on 2 cores",
            "No answer for w on local (cpu), mode process", "2?"]
    assert all((words in text) == beyond for words in said), text
    assert ("Best packing factor" in text) != beyond and collected.best.empty == beyond
    assert list(collected.withheld["factor"]) == ([2] if beyond else [])


@pytest.mark.parametrize("mode, t4, named", [("fused", 0.75, True), ("process", 0.75, False), ("fused", 0.5, False)])
def test_a_mode_of_one_process_may_gain_past_the_cores_by_paying_its_start_once_a_pack(tmp_path, mode, t4, named):
    """fused runs a pack's N trainings in one process. On 2 cores, a 2 s start and 0.5 s of work a training make N=1
    2.5 s a training and N=4 (2 + 4 x 0.5 / 2) / 4 = 0.75 s: 3.3x, which the start paid once gives, not the cores (a
    real fused run at N=4 here measured 3.32x and was told "no N can do that"). Its bound is N / ref, 4x: named. The
    same figures in process mode, where each training starts its own process on the 2 cores, pass min(N, cores) = 2x:
    no answer; and fused past 4x is no answer, its bound said in its words."""
    run = RunDir(tmp_path / "run")
    _loaded_run(run, [{1: (2.5 * d, 0.0), 4: (t4 * d, 0.0)} for d in (1.0, 1.0, 1.02)], mode=mode)
    collected, _ = sweep.collect([run.root], plots=False)
    s = collected.summary.set_index("factor")
    assert s.loc[4, "gain_bound"] == (4 if mode == "fused" else 2)
    text = _text(collected)
    assert (f"Best packing factor for w on local (cpu), mode {mode}: N=4" in text) == named, text
    assert (f"No answer for w on local (cpu), mode {mode}" in text) != named, text
    bound = ("the 4x that 4 trainings at once can give over one alone in one process, whose start a pack pays once"
             if mode == "fused" else "the 2x that 4 trainings at once can give over one alone on 2 cores")
    assert (bound in text) != named, text


def test_every_mode_that_runs_a_pack_in_one_shared_process_says_so():
    """A mode that starts its pack through gpupack/job/pack/_shared.py runs its N trainings in one process: its
    ``one_process`` is what gives it the bound N / ref (one that left it False would have its gains refused on a CPU,
    as fused's were)."""
    import inspect

    from gpupack.job.pack import available_modes, load_packer

    for mode in available_modes():
        packer = load_packer(mode)
        source = inspect.getsource(inspect.getmodule(type(packer)))  # type: ignore[arg-type]
        assert ("run_shared(" in source) == packer.one_process, mode


@pytest.mark.parametrize("cores, n, ref, gpu, mode, bound", [
    (2, 3, 1, "cpu", "process", 2.0), (2, 2, 1, "cpu", "process", 2.0), (8, 3, 1, "cpu", "process", 3.0),
    (2, 4, 2, "cpu", "process", 1.0), (4, 8, 2, "cpu", "process", 2.0), (2, 3, 1, "H100", "process", 3.0),
    (None, 3, 1, "cpu", "process", 3.0), (2, 4, 1, "cpu", "tf_logical", 4.0), (2, 4, 2, "cpu", "fused", 2.0),
    (2, 4, 1, "cpu", "ddp-gloo", 2.0)])
def test_the_bound_is_the_devices(cores, n, ref, gpu, mode, bound):
    """On a CPU, no more trainings run at once than it has cores: min(N, cores) / min(ref, cores); on a GPU (or cores
    unknown), and in a mode whose N trainings share one process (its start paid once a pack), N / ref; a label the
    registry does not hold (a spread layout's) is bounded by the cores."""
    from gpupack.results.analysis.summary import gain_bounds

    frame = pd.DataFrame([{"factor": n, "gain_ref": ref, "gpu_type": gpu, "cores": cores, "mode": mode}])
    assert gain_bounds(frame).iloc[0] == pytest.approx(bound)


@pytest.mark.parametrize("rounds, named, why", [
    # N=1 14x slower under foreign load in every round, N=2 quiet: 14x > 2 is no answer
    ([{1: (70.0, 1.8), 2: (5.0, 0.0)}] * 3, None, "exceeds the 2x that 2 trainings at once can give"),
    # both slowed in every round: nothing quiet to weigh
    ([{1: (70.0, 1.8), 2: (40.0, 1.8)}] * 3, None, "every pack of every N was measured under foreign load"),
    # the hog in one round only: its packs are left out, and the quiet rounds name N=2
    ([{1: (70.0, 1.8), 2: (5.0, 0.0)}, {1: (9.0, 0.0), 2: (5.0, 0.0)}, {1: (9.0, 0.0), 2: (5.0, 0.0)}], 2, None),
])
def test_a_reference_slowed_by_its_neighbours_never_names_an_impossible_answer(tmp_path, rounds, named, why):
    """A programmed device whose reference is 14x slower under foreign load (and not the other N): no N is named
    beyond what 2 cores can give, and the answer box is not green; a quiet majority still names its N."""
    from gpupack.results.report.html import answer_section

    run = RunDir(tmp_path / "run")
    _loaded_run(run, rounds)
    collected, _ = sweep.collect([run.root], plots=False)
    text, box = _text(collected), answer_section(collected)
    assert list(collected.best["factor"]) == ([named] if named else [])
    assert ("No answer for" in text) == ("No answer for" in box) == (named is None)
    if why:
        assert why in text and "Provisional" not in text and "would settle it" not in text, text
        assert "class='answer none'" in box
    else:
        assert "class='answer'" in box and "Best packing factor for w on local (cpu), mode process: N=2" in text


@pytest.mark.slow
@pytest.mark.quiet
def test_a_real_runs_packs_start_in_rounds_each_n_spread_over_the_run(tmp_path):
    """The default sweep at N = 1-4, 3 packs each at least, tiny sizes, really run: ordered by their first training's
    start, the packs run in the plan's rounds, each N's mean position is the run's middle (0.5 ± 0.15), and the drift
    check runs last."""
    run_dir = tmp_path / "run"
    prepared = sweep.prepare(["+sweep=mnist_pack", "packing.factors=[1,2,3,4]", "packing.repeats=3",
                              "sweep.fixed.train_samples=1000", "sweep.fixed.val_samples=200",
                              "sweep.fixed.epochs=1", f"run_dir={run_dir}"])
    outcome = sweep.run(prepared, plots=False)
    assert outcome.ok
    # the run's last line, status and the plan count the same trainings: each of each pack (a grid point at N=1 and
    # at N=4 is two), the drift check's too
    counts = outcome.collected.records.plan_counts()
    assert counts.done and counts.planned == counts.completed == prepared.plan.n_trainings
    assert sum(sweep.status(run_dir).trainings["local"].values()) == prepared.plan.n_trainings
    rec = load_records([run_dir])
    first_start = rec.trainings.groupby("pack_id")["started_at"].min().sort_values()
    ran = list(first_start.index)
    assert ran == [p.pack_id for p in prepared.plan.packs]  # the order the dry run lists is the order they ran
    assert ran[-1].endswith("-end")
    measured = [p for p in ran if not p.endswith("-end")]
    factors = rec.packs.set_index("pack_id")["factor"]
    positions: dict[int, list[float]] = {}
    for i, pack_id in enumerate(measured):
        positions.setdefault(int(factors[pack_id]), []).append((i + 0.5) / len(measured))
    assert sorted(positions) == [1, 2, 3, 4]
    for n, pos in positions.items():
        assert abs(sum(pos) / len(pos) - 0.5) <= 0.15, (n, pos)
    rounds = rec.packs.set_index("pack_id")["round"]
    assert [rounds[p] for p in measured] == sorted(rounds[p] for p in measured)


def test_packs_measured_under_foreign_load_are_left_out_of_the_choice_where_every_n_keeps_a_quiet_one(tmp_path):
    """A hog in the first two rounds slows N=1's two threads 4x and N=2's single ones 1.5x (load from outside is not
    shared evenly by a round): paired, N=2 would gain 5x. Left out, the quiet rounds say 1.6x, and the method says
    how many packs were left out. Where an N has no quiet pack they are kept, and the method says so."""
    hogged = {1: (40.0, 1.8), 2: (9.0, 1.8)}
    quiet = {1: (10.0, 0.0), 2: (6.25, 0.0)}
    _loaded_run(RunDir(tmp_path / "some"), [hogged, hogged, quiet, quiet])
    collected, _ = sweep.collect([tmp_path / "some"], plots=False)
    row = collected.summary.set_index("factor").loc[2]
    assert row["gain"] == pytest.approx(1.6) and row["left_out_disturbed"] == 4 and not row["beyond_bound"]
    assert "4 pack(s) measured under foreign load left out" in row["choice_method"]
    assert "1.60x the trainings per hour of N=1 (paired within 2 rounds)" in _text(collected)

    _loaded_run(RunDir(tmp_path / "all"), [hogged, hogged, {1: quiet[1], 2: hogged[2]}])
    collected, _ = sweep.collect([tmp_path / "all"], plots=False)
    row = collected.summary.set_index("factor").loc[2]
    assert row["left_out_disturbed"] == 0 and row["beyond_bound"]
    assert "5 pack(s) measured under foreign load kept (an N has no quiet pack)" in row["choice_method"]


@pytest.mark.parametrize("end_starts, said", [(30.0, True), (15.0, False)])
def test_a_drift_check_is_said_only_where_it_ran_after_every_other_pack(end_starts, said):
    """Packs side by side (several slots, SLURM arrays) may run the check beside the rest: then it measures no drift
    over the run, and collect says nothing of it."""
    from gpupack.results.analysis.drift import drift_checks

    packs = pd.DataFrame([
        {"run_dir": "r", "pack_id": "p-n01-000", "started_at": 0.0, "ended_at": 10.0, "wall_s": 10.0},
        {"run_dir": "r", "pack_id": "p-n02-000", "started_at": 10.0, "ended_at": 30.0, "wall_s": 20.0},
        {"run_dir": "r", "pack_id": "p-n01-000-end", "reference_of": "p-n01-000", "started_at": end_starts,
         "ended_at": end_starts + 12.0, "wall_s": 12.0},
    ]).assign(complete=True, attempt=0, partition="local", gpu_type="cpu", workload="w")
    got = drift_checks(packs)
    assert len(got) == int(said)
    if said:
        assert got.iloc[0]["change"] == pytest.approx(0.2) and got.iloc[0]["hours"] == pytest.approx(30 / 3600)


def test_the_reference_is_weighed_at_its_faster_set_up(tmp_path):
    """N=1 at 2 threads (the job's cores shared out) runs 14x slower beside a neighbour; its second set-up, 1 thread
    in the same rounds, does not. The choice weighs N=2 against the faster set-up: 1.8x, within 2 cores, named, and
    the method says which set-up it weighed; N=1's row is that set-up's."""
    run = RunDir(tmp_path / "run")
    for r in range(3):
        for n, threads, twin, tpt, foreign in ((1, 2, False, 70.0, 1.8), (1, 1, True, 9.0, 0.0), (2, 1, False, 5.0, 0)):
            pack_id = f"local-process-n{n:02d}-{'t1-' if twin else ''}{r:03d}"
            setup = {"threads_set": 1} if twin else {}
            for k in range(n):
                write_json_atomic(run.training_record(pack_id, f"{pack_id}-{k}"), training_record(
                    pack_id=pack_id, training_id=f"{pack_id}-{k}", workload="w", params={"seed": k}, mode="process",
                    factor=n, partition="local", gpu_type="cpu", status="completed", started_at=0.0,
                    ended_at=tpt * n, threads=threads, round=r, **setup))
            write_json_atomic(run.pack_record(pack_id), pack_record(
                pack_id=pack_id, mode="process", factor=n, partition="local", gpu_type="cpu", wall_s=tpt * n,
                complete=True, concurrent=n, n_completed=n, cores=2, round=r, threads_per_training=threads,
                sampler={"foreign_cpu_cores_mean": foreign, "job_cores": 2}, **setup))
    collected, _ = sweep.collect([run.root], plots=False)
    s = collected.summary.set_index("factor")
    assert s.loc[2, "gain"] == pytest.approx(1.8) and not s.loc[2, "beyond_bound"]
    assert list(collected.best["factor"]) == [2] and collected.withheld.empty
    assert s.loc[1, "time_per_training_s"] == pytest.approx(9.0) and s.loc[1, "threads"] == 1
    assert s.loc[1, "trainings"] == 6  # both set-ups' trainings are N=1's: only the times are the faster's
    assert ("N=1, the reference, measured at 2 and 1 thread(s) per training in the same rounds (70 s and 9 s per "
            "training): weighed at 1, the faster") in s.loc[2, "choice_method"]


@pytest.mark.parametrize("rate_n1, rate_n2, beyond", [(100.0, 90.0, False), (100.0, 101.0, True), (10.0, 100.0, True),
                                                      (100.0, 40.0, False)])
def test_the_knob_table_marks_a_setting_whose_n_passes_the_devices_bound(rate_n1, rate_n2, beyond):
    """Throughput by knob setting: N=2 trainings of one batch size at 90 samples/s each make 1.8x N=1's 100 of the
    same batch size, within the 2 cores' 2x; 101 each (2.02x) or 100 against 10 (20x) is beyond it, marked as the
    main table marks its gain; another batch size is weighed against its own N=1."""
    from gpupack.results.analysis.tables import with_knob_bounds

    knobs = pd.DataFrame([
        {"workload": "w", "partition": "local", "batch_size": "64", "factor": 1, "samples_per_s": rate_n1},
        {"workload": "w", "partition": "local", "batch_size": "64", "factor": 2, "samples_per_s": rate_n2},
        {"workload": "w", "partition": "local", "batch_size": "128", "factor": 1, "samples_per_s": 1.0},
        {"workload": "w", "partition": "local", "batch_size": "128", "factor": 2, "samples_per_s": 0.9},
    ])
    summary = pd.DataFrame([{"workload": "w", "partition": "local", "factor": n, "gain_bound": float(n), "gain_ref": 1}
                            for n in (1, 2)])
    marked = with_knob_bounds(knobs, summary)
    assert list(marked["beyond_bound"]) == [False, beyond, False, False]


def test_the_knob_table_weighs_each_mode_by_its_own_bound():
    """Process and fused N=4 on 2 cores, each 3x its own N=1 in samples/s together (two batch sizes alike): process
    mode's bound is the cores' 2x, so its rows are marked; fused runs its pack in one process, whose start it pays
    once, so its bound is 4x and its rows are not. Pooled in one row per setting, the larger bound hid process mode's
    marks."""
    from gpupack.results.analysis.tables import knob_table, with_knob_bounds

    rows = [(mode, n, rate) for mode in ("process", "fused") for n, rate in ((1, 100.0), (4, 75.0))]
    trainings = pd.DataFrame([{"workload": "w", "partition": "local", "mode": mode, "factor": n, "status": "completed",
                               "knobs": json.dumps({"batch_size": size}), "samples_per_s": rate}
                              for mode, n, rate in rows for size in (64, 128) for _ in range(n)])
    summary = pd.DataFrame([{"workload": "w", "partition": "local", "mode": mode, "factor": n, "gain_ref": 1,
                             "gpu_type": "cpu", "cores": 2.0} for mode, n, _ in rows])
    summary["gain_bound"] = gain_bounds(summary)
    marked = with_knob_bounds(knob_table(trainings), summary)
    assert list(zip(marked["mode"], marked["batch_size"], marked["factor"], marked["beyond_bound"])) == [
        (mode, size, n, mode == "process" and n == 4) for mode in ("fused", "process") for size in ("128", "64")
        for n in (1, 4)]


def _modes_collected(times: dict[tuple[str, int], float], best: tuple[str, int], withheld: tuple[str, ...] = (),
                     partition: str = "local"):
    """A Collected of one workload on an H200 partition with these (mode, N) medians, ``best`` the best (mode, N); the
    modes in ``withheld`` named no N (their choice withheld: no row in ``best``)."""
    import pandas as pd

    from gpupack.results.analysis.aggregate import Collected
    from gpupack.results.analysis.tables import Ranking

    where = {"workload": "mnist_torch", "partition": partition, "gpu_type": "NVIDIA H200"}
    summary = pd.DataFrame([{**where, "mode": m, "factor": n, "time_per_training_s": t} for (m, n), t in times.items()])
    bests = summary[summary.apply(lambda r: r["factor"] == max(n for (m, n) in times if m == r["mode"])
                                  and r["mode"] not in withheld, axis=1)]
    overall = summary[(summary["mode"] == best[0]) & (summary["factor"] == best[1])]
    return Collected(records=pd.DataFrame(), summary=summary, best=bests, best_overall=overall,
                     hyper=Ranking(pd.DataFrame()), cost=pd.DataFrame(), sweep_trainings=4)


@pytest.mark.parametrize("times, best, withheld, said", [
    # the H200 (2026-11-30): fused N=34 is 20.3x fused N=1 (a fresh process), 9.2x one training alone as a process
    ({("process", 1): 3.98, ("process", 21): 0.615, ("fused", 1): 8.76, ("fused", 34): 0.432}, ("fused", 34), (),
     "fused N=34 — 0.43 s per training, 9.2x one training alone (no split (process) N=1, 3.98 s) "
     "(best process: N=21, 0.61 s)."),
    # the fastest N=1 of the modes, whichever it is
    ({("process", 1): 3.0, ("process", 4): 1.0, ("fused", 1): 2.0, ("fused", 4): 0.5}, ("fused", 4), (),
     "fused N=4 — 0.50 s per training, 4.0x one training alone (fused N=1, 2.00 s) (best process: N=4, 1.00 s)."),
    # no N=1 ran: nothing to say against it
    ({("process", 2): 1.0, ("fused", 2): 0.5}, ("fused", 2), (), "fused N=2 — 0.50 s per training (best process"),
    # process named no N (its gain beyond the device: its N=1 set up to lose, e.g. slowed by neighbours): its N=1 is
    # not the training alone a ratio is said against, though it is the fastest
    ({("process", 1): 1.5, ("process", 4): 1.0, ("fused", 1): 2.0, ("fused", 4): 0.5}, ("fused", 4), ("process",),
     "fused N=4 — 0.50 s per training, 4.0x one training alone (fused N=1, 2.00 s)."),
])
def test_the_best_mode_and_n_is_said_against_one_training_alone(times, best, withheld, said):
    from gpupack.results.report.text import mode_lines

    (line,) = mode_lines(_modes_collected(times, best, withheld))
    assert said in line, line


def test_a_mode_withheld_on_one_partition_is_not_its_training_alone_though_named_on_another():
    """Whether a mode named an N is read on the best's own partition: process withheld on h200a (its fastest N=1 set
    up to lose) and named on h200b says fused N=1 on h200a, not process N=1."""
    import pandas as pd

    from gpupack.results.analysis.aggregate import Collected
    from gpupack.results.report.text import mode_lines

    times = {("process", 1): 1.5, ("process", 4): 1.0, ("fused", 1): 2.0, ("fused", 4): 0.5}
    parts = [_modes_collected(times, ("fused", 4), ("process",), "h200a"),
             _modes_collected(times, ("fused", 4), (), "h200b")]
    both = Collected(**{**vars(parts[0]), **{k: pd.concat([getattr(p, k) for p in parts], ignore_index=True)
                                             for k in ("summary", "best", "best_overall")}})
    lines = mode_lines(both)
    assert len(lines) == 2 and "on h200a (" in lines[0] and "on h200b (" in lines[1], lines
    assert "4.0x one training alone (fused N=1, 2.00 s)" in lines[0], lines[0]
    assert "3.0x one training alone (no split (process) N=1, 1.50 s)" in lines[1], lines[1]
