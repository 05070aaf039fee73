"""The reporter: steady throughput leaves warm-up out; the curve has one point per window."""
from __future__ import annotations

import pytest

from gpupack import workload


def test_steady_throughput_excludes_warmup_and_curve_has_windows(monkeypatch):
    clock = iter([0.0] + [0.0 + 0.1 * i for i in range(1, 101)] + [10.0])
    monkeypatch.setattr(workload.time, "time", lambda: next(clock))
    rep = workload.Reporter(warmup_steps=10, curve_window_s=1.0)
    rep.loop_started()
    for _ in range(100):
        rep.step(32)
    rep.loop_ended()
    out = rep.summary()
    assert out["steps"] == 100 and out["samples"] == 3200 and out["warmup_excluded"]
    # steps 11..100 (90 x 32 samples) between step 10 (t=1.0) and the end (t=10.0)
    assert out["samples_per_s"] == pytest.approx(90 * 32 / 9.0)
    assert len(out["curve"]) == 10 and out["curve"][0] == (1.0, 320.0)


def test_too_few_steps_falls_back_to_the_whole_loop(monkeypatch):
    clock = iter([0.0, 0.5, 1.0, 2.0])
    monkeypatch.setattr(workload.time, "time", lambda: next(clock))
    rep = workload.Reporter(warmup_steps=10)
    rep.loop_started()
    rep.step(10)
    rep.step(10)
    rep.loop_ended()
    out = rep.summary()
    assert out["samples_per_s"] == pytest.approx(10.0) and not out["warmup_excluded"]


def test_long_trainings_keep_a_bounded_curve(monkeypatch):
    ticks = iter(range(10**6))
    monkeypatch.setattr(workload.time, "time", lambda: float(next(ticks)))
    rep = workload.Reporter(warmup_steps=1, curve_window_s=1.0, curve_points=16)
    rep.loop_started()
    for _ in range(1000):
        rep.step(5)
    rep.loop_ended()
    curve = rep.summary()["curve"]
    assert 8 <= len(curve) <= 16
    assert all(rate == pytest.approx(5.0) for _, rate in curve[:-1])  # 5 samples per 1 s tick, however merged
    assert 0 < curve[-1][1] <= 5.0  # the last, partial window
    assert [t for t, _ in curve] == sorted(t for t, _ in curve)


def test_a_loop_that_reports_no_samples_has_no_throughput():
    """A Hydra job (or any training that never calls step): samples/s is unknown, not 0."""
    rep = workload.Reporter()
    rep.loop_started()
    rep.loop_ended()
    assert rep.summary()["samples_per_s"] is None
