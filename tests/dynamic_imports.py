"""Imports by name (``importlib.import_module``) checked against the layers of pyproject.toml's import contract,
which sees only ``import`` statements. A name built as ``f"{__name__}.{x}"`` or ``f"gpupack.pkg.{x}"`` is checked by
its literal prefix; a name that is wholly data (a user's module) must be one of ``USER_MODULES``, each saying why."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

# Imports whose target is a user's module, never one of gpupack's: where, and what names it.
USER_MODULES = {
    "gpupack.job.workloads": "a workload in the user's own package: sweep.workload=mypkg.mymodule",
    "gpupack.job.workloads.command": "sweep.fixed.preload: what a forked script's server imports first",
    "gpupack.job.runtime.hydra_job": "hydra.launcher.preload: what a Hydra app's job server imports first",
    "gpupack.core.preload": "a learned preload: the libraries a program imports, for its forked trainings",
}


@dataclass(frozen=True)
class ByName:
    importer: str  # the module that calls import_module
    target: str | None  # the gpupack module or package it names (a literal prefix), None: a name that is data
    line: int


def contracts(pyproject: Path) -> list[dict[str, Any]]:
    """pyproject.toml's import-linter contracts, in its order."""
    found: list[dict[str, Any]] = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    return found


def layers(pyproject: Path) -> list[list[list[str]]]:
    """Each layers contract's layers, top first, each a list of its containers (full names), the house's first. A
    layer of siblings that may import each other ("a : b") is one container per sibling, marked by a trailing ":"."""
    out = []
    for contract in (c for c in contracts(pyproject) if c["type"] == "layers"):
        for container in contract.get("containers", [""]):
            prefix = container + "." if container else ""
            out.append([[prefix + part.strip() + (":" if ":" in layer else "") for part in layer.replace(":", "|")
                         .split("|")] for layer in contract["layers"]])
    return out


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _target(arg: ast.expr, module: str) -> str | None:
    """The gpupack name an import_module argument starts with, or None when it is data."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        prefix = ""
        for part in arg.values:
            if isinstance(part, ast.Constant):
                prefix += str(part.value)
            elif isinstance(part.value, ast.Name) and part.value.id == "__name__":
                prefix += module  # the package's name in its __init__, the module's own elsewhere
            else:
                break
        return prefix.rstrip(".") or None
    return None


def by_name(package: Path) -> list[ByName]:
    """Every ``import_module(...)`` call in the package's modules."""
    root = package.parent
    found = []
    for path in sorted(package.rglob("*.py")):
        module = _module_name(path, root)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == "import_module":
                found.append(ByName(module, _target(node.args[0], module), node.lineno))
    return found


def container_of(module: str, all_layers: list[list[str]]) -> tuple[int, str, bool] | None:
    """The layer (index, top first) and container a module belongs to: the longest container that prefixes it, and
    whether its layer's siblings may import each other."""
    best: tuple[int, str, bool] | None = None
    for i, layer in enumerate(all_layers):
        for marked in layer:
            container = marked.rstrip(":")
            if (module == container or module.startswith(container + ".")) and (
                    best is None or len(container) > len(best[1])):
                best = (i, container, marked.endswith(":"))
    return best


def violations(package: Path, pyproject: Path) -> list[str]:
    """What breaks a layers contract among the imports by name: an upward one, a sibling's, or data outside
    USER_MODULES."""
    contracts = layers(pyproject)
    out = []
    for found in by_name(package):
        where = f"{found.importer}:{found.line}"
        if found.target is None:
            if found.importer not in USER_MODULES:
                out.append(f"{where} imports a module named by data: list it in USER_MODULES with why, or name it")
            continue
        if not found.target.startswith("gpupack"):
            continue
        for n, all_layers in enumerate(contracts):
            mine, theirs = container_of(found.importer, all_layers), container_of(found.target, all_layers)
            if mine is None or theirs is None:
                if n == 0:  # the house holds every module of gpupack
                    out.append(f"{where} -> {found.target}: outside the layers")
            elif theirs[1] != mine[1] and (theirs[0] < mine[0] or theirs[0] == mine[0] and not mine[2]):
                out.append(f"{where} -> {found.target}: {'upward' if theirs[0] < mine[0] else 'a sibling'} "
                           f"({mine[1]} is layer {mine[0]}, {theirs[1]} layer {theirs[0]})")
    return out
