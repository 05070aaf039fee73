"""A best N the user can trust (issue 12): evidence kept across resume, order, caps, auto."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from gpupack import report, sweep
from gpupack.cli import main

REPO = Path(__file__).resolve().parents[1]
PROBE = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack"]


def _text(collected) -> str:
    console = Console(record=True, width=250)
    report.render(collected, console)
    return console.export_text()


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

import pytest  # noqa: E402

from gpupack.collect import best_factors, load_records, summarize  # noqa: E402
from gpupack.plan import make_plan  # noqa: E402
from gpupack.records import pack_record, training_record, write_json_atomic  # noqa: E402
from gpupack.rundir import RunDir  # noqa: E402

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
