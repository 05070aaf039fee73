"""Choose the best packing factor N from time per training, with regard to noise. Pure and deterministic: no I/O, no
clock; the same inputs and ``seed`` give the same answer.

Method
------
Each feasible N's time per training is the **median over its packs** (robust to one slow pack); a **percentile
bootstrap over packs** (each N's packs resampled with replacement, independently, ``resamples`` times from
``numpy.random.default_rng(seed)``) gives its interval (None with fewer than 2 packs). ``lowest`` is the N with the
lowest median; another N **ties** with it when the interval of median(N) - median(lowest), on the same resamples,
holds 0. Among the ties ``rule`` picks the ``"smallest"`` N (least memory, least interference) or the ``"lowest"``
median. ``infeasible`` N (an OOM) are left out of everything.

A single pack would resample to zero width and be told apart too eagerly: its resampled median is drawn as
``x * (1 + s * Z)``, Z standard normal, s the pooled relative spread of one pack (below) over the N with 2 packs or
more; with no such N nothing can be told apart and every N ties. ``provisional``: the lowest or an N tying with it has
fewer than ``min_packs`` packs.

Paired over rounds
------------------
Where the packs ran in rounds (:func:`gpupack.core.plan.in_rounds`) and ``rounds`` says each pack's, every N is
compared with the **reference** N (the smallest feasible one) *inside the same round*: each pack of N is paired with
the reference's time in its round (their median where it has several), and N's **relative time** is the sum of its
packs' times over the sum of their partners'. A ratio of sums, not a median of ratios: a pack of N trains other grid
points than the reference beside it, and only sums weigh the points as the grid does. A drift that a round shares
weighs both sums alike. The bootstrap resamples **rounds**, the same draw for every N; ties and rule follow as above.
An N with one pair borrows the pooled spread of one pair's ratio over the other N (the reference's are 1 and do not
count); with none, √2 times the unpaired spread of one pack (a ratio of two packs). Paired only where the reference
has two rounds or more and every other N shares a round with it; otherwise unpaired, and ``method`` says why.

Sample size
-----------
s is the pooled relative standard deviation of one pack: ``s^2 = sum_N sum_i (t_i/mean_N - 1)^2 / sum_N (k_N - 1)``
over N with k_N >= 2 packs. The median of n packs has variance about (pi/2) s^2 / n, so the difference of two medians
pi s^2 / n, and telling a relative gap d apart at this confidence with 80 % power takes
``n = ceil(pi * s^2 * (z_{1-alpha/2} + z_{0.8})^2 / d^2)``, d the gap from the lowest to the *nearest* tying N at least
1 % higher (closer ones are as good). ``repeats_needed`` is that n (at least one more pack than the pair has now),
raised to ``min_packs`` when provisional, capped at 50; None when settled or not estimable (no N has 2 packs).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from types import MappingProxyType

import numpy as np

RULES = {
    "smallest": "smallest N among ties (least memory, least interference)",
    "lowest": "lowest median among ties",
}
MAX_REPEATS = 50  # beyond this many packs per N a gap is too small to matter for a packing factor
NOT_WORTH = 0.01  # medians within 1 % of the lowest: any of those N is as good, no packs spent to separate them
POWER = 0.8  # chance that repeats_needed packs separate a real gap of that size


@dataclass(frozen=True)
class MedianInterval:
    median: float  # median time per training over this N's packs (seconds)
    low: float | None  # bootstrap interval of that median (None with < 2 packs)
    high: float | None
    packs: int


@dataclass(frozen=True)
class Choice:
    best: int | None  # the N picked: by `rule` among the ties (None: no feasible N with a timing)
    lowest: int | None  # the N with the lowest median
    ties: tuple[int, ...]  # N within noise of `lowest` (lowest included), ascending; (lowest,) when none
    rule: str  # which rule picked among ties, in words
    intervals: Mapping[int, MedianInterval]  # feasible N with at least one timing
    provisional: bool  # too few packs for the method to be trusted
    repeats_needed: int | None  # packs per N that would likely settle it (None: settled or not estimable)
    method: str  # the method in words
    # Paired over rounds (module docstring): the reference N, and each N's time relative to it (ratio of sums, its
    # interval over resampled rounds, its pairs as ``packs``); None / empty: unpaired.
    reference: int | None = None
    relative: Mapping[int, MedianInterval] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Gain:
    median: float  # relative improvement of b over a: 1 - median(b)/median(a) (0.1: b is 10 % faster); paired: 1 -
    # the ratio of b's sum over a's in the rounds they share
    low: float | None  # its bootstrap interval (None when a or b has < 2 packs, or < 2 shared rounds)
    high: float | None
    paired: int = 0  # the rounds the comparison was paired within (0: unpaired)
    unpaired: str = ""  # why it is not paired where rounds were given ("" otherwise)


def _check(confidence: float, resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")


def _clean(values: Sequence[float], what: str) -> np.ndarray:
    """Finite positive timings; NaN is a pack without a timing and is dropped, anything else wrong is an error."""
    arr = np.asarray(list(values), dtype=float)
    arr = arr[~np.isnan(arr)]
    if np.any(~np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{what}: times per training must be finite and > 0, got {arr.tolist()}")
    return np.asarray(arr)


def _boot_medians(samples: Sequence[np.ndarray], resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Bootstrap medians, one (resamples,) array per sample, drawn without drawing the resamples themselves.

    A resample of k values draws k indices uniformly, floor(k U) for uniform U; its median is the sorted sample at
    the middle order statistics of those indices, and the j-th smallest of k uniforms is Beta(j, k - j + 1), the next
    one above it that plus the rest of the way times Beta(1, k - j) (the least of the k - j uniforms above it). So each
    resample's median costs two draws, not k draws and a sort: the same distribution as resampling, at any k.
    """
    out = []
    for s in samples:  # fixed draw order: deterministic for a seed
        k = len(s)
        data = np.sort(s)
        j = (k - 1) // 2 + 1  # the lower middle order statistic, counted from 1
        low = rng.beta(j, k - j + 1, size=resamples)
        high = low if k % 2 else low + (1.0 - low) * rng.beta(1, k - j, size=resamples)
        picks = [np.minimum((k * u).astype(np.int64), k - 1) for u in (low, high)]
        out.append((data[picks[0]] + data[picks[1]]) / 2.0)
    return out


