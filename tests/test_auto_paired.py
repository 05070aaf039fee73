"""packing.factors=auto on a busy machine: every step holds the reference N, each step's verdict and the final choice
are paired within rounds, so a machine that slows as the ladder climbs cannot pick N for it (issue 41's guarantee,
for the probe)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pytest

from gpupack import sweep
from gpupack.core.plan import Pack
from gpupack.core.store.records import pack_record, training_record, write_json_atomic
from gpupack.core.types import PackResult, PackSettings
from gpupack.job.records import order_fields
from gpupack.results.analysis.load import load_records
from gpupack.submit import ProgressFn, progress_state
from gpupack.sweep.flow.auto import step_plan
from tests.fakes import FakeConfig, FakeSubmitter

REPO = Path(__file__).resolve().parents[1]
PROBE = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack"]
GRID = "sweep.grid.lr=[" + ",".join(f"0.{i}" for i in range(1, 10)) + "]"


# ---------------- the step plan ----------------

@pytest.mark.parametrize("n, best, factors", [
    (1, None, {1}),
    (2, 1, {1, 2}),
    (3, 2, {1, 2, 3}),  # from here on the reference is measured beside the two N the verdict weighs
    (5, 2, {1, 2, 5}),
])
def test_each_step_runs_the_new_n_the_best_so_far_and_the_reference_in_every_round(n, best, factors):
    prepared = sweep.prepare(PROBE + [GRID, "packing.factors=auto", "packing.auto.repeats=3", "dry_run=true"])
    plan = step_plan(prepared.spec, ["local"], n, {"local": best}, 3, reference=1)
    assert {p.factor for p in plan.packs} == factors
    rounds: dict[int, set[int]] = {}
    for p in plan.packs:
        rounds.setdefault(p.round, set()).add(p.factor)
    assert sorted(rounds) == [0, 1, 2] and all(of == factors for of in rounds.values())  # each N once a round


# ---------------- a machine that slows as the probe goes ----------------

class SlowingDevice:
    """A programmed device: each N's true time per training, ``slowdown`` slower with every pack it runs (a
    neighbour's jobs arrive one by one) — the clock of the records, not of this machine."""

    def __init__(self, tpt: dict[int, float], slowdown: float, hog: dict[int, tuple[float, float]] | None = None,
                 ) -> None:
        self.tpt, self.slowdown, self.packs, self.clock = tpt, slowdown, 0, 0.0
        self.hog = hog or {}  # pack index -> (how much slower, the foreign cores its sampler saw)

    def wall(self, factor: int) -> tuple[float, float]:
        """The next pack's wall and the foreign load it ran under."""
        slower, foreign = self.hog.get(self.packs, (1.0, 0.0))
        slower = slower if factor == 1 else 1 + (slower - 1) / 3  # a hog slows N=1's two threads more than one each
        wall = factor * self.tpt[factor] * (1 + self.slowdown) ** self.packs * slower
        self.packs += 1
        return wall, foreign


class ProgrammedSubmitter(FakeSubmitter):
    """Runs each pack on the programmed device: writes the records its job would (round included), nothing runs."""

    device = SlowingDevice({1: 1.0}, 0.0)

    def run_packs(self, packs: Sequence[Pack], settings: PackSettings, progress: ProgressFn) -> list[PackResult]:
        results = []
        for pack in packs:
            (wall, foreign), start = self.device.wall(pack.factor), self.device.clock
            self.device.clock += wall
            for t in pack.trainings:
                write_json_atomic(self.run.training_record(pack.pack_id, t.training_id), training_record(
                    pack_id=pack.pack_id, training_id=t.training_id, workload="tests.fake_workloads",
                    params=dict(t.params), mode="process", factor=pack.factor, partition=pack.partition,
                    gpu_type="cpu", status="completed", started_at=start, ended_at=start + wall, threads=1,
                    **order_fields(pack)))
            record = pack_record(pack_id=pack.pack_id, mode="process", factor=pack.factor, partition=pack.partition,
                                 gpu_type="cpu", wall_s=wall, complete=True, concurrent=pack.factor,
                                 n_completed=pack.factor, started_at=start, cores=2,
                                 sampler={"foreign_cpu_cores_mean": foreign, "job_cores": 2}, **order_fields(pack))
            write_json_atomic(self.run.pack_record(pack.pack_id), record)
            result = PackResult(pack.pack_id, pack.partition, f"fake-{pack.pack_id}", ok=True, record=record)
            results.append(result)
            progress(pack, progress_state(result))
        return results


TRUE_TPT = {1: 10.0, 2: 6.0, 3: 5.4, 5: 6.0}  # N=3 is best, 10 % under N=2; N=5 is slower again


def _probe(tmp_path, monkeypatch, slowdown: float, tpt: dict[int, float] = TRUE_TPT, ladder: str = "[1,2,3,5]",
           hog: dict[int, tuple[float, float]] | None = None):
    import gpupack.sweep.flow.auto
    import gpupack.sweep.flow.run
    import gpupack.sweep.flow.status

    monkeypatch.setattr(ProgrammedSubmitter, "device", SlowingDevice(tpt, slowdown, hog))
    load = ProgrammedSubmitter.loader(config=FakeConfig(default_partitions=["cpu"]))
    for module in (gpupack.sweep.flow.run, gpupack.sweep.flow.status):  # auto builds its steps through flow.run
        monkeypatch.setattr(module, "load_submitter", load)
    run_dir = tmp_path / f"slowing-{slowdown}"
    prepared = sweep.prepare(PROBE + [GRID, "packing.factors=auto", f"packing.auto.ladder={ladder}",
                                      "packing.auto.repeats=4", "packing.then=stop", f"run_dir={run_dir}"])
    return sweep.run(prepared, plots=False)


