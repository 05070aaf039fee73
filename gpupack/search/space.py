"""The search space in Hydra's override grammar (``interval``, ``int(interval)``, ``tag(log, interval)``, ``choice``,
``range``: its end left out), read by Hydra's parser into :class:`Dimension` s: a bad one is refused before a run."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from gpupack.errors import ConfigError

if TYPE_CHECKING:
    from hydra.core.override_parser.types import IntervalSweep
    from optuna.distributions import BaseDistribution

Choice = str | int | float | bool | None
EXAMPLE = "tag(log, interval(1e-4, 1e-1))"


@dataclass(frozen=True)
class Dimension:
    """One hyperparameter's range: ``kind`` float | int | categorical; ``step``: an integer range's step."""

    kind: str
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    step: int = 1
    choices: tuple[Choice, ...] = ()

    def distribution(self) -> BaseDistribution:
        """The Optuna distribution of this dimension (Optuna imported here)."""
        from optuna import distributions as d

        if self.kind == "categorical":
            return d.CategoricalDistribution(self.choices)
        if self.kind == "int":  # Optuna >= 3's distributions: the older ones are deprecated, removed in Optuna 6
            return d.IntDistribution(int(self.low), int(self.high), log=self.log, step=1 if self.log else self.step)
        return d.FloatDistribution(self.low, self.high, log=self.log)

    def midpoint(self) -> Choice:
        """The middle of the range on its scale (an integer's nearest step, a choice's middle one): a probe's point."""
        if self.kind == "categorical":
            return self.choices[len(self.choices) // 2]
        mid = math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2
        if self.kind == "int":
            return int(self.low + round((mid - self.low) / self.step) * self.step)
        return mid


def parse_space(space: Mapping[str, object], key: str = "search.space") -> dict[str, Dimension]:
    """Each hyperparameter's dimension, in the given order; ConfigError naming ``key.<name>`` otherwise. Pure."""
    if not space:
        raise ConfigError(key, dict(space), "the search space is empty", f"+{key}.lr='{EXAMPLE}'")
    return {str(name): parse_dimension(str(name), value, f"{key}.{name}") for name, value in space.items()}


def parse_dimension(name: str, text: object, key: str) -> Dimension:
    """One hyperparameter's dimension from its Hydra sweep text (ConfigError on ``key`` otherwise). Pure."""
    # Hydra's parser here, not at the top: a lane reads its study's space back as dimensions, and starts without it
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from hydra.errors import HydraException

    hint = f"{key}='{EXAMPLE}' (or 'int(interval(1, 8))', 'choice(a, b)')"
    try:
        override = OverridesParser.create().parse_override(f"{name}={text}")
    except HydraException as err:
        raise ConfigError(key, text, f"is not Hydra's sweep grammar ({str(err).splitlines()[0]})", hint) from None
    value = override.value()
    if isinstance(value, ChoiceSweep):
        choices = tuple(c for c in value.list if isinstance(c, (str, int, float, bool)) or c is None)
        if not choices or len(choices) != len(value.list):
            raise ConfigError(key, text, "a choice holds plain values (str, int, float, bool)", hint)
        return Dimension("categorical", choices=choices)
    if isinstance(value, IntervalSweep) and value.start is not None and value.end is not None:
        return _interval(value, text, key, hint)
    if isinstance(value, RangeSweep) and value.start is not None and value.stop is not None:
        step = value.step if value.step is not None else 1
        if not all(isinstance(v, int) for v in (value.start, value.stop, step)) or step <= 0:
            raise ConfigError(key, text, "a range here is of whole numbers, rising",
                              f"{key}='range(1, 9)', or 'interval(a, b)' for floats")
        last = value.start + ((value.stop - 1 - value.start) // step) * step
        if last < value.start:
            raise ConfigError(key, text, "the range is empty", f"{key}='range({value.start}, {value.start + 4})'")
        return Dimension("int", float(value.start), float(last), step=int(step))
    raise ConfigError(key, text, "is one value, not a range to search", hint)


def _interval(value: IntervalSweep, text: object, key: str, hint: str) -> Dimension:
    low, high, log = float(value.start or 0.0), float(value.end or 0.0), "log" in value.tags
    if not low < high:
        raise ConfigError(key, text, "an interval's low end must be below its high end", hint)
    if log and low <= 0:
        raise ConfigError(key, text, "a log interval is of positive numbers", f"{key}='{EXAMPLE}'")
    whole = isinstance(value.start, int) and isinstance(value.end, int)
    return Dimension("int" if whole else "float", low, high, log=log)


def probe_grid(space: Mapping[str, Dimension]) -> dict[str, list[Choice]]:
    """The one point of the space a probe for N trains, as a grid of one value per hyperparameter. Pure."""
    return {name: [dim.midpoint()] for name, dim in space.items()}
