"""Learned preload: which libraries a fork server imports for its trainings beyond what their workload preloads.

A program that imports its framework inside its task function (most Hydra apps) would pay those imports in each
training. They are known before the first fork from the program's source (:func:`static_imports`) and after a child
ended from what it imported (:func:`learnable`). Only libraries are ever imported by the server, never the program's
own modules (they may do anything at import) nor a framework that is not fork-safe (:data:`NEVER_LEARNED`).
"""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpupack.errors import ConfigError

# Frameworks that start threads or a device runtime at import (fork_unsafe's): never learned, whoever imported them.
NEVER_LEARNED = ("tensorflow", "tf_keras", "keras", "jax", "jaxlib", "pycuda")
SCAN_FILES = 50  # the program's own files read at most (a large package is not walked whole)


@functools.cache  # the same for the process's life: asked per ended child and per name read from source
def library_roots() -> tuple[str, ...]:
    """Where libraries live: the standard library and the installed packages (and gpupack itself)."""
    paths = sysconfig.get_paths()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return tuple({os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")}
                 | {os.path.realpath(here) + os.sep})


def learnable(new: Sequence[str], modules: Mapping[str, Any], roots: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Of the modules a child imported (``new``), the roots the server may import next: libraries (built in, or under
    ``roots``) and no fork-unsafe framework; and why each other root is not. Pure."""
    fresh = set(new)
    learned: list[str] = []
    refused: dict[str, str] = {}
    for name in sorted(fresh):
        parts = name.split(".")
        if any(".".join(parts[:k]) in fresh for k in range(1, len(parts))) or name in ("__main__", "__mp_main__"):
            continue
        if getattr(modules.get(name), "__spec__", None) is None:  # a failed import's placeholder, or a module made
            continue  # at run time (no spec: nothing to import it by)
        file = getattr(modules[name], "__file__", None)
        if parts[0] in NEVER_LEARNED:
            refused[name] = "a framework that is not fork-safe"
        elif file and not os.path.realpath(file).startswith(tuple(roots)):
            refused[name] = "the program's own module (not a library): it may do anything at import"
        else:
            learned.append(name)
    return learned, refused


def static_imports(files: Sequence[Path], loaded: Mapping[str, Any]) -> list[str]:
    """The top-level names of the libraries ``files`` (the program's own) and the modules beside them import
    anywhere, not yet in ``loaded`` and fit for the server, sorted. Reads source; imports nothing."""
    names: set[str] = set()
    seen: set[Path] = set()
    todo = [Path(f).resolve() for f in files]
    while todo and len(seen) < SCAN_FILES:
        path = todo.pop(0)
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for name in _imported_names(path):
            beside = _beside(path.parent, name)
            if beside is not None:
                todo.append(beside)
            else:
                names.add(name.split(".")[0])
    return sorted(n for n in names if n not in loaded and _library(n))


def _imported_names(path: Path) -> list[str]:
    """Absolute module names a Python file imports (``import a.b``, ``from a.b import c``), anywhere in it."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):
        return []
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
    return out


def _beside(folder: Path, name: str) -> Path | None:
    """The program's own module ``name`` in ``folder`` (where a script's imports look first), else None."""
    top = folder / name.split(".")[0]
    return next((c.resolve() for c in (top.with_suffix(".py"), top / "__init__.py") if c.is_file()), None)


def _library(name: str) -> bool:
    """A top-level module this interpreter finds among the libraries, and may preload."""
    if name in NEVER_LEARNED or name == "__main__":
        return False
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    origin = spec.origin if spec.has_location else None
    return origin is None or os.path.realpath(origin).startswith(library_roots())


def import_libraries(names: Sequence[str], why: str) -> tuple[list[str], dict[str, str]]:
    """Import ``names`` here (the fork server), each alone: those imported, and why the others were not (the
    children import those themselves). Said on stderr with ``why`` (where the names came from)."""
    imported: list[str] = []
    refused: dict[str, str] = {}
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            imported.append(name)
        except BaseException as err:  # noqa: BLE001 - any failure of someone else's import: not ours to stop on
            refused[name] = f"{err.__class__.__name__}: {err}"
    if imported or refused:
        print(f"gpupack fork server: preloaded {', '.join(imported) or '-'} ({why})"
              + (f"; could not import {refused}" if refused else ""), file=sys.stderr, flush=True)
    return imported, refused


def check_importable(module: object, key: str, listed_in: str = "sweep.fixed.preload") -> None:
    """``module`` one this interpreter can import (found, not imported), else a ConfigError naming ``listed_in``."""
    try:
        found = isinstance(module, str) and importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or an empty name
        found = False
    if not found:
        raise ConfigError(key, module, "is no module this Python can import",
                          f"install it in {sys.executable}'s environment, or drop it from {listed_in}")