def _pooled_spread(samples: Sequence[np.ndarray]) -> float | None:
    """Pooled relative standard deviation of one pack over samples of >= 2 packs; None when there is none."""
    num, dof = 0.0, 0
    for s in samples:
        if len(s) >= 2:
            num += float(np.sum((s / s.mean() - 1.0) ** 2))
            dof += len(s) - 1
    return math.sqrt(num / dof) if dof else None


def _pct(confidence: float) -> str:
    return f"{round(confidence * 100, 6):g}%"


def choose(times: Mapping[int, Sequence[float]], *, infeasible: Collection[int] = (), confidence: float = 0.95,
           resamples: int = 2000, seed: int = 0, min_packs: int = 5, rule: str = "smallest",
           rounds: Mapping[int, Sequence[Hashable]] | None = None) -> Choice:
    """The best N from each N's times per training (a value per pack; ``rounds``: each one's round, then paired)."""
    _check(confidence, resamples)
    if rule not in RULES:
        raise ValueError(f"rule must be one of {sorted(RULES)}, got {rule!r}")
    if min_packs < 2:
        raise ValueError(f"min_packs must be >= 2 (one pack has no interval), got {min_packs}")
    alpha = 1.0 - confidence
    method = (f"{_pct(confidence)} percentile bootstrap over packs ({resamples} resamples, seed {seed}); "
              "tie: the difference of medians' interval holds 0")
    skip = set(infeasible)
    tagged = {n: _tagged(v, (rounds or {}).get(n), f"N={n}") for n, v in sorted(times.items()) if n not in skip}
    tagged = {n: v for n, v in tagged.items() if len(v[0])}
    ns = list(tagged)
    if any(n < 1 for n in ns):
        raise ValueError(f"packing factors must be >= 1, got {ns}")
    if not ns:
        return Choice(None, None, (), RULES[rule], MappingProxyType({}), False, None, method)

    samples = [tagged[n][0] for n in ns]
    rng = np.random.default_rng(seed)
    boots = _per_n_boots(samples, resamples, rng)
    medians = np.array([float(np.median(s)) for s in samples])
    q = np.quantile(boots, [alpha / 2, 1 - alpha / 2], axis=1)
    intervals = {n: MedianInterval(float(medians[i]), float(q[0, i]) if len(samples[i]) >= 2 else None,
                             float(q[1, i]) if len(samples[i]) >= 2 else None, len(samples[i]))
                 for i, n in enumerate(ns)}
    spread = _pooled_spread(samples)

    paired = _pairs(tagged) if rounds is not None else None
    reference: int | None = None
    relative: dict[int, MedianInterval] = {}
    if isinstance(paired, str):
        method += f"; unpaired: {paired}"
    elif paired is not None:
        reference = ns[0]
        boots, spread, medians, relative, method = _paired(
            [paired[n] for n in ns], ns, resamples, rng, spread, alpha, f"{_pct(confidence)} percentile bootstrap",
            seed)

    lo = int(np.argmin(medians))  # first minimum: the smaller N wins an exact tie of medians
    lowest = ns[lo]
    if spread is None:  # no N has 2 packs: nothing can be told apart from anything
        tied = list(range(len(ns)))
    else:
        dq = np.nanquantile(boots - boots[lo], [alpha / 2, 1 - alpha / 2], axis=1)
        tied = [i for i in range(len(ns)) if i == lo or dq[0, i] <= 0.0 <= dq[1, i]]
    ties = tuple(ns[i] for i in tied)
    best = min(ties) if rule == "smallest" else lowest
    provisional = any(len(samples[i]) < min_packs for i in tied)
    repeats = _repeats(medians, lo, tied, [len(s) for s in samples], spread, provisional, min_packs, alpha)
    return Choice(best, lowest, ties, RULES[rule], MappingProxyType(intervals), provisional, repeats, method,
                  reference, MappingProxyType(relative))


