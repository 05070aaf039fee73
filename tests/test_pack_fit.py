"""Packs admitted by what this run measured (packing.admission, gpupack.core.memory.pack_fit): the pure rule as tables,
a lane of real packs whose larger N is skipped for memory by the peak its first pack measured, and the table that says
so. No verdict depends on how fast anything ran."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from gpupack import sweep
from gpupack.core.memory.figures import Figure
from gpupack.core.memory.pack_fit import Budget, pack_budget, pack_fit, training_peak
from gpupack.core.store.records import SKIPPED_MEMORY
from gpupack.results.report.terminal import render

REPO = Path(__file__).resolve().parent.parent

GB = 1024.0
RUN = Figure(12.6 * GB, "the peak of 1 training(s) of its setting in this run", measured=True)
EARLIER = Figure(3 * GB, "the peak of 2 training(s) of its setting in runs/x", measured=True)
HOST = Budget(0.8 * 24 * GB, "0.8 x 24.0 GB host memory")


# ---------------- the rule ----------------

@pytest.mark.parametrize("n, peaks, budget, fits, words", [
    # what this run measured: 4 x 12.6 GB do not fit 0.8 x 24 GB
    (4, [RUN] * 4, HOST, False, "N=4 needs 4 x 12.6 GB = 50.4 GB > 0.8 x 24.0 GB host memory (19.2 GB); the peak of 1"),
    # ... 2 do not either (25.2 GB), 1 always starts: it is what measures
    (2, [RUN] * 2, HOST, False, "N=2 needs 2 x 12.6 GB = 25.2 GB > 0.8 x 24.0 GB host memory"),
    (1, [RUN], Budget(1 * GB, "packing.host_memory_mb=1024"), True, "one training"),
    # within the share: it starts, and says by how much
    (4, [EARLIER] * 4, HOST, True, "N=4 needs 4 x 3.0 GB = 12.0 GB <= 0.8 x 24.0 GB host memory"),
    # settings of a pack apart, largest first
    (3, [RUN, EARLIER, EARLIER], HOST, True, "N=3 needs 1 x 12.6 GB + 2 x 3.0 GB = 18.6 GB <="),
    # what is not known counts as nothing, and is said
    (4, [RUN, RUN, None, None], HOST, False, "N=4 needs 2 x 12.6 GB = 25.2 GB > 0.8 x 24.0 GB host memory (19.2 GB), "
                                             "2 training(s) not known"),
    # nothing known, or no share known: started as without admission
    (4, [None] * 4, HOST, True, "no training's peak is known yet"),
    (4, [RUN] * 4, None, True, "no memory share known"),
    # MB below a GB
    (2, [Figure(300.0, "sweep.training_memory_mb=300")] * 2, Budget(500.0, "packing.host_memory_mb=500"), False,
     "N=2 needs 2 x 300 MB = 600 MB > packing.host_memory_mb=500 (500 MB); sweep.training_memory_mb=300"),
], ids=["measured-4", "measured-2", "one-always", "fits", "mixed-settings", "partly-known", "none-known", "no-share",
        "megabytes"])
def test_the_pack_fit_rule(n, peaks, budget, fits, words):
    fit = pack_fit(n, peaks, budget)
    assert fit.fits is fits
    assert words in fit.why, fit.why


@pytest.mark.parametrize("this_run, earlier, stated, expected", [
    (RUN, EARLIER, 500.0, RUN),  # this run first: what this device measured now
    (None, EARLIER, 500.0, EARLIER),  # then earlier runs of the setting
    (None, None, 500.0, Figure(500.0, "sweep.training_memory_mb=500")),  # then the user's word
    (None, None, None, None),  # else not known
])
def test_a_training_s_expected_peak_for_a_pack(this_run, earlier, stated, expected):
    assert training_peak(this_run, earlier, stated) == expected


@pytest.mark.parametrize("on_gpu, total, host_total, given, expected", [
    (True, 80 * GB, 24 * GB, 500.0, Budget(64 * GB, "0.8 x 80.0 GB GPU memory")),  # a GPU: its memory, whatever else
    (False, None, 24 * GB, None, Budget(0.8 * 24 * GB, "0.8 x 24.0 GB host memory")),  # a CPU: the host's
    (False, None, 24 * GB, 2000.0, Budget(2000.0, "packing.host_memory_mb=2000")),  # ... or what the user gives
    (True, None, 24 * GB, None, None),  # a GPU whose memory is not known
])
def test_a_pack_s_memory_share(on_gpu, total, host_total, given, expected):
    assert pack_budget(on_gpu, 0.8, total, host_total, given) == expected


# ---------------- a lane of real packs: the first measures, the larger are held against it ----------------

def _hold_sweep(run_dir: Path, host_memory_mb: int, *extra: str) -> list[str]:
    """Trainings that each hold 200 MB of host memory (pages touched), at N = 1, 2, 4, under a host budget."""
    return [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack", "sweep.grid.lr=[0.1]",
            "+sweep.grid.seed=[0,1,2,3]", "sweep.fixed.steps=1", "sweep.fixed.sleep_s=0", "+sweep.fixed.hold_mb=200",
            "packing.factors=[4,2,1]", "packing.repeats=1", f"packing.host_memory_mb={host_memory_mb}",
            f"run_dir={run_dir}", *extra]


def _records(run_dir: Path, kind: str) -> list[dict]:
    name = "pack.json" if kind == "pack" else "trainings/*.json"
    return [json.loads(p.read_text()) for p in run_dir.glob(f"packs/*/{name}")]


@pytest.mark.slow
@pytest.mark.quiet
def test_a_pack_whose_measured_need_passes_the_share_is_skipped_and_said(tmp_path):
    run_dir = tmp_path / "run"
    outcome = sweep.run(sweep.prepare(_hold_sweep(run_dir, 500)), plots=False)
    by_n = {(r["factor"], r["status"]) for r in _records(run_dir, "training")}
    # N=1 ran first and measured ~200 MB; 2 x 200 fit 500 MB and ran; 4 x 200 did not and never started
    assert by_n == {(1, "completed"), (2, "completed"), (4, SKIPPED_MEMORY)}
    (skipped,) = [r for r in _records(run_dir, "pack") if r["factor"] == 4]
    assert skipped["training_ids"] == [] and len(skipped["skipped_training_ids"]) == 4
    assert skipped["skipped_memory"].startswith("N=4 needs 4 x 2") and "> packing.host_memory_mb=500 (500 MB)" \
        in skipped["skipped_memory"] and "in this run" in skipped["skipped_memory"]
    assert not any(r.get("memory") for r in _records(run_dir, "training") if r["factor"] == 4)  # nothing ran
    assert outcome.ok and outcome.collected is not None  # the run finished: skipped is neither failed nor unfinished
    row = outcome.collected.summary.set_index("factor").loc[4]
    assert row["skipped_memory"] == 4 and row["infeasible"] and not row["chosen"] and row["unfinished"] == 0
    assert "N=4 needs 4 x" in row["skipped_memory_why"]
    console = Console(record=True, width=250)
    render(outcome.collected, console)
    text = console.export_text()
    assert "(4 skipped for memory: infeasible)" in text and "N=4 skipped for memory on local (cpu), process" in text
    # resumed with a larger share, the skipped N is held against it again, and runs
    again = sweep.run(sweep.prepare(_hold_sweep(run_dir, 1000)), plots=False)
    assert again.ok and {r["status"] for r in _records(run_dir, "training") if r["factor"] == 4} == {"completed"}


@pytest.mark.slow
def test_without_admission_no_pack_is_held_against_the_share(tmp_path):
    run_dir = tmp_path / "run"
    assert sweep.run(sweep.prepare(_hold_sweep(run_dir, 500, "packing.admission=off")), plots=False).ok
    assert {r["status"] for r in _records(run_dir, "training")} == {"completed"}


def test_a_lanes_book_learns_what_lanes_beside_it_fold_meanwhile(tmp_path):
    """Lanes run at the same time: before a pack starts, a lane reads the new lines of the run's journals (at most
    every REFRESH_EVERY_S) and learns the completed trainings' peaks, so its larger packs are held against what another
    lane just measured. A record it cannot place (a workload that does not load here) or that did not complete is
    not learnt from."""
    import json as _json

    from gpupack.core.plan import make_plan
    from gpupack.core.store.records import write_json_atomic
    from gpupack.core.store.rundir import RunDir
    from gpupack.job.peaks import REFRESH_EVERY_S, PeakBook

    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="m", workload="tests.fake_workloads", grid={"tag": ["a", "b"]}, fixed={"steps": 1},
                     factors=[2], modes=["process"], partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    first = plan.packs[0].trainings[0]
    run.lanes.mkdir(parents=True)
    journal = run.lanes / "lane-other.jsonl"
    journal.write_text("")
    now = [0.0]
    book = PeakBook(run, plan.packs[0].trainings, clock=lambda: now[0], device="cpu")
    assert book.figure(first, on_gpu=False, stated_mb=None) is None

    folded = [0]

    def fold(**rec: object) -> None:
        folded[0] += 1
        with open(journal, "a") as f:
            f.write(_json.dumps({"kind": "training", "folded_at": 1.0, "seq": 0, "record": {
                "training_id": f"x{folded[0]}", "workload": first.workload, "params": dict(first.params),
                "status": "completed", "gpu_type": "cpu", "memory": {"peak_rss_mb": 700.0}, **rec}}) + "\n")

    fold(workload="no.such.workload", memory={"peak_rss_mb": 9000.0})  # not loadable here: ignored, no error
    fold(status="oom", memory={"peak_rss_mb": 8000.0})  # cut short: a lower bound, not learnt
    fold(gpu_type="NVIDIA A100-SXM4-40GB", device="cuda", memory={"peak_rss_mb": 6000.0})  # another device's lane
    fold()
    book.refresh()
    assert book.figure(first, on_gpu=False, stated_mb=None) is None  # read at most every REFRESH_EVERY_S
    now[0] += REFRESH_EVERY_S
    book.refresh()
    figure = book.figure(first, on_gpu=False, stated_mb=None)
    assert figure is not None and figure.mb == 700.0 and "this run" in figure.source
    fold(memory={"peak_rss_mb": 900.0})
    now[0] += REFRESH_EVERY_S
    book.refresh()  # only the new line: the highest so far, of the 2 completed trainings folded
    again = book.figure(first, on_gpu=False, stated_mb=None)
    assert again is not None and again.mb == 900.0 and again.source.startswith("the peak of 2 training(s)")
    # the lane's own trainings, learnt as its pack ended, come again in its journal: counted once
    own = {"training_id": "own", "workload": first.workload, "params": dict(first.params), "status": "completed",
           "gpu_type": "cpu", "memory": {"peak_rss_mb": 800.0}}
    book.learn({"own": first}, [own])
    with open(journal, "a") as f:
        f.write(_json.dumps({"kind": "training", "folded_at": 2.0, "seq": 0, "record": own}) + "\n")
    now[0] += REFRESH_EVERY_S
    book.refresh()
    assert book.figure(first, on_gpu=False, stated_mb=None).source.startswith("the peak of 3 training(s)")
