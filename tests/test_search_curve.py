"""A search's trial and its lane (gpupack.core.store.curves, gpupack.job.pack._curve): the trial's process appends its
curve and waits for its lane's verdict; the lane's packer gives each point to the study (faked here: a programmed
pruner) and answers. The trial's process never opens the study: the job side knows none (the layer contract)."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpupack.core.store.curves import CurveSpec, NewLines, append_point, await_verdict, points, read_verdict
from gpupack.job.pack._curve import CurveFollower, matched
from gpupack.workload import Reporter, TrainingContext


class ProgrammedCurve:
    """A study's side of a curve: prunes at the steps given; what it was told, in order."""

    def __init__(self, prune_at: set[int], pattern: str | None = None) -> None:
        self.prune_at, self.pattern, self.metric = prune_at, pattern, "val_accuracy"
        self.told: list[tuple[int, float, bool]] = []

    def report(self, step: int, value: float, prune: bool = True) -> bool:
        self.told.append((step, value, prune))
        return prune and step in self.prune_at


def files(tmp_path: Path) -> CurveSpec:
    return {"points": str(tmp_path / "t.curve.json"), "verdict": str(tmp_path / "t.verdict.json"),
            "metric": "val_accuracy"}


@pytest.mark.parametrize("reported, prune_at, told, verdict", [
    ([(1, 0.5)], set(), [(1, 0.5, True)], {"step": 1, "pruned": None}),
    ([(1, 0.5), (2, 0.6)], set(), [(1, 0.5, True), (2, 0.6, True)], {"step": 2, "pruned": None}),
    # pruned at step 2: the later point is not judged (the trial returned at its verdict)
    ([(1, 0.5), (2, 0.1), (3, 0.9)], {2}, [(1, 0.5, True), (2, 0.1, True)],
     {"step": 2, "pruned": {"step": 2, "value": 0.1}}),
])
def test_the_lane_judges_each_reported_point_in_order_and_answers(tmp_path, reported, prune_at, told, verdict):
    spec, curve = files(tmp_path), ProgrammedCurve(prune_at)
    follower = CurveFollower(curve, spec, tmp_path / "t.out")
    for step, value in reported:
        append_point(Path(spec["points"]), step, value)
    hit = follower.follow()
    assert curve.told == told
    assert read_verdict(Path(spec["verdict"])) == verdict
    assert hit == verdict["pruned"]


def test_what_is_left_at_the_end_is_given_without_the_pruner_and_answered_nothing(tmp_path):
    spec, curve = files(tmp_path), ProgrammedCurve({1})
    append_point(Path(spec["points"]), 1, 0.5)
    assert CurveFollower(curve, spec, tmp_path / "t.out").follow(prune=False) is None
    assert curve.told == [(1, 0.5, False)]
    assert read_verdict(Path(spec["verdict"])) is None


def test_a_printed_curve_is_judged_by_its_matches_and_the_last_unended_line_at_the_end(tmp_path):
    out = tmp_path / "t.out"
    out.write_text("epoch 1 acc=0.5\nnoise acc=x\nepoch 2 acc=0.25")
    curve = ProgrammedCurve(set(), pattern=r"acc=([0-9.]+)")
    follower = CurveFollower(curve, files(tmp_path), out)
    assert follower.follow() is None
    assert curve.told == [(1, 0.5, True)]  # the second line holds no number; the third is not ended yet
    assert follower.follow(prune=False) is None
    assert curve.told == [(1, 0.5, True), (2, 0.25, False)]


def test_a_line_being_written_is_read_whole_at_the_next_look(tmp_path):
    path = tmp_path / "t.curve.json"
    lines = NewLines(path)
    path.write_bytes(b'{"step": 1, "value": 0.5}\n{"step": 2, "va')
    assert points(lines.read()) == [(1, 0.5)]
    with path.open("ab") as f:
        f.write(b'lue": 0.7}\nnot a point\n')
    assert points(lines.read()) == [(2, 0.7)]
    assert matched(__import__("re").compile(r"v=(\S+)"), [b"v=1 v=two v=3"]) == [1.0, 3.0]


def test_a_trial_is_told_its_lanes_verdict_on_each_report(tmp_path):
    """The trial's side as a workload calls it: report() waits for its lane, which prunes it at step 2."""
    spec, curve = files(tmp_path), ProgrammedCurve({2})
    follower = CurveFollower(curve, spec, tmp_path / "t.out")
    done = threading.Event()

    def lane() -> None:
        while not done.is_set():
            follower.follow()
            done.wait(0.005)

    looker = threading.Thread(target=lane)
    looker.start()
    try:
        ctx = TrainingContext("cpu", 1, Reporter(), curve=spec)
        assert ctx.ranks_by("val_accuracy") and not ctx.ranks_by("loss")
        assert ctx.report(0.5, 1) is False
        assert ctx.report(0.1, 2) is True
        assert ctx.pruned == {"step": 2, "value": 0.1}
        assert ctx.report(0.9, 3) is True  # once pruned it stays so, and reports nothing more
    finally:
        done.set()
        looker.join()
    assert [t[0] for t in curve.told] == [1, 2]


def test_outside_a_search_report_records_nothing():
    ctx = TrainingContext("cpu", 1, Reporter())
    assert ctx.report(0.5, 1) is False and not ctx.ranks_by("val_accuracy")


def test_a_trial_whose_lane_never_answers_goes_on_unpruned_and_says_so(tmp_path, capsys):
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    assert await_verdict(tmp_path / "none.verdict.json", 1, wait_s=5.0, clock=clock) is None
    assert "no verdict on step 1" in capsys.readouterr().err