def _paired(pairs: list[list[tuple[float, float, Hashable]]], ns: list[int], resamples: int,
            rng: np.random.Generator, spread: float | None, alpha: float, bootstrap: str, seed: int,
            ) -> tuple[np.ndarray, float | None, np.ndarray, dict[int, MedianInterval], str]:
    """The paired comparison against ``ns[0]``: boots, spread, each N's ratio of sums, intervals, words."""
    boots, spread = _paired_boots(pairs, resamples, rng, None if spread is None else spread * math.sqrt(2))
    medians = np.array([1.0] + [_ratio_of_sums(p) for p in pairs[1:]])
    rq = np.nanquantile(boots, [alpha / 2, 1 - alpha / 2], axis=1)
    relative = {n: MedianInterval(float(medians[i]), float(rq[0, i]) if len(pairs[i]) >= 2 else None,
                                  float(rq[1, i]) if len(pairs[i]) >= 2 else None, len(pairs[i]))
                for i, n in enumerate(ns)}
    n_rounds = len({k for of_n in pairs for _, _, k in of_n})
    method = (f"paired within rounds: each N's time per training over N={ns[0]}'s in the same rounds (ratio of their "
              f"sums), {bootstrap} over its {n_rounds} rounds ({resamples} resamples, seed {seed}); tie: the interval "
              "of the difference of the ratios holds 0")
    return boots, spread, medians, relative, method


def _tagged(values: Sequence[float], rounds: Sequence[Hashable] | None, what: str) -> tuple[np.ndarray, list[Hashable]]:
    """The finite timings (:func:`_clean`) and each one's round (None: none), NaN packs dropped from both."""
    tags = list(rounds) if rounds is not None else [None] * len(values)
    if len(tags) != len(values):
        raise ValueError(f"{what}: {len(values)} times but {len(tags)} rounds")
    keep = [i for i, v in enumerate(values) if not (isinstance(v, float) and math.isnan(v))]
    return _clean([values[i] for i in keep], what), [tags[i] for i in keep]


def _pairs(tagged: Mapping[int, tuple[np.ndarray, list[Hashable]]], names: Callable[[int], str] = "N={}".format,
           ) -> dict[int, list[tuple[float, float, Hashable]]] | str:
    """Each N's (its time, the reference's in that round, round) pairs, or why they cannot be paired."""
    ns = list(tagged)
    ref_times, ref_rounds = tagged[ns[0]]
    by_round: dict[Hashable, list[float]] = {}
    for t, k in zip(ref_times, ref_rounds):
        if k is not None:
            by_round.setdefault(k, []).append(float(t))
    if not by_round and all(k is None for _, tags in tagged.values() for k in tags):
        return "the packs ran in no rounds (packing.order=by_factor, or a run planned before rounds)"
    if len(by_round) < 2:
        return f"{names(ns[0])} (the reference) ran in fewer than 2 rounds"
    ref = {k: float(np.median(v)) for k, v in by_round.items()}
    out: dict[int, list[tuple[float, float, Hashable]]] = {}
    for n in ns:
        times, tags = tagged[n]
        out[n] = [(float(t), ref[k], k) for t, k in zip(times, tags) if k in ref]
        if not out[n]:
            return f"{names(n)} shares no round with {names(ns[0])}"
    return out


