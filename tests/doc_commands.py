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
