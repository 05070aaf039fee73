"""gpupack's errors: a short hierarchy whose messages quote the bad value and give a HINT.

Everything a user can get wrong raises a :class:`GpupackError` subclass before anything is submitted;
the CLI prints ``str(err)`` as one line and exits non-zero.
"""
from __future__ import annotations

import difflib
import json
from typing import Iterable, Sequence


class GpupackError(Exception):
    """Base of every error gpupack raises on purpose."""

    exit_code = 2


class ConfigError(GpupackError):
    """A config key holds a value gpupack cannot use: ``<key>=<value!r>: <why>. HINT: <hint>``."""

    def __init__(self, key: str, value: object, why: str, hint: str) -> None:
        self.key, self.value, self.why, self.hint = key, value, why, hint
        super().__init__(f"{key}={value!r}: {why}. HINT: {hint}")


class DataError(ConfigError):
    """A data path is missing, unreadable, or not in the expected format."""


class RunDirError(GpupackError):
    """The run directory cannot be used (not writable, or holds a different sweep)."""


class StorageError(RunDirError):
    """A write into a run directory (or collect's output) failed for space, quota or permission: the path, what failed,
    the free space and the fix (:meth:`again`: with the command that resumes; records are written whole)."""

    def __init__(self, path: str, why: str, free_bytes: int | None, command: str | None = None) -> None:
        self.path, self.why, self.free_bytes, self.command = path, why, free_bytes, command
        free = f" ({human_bytes(free_bytes)} free there)" if free_bytes is not None else ""
        again = f": {command}" if command else ""
        super().__init__(f"{path}: {why}{free}. HINT: {STORAGE_FIXES.get(why, 'fix the fault')}, then run the same "
                         f"command again; it resumes where it stopped, keeping every record already written{again}")

    def again(self, command: str) -> StorageError:
        """The same fault, its HINT ending with the command that resumes the run."""
        return StorageError(self.path, self.why, self.free_bytes, command)


NO_SPACE, OUT_OF_QUOTA, READ_ONLY, NO_PERMISSION = ("no space left on device", "out of quota",
                                                    "read-only file system", "permission denied")
# Each fault's fix, said first in the HINT.
STORAGE_FIXES = {
    NO_SPACE: "free space on its file system (df -h, du -sh)",
    OUT_OF_QUOTA: "free space within your quota there, or have it raised (quota -s; diskusage_report on the Alliance)",
    READ_ONLY: "remount its file system read-write",
    NO_PERMISSION: "give yourself write permission there (ls -ld; chmod u+w)",
}


def human_bytes(n: int) -> str:
    """``n`` bytes as a person reads them: 0 B, 512 B, 12.0 KiB, 3.4 GiB."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


class SubmissionError(GpupackError):
    """The cluster refused or lost a job."""

    exit_code = 3


class UnreachableError(GpupackError):
    """The cluster's scheduler does not answer here: the client's own words, where its config was looked for, and
    the fix, ending with how to run here instead (``instead``: the front-end's own words for it)."""

    def __init__(self, words: str, where: str, fix: str, instead: str = "cluster=local to run here") -> None:
        self.words, self.where, self.fix, self.instead = words, where, fix, instead
        super().__init__(f"{words} ({where}). HINT: {fix}; or {instead}")

    def run_here(self, instead: str) -> UnreachableError:
        """The same error, its HINT ending with ``instead`` (a Hydra launcher's hydra/launcher=gpupack_local)."""
        return UnreachableError(self.words, self.where, self.fix, instead)


def nearest(word: str, choices: Iterable[str]) -> str:
    """A 'did you mean' fragment for hints: the closest choices, or the full list when none is close."""
    options = sorted(set(choices))
    close = difflib.get_close_matches(word, options, n=3, cutoff=0.5)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "valid: " + ", ".join(options) if options else "nothing is available"


def require_counts(values: Sequence[object], key: str, noun: str, example: str, each: str | None = None) -> None:
    """Each of ``values`` a whole number >= 1 (a bool is not one), else a ConfigError on ``key[i]`` naming ``noun``
    ("a packing factor") with ``example`` as the hint; with ``each`` ("N"), also none listed twice."""
    for i, n in enumerate(values):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{key}[{i}]", n, f"{noun} must be a whole number >= 1", f"e.g. {example}")
    if each is not None:
        require_unique(values, key, noun, each)


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


def require_unique(values: Sequence[object], key: str, noun: str, each: str) -> None:
    """None of ``values`` listed twice, else a ConfigError on ``key`` with the list deduplicated as the hint."""
    seen: list[object] = []
    known: set[object] = set()  # linear in the values (an axis of 100,000), an unhashable one by its JSON
    twice: list[object] = []
    for value in values:
        told = _unique_key(value)
        (twice if told in known else seen).append(value)
        known.add(told)
    if twice:  # the hint's list as an override writes it: null, true, false, numbers and words as they are
        shown = ",".join("null" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for v in seen)
        raise ConfigError(key, list(values), f"{noun} is listed twice ({twice[0]!r})",
                          f"list each {each} once: {key}=[{shown}]")


def _unique_key(value: object) -> object:
    """What tells ``value`` apart in a set: itself, or, unhashable (a command's argv), its JSON."""
    try:
        hash(value)
    except TypeError:
        return ("\0unhashable", json.dumps(value, sort_keys=True, default=repr))
    return value


# The most memory one figure may plausibly name (MB): 10 TB. A larger one is in a smaller unit than its key says.
MOST_MEMORY_MB = 10.0 ** 7
MEMORY_UNITS = {"MB": 1.0, "GB": 1024.0}


def require_memory(value: object, key: str, unit: str, example: str, *, allow_none: bool = True,
                   allow_zero: bool = False) -> None:
    """``value`` a memory figure in ``unit`` (MB or GB) > 0 (>= 0 with ``allow_zero``), or None where ``allow_none``,
    at most :data:`MOST_MEMORY_MB` (a larger one is refused as given in a smaller unit), else a ConfigError."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
            or not (value >= 0 if allow_zero else value > 0):
        what = f"must be a number of {unit} {'>= 0' if allow_zero else '> 0'}{' or null' if allow_none else ''}"
        raise ConfigError(key, value, what, f"e.g. {example}")
    most = MOST_MEMORY_MB / MEMORY_UNITS[unit]
    if value > most:
        if unit == "GB" and value / 1024 <= most:
            given, converted = "MB", value / 1024
        else:
            given, converted = "bytes", value / 2 ** 20 / MEMORY_UNITS[unit]
        raise ConfigError(key, value, f"is in {unit}, and {value:g} {unit} is more than any machine holds "
                          f"(10 TB): it looks like {given}",
                          f"{key}={max(1, round(converted)):g} ({value:g} {given} in {unit})")
