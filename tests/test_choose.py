"""gpupack.results.analysis.choose: the best N with regard to noise (bootstrap intervals, ties, rules, sample size)."""
from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

from gpupack.results.analysis.choose import (
    MAX_REPEATS,
    RULES,
    Choice,
    _boot_medians,
    choose,
    gain,
    keeps_improving,
    tie_label,
)


def packs(center: float, rel: float, k: int) -> list[float]:
    """k pack times spread evenly over center * (1 ± rel): deterministic, and the median is exactly center."""
    return list(center * (1 + rel * np.linspace(-1, 1, k)))


# --- choose ---------------------------------------------------------------------------------------------------

def test_clear_winner_with_many_packs() -> None:
    c = choose({1: packs(10, 0.02, 20), 2: packs(7, 0.02, 20), 4: packs(5, 0.02, 20), 8: packs(6, 0.02, 20)})
    assert (c.best, c.lowest, c.ties) == (4, 4, (4,))
    assert not c.provisional and c.repeats_needed is None
    assert c.rule == RULES["smallest"] and "bootstrap" in c.method and "2000 resamples" in c.method
    for n, iv in c.intervals.items():
        assert iv.packs == 20 and iv.low is not None and iv.high is not None
        assert iv.low <= iv.median <= iv.high


@pytest.mark.parametrize("rule, best", [("smallest", 2), ("lowest", 4)])
def test_two_n_within_noise_tie_and_rule_picks(rule: str, best: int) -> None:
    # 0.7 % apart with 3 % spread per pack: a tie; the gap is under 1 %, not worth packs to separate.
    c = choose({1: packs(10, 0.03, 10), 2: packs(7.0, 0.03, 10), 4: packs(6.95, 0.03, 10)}, rule=rule)
    assert c.lowest == 4 and c.ties == (2, 4) and c.best == best
    assert c.rule == RULES[rule]
    assert not c.provisional and c.repeats_needed is None


def test_tie_worth_separating_estimates_repeats() -> None:
    # 2 % apart with 3 % spread: tied at 10 packs; n = ceil(pi s^2 (z_0.975 + z_0.8)^2 / d^2) says how many.
    a, b = packs(7.14, 0.03, 10), packs(7.0, 0.03, 10)
    c = choose({2: a, 4: b})
    assert c.ties == (2, 4) and c.best == 2 and not c.provisional
    s2 = sum(((np.array(x) / np.mean(x) - 1) ** 2).sum() for x in (a, b)) / 18  # pooled relative variance
    z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)
    assert c.repeats_needed == math.ceil(math.pi * s2 * z**2 / (0.14 / 7.0) ** 2) == 26


def test_repeats_capped() -> None:
    c = choose({2: packs(7.08, 0.2, 10), 4: packs(7.0, 0.2, 10)})  # 1.1 % apart, 20 % spread: hopeless
    assert c.ties == (2, 4) and c.repeats_needed == MAX_REPEATS


def test_clearly_separated_when_apart() -> None:
    c = choose({2: packs(7.2, 0.03, 10), 4: packs(7.0, 0.03, 10)})
    assert c.ties == (4,) and c.best == 4


@pytest.mark.parametrize("rule", ["smallest", "lowest"])
def test_infeasible_lowest_is_never_chosen(rule: str) -> None:
    times = {1: packs(10, 0.02, 10), 2: packs(7, 0.02, 10), 4: packs(4, 0.02, 10), 8: packs(6.95, 0.02, 10)}
    c = choose(times, infeasible={4}, rule=rule)
    assert c.lowest == 8 and c.ties == (2, 8) and c.best == (8 if rule == "lowest" else 2)
    assert 4 not in c.intervals
    assert choose(times, rule=rule).best == 4  # feasible, it would have won


@pytest.mark.parametrize("times, infeasible", [({}, ()), ({1: [], 2: []}, ()), ({1: [5.0, 5.1], 2: [4.0]}, {1, 2})])
def test_nothing_feasible_gives_none(times: dict[int, list[float]], infeasible: set[int]) -> None:
    c = choose(times, infeasible=infeasible)
    assert (c.best, c.lowest, c.ties, dict(c.intervals)) == (None, None, (), {})
    assert not c.provisional and c.repeats_needed is None


