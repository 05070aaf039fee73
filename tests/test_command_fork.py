"""Fast start for a Python script (sweep.fixed.start=fork): a child forked from a server that imported
sweep.fixed.preload runs the script as `python SCRIPT.py` would — same sys.argv, __name__, working directory,
environment and exit status — and where that cannot hold, it is refused before anything runs."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpupack.cli import main

SEE = '''
import json, os, sys
seen = {"argv": sys.argv, "name": __name__, "cwd": os.getcwd(), "env": dict(os.environ),
        "path0": sys.path[0], "json_loaded": "json" in sys.modules}
with open(os.path.join(os.getcwd(), f"seen-{sys.argv[2]}.json"), "w") as f:
    json.dump(seen, f)
if sys.argv[2] == "raise":
    raise RuntimeError("failure on purpose")
sys.exit(int(sys.argv[2]))
'''


RUN_OWN = ("GPUPACK_RESULT", "GPUPACK_JOB_ID", "SUBMITIT_LOCAL_JOB_ID")


def _sweep(tmp_path: Path, start: str) -> tuple[Path, Path]:
    app, cwd, run_dir = tmp_path / "app", tmp_path / start, tmp_path / f"run-{start}"
    app.mkdir(exist_ok=True)
    cwd.mkdir()
    (app / "see.py").write_text(SEE)
    main(["+sweep=command", f"sweep.fixed.argv=['{{python}}',{app / 'see.py'},--code,'{{code}}']",
          f"sweep.fixed.cwd={cwd}", f"sweep.fixed.start={start}", "sweep.fixed.preload=[json]",
          "sweep.grid.code=[0,3,raise]", "packing.factors=[3]", "packing.repeats=1", f"run_dir={run_dir}"])
    return cwd, run_dir


def _records(run_dir: Path) -> dict[str, dict]:
    recs = [json.loads(p.read_text()) for p in run_dir.glob("packs/*/trainings/*.json")]
    return {str(r["params"]["code"]): r for r in recs}


@pytest.mark.slow
def test_a_forked_script_sees_and_ends_as_a_fresh_one(tmp_path):
    seen, recs = {}, {}
    for start in ("fresh", "fork"):
        cwd, run_dir = _sweep(tmp_path, start)
        recs[start] = _records(run_dir)
        for code in ("0", "3", "raise"):
            s = json.loads((cwd / f"seen-{code}.json").read_text())
            s["env"] = {k: v.replace(str(run_dir), "RUN") for k, v in s["env"].items()}
            s["cwd"] = s["cwd"].replace(str(cwd), "CWD")
            seen[start, code] = s
    for code in ("0", "3", "raise"):
        fresh, fork = seen["fresh", code], seen["fork", code]
        assert fork["argv"] == fresh["argv"] == [str(tmp_path / "app" / "see.py"), "--code", code]
        assert fork["name"] == fresh["name"] == "__main__"
        assert fork["cwd"] == fresh["cwd"] == "CWD"
        # the same variables; the same values but the run's own (its result file, its job's id)
        assert fork["env"].keys() == fresh["env"].keys()
        assert {k: v for k, v in fork["env"].items() if k not in RUN_OWN} == \
            {k: v for k, v in fresh["env"].items() if k not in RUN_OWN}
        assert fork["path0"] == fresh["path0"] == str(tmp_path / "app")
        assert recs["fork"][code]["start"] == "fork" and recs["fresh"][code]["start"] == "fresh"
        assert recs["fork"][code]["exit_code"] == recs["fresh"][code]["exit_code"]
    assert [recs["fork"][c]["exit_code"] for c in ("0", "3", "raise")] == [0, 3, 1]
    assert recs["fork"]["0"]["status"] == "completed"
    for start in ("fresh", "fork"):
        error = recs[start]["raise"]["error"]
        assert "Traceback (most recent call last)" in error and error.endswith("RuntimeError: failure on purpose")
        assert "runpy" not in error and "forkserver" not in error


BAD = [
    (["sweep.fixed.argv=[bash,-c,'exit 0']", "sweep.fixed.start=fork"], "sweep.fixed.start='fork'",
     "not a Python program"),
    (["sweep.fixed.argv=['{python}',-c,'print(1)']", "sweep.fixed.start=fork"], "sweep.fixed.start='fork'",
     "not a Python program"),
    (["sweep.fixed.argv=['{python}',-m,json.tool]", "sweep.fixed.start=fork",
      "sweep.fixed.preload=[no_such_module_for_gpupack]"], "sweep.fixed.preload[0]='no_such_module_for_gpupack'",
     "no module"),
    (["sweep.fixed.argv=['{python}',-m,json.tool]", "sweep.fixed.start=sideways"], "sweep.fixed.start='sideways'",
     "unknown start"),
]


@pytest.mark.parametrize("overrides, key, why", BAD)
def test_fork_start_where_it_cannot_hold_is_one_line_before_anything_runs(tmp_path, capsys, overrides, key, why):
    code = main(["+sweep=command", *overrides, "sweep.grid.lr=[0.1]", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and key in err and why in err and "HINT" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_module_runs_forked_as_python_dash_m(tmp_path):
    data = tmp_path / "in.json"
    data.write_text('{"b": 1, "a": 2}')
    run_dir = tmp_path / "run"
    assert main(["+sweep=command", f"sweep.fixed.argv=['{{python}}',-m,json.tool,--sort-keys,{data}]",
                 "sweep.fixed.start=fork", "sweep.grid.lr=[0.1]", "packing.factors=[1]", "packing.repeats=1",
                 f"run_dir={run_dir}"]) == 0
    [rec] = [json.loads(p.read_text()) for p in run_dir.glob("packs/*/trainings/*.json")]
    assert rec["start"] == "fork" and rec["status"] == "completed"
    out = next(run_dir.glob("packs/*/logs/*.out")).read_text()
    assert json.loads(out) == {"a": 2, "b": 1} and out.index('"a"') < out.index('"b"')
    assert sys.executable  # the server is this interpreter's


LAZY = '''
import json, os, sys
loaded = {m: m in sys.modules for m in ("colorsys", "wave", "lazy_helper")}


def main():
    import colorsys  # inside a function, as a task function imports its framework
    import lazy_helper  # the program's own module beside it: it imports wave
    with open(os.path.join(os.getcwd(), f"loaded-{sys.argv[1]}.json"), "w") as f:
        json.dump(loaded, f)


main()
'''


@pytest.mark.parametrize("start, preloaded", [("fork", True), ("fresh", False)])
@pytest.mark.slow
def test_a_forked_scripts_libraries_are_imported_once_by_its_server_never_its_own_modules(tmp_path, start,
                                                                                          preloaded):
    """Issue 31: every import of a forked script runs in its child, so its server imports the libraries the script's
    files import, anywhere in them (a function's too) and in the modules beside it, before the first fork; never
    the script's own modules (they may do anything at import)."""
    app, run_dir = tmp_path / "app", tmp_path / "run"
    app.mkdir()
    (app / "lazy.py").write_text(LAZY)
    (app / "lazy_helper.py").write_text("import wave  # noqa: F401\n")
    assert main(["+sweep=command", f"sweep.fixed.argv=['{{python}}',{app / 'lazy.py'},'{{code}}']",
                 f"sweep.fixed.cwd={tmp_path}", f"sweep.fixed.start={start}", "sweep.grid.code=[1,2]",
                 "packing.factors=[2]", "packing.repeats=1", f"run_dir={run_dir}"]) == 0
    for code in ("1", "2"):
        loaded = json.loads((tmp_path / f"loaded-{code}.json").read_text())
        assert loaded == {"colorsys": preloaded, "wave": preloaded, "lazy_helper": False}
    if preloaded:
        log = next(run_dir.glob("packs/*/logs/forkserver.err")).read_text()
        assert "preloaded colorsys, wave (imported by the script's files)" in log


def test_the_libraries_a_programs_files_import_anywhere(tmp_path):
    from gpupack.core.preload import static_imports

    (tmp_path / "main.py").write_text("import numpy\nfrom . import sibling\n\ndef task():\n    import torch.nn\n"
                                      "    import tensorflow\n    from colorsys import rgb_to_hsv\n"
                                      "    import no_such_module_here\n    import helper\n")
    (tmp_path / "helper.py").write_text("import wave\nimport main  # a cycle: read once\n")
    (tmp_path / "broken.py").write_text("def (:\n")
    assert static_imports([tmp_path / "main.py", tmp_path / "broken.py"], {}) == ["colorsys", "numpy", "torch",
                                                                                 "wave"]
    assert static_imports([tmp_path / "main.py"], {"numpy": object()}) == ["colorsys", "torch", "wave"]


def test_a_m_modules_file_is_found_without_importing_its_packages(tmp_path):
    """`-m pkg.train`: the server reads the module's imports; finding its file imports nothing (a package's
    __init__ may do anything), from the working folder first; none where there is none."""
    from gpupack.job.workloads.command import module_file

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    (tmp_path / "pkg" / "train.py").write_text("import colorsys\n")
    assert module_file("pkg.train", [str(tmp_path)]) == tmp_path / "pkg" / "train.py"
    assert module_file("pkg", [str(tmp_path)]) == tmp_path / "pkg" / "__init__.py"
    assert module_file("pkg.missing", [str(tmp_path)]) is None and module_file("nope", [str(tmp_path)]) is None
    assert "pkg" not in sys.modules
