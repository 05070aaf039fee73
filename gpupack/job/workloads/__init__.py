"""Training workloads that gpupack packs: one module per workload, each exposing ``WORKLOAD``, found by name (or a
user's module by its dotted name) by :func:`load_workload`."""
from __future__ import annotations

import functools
import importlib

from gpupack.core.moves import moved
from gpupack.core.registry import module_names, require_known
from gpupack.core.workload import Workload
from gpupack.errors import ConfigError


def available_workloads() -> list[str]:
    return module_names(__path__)


def load_workload(name: str, key: str = "sweep.workload") -> Workload:
    """``gpupack.job.workloads.<name>``'s ``WORKLOAD``; a dotted name (``mypkg.mymodule``) imports that module instead,
    so users can keep workloads in their own packages. An unknown name is a ConfigError."""
    if "." in name:
        try:
            module = importlib.import_module(moved(name))  # a plan an earlier gpupack wrote may name an old path
        except ImportError as err:
            raise ConfigError(key, name, f"cannot import it ({err})", "make the module importable (PYTHONPATH) or "
                              "use a built-in workload (python -m gpupack --info lists them)") from None
    else:
        require_known(name, available_workloads(), key, "built-in workload")
        module = importlib.import_module(f"{__name__}.{name}")
    workload = getattr(module, "WORKLOAD", None)
    if not isinstance(workload, Workload):
        raise ConfigError(key, name, f"module {module.__name__} defines no WORKLOAD",
                          "define WORKLOAD = YourWorkload() in it")
    return workload


@functools.cache
def seed_key(name: str) -> str:
    """Workload ``name``'s seed key, loaded once a process (lanes and peak books ask it of every training)."""
    return load_workload(name).seed_key