def test_fewer_than_min_packs_is_provisional() -> None:
    times = {1: packs(10, 0.03, 3), 2: packs(7, 0.03, 3), 4: packs(5, 0.03, 3)}
    c = choose(times)
    assert c.best == 4 and c.provisional
    assert c.repeats_needed is not None and c.repeats_needed > 3
    assert not choose(times, min_packs=3).provisional


def test_provisional_only_counts_the_ties() -> None:
    # N=1 has 2 packs but is far off: it does not make the choice provisional.
    c = choose({1: packs(10, 0.03, 2), 4: packs(5, 0.03, 8)})
    assert c.ties == (4,) and not c.provisional and c.repeats_needed is None


@pytest.mark.parametrize("x, tied", [
    (5.2, True),   # inside the lowest's interval [4.72, 5.28]
    (5.5, True),   # outside it, but within one pack's spread: a single pack cannot rule itself out
    (6.5, False),  # far beyond both
])
def test_single_pack_n_borrows_the_pooled_spread(x: float, tied: bool) -> None:
    c = choose({1: packs(8, 0.02, 10), 2: [x], 4: packs(5, 0.1, 10)})
    iv = c.intervals[4]
    assert iv.low is not None and iv.high is not None and iv.high < 5.5
    assert c.intervals[2] == type(iv)(x, None, None, 1)
    assert (2 in c.ties) is tied and c.lowest == 4
    assert c.provisional is tied  # a 1-pack N among the ties makes it provisional


def test_single_pack_everywhere_ties_everything() -> None:
    c = choose({1: [10.0], 2: [7.0], 4: [5.0]})
    assert c.lowest == 4 and c.ties == (1, 2, 4) and c.best == 1
    assert c.provisional and c.repeats_needed is None  # no spread to estimate from
    assert all(iv.low is None and iv.high is None for iv in c.intervals.values())


def test_deterministic_for_a_seed() -> None:
    rng = np.random.default_rng(3)
    times = {n: list(rng.normal(7 - 0.02 * n, 0.2, 25)) for n in (1, 2, 3, 4)}  # 25 packs: many possible medians
    a, b = choose(times, seed=11), choose(times, seed=11)
    assert a == b
    assert a.intervals != choose(times, seed=12).intervals  # the seed does drive the resamples


def test_bootstrap_medians_follow_resampling_exactly() -> None:
    """The medians are drawn from their order statistics, not from resamples: their distribution must be the
    resamples' own. For k <= 5 every one of the k**k equally likely resamples is enumerated and each median's exact
    probability compared with its frequency in 200,000 draws (within 5 standard errors); for k = 40 the quantiles
    are compared with those of real resamples."""
    for k in (1, 2, 3, 4, 5):
        x = np.random.default_rng(k).normal(size=k)
        got = _boot_medians([x], 200_000, np.random.default_rng(7))[0]
        every = np.array(list(itertools.product(range(k), repeat=k)))
        exact = pd.Series(np.median(x[every], axis=1)).round(12).value_counts(normalize=True)
        seen = pd.Series(got).round(12).value_counts(normalize=True)
        assert set(seen.index) <= set(exact.index)  # only medians a resample can have
        for value, prob in exact.items():
            error = 5 * math.sqrt(prob * (1 - prob) / len(got)) + 1e-9
            assert abs(seen.get(value, 0.0) - prob) <= error, (k, value, prob, seen.get(value, 0.0))
    x = np.random.default_rng(40).normal(size=40)
    got = _boot_medians([x, 2 * x], 100_000, np.random.default_rng(7))
    resampled = np.median(x[np.random.default_rng(8).integers(0, 40, size=(100_000, 40))], axis=1)
    for q in (0.025, 0.25, 0.5, 0.75, 0.975):
        assert abs(np.quantile(got[0], q) - np.quantile(resampled, q)) < 0.02
        assert abs(np.quantile(got[1], q) - 2 * np.quantile(resampled, q)) < 0.04


def test_twenty_n_of_fifty_packs_each_choose_the_steady_best() -> None:
    """A large input (its speed is benchmarks' business, not a test's): time per training falls by 0.1 s per N with
    0.3 s of noise, so the lowest N's are within noise of each other and the smallest of those is chosen."""
    rng = np.random.default_rng(0)
    times = {n: list(rng.normal(10 - 0.1 * n, 0.3, 50)) for n in range(1, 21)}
    got = choose(times)
    assert got.best == min(got.ties) and 20 in got.ties and 1 not in got.ties
    assert got == choose(times)  # seeded: the same answer every time


