"""Slots admitted by memory (packing.admission): the pure rule and a training's expected peak as tables, the lane at
the NVML seam (tests/fakes.py's FakeNvml: the device's free memory follows what the lane's trainings hold), the config
keys refused in one line, and a streaming run of real processes that hold memory on a programmed device, where
without admission some end oom and with it none does. No verdict depends on how fast anything ran."""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpupack.core import monitor
from gpupack.core.memory.admission import (
    Candidate,
    LaneMemory,
    admit,
    expected_peak,
    lane_budget_mb,
    max_passes,
    peak_of,
)
from gpupack.core.memory.figures import CUDA_CONTEXT_MB, Figure, setting_key
from gpupack.core.monitor import free_memory_mb
from gpupack.core.plan import make_plan
from gpupack.core.store.claims import Claimant, claims
from gpupack.core.store.records import write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.errors import ConfigError
from gpupack.job import lanes as lanes_module
from gpupack.job.lanes import run_lane
from gpupack.job.pack import WAIT
from gpupack.job.stream import RECHECK_S, AdmissionInputs, Lane
from gpupack.sweep.setup.compose import compose_config
from gpupack.sweep.setup.validate import check_packing
from tests.fakes import FakeNvml

REPO = Path(__file__).resolve().parent.parent
FAKE = "tests.fake_workloads"
S, L = Candidate("small", 100.0), Candidate("large", 400.0)


# ---------------- the rule ----------------

@pytest.mark.parametrize("queue, room, passes, take", [
    # the head fits: it goes
    ([L, S], LaneMemory(free_mb=None, budget_mb=800, committed_mb=300, running=1), 0, 0),
    # the device's free memory binds, whatever the budget says
    ([L, S], LaneMemory(free_mb=350, budget_mb=800, committed_mb=0, running=1), 0, 1),
    # the head does not fit: a smaller one that fits goes past it
    ([L, S, S], LaneMemory(free_mb=None, budget_mb=800, committed_mb=500, running=2), 0, 1),
    # ... the first that fits, not one that does not
    ([L, L, S], LaneMemory(free_mb=None, budget_mb=800, committed_mb=500, running=2), 1, 2),
    # passed over max_passes times: reserved, the slot waits for memory
    ([L, S], LaneMemory(free_mb=None, budget_mb=800, committed_mb=500, running=2), 2, None),
    # nothing fits: wait
    ([L, Candidate("medium", 350.0)], LaneMemory(free_mb=None, budget_mb=800, committed_mb=500, running=2), 0, None),
    # nothing runs in the lane: the head goes, waiting would free nothing
    ([L, S], LaneMemory(free_mb=200, budget_mb=800, committed_mb=0, running=0), 0, 0),
    # the head's peak is not known: admitted as without admission
    ([Candidate("new", None), S], LaneMemory(free_mb=None, budget_mb=800, committed_mb=790, running=3), 0, 0),
    # ... but one not known is never taken past a head that does not fit
    ([L, Candidate("new", None), S], LaneMemory(free_mb=None, budget_mb=800, committed_mb=500, running=2), 0, 2),
    # no budget and no free memory known: everything fits
    ([L], LaneMemory(free_mb=None, budget_mb=None, committed_mb=5000, running=9), 0, 0),
], ids=["fits", "free-memory-binds", "smaller-passes", "first-that-fits", "head-reserved", "nothing-fits-wait",
        "idle-lane-takes-head", "unknown-head", "unknown-not-past-head", "nothing-to-go-by"])
def test_the_admission_rule(queue, room, passes, take):
    verdict = admit(queue, room, head_passes=passes, max_passes=2)
    assert verdict.take == take, verdict.why
    assert verdict.why


def test_a_head_may_be_passed_over_once_per_slot():
    assert [max_passes(n) for n in (1, 4, 8)] == [1, 4, 8]


