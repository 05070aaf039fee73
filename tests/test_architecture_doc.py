"""docs/ARCHITECTURE.md is a map: every name it cites in `backticks` exists, its glossary gives each word once, and it
stays short (issue 45). A name is checked by its kind:

- a path (``core/plan.py``, ``tests/fakes.py``, ``lanes/<lane>.jsonl``): a file or folder of the repository or of
  ``gpupack/``, else a run directory's (its fixed parts written in :mod:`gpupack.core.store.rundir`'s layout);
- a file name (``plan.json``, ``pyproject.toml``): likewise;
- a dotted name (``gpupack.core.plan.in_rounds``, ``Pack.stream``, ``importlib.import_module``): imported, then each
  part by getattr (a dataclass's field counts); a bare class's module is found by its definition;
- a config key (``packing.admission``): in the composed config, with the local or the SLURM backend;
- a bare name (``RunLock``, ``WAIT``, ``local``): a class, function or module-level name defined in ``gpupack/``,
  ``hydra_plugins/`` or ``tests/``, or a module of gpupack, or an installed module.

What holds a space or an operator (a command, an override, ``[tool.importlinter]``) is prose, not a name.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from tests.dynamic_imports import contracts

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "ARCHITECTURE.md"
MAX_LINES = 220

SPAN = re.compile(r"`([^`\n]+)`")
NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
FILE_EXTENSIONS = {"json", "jsonl", "yaml", "toml", "md", "html", "csv", "parquet", "arrows", "sh", "sbatch", "log",
                   "lock", "pkl", "pkls", "claim", "py", "cfg", "txt"}
CONFIG_ROOTS = {"packing", "sweep", "cluster", "collect", "spread", "hydra"}
GLOSSARY_ENTRY = re.compile(r"^- \*\*([^*]+)\*\*:")


def cited(text: str) -> list[str]:
    """The spans in backticks that name something (not a command, an override or a section)."""
    return [s for s in SPAN.findall(text) if not re.search(r"[\s=*$|\[\]()]", s)]


@cache
def definitions() -> dict[str, set[Path]]:
    """Every class, function and module-level name defined in the code the map cites, with where."""
    found: dict[str, set[Path]] = {}
    for root in ("gpupack", "hydra_plugins", "tests"):
        for path in (REPO / root).rglob("*.py"):
            tree = ast.parse(path.read_text(), filename=str(path))
            names = [n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef,
                                                                       ast.AsyncFunctionDef))]
            for node in tree.body:  # module-level constants: WAIT, PACKER, DETACHED
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, ast.AnnAssign) else []
                names += [t.id for t in targets if isinstance(t, ast.Name)]
            for name in names:
                found.setdefault(name, set()).add(path)
    return found


def gpupack_modules() -> set[str]:
    return {p.stem if p.suffix else p.name for p in (REPO / "gpupack").rglob("*")
            if (p.suffix == ".py" or p.is_dir()) and "__pycache__" not in p.parts}


def module_of(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def has_attr(obj: Any, attr: str) -> bool:
    if hasattr(obj, attr):
        return True
    if isinstance(obj, type):
        if dataclasses.is_dataclass(obj) and attr in {f.name for f in dataclasses.fields(obj)}:
            return True
        return any(attr in getattr(k, "__annotations__", {}) for k in obj.__mro__)
    return False


def resolves(obj: Any, parts: list[str]) -> bool:
    for i, part in enumerate(parts):
        if not has_attr(obj, part):
            return False
        if i < len(parts) - 1:
            obj = getattr(obj, part)
    return True


def dotted_exists(name: str) -> bool:
    """A module's attribute path: the longest importable prefix, then getattr."""
    parts = name.split(".")
    if parts[-1] == "__main__":  # importing it would run the program: its file is enough
        return (REPO / Path(*parts)).with_suffix(".py").is_file()
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return resolves(module, parts[cut:])
    return False


def class_attr_exists(name: str) -> bool:
    """``Class.attr``: the class found by its definition, imported from its module."""
    head, *rest = name.split(".")
    for path in definitions().get(head, ()):
        module = importlib.import_module(module_of(path))
        if hasattr(module, head) and resolves(getattr(module, head), rest):
            return True
    return False


@cache
def configs() -> tuple[Any, ...]:
    from gpupack.sweep.setup.compose import compose_config
    return tuple(compose_config(["+sweep=mnist_pack", *extra]) for extra in ([], ["cluster=slurm"]))


