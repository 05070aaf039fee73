"""Modes, strategies, backends and workloads are found by module name, one module each in their package
(``gpupack/job/pack/<mode>.py`` exposing ``PACKER``, ...): the steps every package shares. Each package imports its
own modules itself, so tests/dynamic_imports.py can check those imports against the layers."""
from __future__ import annotations

import pkgutil
from types import ModuleType
from typing import Iterable, TypeVar

from gpupack.errors import ConfigError, nearest

T = TypeVar("T")


def module_names(path: Iterable[str]) -> list[str]:
    """The public modules of a package (its ``__path__``): what can be named."""
    return sorted(m.name for m in pkgutil.iter_modules(path) if not m.name.startswith("_"))


def require_known(name: str, names: list[str], key: str, noun: str) -> None:
    """``name`` one of ``names``, else a ConfigError on ``key`` ("no such ``noun``") with the nearest names."""
    if name not in names:
        raise ConfigError(key, name, f"no such {noun}", nearest(name, names))


def exported(module: ModuleType, attr: str, kind: type[T]) -> T:
    """``module.<attr>``, an instance of ``kind`` (a module of the registry that defines none is gpupack's bug)."""
    found = getattr(module, attr, None)
    if not isinstance(found, kind):
        raise TypeError(f"{module.__name__.replace('.', '/')}.py defines no {attr}, a {kind.__name__}")
    return found
