"""What gpupack ships by value fails in the job as it fails at home: the app's file, line and source line.

cloudpickle 3.1.3 rewrites every pickled code object's file name to "<dynamic-code>". The fixture below makes any
installed cloudpickle do the same, so these tests hold the guarantee whatever version is installed, in one venv.
"""
from __future__ import annotations

import subprocess
import sys
import types
from collections import ChainMap
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from gpupack.core.store import pickling

APP = '''\
import functools

def helper(x):
    raise RuntimeError(f"job failure on purpose (lr={x})")

def main(x):
    return [helper(v) for v in [x]]  # the comprehension: a code object nested in main's constants

class Task:
    def __call__(self, x):
        return functools.reduce(lambda a, b: helper(b), [x, x])  # a lambda in a method of a class of __main__
'''


@pytest.fixture
def rewriting_cloudpickle(monkeypatch: pytest.MonkeyPatch) -> None:
    """cloudpickle as 3.1.3 behaves: every code object it reduces is named "<dynamic-code>"."""
    table = cloudpickle.Pickler.dispatch_table
    original = table[types.CodeType]

    def rewrite(code: types.CodeType) -> Any:
        return original(code.replace(co_filename="<dynamic-code>"))

    monkeypatch.setattr(cloudpickle.Pickler, "dispatch_table", ChainMap({types.CodeType: rewrite}, table))


def _app(tmp_path: Path) -> dict[str, Any]:
    """The app's namespace as `python app.py` makes it: its functions live in __main__, so they travel by value."""
    path = tmp_path / "app.py"
    path.write_text(APP)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(APP, str(path), "exec"), namespace)
    return namespace


def _traceback_in_a_fresh_process(tmp_path: Path, payload: bytes) -> str:
    (tmp_path / "payload.pkl").write_bytes(payload)
    code = ("import pickle, sys, traceback\n"
            "fn = pickle.load(open(sys.argv[1], 'rb'))\n"
            "try:\n    fn(0.1)\nexcept RuntimeError:\n    print(traceback.format_exc())\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "payload.pkl")], capture_output=True, text=True,
                         cwd="/", timeout=120)  # elsewhere than the app's folder: nothing imports it by name
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("entry", ["main", "Task"])
def test_code_shipped_by_value_keeps_its_file_and_source_line(tmp_path, rewriting_cloudpickle, entry):
    app = _app(tmp_path)
    fn = app[entry] if entry == "main" else app[entry]()
    tb = _traceback_in_a_fresh_process(tmp_path, pickling.dumps(fn))
    path = tmp_path / "app.py"
    assert f'File "{path}", line 4, in helper' in tb, tb
    assert 'raise RuntimeError(f"job failure on purpose (lr={x})")' in tb, tb  # linecache found the source
    caller = "line 7, in <listcomp>" if entry == "main" and sys.version_info < (3, 12) else (
        "line 7, in main" if entry == "main" else "line 11, in <lambda>")
    assert f'File "{path}", {caller}' in tb, tb
    assert "<dynamic-code>" not in tb


def test_the_fixture_reproduces_the_rewrite_that_plain_cloudpickle_then_makes(tmp_path, rewriting_cloudpickle):
    """The guarantee above is not vacuous: under the same fixture, plain cloudpickle loses the file."""
    tb = _traceback_in_a_fresh_process(tmp_path, cloudpickle.dumps(_app(tmp_path)["main"]))
    assert 'File "<dynamic-code>", line 4, in helper' in tb and str(tmp_path) not in tb, tb


def test_dump_and_load_round_trip_through_a_file_and_plain_pickle_reads_it(tmp_path):
    import pickle

    data = {"f": _app(tmp_path)["main"], "n": [1, 2.5, "x"]}
    pickling.dump(data, tmp_path / "p.pkl")
    for back in (pickling.load(tmp_path / "p.pkl"), pickle.loads((tmp_path / "p.pkl").read_bytes())):
        assert back["n"] == [1, 2.5, "x"] and back["f"].__code__.co_filename == str(tmp_path / "app.py")
        with pytest.raises(RuntimeError, match=r"lr=0.3"):
            back["f"](0.3)


def test_the_marshalled_code_must_be_code():
    with pytest.raises(TypeError, match="expected marshalled code, got int"):
        pickling._code(__import__("marshal").dumps(3))