def config_key_exists(key: str) -> bool:
    missing = object()
    return any(OmegaConf.select(cfg, key, default=missing) is not missing for cfg in configs())


def in_rundir_layout(path: str) -> bool:
    """A run directory's path: each fixed part of it (between ``<...>`` placeholders) is in
    gpupack.core.store.rundir."""
    layout = (REPO / "gpupack" / "core" / "store" / "rundir.py").read_text()
    return all(piece in layout for piece in re.split(r"<[^>]*>", path) if piece)


def path_exists(path: str) -> bool:
    plain = path.rstrip("/")
    if "<" not in plain and any((base / plain).exists() for base in (REPO, REPO / "gpupack")):
        return True
    return in_rundir_layout(path)


def exists(span: str) -> bool:
    """Whether the name the span cites exists, by its kind (the module's docstring)."""
    if "/" in span or span.rsplit(".", 1)[-1] in FILE_EXTENSIONS and "." in span:
        return path_exists(span)
    if not NAME.fullmatch(span):
        return False
    head = span.split(".")[0]
    if "." not in span:
        return (span in definitions() or span in gpupack_modules()
                or importlib.util.find_spec(span) is not None)
    if head == "gpupack":
        return dotted_exists(span)
    if head in gpupack_modules() and dotted_exists(f"gpupack.{span}"):  # core.plan.in_rounds
        return True
    if head in CONFIG_ROOTS:
        return config_key_exists(span)
    if head in definitions():
        return class_attr_exists(span)
    return importlib.util.find_spec(head) is not None and dotted_exists(span)  # importlib.import_module


def glossary(text: str) -> list[str]:
    """The words the glossary defines, in order: the entries after its heading, up to the next heading."""
    section = text.split("\n## Glossary\n", 1)[1].split("\n## ", 1)[0]
    return [m.group(1).strip().lower() for line in section.splitlines() if (m := GLOSSARY_ENTRY.match(line))]


TEXT = DOC.read_text()
NAMES = sorted(set(cited(TEXT)))


def test_the_map_cites_names_at_all():
    assert len(NAMES) > 100 and "RunLock" in NAMES and "gpupack.core.plan.in_rounds" in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_every_name_the_map_cites_exists(name):
    assert exists(name), f"docs/ARCHITECTURE.md cites `{name}`, which the code does not define"


@pytest.mark.parametrize("made_up", ["gpupack.core.plan.in_squares", "core/plans.py", "RunLocks", "Pack.strem",
                                     "packing.admision", "lanes/<lane>.jsonx", "gpupack.core.nowhere",
                                     "Claimant.lanes", "notamodule.thing", "gpupack.sweep.flow.__main__"])
def test_a_name_that_does_not_exist_is_told(made_up):
    assert not exists(made_up)


def test_the_glossary_defines_each_word_once_in_at_most_40_entries():
    words = glossary(TEXT)
    assert 30 <= len(words) <= 40, f"{len(words)} glossary entries: a newcomer learns at most 40 words (issue 54)"
    twice = sorted({w for w in words if words.count(w) > 1})
    assert not twice, f"defined more than once in the glossary: {twice}"


def test_the_map_is_short():
    lines = len(TEXT.splitlines())
    assert lines <= MAX_LINES, f"docs/ARCHITECTURE.md has {lines} lines; a map holds at most {MAX_LINES}"


NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}


def layer_rows(text: str) -> list[set[str]]:
    """The modules of each row of the map's table of the house, top to bottom (``errors.py`` → errors, ``job/`` →
    job)."""
    table = text.split("\n## The house: wings over a ground\n", 1)[1].split("\n\n| floor |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split(" | ", 1)[0] for line in table.splitlines()[2:]]  # after the header and its rule
    return [{n.removesuffix(".py").rstrip("/") for n in SPAN.findall(row)} for row in rows]


def test_the_map_counts_the_contracts_pyproject_holds():
    said = re.search(r"holds (\w+) contracts", TEXT)
    assert said is not None, "the map no longer says how many import contracts there are"
    held = len(contracts(REPO / "pyproject.toml"))
    assert NUMBERS[said.group(1)] == held, f"the map says {said.group(1)} contracts; pyproject.toml holds {held}"


def test_the_layer_table_is_the_layers_contract_in_its_order():
    layers = next(c for c in contracts(REPO / "pyproject.toml") if c["name"].startswith("the house:"))["layers"]
    wanted = [{m.strip().removeprefix("gpupack.") for m in re.split(r"[|:]", row)} for row in layers]
    assert layer_rows(TEXT) == wanted
