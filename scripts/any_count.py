"""Count ``Any`` in gpupack's type hints: all of them, and those outside ``dict[str, Any]`` / ``Mapping[str, Any]``
(JSON and user hyperparameters, the true dynamic edges). Usage: python scripts/any_count.py [ROOT ...]"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

JSON_LIKE = {"dict", "Dict", "Mapping", "MutableMapping"}


def _is_any(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any")


def count(path: Path) -> tuple[int, int]:
    tree = ast.parse(path.read_text())
    total = json_like = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            continue
        if _is_any(node):
            total += 1
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in JSON_LIKE
                and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) == 2 and _is_any(node.slice.elts[1])):
            json_like += 1
    return total, json_like


def main(roots: list[str]) -> None:
    total = json_like = 0
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            t, j = count(path)
            total, json_like = total + t, json_like + j
    print(f"Any: {total} in hints, {total - json_like} outside dict[str, Any] / Mapping[str, Any]")


if __name__ == "__main__":
    main(sys.argv[1:] or ["gpupack", "hydra_plugins"])
