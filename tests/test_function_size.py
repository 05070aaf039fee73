"""No function of gpupack/ is over :data:`MAX_LINES` lines: each is one step that reads at a glance (issue 45 held
the job body to it, issue 54 all of gpupack/). A function's length is ``end_lineno - lineno + 1``: from its ``def``
line to its last line, its docstring and comments included, its decorators not; methods and nested functions count
alone. At most :data:`MAX_LONG` are over :data:`LONG_LINES`."""
from __future__ import annotations

import ast
from pathlib import Path

GPUPACK = Path(__file__).resolve().parent.parent / "gpupack"
MAX_LINES = 60


def functions_over(root: Path, limit: int) -> list[str]:
    """``path:line name (n lines)`` of every function under ``root`` longer than ``limit`` lines."""
    over = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    over.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return over


def test_the_rule_counts_from_def_to_last_line_docstring_included(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(57))
    (tmp_path / "short.py").write_text(f'def ok():\n    """Doc."""\n{body}\n    return 0\n')  # 60 lines
    (tmp_path / "long.py").write_text(f'def too_long():\n    """Doc\n    on two lines."""\n{body}\n    return 0\n')
    assert functions_over(tmp_path, MAX_LINES) == [f"{tmp_path.name}/long.py:1 too_long (61 lines)"]


def test_no_function_of_gpupack_is_over_60_lines():
    assert (GPUPACK / "job").is_dir()  # the package itself, not a folder that happens to be empty
    over = functions_over(GPUPACK, MAX_LINES)
    assert not over, f"functions over {MAX_LINES} lines in gpupack/ (split them): " + "; ".join(over)


LONG_LINES = 40
MAX_LONG = 15  # issue 54: at most 15 functions over 40 lines (27 before its splits)


def test_at_most_15_functions_of_gpupack_are_over_40_lines():
    long = functions_over(GPUPACK, LONG_LINES)
    assert len(long) <= MAX_LONG, (f"{len(long)} functions over {LONG_LINES} lines in gpupack/, at most {MAX_LONG} "
                                   "(split one before adding one): " + "; ".join(long))
