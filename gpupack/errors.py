"""gpupack's errors: a short hierarchy whose messages quote the bad value and give a HINT.

Everything a user can get wrong raises a :class:`GpupackError` subclass before anything is submitted;
the CLI prints ``str(err)`` as one line and exits non-zero.
"""
from __future__ import annotations

import difflib
from typing import Any, Iterable, Sequence


class GpupackError(Exception):
    """Base of every error gpupack raises on purpose."""

    exit_code = 2


class ConfigError(GpupackError):
    """A config key holds a value gpupack cannot use.

    ``ConfigError("packing.factors[0]", 0, "use integers >= 1, e.g. packing.factors=[1,2,4]")``
    reads: ``packing.factors[0]=0 is invalid: <why>. HINT: <hint>``.
    """

    def __init__(self, key: str, value: Any, why: str, hint: str) -> None:
        self.key, self.value, self.why, self.hint = key, value, why, hint
        super().__init__(f"{key}={value!r}: {why}. HINT: {hint}")


class DataError(ConfigError):
    """A data path is missing, unreadable, or not in the expected format."""


class RunDirError(GpupackError):
    """The run directory cannot be used (not writable, or holds a different sweep)."""


class SubmissionError(GpupackError):
    """The cluster refused or lost a job."""

    exit_code = 3


def nearest(word: str, choices: Iterable[str]) -> str:
    """A 'did you mean' fragment for hints: the closest choices, or the full list when none is close."""
    options = sorted(set(choices))
    close = difflib.get_close_matches(word, options, n=3, cutoff=0.5)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "valid: " + ", ".join(options) if options else "nothing is available"


def require_counts(values: Sequence[Any], key: str, noun: str, example: str, each: str | None = None) -> None:
    """Each of ``values`` a whole number >= 1 (a bool is not one), else a ConfigError on ``key[i]`` naming ``noun``
    ("a packing factor") with ``example`` as the hint; with ``each`` ("N"), also none listed twice."""
    for i, n in enumerate(values):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{key}[{i}]", n, f"{noun} must be a whole number >= 1", f"e.g. {example}")
    if each is not None and len(set(values)) != len(values):
        raise ConfigError(key, list(values), f"{noun} is listed twice", f"list each {each} once")


def require_choice(value: object, choices: Sequence[str], key: str, what: str) -> str:
    """``value`` one of ``choices``, else a ConfigError on ``key`` ("unknown ``what``") with the nearest choices."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(key, value, f"unknown {what}", nearest(str(value), choices))
    return value


def require_positive(value: object, key: str, example: str, *, whole: bool = False, allow_none: bool = True) -> None:
    """``value`` a number > 0 (``whole``: a whole number; a bool is neither), or None where ``allow_none``; else a
    ConfigError on ``key`` with ``example`` (``key=VALUE``) as the hint."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and not isinstance(value, int)) \
            or not value > 0:
        what = f"must be a {'whole ' if whole else ''}number > 0{' or null' if allow_none else ''}"
        raise ConfigError(key, value, what, f"e.g. {example}")
