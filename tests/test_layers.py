"""The layers of gpupack/ (pyproject.toml's [tool.importlinter], docs/ARCHITECTURE.md): imports only downward, no
cycle between the modules or folders of any package — module-level imports and those inside functions alike."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def lint_imports(cwd: Path, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env_path = [str(extra_path)] if extra_path else []
    code = ("import sys; sys.path[:0] = " + repr(env_path) + "; from importlinter.cli import lint_imports_command; "
            "lint_imports_command()")
    return subprocess.run([sys.executable, "-c", code, "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_gpupack_keeps_its_layers_and_has_no_cycle():
    proc = lint_imports(ROOT, ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "BROKEN" not in proc.stdout and proc.stdout.count("KEPT") == 3, proc.stdout[-4000:]


@pytest.mark.parametrize("importer, imported", [
    ("gpupack/core/plan.py", "gpupack.sweep"),                # an upward import at module level
    ("gpupack/runtime/sampler.py", "gpupack.pack.process"),   # ... and one inside a function
])
def test_an_upward_import_breaks_the_contract(tmp_path, importer, imported):
    """The contract bites: a copy of the package with one upward import added fails it, naming both modules."""
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "gpupack", copy / "gpupack", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    target = copy / importer
    inside = "sampler" in importer
    target.write_text(target.read_text() + textwrap.dedent(f"""

        def _upward() -> None:
            import {imported}  # noqa
        """ if inside else f"\nimport {imported}  # noqa\n"))
    proc = lint_imports(tmp_path, copy)
    assert proc.returncode != 0
    module = importer.replace("/", ".").removesuffix(".py")
    assert "BROKEN" in proc.stdout and module in proc.stdout, proc.stdout[-3000:]


# ---------------- imports by name (importlib), which the contract above cannot see ----------------

def test_imports_by_name_keep_the_layers():
    from tests.dynamic_imports import by_name, violations

    found = by_name(ROOT / "gpupack")
    assert len(found) >= 7, found  # the backends, modes, strategies' two sides, workloads, user modules
    assert violations(ROOT / "gpupack", ROOT / "pyproject.toml") == []


@pytest.mark.parametrize("importer, call, says", [
    # what runtime/worker.py did before a strategy's training side moved below it (issue 29)
    ("gpupack/runtime/worker.py", 'importlib.import_module(f"gpupack.spread.{name}")', "upward"),
    ("gpupack/workload.py", 'importlib.import_module(f"gpupack.workloads.{name}")', "upward"),
    ("gpupack/core/plan.py", "importlib.import_module(name)", "named by data"),
    ("gpupack/workload.py", 'importlib.import_module("gpupack.result")', "a sibling"),
])
def test_an_upward_import_by_name_breaks_it(tmp_path, importer, call, says):
    from tests.dynamic_imports import violations

    copy = tmp_path / "gpupack"
    shutil.copytree(ROOT / "gpupack", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy.parent / importer
    target.write_text(target.read_text() + f"\n\ndef _by_name(name: str) -> object:\n    import importlib\n\n"
                      f"    return {call}\n")
    found = violations(copy, ROOT / "pyproject.toml")
    module = importer.replace("/", ".").removesuffix(".py")
    assert len(found) == 1 and found[0].startswith(module) and says in found[0], found