@pytest.mark.slow
def test_a_machine_that_slows_as_the_ladder_climbs_gets_the_answer_of_a_steady_one(tmp_path, monkeypatch):
    """The steady device's answer is N=3. Slowing 3 % a pack, N=3's packs all run late: weighed unpaired (each N's
    packs pooled over the steps), N=3 looks slower than N=2 and N=2 would be the answer. Paired, each N against the
    reference N=1 in the rounds they share, the answer is N=3 again, and every verdict and the choice say paired."""
    steady = _probe(tmp_path, monkeypatch, 0.0)
    assert steady.auto.best == {"cpu": 3}
    slowing = _probe(tmp_path, monkeypatch, 0.03)
    assert [s.factor for s in slowing.auto.steps] == [1, 2, 3, 5]
    assert slowing.auto.best == {"cpu": 3}, slowing.auto.stopped
    assert "N=5 is slower than N=3" in slowing.auto.stopped["cpu"]
    for step in slowing.auto.steps[1:3]:  # the climbs
        assert step.verdict == "climb"
    assert "paired within 4 rounds" in slowing.auto.stopped["cpu"]
    summary = slowing.collected.summary.set_index("factor")
    assert summary["paired"].all() and (summary["gain_ref"] == 1).all()
    assert summary.loc[3, "choice_method"].startswith("paired within rounds")
    # what the choice would have said unpaired: N=3's late packs against N=2's earlier ones
    pooled = slowing.collected.records.packs.groupby("factor")["wall_s"].median() / pytest.importorskip(
        "pandas").Series({n: n for n in TRUE_TPT})
    assert pooled[3] > pooled[2]


@pytest.mark.slow
def test_a_step_leaves_out_its_packs_under_foreign_load_and_its_verdict_says_so(tmp_path, monkeypatch):
    """N=2 is 2 % faster than N=1: below min_gain, the climb stops at N=2. A hog beside step 2's first round (N=1's
    two threads 3x, in either set-up, N=2's single ones 1.67x): kept, that round alone would make N=2 beat N=1 by 5 %
    and more. Left out, as the final choice leaves them, the verdict is the quiet rounds' own, and it says so."""
    # step 1 ran packs 0-7: 4 packs of N=1 (repeats 4) and as many of its 1-thread set-up; step 2's round 0 is 8-10
    outcome = _probe(tmp_path, monkeypatch, 0.0, tpt={1: 10.0, 2: 9.8}, ladder="[1,2]",
                     hog={8: (3.0, 1.8), 9: (3.0, 1.8), 10: (3.0, 1.8)})
    stopped = outcome.auto.stopped["cpu"]
    assert stopped.startswith("N=2 improves on N=1 by 2.0 % (< 5 %, paired within 3 rounds)"), stopped
    # the three hogged: N=2's and each set-up's of N=1; the set-ups tie, the reference's own is weighed
    assert stopped.endswith("; 2 pack(s) measured under foreign load left out"), stopped


class NeighbouredReference(SlowingDevice):
    """The reference N=1 runs 14x slower under a neighbour's load (its sampler sees it); every other N is quiet."""

    def wall(self, factor: int) -> tuple[float, float]:
        wall, _ = super().wall(factor)
        return (wall * 14, 1.8) if factor == 1 else (wall, 0.0)


@pytest.mark.slow
def test_a_probe_whose_reference_its_neighbours_slowed_names_no_n_and_runs_the_rest_at_the_reference(
        tmp_path, monkeypatch):
    """Every gain over a reference 14x slowed is beyond what 2 cores can give: the probe names no N, says why, and the
    rest of the grid runs at the ladder's reference N=1 (needing no comparison), not at an N it cannot trust."""
    import gpupack.sweep.flow.auto
    import gpupack.sweep.flow.run
    import gpupack.sweep.flow.status

    monkeypatch.setattr(ProgrammedSubmitter, "device", NeighbouredReference(TRUE_TPT, 0.0))
    load = ProgrammedSubmitter.loader(config=FakeConfig(default_partitions=["cpu"]))
    for module in (gpupack.sweep.flow.run, gpupack.sweep.flow.status):  # auto builds its steps through flow.run
        monkeypatch.setattr(module, "load_submitter", load)
    outcome = sweep.run(sweep.prepare(PROBE + [GRID, "packing.factors=auto", "packing.auto.ladder=[1,2,3]",
                                               "packing.auto.repeats=2", "packing.then=run",
                                               f"run_dir={tmp_path / 'run'}"]), plots=False)
    assert outcome.auto.best == {"cpu": None} and outcome.auto.runs_at == {"cpu": 1}, outcome.auto
    assert outcome.collected.best.empty and list(outcome.collected.withheld["partition"]) == ["cpu"]
    lines = "\n".join(outcome.collected.auto_lines)
    assert "Best N: none named (no answer: see below)" in lines
    assert "No N was named (cpu: beyond the device): the rest ran at the ladder's reference (N=1 on cpu)" in lines
    assert outcome.auto.run_dir and outcome.ok
    ran = load_records([Path(outcome.auto.run_dir)])
    assert set(ran.packs["factor"]) == set(ran.trainings["factor"]) == {1}
    assert len(ran.trainings) == outcome.auto.left > 0  # the grid points the probe did not train, each once