@pytest.mark.parametrize("kwargs", [{"rule": "fastest"}, {"confidence": 1.0}, {"resamples": 0}, {"min_packs": 1}])
def test_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        choose({1: [1.0, 1.1]}, **kwargs)


@pytest.mark.parametrize("bad", [[1.0, -1.0], [1.0, 0.0], [1.0, float("inf")]])
def test_bad_times(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        choose({1: bad})


def test_nan_is_a_pack_without_timing() -> None:
    assert choose({1: [5.0, float("nan"), 5.2]}).intervals[1].packs == 2


def test_drift_fools_n_ordered_runs_not_interleaved() -> None:
    """Why run order matters (data only): a slow linear drift by run position, no other noise.

    True time per training is N=1: 10, N=2: 7, N=3: 6.9, N=4: 8. Run all of N=1's packs, then N=2's...
    and the drift charges each later N 10 positions more: N=3 looks worse than N=2 beyond noise. Run them
    round-robin and the drift is shared: N=3 is the lowest again (and within noise of N=2).
    """
    true, drift, k = {1: 10.0, 2: 7.0, 3: 6.9, 4: 8.0}, 0.05, 10
    by_n = {n: [true[n] + drift * ((n - 1) * k + r) for r in range(k)] for n in true}
    interleaved = {n: [true[n] + drift * (r * len(true) + n - 1) for r in range(k)] for n in true}
    fooled = choose(by_n, rule="lowest")
    assert fooled.best == 2 and 3 not in fooled.ties and not fooled.provisional
    right = choose(interleaved, rule="lowest")
    assert right.best == 3 and right.ties == (2, 3)


# --- tie_label ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ties, measured, label", [
    ((4,), None, "N=4"),
    ((2, 3, 4), None, "N=2–4"),
    ((2, 3), None, "N=2–3"),
    ((2, 8), None, "N=2, 8"),
    ((8, 2), None, "N=2, 8"),
    ((1, 2, 3, 8), None, "N=1–3, 8"),
    ((3, 5), [1, 3, 5, 8], "N=3–5"),
    ((3, 5), None, "N=3, 5"),
    ((1, 5), [1, 3, 5, 8], "N=1, 5"),
    ((), None, "none"),
])
def test_tie_label(ties: tuple[int, ...], measured: list[int] | None, label: str) -> None:
    assert tie_label(ties, measured) == label


def test_tie_label_rejects_unmeasured() -> None:
    with pytest.raises(ValueError):
        tie_label((3, 4), [1, 3, 5])


# --- gain / keeps_improving -----------------------------------------------------------------------------------

@pytest.mark.parametrize("b_center, b_spread, keeps, why", [
    (8.0, 0.02, True, ">= 5 %"),          # 20 % faster, tight: keep going
    (9.8, 0.02, False, "(< 5 %)"),         # 2 %: below the threshold
    (9.0, 0.9, False, "within noise"),     # 10 % median gain, huge spread
    (10.5, 0.02, False, "slower"),
])
def test_keeps_improving(b_center: float, b_spread: float, keeps: bool, why: str) -> None:
    a, b = packs(10, 0.02, 8), packs(b_center, b_spread, 8)
    ok, reason = keeps_improving(a, b, names=("N=5", "N=8"))
    assert ok is keeps and why in reason and "N=8" in reason and "N=5" in reason


def test_keeps_improving_reason_text() -> None:
    ok, reason = keeps_improving(packs(10, 0.02, 8), packs(9.79, 0.02, 8), names=("N=5", "N=8"))
    assert not ok and reason == "N=8 improves on N=5 by 2.1 % (< 5 %)"
    ok, reason = keeps_improving(packs(10, 0.02, 8), packs(9.0, 0.9, 8), names=("N=5", "N=8"))
    assert not ok and reason.startswith("N=8 improves on N=5 by 10.0 % within noise (interval -")


DRIFT = [1.0, 1.6, 0.8, 2.2, 1.3, 0.9]  # how slow the machine was in each of six rounds (a neighbour comes, goes)


