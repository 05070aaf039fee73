"""Imports made meanwhile (gpupack.core.warm): a command imports collect's tables and plots while its first jobs
start, never while a pack runs beside it, and starts without them (gpupack.sweep's later attributes)."""
from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from gpupack.core.warm import warm


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Three importable modules of this test's own, forgotten again after it."""
    names = [f"warm_probe_{k}_{tmp_path.name}" for k in "abc"]
    for name in names:
        (tmp_path / f"{name}.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield names
    for name in names:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("began_after, imported", [
    (None, 3),  # no pack begins: all of them, in order
    (1, 1),  # a pack began after the first: none more (its CPU would be load beside the trainings measured)
    (0, 0),  # a pack had begun already (a resumed run): none at all
])
def test_warming_stops_once_a_pack_has_begun(modules: list[str], began_after: int | None, imported: int) -> None:
    asked: list[int] = []

    def began() -> bool:
        asked.append(1)
        return began_after is not None and sum(name in sys.modules for name in modules) >= began_after

    warm([partial(importlib.import_module, m) for m in modules], began).join(timeout=10)
    assert [name in sys.modules for name in modules] == [k < imported for k in range(3)]
    assert asked, "began() was never asked"


def test_a_module_that_fails_to_import_stops_the_warming_quietly(modules: list[str], tmp_path: Path) -> None:
    broken = f"warm_broken_{tmp_path.name}"
    (tmp_path / f"{broken}.py").write_text("raise RuntimeError('broken on purpose')\n")
    thread = warm([partial(importlib.import_module, m) for m in (modules[0], broken, modules[1])])
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert modules[0] in sys.modules and broken not in sys.modules and modules[1] not in sys.modules
    with pytest.raises(RuntimeError, match="broken on purpose"):  # said where it is imported again
        __import__(broken)


def test_the_commands_start_imports_none_of_collects_tables_or_plots() -> None:
    """`python -m gpupack` plans, checks and submits without pandas, pyarrow or matplotlib (about half a second of
    its start): collect's modules, which the warming imports while the first jobs start."""
    heavy = ("pandas", "pyarrow", "matplotlib", "gpupack.sweep.flow.collect", "gpupack.results.analysis.aggregate")
    code = f"import sys, gpupack.cli, gpupack.sweep; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr

    # ... and that the warming imports them
    code = ("import sys; from gpupack.sweep.flow.run import COLLECT_IMPORTS; from gpupack.core.warm import warm; "
            f"warm(COLLECT_IMPORTS).join(); print([m for m in {heavy!r} if m not in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_library_still_offers_collect_and_its_step() -> None:
    import gpupack.sweep as sweep
    from gpupack.sweep.flow.collect import Step, collect

    assert sweep.collect is collect and sweep.Step is Step
    with pytest.raises(AttributeError, match="no_such_thing"):
        sweep.no_such_thing  # noqa: B018
