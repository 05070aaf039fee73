"""The gpupack commands a user pastes from README.md, examples/README.md and ``python -m gpupack --help``.

Read from the files as they are: fenced ``bash`` blocks (a trailing backslash continues a line, ``#`` starts a
comment as in bash) and inline code spans that start a command (``python -m gpupack ...``,
``python examples/...``). Install lines, ``eval`` and ``scripts/`` lines are left to the tests that own them.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")), "examples/README.md")

_FENCE = re.compile(r"^( *)```(\w*)\s*$")
_INLINE = re.compile(r"`((?:PYTHONPATH=\S+ )?python (?:-m gpupack|examples/)[^`]*)`")
# What starts a gpupack command: the CLI, or an example app/script (the Hydra launchers).
_STARTS = ("python -m gpupack", "python examples/")


@dataclass(frozen=True)
class DocCommand:
    """One command as the documentation shows it, with where it was read."""

    text: str  # the shell text, continuation lines joined, a trailing comment dropped
    where: str  # file:line

    @property
    def words(self) -> list[str]:
        """The command's words as bash reads them (quotes removed)."""
        return shlex.split(self.text, comments=True)


def _strip_comment(line: str) -> str:
    """The line without a trailing ``# comment``: a ``#`` that starts a word outside quotes, as bash reads it."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _fenced(path: Path) -> list[DocCommand]:
    commands: list[DocCommand] = []
    lang: str | None = None
    pending, start = "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = _FENCE.match(line)
        if fence:
            lang = None if lang is not None else fence.group(2)
            continue
        if lang != "bash":
            continue
        text = _strip_comment(line.strip())
        if not pending:
            start = number
        if text.endswith("\\"):
            pending += text[:-1].rstrip() + " "
            continue
        full = (pending + text).strip()
        pending = ""
        if full.startswith(_STARTS) or full.startswith("PYTHONPATH="):
            commands.append(DocCommand(full, f"{path.relative_to(REPO)}:{start}"))
    return commands


def _inline(path: Path) -> list[DocCommand]:
    commands = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if _FENCE.match(line):
            continue
        for match in _INLINE.finditer(line):
            commands.append(DocCommand(match.group(1).strip(), f"{path.relative_to(REPO)}:{number}"))
    return commands


def from_docs() -> list[DocCommand]:
    """Every gpupack command of the documentation files, fenced and inline, in file order."""
    found: list[DocCommand] = []
    for name in DOCS:
        path = REPO / name
        found += _fenced(path) + _inline(path)
    return found


def from_help(text: str) -> list[DocCommand]:
    """The commands of ``--help``'s examples: each line there that starts with ``python -m gpupack``."""
    commands = []
    in_examples = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().lower().startswith("examples"):
            in_examples = True
            continue
        if in_examples and not line.strip():
            in_examples = False
        stripped = _strip_comment(line.strip())
        if in_examples and stripped.startswith(_STARTS):
            commands.append(DocCommand(stripped, f"--help:{number}"))
    return commands


# The docs commands a dedicated test runs for real, as pasted, with its own small sizes and closer checks: the docs
# test runs each of these dry (composed, validated, planned), so no command runs for real twice in a suite. The test
# named takes the command's words from `pasted`, which fails once no docs page shows that text.
RUN_BY: dict[str, str] = {
    "python -m gpupack +sweep=mnist_spread": "tests/test_spread.py",
    "python -m gpupack +sweep=mnist_tf_spread": "tests/test_spread.py",
    "python -m gpupack +sweep=mnist_tf_pack": "tests/test_tensorflow.py",
    "python -m gpupack +sweep=cifar10_pack sweep.fixed.data_dir=/project/def-me/cifar-10-batches-py":
        "tests/test_tensorflow.py",
    "python -m gpupack +sweep=cifar10_pack sweep.workload=cifar10_torch packing.modes=[process] "
    "sweep.fixed.data_dir=/project/def-me/cifar-10-batches-py": "tests/test_tensorflow.py",
    "python -m gpupack +sweep=mnist_pack packing.modes=[process,fused]": "tests/test_fused.py",
    "PYTHONPATH=examples python -m gpupack 'hydra.searchpath=[file://examples/own_workload/conf]' "
    "+sweep=quadratic_pack": "tests/test_end_to_end.py",
}


def pasted(text: str, paths: dict[str, str] | None = None) -> list[str]:
    """The words after ``python -m gpupack`` of the docs command ``text`` (one of RUN_BY's), each placeholder path of
    ``paths`` (the docs' path: the test's) replaced. Fails where no docs page shows ``text``: the test follows the
    docs. Its leading ``NAME=value`` words, if any: :func:`pasted_env`."""
    words = _words(text)
    words = words[len(_leading_env(words)):]
    for placeholder, path in (paths or {}).items():
        words = [word.replace(placeholder, path) for word in words]
    if words[:3] != ["python", "-m", "gpupack"]:
        raise LookupError(f"{text!r} is no `python -m gpupack` command")
    return words[3:]


def pasted_env(text: str) -> dict[str, str]:
    """The variables the docs command ``text`` sets before ``python`` (``PYTHONPATH=examples python -m ...``)."""
    return _leading_env(_words(text))


def _leading_env(words: list[str]) -> dict[str, str]:
    env = {}
    for word in words:
        name, eq, value = word.partition("=")
        if not eq or not name.isidentifier() or not name.isupper():
            break
        env[name] = value
    return env


def _words(text: str) -> list[str]:
    if text not in RUN_BY or not any(c.text == text for c in from_docs()):
        raise LookupError(f"no docs page shows {text!r} as RUN_BY names it: the docs changed, change the test too")
    return shlex.split(text)