def _ratio_of_sums(pairs: Sequence[tuple[float, float, Hashable]]) -> float:
    return sum(t for t, _, _ in pairs) / sum(r for _, r, _ in pairs)


def _per_n_boots(samples: Sequence[np.ndarray], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Each N's bootstrap medians over its own packs (one pack: the pooled spread borrowed, module docstring)."""
    spread = _pooled_spread(samples)
    multi = [i for i, s in enumerate(samples) if len(s) >= 2]
    boots = np.empty((len(samples), resamples))
    for i, m in zip(multi, _boot_medians([samples[i] for i in multi], resamples, rng)):
        boots[i] = m
    for i, s in enumerate(samples):
        if len(s) == 1:  # borrowed spread: one pack is as noisy as the others (module docstring)
            boots[i] = s[0] * (1.0 + (spread or 0.0) * rng.standard_normal(resamples))
    return boots


def _paired_boots(pairs: Sequence[Sequence[tuple[float, float, Hashable]]], resamples: int,
                  rng: np.random.Generator, fallback: float | None) -> tuple[np.ndarray, float | None]:
    """Each N's ratio of sums over rounds resampled, one draw for every N (NaN where a draw holds none of its rounds;
    the reference's is 1), and the pooled spread of one pair's ratio, else ``fallback``, which an N of one pair
    borrows (module docstring)."""
    keys = list(dict.fromkeys(k for of_n in pairs for _, _, k in of_n))
    index = {k: j for j, k in enumerate(keys)}
    counts = rng.multinomial(len(keys), np.full(len(keys), 1.0 / len(keys)), size=resamples)  # (resamples, rounds)
    spread = _pooled_spread([np.array([t / r for t, r, _ in of_n]) for of_n in pairs[1:] if len(of_n) >= 2])
    spread = fallback if spread is None else spread
    boots = np.ones((len(pairs), resamples))
    for i, of_n in enumerate(pairs[1:], start=1):
        if len(of_n) == 1:
            boots[i] = _ratio_of_sums(of_n) * (1.0 + (spread or 0.0) * rng.standard_normal(resamples))
            continue
        weights = counts[:, [index[k] for _, _, k in of_n]]  # each pair weighs as often as its round was drawn
        num = weights @ np.array([t for t, _, _ in of_n])
        den = weights @ np.array([r for _, r, _ in of_n])
        with np.errstate(invalid="ignore", divide="ignore"):
            boots[i] = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return boots, spread


def _repeats(medians: np.ndarray, lo: int, tied: Sequence[int], packs: Sequence[int], spread: float | None,
             provisional: bool, min_packs: int, alpha: float) -> int | None:
    """Packs per N that would likely settle a tie worth separating (module docstring, Sample size)."""
    if spread is None:
        return None
    gaps = {i: (medians[i] - medians[lo]) / medians[lo] for i in tied if i != lo}
    worth = {i: g for i, g in gaps.items() if g >= NOT_WORTH}
    need = [min_packs] if provisional else []
    if worth:
        near = min(worth, key=lambda i: (worth[i], i))
        z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(POWER)
        n = math.ceil(math.pi * spread**2 * z**2 / worth[near] ** 2)
        need.append(max(n, packs[lo] + 1, packs[near] + 1))  # they still tie: more than now
    return min(max(need), MAX_REPEATS) if need else None


def tie_label(ties: Sequence[int], measured: Sequence[int] | None = None) -> str:
    """'N=2–4' for a run of consecutive factors, 'N=2, 8' otherwise, 'N=4' alone ('none' for no ties). Consecutive:
    adjacent among ``measured`` where given (ties (3, 5) among [1, 3, 5, 8] are 'N=3–5'), else adjacent integers."""
    if not ties:
        return "none"
    rank = {n: i for i, n in enumerate(sorted(set(measured)))} if measured is not None else {n: n for n in ties}
    missing = [n for n in ties if n not in rank]
    if missing:
        raise ValueError(f"ties {missing} are not among the measured factors {sorted(set(measured or ()))}")
    runs: list[list[int]] = []
    for n in sorted(set(ties)):
        if runs and rank[n] == rank[runs[-1][-1]] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return "N=" + ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


def gain(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000,
         seed: int = 0, rounds: tuple[Sequence[Hashable], Sequence[Hashable]] | None = None,
         names: tuple[str, str] = ("a", "b")) -> Gain:
    """Relative gain of b over a in median time per training, with its bootstrap interval; paired within the rounds
    they share where ``rounds`` says each pack's (as the choice of N is), else ``unpaired`` says why."""
    _check(confidence, resamples)
    xa, xb = _clean(a, "a"), _clean(b, "b")
    if not len(xa) or not len(xb):
        raise ValueError("gain needs at least one timing on each side")
    why = ""
    if rounds is not None:
        tagged = {0: _tagged(a, rounds[0], names[0]), 1: _tagged(b, rounds[1], names[1])}
        pairs = _pairs(tagged, names=lambda i: names[i])
        if not isinstance(pairs, str):
            return _paired_gain(pairs[1], confidence, resamples, seed)
        why = pairs
    med = 1.0 - float(np.median(xb)) / float(np.median(xa))
    if len(xa) < 2 or len(xb) < 2:  # a single pack has no spread to resample
        return Gain(med, None, None, unpaired=why)
    rng = np.random.default_rng(seed)
    ba = _boot_medians([xa], resamples, rng)[0]
    bb = _boot_medians([xb], resamples, rng)[0]
    alpha = 1.0 - confidence
    low, high = np.quantile(1.0 - bb / ba, [alpha / 2, 1 - alpha / 2])
    return Gain(med, float(low), float(high), unpaired=why)


def _paired_gain(pairs: Sequence[tuple[float, float, Hashable]], confidence: float, resamples: int,
                 seed: int) -> Gain:
    """1 - b's time over a's in their shared rounds (ratio of sums), its interval over rounds (one: None)."""
    n_rounds = len({k for _, _, k in pairs})
    med = 1.0 - _ratio_of_sums(pairs)
    if n_rounds < 2:
        return Gain(med, None, None, paired=n_rounds)
    boots, _ = _paired_boots([[], pairs], resamples, np.random.default_rng(seed), None)  # [0]: the reference
    alpha = 1.0 - confidence
    low, high = np.nanquantile(1.0 - boots[1], [alpha / 2, 1 - alpha / 2])
    return Gain(med, float(low), float(high), paired=n_rounds)


def keeps_improving(a: Sequence[float], b: Sequence[float], threshold: float = 0.05, *,
                    names: tuple[str, str] = ("a", "b"), confidence: float = 0.95, resamples: int = 2000,
                    seed: int = 0, rounds: tuple[Sequence[Hashable], Sequence[Hashable]] | None = None
                    ) -> tuple[bool, str]:
    """Whether b beats a by >= ``threshold`` (median gain) and beyond noise (interval above 0), and why (``names``
    label a and b in it). ``rounds``: each pack's round, for a and for b: the gain is paired (:func:`gain`)."""
    g = gain(a, b, confidence=confidence, resamples=resamples, seed=seed, rounds=rounds, names=names)
    na, nb = names
    how = f"paired within {g.paired} rounds" if g.paired else (f"unpaired: {g.unpaired}" if g.unpaired else "")
    span = ", ".join(x for x in ("" if g.low is None or g.high is None else
                                 f"interval {g.low * 100:+.1f} %..{g.high * 100:+.1f} %", how) if x)
    tail = f" ({how})" if how else ""
    if g.median < 0:
        return False, f"{nb} is slower than {na} by {-g.median * 100:.1f} % per training{tail}"
    head = f"{nb} improves on {na} by {g.median * 100:.1f} %"
    if g.median < threshold:
        return False, f"{head} (< {threshold * 100:g} %{', ' + how if how else ''})"
    if g.low is None:
        one = "a single round" if g.paired else "a single pack"
        return False, f"{head} but {one} has no spread: cannot tell it from noise"
    if g.low <= 0:
        return False, f"{head} within noise ({span})"
    return True, f"{head} (>= {threshold * 100:g} %, {span})"
