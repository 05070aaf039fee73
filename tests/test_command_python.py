"""{python} in a command's argv is the interpreter running gpupack; a program that fails for want of a module is told
which interpreter ran it."""
from __future__ import annotations

import json
import os
import sys

import pytest

from gpupack.cli import main
from gpupack.job.workloads import load_workload

COMMAND = load_workload("command")


def _records(run_dir):
    return [json.loads(p.read_text()) for p in run_dir.glob("packs/*/trainings/*.json")]


@pytest.mark.slow
def test_python_placeholder_is_gpupacks_interpreter(tmp_path, capsys):
    assert COMMAND.program({"argv": ["{python}", "t.py", "--lr", "{lr}"], "lr": 0.1}).argv == \
        [sys.executable, "t.py", "--lr", "0.1"]
    seen = tmp_path / "seen.txt"
    run_dir = tmp_path / "run"
    code = main(["+sweep=command", f"sweep.fixed.argv=['{{python}}',-c,'import sys; open(r\"{seen}\", \"w\")"
                 ".write(sys.executable)']", "sweep.grid.lr=[0.1]", "packing.factors=[1]", "packing.repeats=1",
                 f"run_dir={run_dir}"])
    assert code == 0, capsys.readouterr()
    assert seen.read_text() == sys.executable


@pytest.mark.slow
def test_a_missing_module_names_the_interpreter_that_ran_the_program(tmp_path, capsys):
    other = tmp_path / "bin" / "python3"  # another interpreter than gpupack's, as a PATH lookup can find
    other.parent.mkdir()
    os.symlink(sys.executable, other)
    run_dir = tmp_path / "run"
    code = main(["+sweep=command", f"sweep.fixed.argv=[{other},-c,'import no_such_module_for_gpupack']",
                 "sweep.grid.lr=[0.1]", "packing.factors=[1]", "packing.repeats=1", f"run_dir={run_dir}"])
    assert code == 1, capsys.readouterr()
    [rec] = _records(run_dir)
    assert rec["status"] == "failed" and "No module named 'no_such_module_for_gpupack'" in rec["error"]
    assert f"HINT: argv[0] '{other}' ran {other}, not the Python running gpupack ({sys.executable})" in rec["error"]
    assert "{python}" in rec["error"]


@pytest.mark.slow
def test_no_hint_when_gpupacks_own_interpreter_lacks_the_module(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["+sweep=command", "sweep.fixed.argv=['{python}',-c,'import no_such_module_for_gpupack']",
                 "sweep.grid.lr=[0.1]", "packing.factors=[1]", "packing.repeats=1", f"run_dir={run_dir}"])
    assert code == 1, capsys.readouterr()
    [rec] = _records(run_dir)
    assert "No module named" in rec["error"] and "HINT" not in rec["error"]