@pytest.mark.parametrize("b_tpt, rounds_b, keeps, why", [
    # b 10 % faster in every round, but the rounds' drift spreads each side 0.8x-2.2x: only pairing sees it
    (9.0, list(range(6)), True, "N=8 improves on N=5 by 10.0 % (>= 5 %, interval +10.0 %..+10.0 %, paired within 6 "
                                "rounds)"),
    (9.8, list(range(6)), False, "N=8 improves on N=5 by 2.0 % (< 5 %, paired within 6 rounds)"),
    (10.5, list(range(6)), False, "N=8 is slower than N=5 by 5.0 % per training (paired within 6 rounds)"),
    (9.0, [3] * 6, False, "but a single round has no spread: cannot tell it from noise"),
    (9.0, [None] * 6, False, "within noise (interval -"),  # no rounds: unpaired, the drift is noise
    (9.0, [None] * 6, False, "unpaired: N=8 shares no round with N=5)"),
])
def test_a_gain_is_paired_within_the_rounds_both_sides_share(b_tpt, rounds_b, keeps, why) -> None:
    a = [10.0 * d for d in DRIFT]
    b = [b_tpt * d for d in DRIFT] if rounds_b[0] != 3 else [b_tpt * DRIFT[3]] * 6
    ok, reason = keeps_improving(a, b, names=("N=5", "N=8"), rounds=(list(range(6)), rounds_b))
    assert ok is keeps and why in reason, reason


def test_an_unpaired_gain_of_the_same_drifting_packs_cannot_tell_ten_percent_from_noise() -> None:
    a, b = [10.0 * d for d in DRIFT], [9.0 * d for d in DRIFT]
    ok, reason = keeps_improving(a, b, names=("N=5", "N=8"))
    assert not ok and "within noise" in reason and "paired" not in reason
    g = gain(a, b, rounds=(list(range(6)), list(range(6))))
    assert g.paired == 6 and g.median == pytest.approx(0.1) and g.low == pytest.approx(0.1) and not g.unpaired
    assert gain(a, b, rounds=([0] * 6, [0] * 6)).unpaired == "a (the reference) ran in fewer than 2 rounds"


def test_gain_interval_and_single_pack() -> None:
    g = gain(packs(10, 0.02, 8), packs(8, 0.02, 8))
    assert g.median == pytest.approx(0.2) and g.low is not None and g.high is not None
    assert 0 < g.low <= g.median <= g.high
    assert gain(packs(10, 0.02, 8), packs(8, 0.02, 8), seed=5) == gain(packs(10, 0.02, 8), packs(8, 0.02, 8), seed=5)
    single = gain([10.0], packs(8, 0.02, 8))
    assert single.median == pytest.approx(0.2) and single.low is None and single.high is None
    ok, reason = keeps_improving([10.0], packs(8, 0.02, 8))
    assert not ok and "single pack" in reason
    with pytest.raises(ValueError):
        gain([], [1.0])


def test_choice_is_frozen() -> None:
    c = choose({1: [1.0, 1.1]})
    assert isinstance(c, Choice)
    with pytest.raises(AttributeError):
        c.best = 2  # type: ignore[misc]


def test_still_tied_asks_for_more_packs_than_now() -> None:
    # Bimodal packs: the median's bootstrap swings between the modes, wider than the normal approximation,
    # so the formula says fewer packs than the 10 already run; the answer is at least one more.
    def bimodal(c: float) -> list[float]:
        return [c * 0.97] * 5 + [c * 1.03] * 5

    c = choose({2: bimodal(7.4), 4: bimodal(7.0)})
    assert c.ties == (2, 4) and not c.provisional and c.repeats_needed == 11


# --- paired within rounds ---------------------------------------------------------------------------------------

def _rounds(true: dict[int, float], drift: list[float], jitter: float = 0.01, seed: int = 0):
    """Each N once per round; round r's every pack slowed by drift[r] (what a round shares), a little noise each."""
    rng = np.random.default_rng(seed)
    times = {n: [t * d * (1 + jitter * rng.uniform(-1, 1)) for d in drift] for n, t in true.items()}
    return times, {n: list(range(len(drift))) for n in true}