def test_a_pickle_written_before_core_was_split_still_loads(tmp_path):
    """A launch's payload or a job's returns written when core's modules sat at gpupack.core.<name> names them so
    (this module's _code, core's classes): they load as where the modules are now."""
    import pickle

    from gpupack.core.memory.figures import Figure
    from gpupack.core.store.rundir import RunDir

    new = pickle.dumps({"code": pickling._code, "run": RunDir(tmp_path), "figure": Figure(1.0, "x")}, protocol=0)
    old = (new.replace(b"gpupack.core.store.pickling", b"gpupack.core.pickling")
           .replace(b"gpupack.core.store.rundir", b"gpupack.core.rundir")
           .replace(b"gpupack.core.memory.figures", b"gpupack.core.memory"))
    assert b"gpupack.core.rundir\n" in old and b"gpupack.core.pickling\n" in old
    with pytest.raises(ModuleNotFoundError):
        pickle.loads(old)
    (tmp_path / "old.pkl").write_bytes(old)
    for back in (pickling.loads(old), pickling.load(tmp_path / "old.pkl")):
        assert back["code"] is pickling._code and back["run"].root == tmp_path and back["figure"] == Figure(1.0, "x")


def test_a_pickle_written_before_the_wings_still_loads():
    """A payload written when the job side's folders sat at the top (gpupack.pack, gpupack.runtime, ...) loads as
    where they are now (issue 54's wings)."""
    import pickle

    from gpupack.core.jobenv import JobEnvironment
    from gpupack.core.plan import Pack
    from gpupack.job.pack import Curve
    from gpupack.results.analysis.disturbance import disturbed_rounds

    new = pickle.dumps({"curve": Curve, "env": JobEnvironment, "fn": disturbed_rounds, "pack": Pack}, protocol=0)
    old = (new.replace(b"gpupack.job.pack\n", b"gpupack.pack\n")
           .replace(b"gpupack.core.jobenv", b"gpupack.runtime.jobenv")
           .replace(b"gpupack.results.analysis.", b"gpupack.analysis."))
    assert b"gpupack.pack\n" in old and b"gpupack.runtime.jobenv" in old and b"gpupack.analysis.disturbance" in old
    with pytest.raises(ModuleNotFoundError):
        pickle.loads(old)
    back = pickling.loads(old)
    assert back == {"curve": Curve, "env": JobEnvironment, "fn": disturbed_rounds, "pack": Pack}


@pytest.mark.parametrize("old, new", [
    ("gpupack.pack", "gpupack.job.pack"),
    ("gpupack.pack.process", "gpupack.job.pack.process"),
    ("gpupack.spread.ddp", "gpupack.job.spread.ddp"),
    ("gpupack.runtime.worker", "gpupack.job.runtime.worker"),
    ("gpupack.runtime.joins.ddp", "gpupack.job.runtime.joins.ddp"),
    ("gpupack.runtime.jobenv", "gpupack.core.jobenv"),      # to the ground, not with its folder
    ("gpupack.runtime.monitor", "gpupack.core.monitor"),
    ("gpupack.workloads.command", "gpupack.job.workloads.command"),
    ("gpupack.analysis.load", "gpupack.results.analysis.load"),
    ("gpupack.report.html", "gpupack.results.report.html"),
    ("gpupack.flow.run", "gpupack.sweep.flow.run"),
    ("gpupack.setup.config", "gpupack.sweep.setup.config"),
    ("gpupack.cli_show", "gpupack.cli.show"),
    ("gpupack.cli_stop", "gpupack.sweep.stop"),
    ("gpupack.core.rundir", "gpupack.core.store.rundir"),   # core's own split, before the wings
    ("gpupack.job.pack.process", "gpupack.job.pack.process"),  # where it is now: as it is
    ("gpupack.sweep", "gpupack.sweep"),
    ("gpupack.workload", "gpupack.workload"),               # the names a user imports never moved
])
def test_an_old_module_name_reads_where_the_module_is_now(old, new):
    import importlib

    from gpupack.core.moves import moved

    assert moved(old) == new
    importlib.import_module(new)


def test_a_plan_naming_the_hydra_jobs_old_module_still_loads_its_workload():
    """A Hydra launch's plan written before the wings names its workload gpupack.runtime.hydra_job; a job of that
    launch that starts after an upgrade (queued, requeued) still finds it."""
    from gpupack.job.runtime.hydra_job import WORKLOAD
    from gpupack.job.workloads import load_workload

    assert load_workload("gpupack.runtime.hydra_job") is WORKLOAD
