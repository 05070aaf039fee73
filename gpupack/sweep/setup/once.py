"""A check of one training's hyperparameters, run over the product of the grid's axes it reads, each point once.

Each call records which hyperparameters it read, and the grid is walked over the axes read alone, the others held at
their first value, until the calls read no new axis. For a check that depends only on what it reads, a point off that
walk ends as its projection on it: every training is checked, each distinct reading once. A check the recording cannot
follow (it fails on the recording object only) is walked over the whole product.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from gpupack.core.plan import expand_grid
from gpupack.errors import ConfigError

R = TypeVar("R")

__all__ = ["each_reading"]


class _Recording(Mapping[str, object]):
    """A training's values as a read-only Mapping noting each key read (a ``{**values}`` copy reads them all)."""

    def __init__(self, values: Mapping[str, object], seen: set[str]) -> None:
        self._values, self._seen = dict(values), seen

    def __getitem__(self, key: str) -> object:
        self._seen.add(key)
        return self._values[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self._seen.add(key)
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        self._seen.update(self._values)
        return iter(self._values)

    def __len__(self) -> int:
        self._seen.update(self._values)
        return len(self._values)


def _recorded(arg: object, seen: set[str]) -> object:
    """``arg`` (a dataclass of hyperparameters, or a Mapping of them) as an object that notes which fields are read;
    anything else as it is (then every axis counts as read)."""
    if isinstance(arg, Mapping):
        return _Recording(arg, seen)
    if dataclasses.is_dataclass(arg) and not isinstance(arg, type):
        names = {f.name for f in dataclasses.fields(arg)}
        base = type(arg)

        def noted(self: object, name: str) -> Any:
            if name in names:
                seen.add(name)
            return object.__getattribute__(self, name)

        # a subclass of the Params class (isinstance holds), its instance a field-for-field copy of ``arg``
        cls = type(f"Recording{base.__name__}", (base,), {"__getattribute__": noted})
        copy: object = object.__new__(cls)
        for name, value in [*((n, object.__getattribute__(arg, n)) for n in names),
                            *getattr(arg, "__dict__", {}).items()]:
            object.__setattr__(copy, name, value)
        return copy
    seen.add("*")
    return arg


def _walk(grid: Mapping[str, Sequence[object]], axes: set[str], first: Mapping[str, object]) -> list[dict[str, object]]:
    """Every point of ``grid`` over ``axes`` (in the grid's order), the other axes at ``first``. Pure."""
    return [{**first, **point} for point in expand_grid({k: v for k, v in grid.items() if k in axes})]


def each_reading(fn: Callable[[Any], R], grid: Mapping[str, Sequence[object]], fixed: Mapping[str, object],
                 build: Callable[[dict[str, object]], object] = dict) -> list[tuple[dict[str, object], R]]:
    """``fn`` of each distinct reading of the grid's trainings (``build`` makes its argument from a training's values:
    ``{**fixed, **point}``), as (point, result): every training's result is that of a point listed. A ConfigError
    from ``fn`` is raised at once, for a point of the grid."""
    if not grid or any(not values for values in grid.values()):
        return []
    first = {k: values[0] for k, values in grid.items()}
    read: set[str] = set()
    results: dict[tuple[str, ...], tuple[dict[str, object], R]] = {}
    while True:
        grew = False
        for point in _walk(grid, read, first):
            key = tuple(repr(point[k]) for k in grid)
            if key in results:
                continue
            seen: set[str] = set()
            values = {**fixed, **point}
            try:
                result = fn(_recorded(build(values), seen))
            except ConfigError:
                raise
            except Exception:
                fn(build(values))  # raises as the plain call does; if not, the recording is what it cannot take
                return [(p, fn(build({**fixed, **p}))) for p in expand_grid(grid)]
            results[key] = (point, result)
            if "*" in seen:
                seen = set(grid)
            if (seen & set(grid)) - read:
                read |= seen & set(grid)
                grew = True
        if not grew:
            return list(results.values())
