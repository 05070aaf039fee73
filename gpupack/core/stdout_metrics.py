"""Metrics read from a program's kept stdout by regular expressions: at the end of each training (the `command`
workload's ``sweep.fixed.metrics``) or after the run (``collect --metric NAME --pattern REGEX``), one way."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from gpupack.errors import ConfigError


def stdout_patterns(value: Any, key: str) -> dict[str, str]:
    """sweep.fixed.metrics: metric name → a regular expression whose one group (or ``value``) holds the number."""
    if not isinstance(value, dict):
        raise ConfigError(key, value, "must map metric names to regular expressions",
                          f"e.g. '+{key}.loss=Average loss: ([0-9.]+)'")
    for name, pattern in value.items():
        try:
            compiled = re.compile(str(pattern))
        except re.error as err:
            raise ConfigError(f"{key}.{name}", pattern, f"is not a regular expression ({err})",
                              "escape ( ) [ ] . with a backslash where you mean the character") from None
        if compiled.groups != 1 and "value" not in compiled.groupindex:
            raise ConfigError(f"{key}.{name}", pattern, f"has {compiled.groups} groups: gpupack cannot tell which "
                              "holds the number", "give exactly one group, e.g. 'loss: ([0-9.]+)', or name it "
                              "(?P<value>...)")
    return {str(k): str(v) for k, v in value.items()}


def metrics_from_output(path: Path, patterns: Mapping[str, str]) -> dict[str, float]:
    """Each metric's number from the program's stdout file: the last match wins (the final epoch's, the test set's)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    return metrics_from_text(text, patterns)


def metrics_from_text(text: str, patterns: Mapping[str, str]) -> dict[str, float]:
    """Each metric's number from the program's stdout as text: the last match wins."""
    out: dict[str, float] = {}
    for name, pattern in patterns.items():
        compiled = re.compile(pattern)
        for match in compiled.finditer(text):
            raw = match.group("value") if "value" in compiled.groupindex else match.group(1)
            try:
                out[name] = float(raw)
            except (TypeError, ValueError):  # a match that holds no number: the earlier one stands
                continue
    return out