@pytest.mark.parametrize("earlier, stated, this_run, expected", [
    (Figure(700.0, "records", measured=True), 500.0, 300.0, 700.0),  # earlier records of the setting first
    (None, 500.0, 300.0, 500.0),  # then sweep.training_memory_mb
    (None, None, 300.0, 300.0),  # then its setting's peak in this run
    (None, None, None, None),  # not known
])
def test_a_training_s_expected_peak(earlier, stated, this_run, expected):
    figure = expected_peak(earlier, stated, this_run)
    assert (figure.mb if figure else None) == expected


@pytest.mark.parametrize("on_gpu, total, host_total, given, budget", [
    (True, 16000.0, 64000.0, 3000.0, 12800.0),  # a GPU: memory_fraction of its memory (host_memory_mb is the host's)
    (True, None, 64000.0, None, None),
    (False, 16000.0, 64000.0, 3000.0, 3000.0),  # a CPU: packing.host_memory_mb where given
    (False, None, 64000.0, None, 51200.0),  # ... else memory_fraction of the host's
])
def test_a_lane_s_budget(on_gpu, total, host_total, given, budget):
    assert lane_budget_mb(on_gpu, 0.8, total, host_total, given) == budget


def test_the_peak_a_record_says_on_the_lane_s_device():
    rec = {"memory": {"peak_rss_mb": 310.0, "peak_gpu_mem_mb": 900.0}}
    assert peak_of(rec, on_gpu=False) == 310.0
    assert peak_of(rec, on_gpu=True) == 900.0 + CUDA_CONTEXT_MB  # torch's own peak: its context added
    sampled = {"memory": {"peak_rss_mb": 310.0, "peak_gpu_mem_mb": 1300.0, "from_sampler": ["peak_gpu_mem_mb"]}}
    assert peak_of(sampled, on_gpu=True) == 1300.0  # NVML's figure of the process is whole
    assert peak_of({"memory": None}, on_gpu=False) is None


# ---------------- the seam ----------------

def test_free_memory_is_nvml_s_on_a_gpu_and_the_host_s_on_a_cpu(monkeypatch):
    nvml = FakeNvml(names=["Tesla T4"], used_mb=6000)  # 16384 MB in all
    monkeypatch.setattr(monitor, "_nvml", lambda: nvml)
    assert free_memory_mb(True, {"CUDA_VISIBLE_DEVICES": "0"}) == pytest.approx(16384 - 6000)
    assert free_memory_mb(True, {"CUDA_VISIBLE_DEVICES": "-1"}) is None  # no GPU given: nothing to say
    assert nvml.shutdowns == 2
    assert (free_memory_mb(False) or 0) > 0  # the host's available memory


def test_without_nvml_free_memory_is_not_known(monkeypatch):
    monkeypatch.setattr(monitor, "_nvml", lambda: FakeNvml(fail_init=RuntimeError("no driver")))
    assert free_memory_mb(True, {}) is None


# ---------------- the lane, at the NVML seam ----------------

SMALL_MB, LARGE_MB = 100.0, 400.0