def test_a_drift_shared_by_each_round_divides_out_when_paired() -> None:
    """A machine whose speed swings by 2x between rounds hides a 10 % gain from the unpaired medians (a tie) and not
    from the paired ratios, which are the gain itself round by round."""
    true = {1: 10.0, 2: 9.0, 3: 9.6}
    times, rounds = _rounds(true, [1.0, 2.0, 1.3, 0.7, 1.8, 1.1])
    unpaired = choose(times)
    paired = choose(times, rounds=rounds)
    assert unpaired.ties == (1, 2, 3) and unpaired.best == 1 and unpaired.reference is None
    assert paired.best == 2 and paired.ties == (2,) and paired.reference == 1
    assert paired.relative[2].median == pytest.approx(0.9, rel=0.03) and paired.relative[1].median == 1.0
    assert paired.relative[2].packs == 6 and "paired within rounds" in paired.method and "6 rounds" in paired.method


def test_paired_needs_the_reference_in_two_rounds_and_every_n_beside_it_else_says_why() -> None:
    times = {1: [10.0, 10.1], 2: [9.0, 9.1]}
    one_round = choose(times, rounds={1: [0, 0], 2: [0, 1]})
    assert one_round.reference is None
    assert "unpaired: N=1 (the reference) ran in fewer than 2 rounds" in one_round.method
    apart = choose(times, rounds={1: [0, 1], 2: [2, 3]})
    assert apart.reference is None and "unpaired: N=2 shares no round with N=1" in apart.method


def test_an_infeasible_smallest_n_hands_the_reference_to_the_next() -> None:
    times, rounds = _rounds({1: 10.0, 2: 9.0, 4: 6.0}, [1.0, 1.5, 0.8])
    c = choose(times, rounds=rounds, infeasible={1})
    assert c.reference == 2 and c.best == 4 and set(c.relative) == {2, 4}


def test_a_round_with_two_reference_packs_pairs_with_their_median_and_nan_packs_drop_with_their_round() -> None:
    times = {1: [10.0, 12.0, 10.0, math.nan], 2: [9.0, 9.0, 9.0]}
    c = choose(times, rounds={1: [0, 0, 1, 2], 2: [0, 1, 2]})  # N=1's NaN pack took round 2's pair with it
    assert c.reference == 1 and c.relative[2].packs == 2
    assert c.relative[2].median == pytest.approx((9 + 9) / (11 + 10))  # the sums over the rounds they share


def test_paired_gain_weighs_the_grid_points_as_the_grid_does_not_as_the_round_s_one_reference() -> None:
    """Grid points costing 1, 2, 3, 4 s alone; N=2 runs two at once in the time of the dearer (1 and 2 s per training).
    Its packs land beside the references of points 0 and 3: a median of their ratios (1/1, 2/4) says 1.33x, the sums
    say the true 10/6 = 1.67x."""
    c = choose({1: [1.0, 2.0, 3.0, 4.0], 2: [1.0, 2.0]}, rounds={1: [0, 1, 2, 3], 2: [0, 3]})
    assert 1 / c.relative[2].median == pytest.approx(10 / 6)


def test_one_pair_with_no_other_n_to_borrow_from_borrows_the_reference_packs_spread() -> None:
    """The reference's own ratios are 1 by construction and lend no spread; its packs' spread, √2 times (a ratio of
    two packs), is borrowed instead: a gain within it ties, as unpaired."""
    c = choose({1: [10.0, 14.0], 2: [9.0]}, rounds={1: [0, 1], 2: [1]})
    assert c.reference == 1 and c.ties == (1, 2) and c.best == 1
    assert choose({1: [10.0, 14.0], 2: [9.0]}).ties == (1, 2)  # as unpaired
    alone = choose({1: [10.0], 2: [9.0]}, rounds={1: [0], 2: [0]})  # no spread anywhere: nothing told apart
    assert alone.ties == (1, 2) and alone.best == 1


def test_a_run_cut_after_its_first_round_still_tells_a_large_gain_apart() -> None:
    """The H200's fused ladder, stopped by its time limit (2026-11-28): N=1 in three rounds, N=8 and N=34 in the first
    only. N=34's 24x is far outside N=1's spread between packs: it is the answer (provisional), not a tie with N=1."""
    c = choose({1: [7.23, 8.09, 8.63], 8: [1.05], 34: [0.355]}, rounds={1: [0, 1, 2], 8: [0], 34: [0]})
    assert c.reference == 1 and c.best == 34 and c.ties == (34,) and c.provisional


def test_packs_in_no_rounds_say_so() -> None:
    c = choose({1: [10.0, 10.1], 2: [9.0, 9.1]}, rounds={1: [None, None], 2: [None, None]})
    assert c.reference is None and "the packs ran in no rounds" in c.method