def _lane(tmp_path, monkeypatch, sizes, factor=4, budget=1000.0, other_mb=0.0, inputs=True):
    """A lane of one job over trainings of ``sizes`` (MB each holds, in queue order), on a 16 GB GPU whose NVML
    figures follow what the lane's running trainings hold (plus ``other_mb`` another process holds); the peaks of
    both settings known from earlier records."""
    grid = {"hold_mb": sorted(set(sizes)), "seed": list(range(len(sizes)))}
    points = [{"hold_mb": mb, "seed": i} for i, mb in enumerate(sizes)]
    plan = make_plan(sweep="s", workload=FAKE, grid=grid, fixed={"steps": 1}, factors=[factor], modes=["process"],
                     partitions=["local"], repeats=1, stream_jobs=1, points=points)
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.plan, plan.to_json())
    (pack,) = plan.packs
    nvml = FakeNvml(names=["Tesla T4"], used_mb=other_mb)
    monkeypatch.setattr(monitor, "_nvml", lambda: nvml)
    earlier = {(FAKE, setting_key({"steps": 1, "hold_mb": mb, "seed": 0})): Figure(mb, "records", measured=True)
               for mb in set(sizes)}
    clock = _Clock()
    lane = Lane(run, plan, pack, Claimant.here(pack.pack_id, "7"), PackSettings(), clock=clock,
                inputs=AdmissionInputs(functools.partial(free_memory_mb, True, {"CUDA_VISIBLE_DEVICES": "0"}), budget,
                                       True, earlier) if inputs else None)
    return lane, nvml, clock


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _drain(lane: Lane, nvml: FakeNvml, clock: _Clock, other_mb: float = 0.0) -> list[list[float]]:
    """Run the lane as process mode does, on a fake clock: N slots filled, then the training that ends first (each
    takes 1 s per 100 MB it holds: a larger model trains longer) frees its slot and the free slots ask the lane again,
    until nothing is left. What ran at once (MB each), at each training's start; the claims are checked at every
    step: the lane holds a claim of exactly what it started."""
    running: list[tuple[float, str, float]] = []  # (when it ends, id, MB)
    started: list[str] = []
    together: list[list[float]] = []
    free_slots = lane.pack.factor

    def ask() -> None:
        nonlocal free_slots
        while free_slots:
            nvml.used_mb = other_mb + sum(mb for *_, mb in running)  # what the device holds now
            got = lane.next()
            if got is WAIT or got is None:
                return
            mb = float(got.params["hold_mb"])
            running.append((clock.now + mb / 100, got.training_id, mb))
            started.append(got.training_id)
            together.append([mb for *_, mb in running])
            free_slots -= 1
            assert set(claims(lane.folder)) == set(started), "a claim of a training the lane did not start"

    ask()
    while running:
        running.sort()
        clock.now, tid, _ = running.pop(0)
        lane.ended(tid, 1.0)
        free_slots += 1
        ask()
    assert len(started) == len(set(started)), "a training started twice"
    assert sorted(started) == sorted(t.training_id for t in lane.queue), "a training lost"
    return together


def test_a_large_training_waits_while_small_ones_run_beside_it_and_still_runs(tmp_path, monkeypatch):
    sizes = [SMALL_MB, LARGE_MB] * 6
    lane, nvml, clock = _lane(tmp_path, monkeypatch, sizes, budget=1000.0)
    together = _drain(lane, nvml, clock)
    assert max(sum(mbs) for mbs in together) <= 1000.0  # never past the budget
    assert max(mbs.count(LARGE_MB) for mbs in together) == 2  # two large ones at once at most: 800 of 1000 MB
    assert any(mbs.count(LARGE_MB) == 2 and mbs.count(SMALL_MB) >= 1 for mbs in together)  # smalls beside them
    assert lane.passed_over > 0 and lane.waits > 0


def test_without_admission_the_lane_takes_the_queue_s_order_past_the_budget(tmp_path, monkeypatch):
    lane, nvml, clock = _lane(tmp_path, monkeypatch, [LARGE_MB] * 4, budget=1000.0, inputs=False)
    together = _drain(lane, nvml, clock)
    assert max(sum(mbs) for mbs in together) == 4 * LARGE_MB  # what admission is for


def test_a_large_training_passed_over_is_reserved_not_starved(tmp_path, monkeypatch):
    # one large one behind a stream of small ones that would always fit: after N passes the smalls wait for it
    sizes = [SMALL_MB, SMALL_MB, LARGE_MB] + [SMALL_MB] * 20
    lane, nvml, clock = _lane(tmp_path, monkeypatch, sizes, factor=4, budget=450.0)
    large = next(t.training_id for t in lane.queue if t.params["hold_mb"] == LARGE_MB)
    order: list[str] = []
    real_next = lane.next

    def watched():
        got = real_next()
        if got is not WAIT and got is not None:
            order.append(got.training_id)
        return got

    lane.next = watched  # type: ignore[method-assign]
    _drain(lane, nvml, clock)
    assert order.index(large) <= 2 + max_passes(4)  # started after at most N smaller ones went past it


def test_the_device_s_free_memory_binds_where_another_process_holds_it(tmp_path, monkeypatch):
    # the budget would take two large ones; NVML says another process holds all but 600 MB of the GPU
    other = 16384 - 600.0
    lane, nvml, clock = _lane(tmp_path, monkeypatch, [LARGE_MB, LARGE_MB, SMALL_MB], budget=10000.0, other_mb=other)
    together = _drain(lane, nvml, clock, other_mb=other)
    assert max(mbs.count(LARGE_MB) for mbs in together) == 1
    assert [LARGE_MB, SMALL_MB] in together  # the small one went past the second large one


def test_a_waiting_slot_measures_again_only_as_a_training_ends_or_after_a_while(tmp_path, monkeypatch):
    lane, nvml, clock = _lane(tmp_path, monkeypatch, [LARGE_MB, LARGE_MB, LARGE_MB], factor=3, budget=900.0)
    first = [lane.next(), lane.next()]
    asked: list[float] = []
    real = lane.inputs.free_mb
    lane.inputs = AdmissionInputs(lambda: asked.append(clock.now) or real(), 900.0, True, lane.inputs.earlier)
    assert lane.next() is WAIT and lane.next() is WAIT and len(asked) == 1  # the second look: too soon to measure
    clock.now += RECHECK_S
    assert lane.next() is WAIT and len(asked) == 2
    lane.ended(first[0].training_id, 1.0)  # its memory frees: measured again at once, and it fits
    assert lane.next() not in (WAIT, None) and len(asked) == 3


def test_a_setting_s_peak_measured_in_this_run_admits_the_next(tmp_path, monkeypatch):
    lane, nvml, clock = _lane(tmp_path, monkeypatch, [LARGE_MB] * 3, factor=3, budget=1000.0)
    lane.inputs = AdmissionInputs(lane.inputs.free_mb, 1000.0, True, {})  # nothing earlier
    first = lane.next()
    assert lane.expected_mb(first) is None
    lane.judge({"training_id": first.training_id, "status": "completed",
                "memory": {"peak_gpu_mem_mb": 600.0, "from_sampler": ["peak_gpu_mem_mb"]}})
    assert lane.expected_mb(first) == 600.0
    lane.ended(first.training_id, 1.0)
    second = lane.next()
    assert lane.next() is WAIT  # 600 + 600 > 1000
    assert second is not None


@pytest.mark.slow
def test_a_slot_that_waits_for_memory_takes_its_training_while_the_others_run(tmp_path, monkeypatch):
    # Two trainings that complete only if they run together (a barrier, not a clock): the second does not fit the
    # memory free at the lane's start, so its slot waits; NVML's answer grows as the first runs, and the waiting slot,
    # asked again while the first still runs, takes it. A slot given up at its first WAIT would leave the first alone
    # at the barrier until its liveness bound fails it.
    sizes = [LARGE_MB, LARGE_MB]
    lane, nvml, _ = _lane(tmp_path, monkeypatch, sizes, factor=2, budget=10000.0, other_mb=16384 - 450.0)
    meet = f"{tmp_path / 'meet'}:2"
    plan = make_plan(sweep="s", workload=FAKE, grid={"hold_mb": [LARGE_MB], "seed": [0, 1]},
                     fixed={"steps": 1, "meet": meet, "meet_timeout_s": 30.0}, factors=[2], modes=["process"],
                     partitions=["local"], repeats=1, stream_jobs=1)
    write_json_atomic(lane.run.plan, plan.to_json())
    (pack,) = plan.packs
    looks = []

    def free() -> float | None:  # 350 MB free for the first looks (the first goes: nothing else runs), then more
        looks.append(1)
        nvml.used_mb = 16384 - 350.0 if len(looks) <= 3 else 0.0
        return free_memory_mb(True, {"CUDA_VISIBLE_DEVICES": "0"})

    earlier = {(FAKE, setting_key(t.params)): Figure(LARGE_MB, "records", measured=True) for t in pack.trainings}
    monkeypatch.setattr(lanes_module, "admission_inputs", lambda *args: AdmissionInputs(free, 10000.0, True, earlier))
    rec = run_lane(str(lane.run.root), pack.pack_id, PackSettings(device="cpu"))
    assert rec["n_completed"] == 2, rec
    assert rec["admission"]["waits"] >= 1  # the second did wait


# ---------------- the config keys ----------------

@pytest.mark.parametrize("override, key", [
    ("packing.admission=maybe", "packing.admission"),
    ("packing.host_memory_mb=-5", "packing.host_memory_mb"),
    ("packing.host_memory_mb=0", "packing.host_memory_mb"),
])
def test_bad_admission_options_are_refused_in_one_line(override, key):
    cfg = compose_config(["+sweep=mnist_pack", override])
    with pytest.raises(ConfigError) as err:
        check_packing(cfg)
    assert err.value.key == key and "HINT" in str(err.value) and "\n" not in str(err.value)


def test_admission_is_on_by_default_and_carried_to_the_job():
    from gpupack.sweep.setup.options import pack_settings

    cfg = compose_config(["+sweep=mnist_pack", "packing.host_memory_mb=800"])
    settings = pack_settings(cfg.packing, None, 500.0)
    assert settings.admission and settings.host_memory_mb == 800 and settings.training_memory_mb == 500.0
    off = pack_settings(compose_config(["+sweep=mnist_pack", "packing.admission=off"]).packing)
    assert not off.admission


# ---------------- end to end: real processes holding real memory ----------------

def _sweep(run_dir: Path, device: Path, seeds: int, admission: str, factor: int = 4) -> list[str]:
    return [sys.executable, "-m", "gpupack", f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]",
            "+sweep=probe_pack", "~sweep.grid.lr", f"+sweep.grid.seed=[{','.join(map(str, range(seeds)))}]",
            "+sweep.grid.hold_mb=[40,300]", "sweep.fixed.steps=1", "sweep.fixed.sleep_s=0",
            "+sweep.fixed.hold_s_per_100mb=0.5", f"+sweep.fixed.hold_device={device}:800",
            f"packing.factors=[{factor}]", "packing.stream=on", "packing.jobs=1", "packing.host_memory_mb=800",
            f"packing.admission={admission}", f"run_dir={run_dir}"]


def _statuses(run_dir: Path) -> list[str]:
    return [json.loads(p.read_text())["status"] for p in run_dir.glob("packs/*/trainings/*.json")]


@pytest.mark.slow
def test_under_a_host_memory_budget_admission_ends_no_training_oom(tmp_path, subprocess_env):
    device = tmp_path / "device"  # 800 MB shared by the trainings; 3 large ones (900 MB) do not fit
    sweeps = tmp_path / "runs"
    # earlier records of both settings (a run of one training each), as a sibling run directory
    calib = subprocess.run(_sweep(sweeps / "calib", device, 1, "off", factor=1), capture_output=True, text=True,
                           env=subprocess_env, cwd=REPO, timeout=300)
    assert calib.returncode == 0, calib.stdout + calib.stderr
    for admission in ("off", "on"):
        subprocess.run(_sweep(sweeps / admission, device, 4, admission), capture_output=True, text=True,
                       env=subprocess_env, cwd=REPO, timeout=300)
    off, on = _statuses(sweeps / "off"), _statuses(sweeps / "on")
    assert len(off) == len(on) == 8
    assert "oom" in off  # the trainings really allocate: past the device's 800 MB one fails
    assert on == ["completed"] * 8
    (lane,) = [json.loads(p.read_text()) for p in (sweeps / "on").glob("packs/*/pack.json")]
    assert lane["admission"]["passed_over"] > 0  # small ones ran beside the large ones
