"""The ``command`` workload: pack any program by its argv, templated per training, never through a shell.

What is guaranteed and checked here:
- ``{name}`` placeholders render per training (``{{``/``}}`` literal, format specs, conversions); bad templates
  are refused with a ConfigError naming the key, the value and a HINT;
- bad input (no program, missing program or script, non-executable path, unknown placeholder, program keys as grid
  axes, a missing cwd, dict-valued hyperparameters) stops the CLI with exit 2 and one line, writing nothing;
- end to end, argv items arrive verbatim (shell metacharacters included), and what the program reports through
  gpupack.result (first step, samples, metrics) lands in the records; a program that reports nothing still
  completes, with start-up and loop as one figure, and ``collect`` says so;
- trainings are independent: one exiting non-zero, or one whose program vanished after validation, fails alone;
- gpupack.result is a no-op outside gpupack and writes valid JSON inside it.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import gpupack.core.result as result_module
from gpupack.cli import main
from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.errors import ConfigError, DataError
from gpupack.job.body import run_pack
from gpupack.job.workloads.command import WORKLOAD, checked_report, render, result_from_report
from gpupack.result import ENV, TrainingResult, report
from tests.conftest import verdict

REPO = Path(__file__).resolve().parent.parent
PROGRAM = REPO / "tests" / "programs" / "report_train.py"
PY = sys.executable


# ---------------------------------------------------------------- 1. render

VALUES = {"lr": 0.001, "seed": 7, "model": "mlp", "name": "ab", "tag": "{lr}", "flag": True}

RENDERED = [
    # (template, expected)
    ("plain-text", "plain-text"),
    ("{lr}", "0.001"),
    ("--lr={lr}", "--lr=0.001"),
    ("{model}-s{seed}-lr{lr}", "mlp-s7-lr0.001"),
    ("{seed}{seed}", "77"),
    ("{{lr}}", "{lr}"),
    ("{{{lr}}}", "{0.001}"),
    ("{{}}", "{}"),
    ("{lr:.0e}", "1e-03"),
    ("{seed:03d}", "007"),
    ("{model:>5}", "  mlp"),
    ("{name!r}", "'ab'"),
    ("{lr!r}", "0.001"),
    ("{name!s:>4}", "  ab"),
    ("{flag}", "True"),
    ("{tag}", "{lr}"),  # a value is inserted as is: never rendered a second time
]


@pytest.mark.parametrize("template, expected", RENDERED, ids=[t for t, _ in RENDERED])
def test_render_fills_each_placeholder(template, expected):
    assert render(template, VALUES, "argv[1]") == expected


REFUSED = [
    # (template, text the error's reason or hint must hold)
    ("{lrr}", ["names no hyperparameter", "did you mean 'lr'?"]),
    ("--seed={sede}", ["names no hyperparameter", "did you mean 'seed'?"]),
    ("{zzzzzz}", ["names no hyperparameter", "valid: flag, lr, model, name, seed, tag"]),
    ("{}", ["is not a hyperparameter placeholder"]),
    ("{0}", ["is not a hyperparameter placeholder"]),
    ("{lr.real}", ["{lr.real} is not a hyperparameter placeholder"]),
    ("{lr[0]}", ["is not a hyperparameter placeholder"]),
    ("{lr", ["is not a valid template"]),
    ("lr}", ["is not a valid template"]),
    ("{lr:d}", ["format spec 'd' does not fit lr=0.001"]),
    ("{model:.2f}", ["format spec '.2f' does not fit model='mlp'"]),
]


@pytest.mark.parametrize("template, needles", REFUSED, ids=[t for t, _ in REFUSED])
def test_render_refuses_bad_templates_naming_key_value_and_hint(template, needles):
    with pytest.raises(ConfigError) as caught:
        render(template, VALUES, "argv[3]")
    err = caught.value
    assert err.key == "argv[3]" and err.value == template
    text = str(err)
    assert text.startswith(f"argv[3]={template!r}: ")
    assert "HINT: " in text and len(text.splitlines()) == 1
    for needle in needles:
        assert needle in text, text


def test_render_refuses_an_unknown_conversion():
    with pytest.raises(ConfigError):
        render("{lr!x}", VALUES, "argv[1]")


def test_program_and_launch_render_argv_env_and_cwd(tmp_path):
    params = WORKLOAD.params({"argv": ["prog", "--lr", "{lr:.0e}", "{{x}}"], "cwd": str(tmp_path / "w-{seed}"),
                              "env": {"RUN": "r{seed}", "GPUPACK_RESULT": "mine"}, "lr": 0.01, "seed": 3})
    launch = WORKLOAD.launch(params, "/spec.json", "/where/result.json")
    assert launch.argv == ["prog", "--lr", "1e-02", "{x}"]
    assert launch.cwd == str(tmp_path / "w-3")
    assert launch.env == {"RUN": "r3", ENV: "/where/result.json"}  # gpupack's result path wins


# ---------------------------------------------------------------- 2. bad input through the CLI

VALID_ARGV = f"sweep.fixed.argv=['{PY}',-c,pass]"

BAD = [
    # (id, overrides, texts the one line must hold)
    ("empty argv", ["sweep.grid.lr=[0.1]"], ["sweep.fixed.argv=[]", "no program given"]),
    ("empty argv given", ["sweep.fixed.argv=[]", "sweep.grid.lr=[0.1]"], ["sweep.fixed.argv=[]", "no program"]),
    ("unknown placeholder", [f"sweep.fixed.argv=['{PY}',-c,pass,'--lr={{lrr}}']", "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.argv[3]='--lr={lrr}'", "names no hyperparameter", "did you mean 'lr'?"]),
    ("unknown placeholder in env", [VALID_ARGV, "+sweep.fixed.env.RUN_NAME='run-{sed}'", "sweep.grid.seed=[1]"],
     ["sweep.fixed.env.RUN_NAME='run-{sed}'", "did you mean 'seed'?"]),
    ("bad format spec", [f"sweep.fixed.argv=['{PY}',-c,pass,'{{lr:d}}']", "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.argv[3]='{lr:d}'", "format spec 'd' does not fit lr=0.1"]),
    ("program not on PATH", ["sweep.fixed.argv=[gpupack-no-such-program-xyz,--lr,'{lr}']", "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.argv[0]='gpupack-no-such-program-xyz'", "not a program on PATH"]),
    ("relative path missing", ["sweep.fixed.argv=[./bin/missing-tool]", "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.argv[0]='./bin/missing-tool'", "no such program", "bin/missing-tool"]),
    ("not executable", ["sweep.fixed.argv=[./tool.sh,'{lr}']", "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.argv[0]='./tool.sh'", "is not executable", "chmod +x ./tool.sh"]),
    ("missing script", [f"sweep.fixed.argv=['{PY}',missing_script.py,'{{lr}}']", "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.argv[1]='missing_script.py'", "no such script"]),
    ("script not in cwd", [f"sweep.fixed.argv=['{PY}',train_here.py]", "+sweep.fixed.cwd=./sub",
                           "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.argv[1]='train_here.py'", "no such script", "sub", "sweep.fixed.cwd"]),
    ("argv as a shell line", [f"sweep.fixed.argv='{PY} -c pass'", "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.argv=", "never a shell line"]),
    ("argv only in the grid", ["~sweep.fixed.argv", "+sweep.grid.argv=[a,b]", "sweep.grid.lr=[0.1]"],
     ["sweep.grid.argv='a'", "describes the program", "sweep.fixed.argv"]),
    ("argv in grid and fixed", [VALID_ARGV, "+sweep.grid.argv=[a,b]", "sweep.grid.lr=[0.1]"],
     ["sweep.grid.argv='a'", "describes the program", "sweep.fixed.argv"]),
    ("cwd in the grid", [VALID_ARGV, "+sweep.grid.cwd=[/tmp,/var]", "sweep.grid.lr=[0.1]"],
     ["sweep.grid.cwd='/tmp'", "describes the program", "sweep.fixed.cwd"]),
    ("env in the grid", [VALID_ARGV, "+sweep.grid.env=[a,b]", "sweep.grid.lr=[0.1]"],
     ["sweep.grid.env='a'", "describes the program"]),
    ("cwd missing", [VALID_ARGV, "+sweep.fixed.cwd=./missing_folder", "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.cwd='./missing_folder'", "is not a folder"]),
    ("templated cwd missing", [VALID_ARGV, "+sweep.fixed.cwd='./data-{lr}'", "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.cwd='./data-0.1'", "is not a folder"]),
    ("cwd a file", [VALID_ARGV, "+sweep.fixed.cwd=./tool.sh", "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.cwd='./tool.sh'", "is not a folder"]),
    ("dict hyperparameter in grid", [VALID_ARGV, "+sweep.grid.opt={a:1}"],
     ["sweep.grid.opt={'a': 1}", "a hyperparameter must be a value"]),
    ("dict hyperparameter fixed", [VALID_ARGV, "+sweep.fixed.opt={a:1}", "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.opt={'a': 1}", "a hyperparameter must be a value"]),
    ("bad env name", [VALID_ARGV, "+sweep.fixed.env={1BAD:x}", "sweep.grid.lr=[0.1]"],
     ["sweep.fixed.env.1BAD='x'", "not an environment variable name"]),
    ("thread-hosting mode", [VALID_ARGV, "sweep.grid.lr=[0.1]", "packing.modes=[tf_logical]"],
     ["packing.modes", "tf_logical"]),
]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run from tmp_path, which holds a non-executable ./tool.sh and an empty ./sub/."""
    monkeypatch.chdir(tmp_path)
    tool = tmp_path / "tool.sh"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o644)
    (tmp_path / "sub").mkdir()
    (tmp_path / "train_here.py").write_text("print('hi')\n")
    return tmp_path


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("overrides, needles", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_command_input_is_one_line_exit_2_and_writes_nothing(in_tmp, capsys, overrides, needles):
    before = _listing(in_tmp)
    run_dir = in_tmp / "run"
    code = main(["+sweep=command", *overrides, f"run_dir={run_dir}"])
    out = capsys.readouterr()
    err = out.err.strip()
    assert code == 2, out
    assert len(err.splitlines()) == 1, err
    assert err.startswith("gpupack: error: "), err
    for needle in needles:
        assert needle in err, err
    assert "HINT: " in err, err
    assert not run_dir.exists()
    assert _listing(in_tmp) == before  # nothing written anywhere, nothing started


def test_argv_in_grid_and_fixed_hint_does_not_suggest_the_grid(in_tmp, capsys):
    assert main(["+sweep=command", VALID_ARGV, "+sweep.grid.argv=[a,b]", "sweep.grid.lr=[0.1]",
                 f"run_dir={in_tmp / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "keep argv in sweep.grid" not in err and "sweep.fixed.argv" in err.split("HINT:")[1]


@pytest.mark.slow
def test_bad_command_input_from_the_command_line(tmp_path, subprocess_env):
    proc = subprocess.run([PY, "-m", "gpupack", "+sweep=command", "sweep.fixed.argv=[./nothere.sh,'{lr}']",
                           "sweep.grid.lr=[0.1]", f"run_dir={tmp_path / 'run'}"], capture_output=True, text=True,
                          env=subprocess_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "sweep.fixed.argv[0]='./nothere.sh'" in proc.stderr and "HINT: " in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- 3-5. end to end, in a subprocess

def _gpupack(args, env, cwd, timeout=300):
    return subprocess.run([PY, "-m", "gpupack", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout)


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("packs/*/trainings/*.json"))]


def _received(run_dir: Path, rec: dict) -> dict:
    """What the program wrote first on stdout: its argv items, cwd and $STUB_ENV."""
    out = run_dir / "packs" / rec["pack_id"] / "logs" / f"{rec['training_id']}.out"
    return json.loads(out.read_text().splitlines()[0])


TAGS = ['a;b $(echo x) "q"', "it's *.py {lr} `id` > out.txt"]


@pytest.mark.slow
def test_reporting_program_end_to_end_argv_verbatim_metrics_and_split_timings(tmp_path, subprocess_env):
    run_dir = tmp_path / "run"
    work = tmp_path / "work-0.25"
    work.mkdir()
    argv = (f"sweep.fixed.argv=['{PY}','{PROGRAM}',--mode,report,--lr,'{{lr}}',--tag,'{{tag}}',"
            "'lit-{{lr}}-{lr:.1e}']")
    tags = "sweep.grid.tag=['a;b $(echo x) \"q\"', \"it's *.py {lr} `id` > out.txt\"]"
    proc = _gpupack(["+sweep=command", argv, tags, "sweep.grid.lr=[0.25]", "+sweep.fixed.env.STUB_ENV='e-{tag}'",
                     f"+sweep.fixed.cwd='{tmp_path}/work-{{lr}}'", "packing.factors=[1,2]", "packing.repeats=1",
                     f"run_dir={run_dir}"], subprocess_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(verdict("command", "local"), proc.stdout), proc.stdout
    records = _records(run_dir)
    # N=1: two packs of one, and two at its 1-thread set-up (2 cores); N=2: one pack of two; the drift check at the end
    assert len(records) == 4 + 2 + 1
    assert {r["factor"] for r in records} == {1, 2}
    assert sorted(r["params"]["tag"] for r in records) == sorted(TAGS * 3 + TAGS[:1])  # the drift check: the first
    for rec in records:
        tag = rec["params"]["tag"]
        assert rec["status"] == "completed" and rec["exit_code"] == 0 and rec["error"] is None, rec
        assert rec["metrics"] == {"val_accuracy": 0.25, "tag_len": len(tag)}
        timings = rec["timings"]
        assert timings["split"] is True
        assert isinstance(timings["startup_s"], float) and timings["startup_s"] > 0
        assert isinstance(timings["loop_s"], float) and timings["loop_s"] > 0
        assert timings["loop_s"] < rec["wall_s"] and timings["startup_s"] < rec["wall_s"]
        assert rec["throughput"]["samples"] == 4 * 8 and rec["throughput"]["steps"] == 4
        assert rec["throughput"]["samples_per_s"] > 0
        received = _received(run_dir, rec)
        # each item verbatim, as one argv item: no shell split, expanded, globbed or redirected anything
        assert received["argv"] == ["--mode", "report", "--lr", "0.25", "--tag", tag, "lit-{lr}-2.5e-01"]
        assert received["env"] == f"e-{tag}"
        assert Path(received["cwd"]) == work
    assert not (work / "out.txt").exists() and not (tmp_path / "out.txt").exists()


@pytest.mark.slow
def test_silent_program_completes_unsplit_and_collect_says_so(tmp_path, subprocess_env):
    run_dir = tmp_path / "run"
    proc = _gpupack(["+sweep=command", f"sweep.fixed.argv=['{PY}','{PROGRAM}',--mode,silent,--lr,'{{lr}}']",
                     "sweep.grid.lr=[0.1,0.2]", "packing.factors=[1,2]", "packing.repeats=1", f"run_dir={run_dir}"],
                    subprocess_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = _records(run_dir)
    assert len(records) == 4 + 2 + 1  # N=1's 1-thread set-up too, and the drift check at the end
    for rec in records:
        assert rec["status"] == "completed" and rec["exit_code"] == 0 and rec["error"] is None, rec
        assert rec["metrics"] == {}
        assert rec["timings"]["split"] is False
        assert rec["timings"]["startup_s"] is None and rec["timings"]["loop_s"] is None
        assert rec["wall_s"] > 0
        assert rec["throughput"]["samples"] == 0
        assert _received(run_dir, rec)["argv"] == ["--mode", "silent", "--lr", str(rec["params"]["lr"])]
    collected = _gpupack(["collect", str(run_dir)], subprocess_env, tmp_path, timeout=120)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert any("did not mark its first step" in line for line in collected.stdout.splitlines()), collected.stdout


@pytest.mark.slow
def test_a_failing_training_fails_alone_in_its_pack(tmp_path, subprocess_env):
    run_dir = tmp_path / "run"
    proc = _gpupack(["+sweep=command",
                     f"sweep.fixed.argv=['{PY}','{PROGRAM}',--exit-code,'{{code}}',--lr,'0.5']",
                     "sweep.grid.code=[0,3]", "packing.factors=[2]", "packing.repeats=1", f"run_dir={run_dir}"],
                    subprocess_env, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the sweep ran, but not every training completed
    assert "Traceback" not in proc.stderr, proc.stderr
    records = {r["params"]["code"]: r for r in _records(run_dir)}
    assert set(records) == {0, 3}
    assert records[0]["pack_id"] == records[3]["pack_id"]  # one pack of two, run side by side
    assert records[0]["concurrent"] == records[3]["concurrent"] == 2
    failed, ok = records[3], records[0]
    assert failed["status"] == "failed" and failed["exit_code"] == 3 and failed["signal"] is None
    assert "stub training failing on purpose with code 3" in failed["error"]
    assert "some earlier noise" in failed["error"]  # the tail of its stderr, not just the last line
    assert ok["status"] == "completed" and ok["exit_code"] == 0 and ok["error"] is None
    assert ok["metrics"]["val_accuracy"] == 0.5 and ok["timings"]["split"] is True
    pack = read_json(run_dir / "packs" / ok["pack_id"] / "pack.json")
    assert pack["n_completed"] == 1 and pack["n_failed"] == 1


@pytest.mark.slow
def test_a_malformed_result_file_fails_its_training_alone(tmp_path, subprocess_env):
    """A program that writes its result file itself (another language's, say) with a count that is no number: its
    training fails, saying which key holds what, and its neighbour in the pack completes (before, the reader's
    ValueError took the whole job down: neither training had a record)."""
    run_dir = tmp_path / "run"
    proc = _gpupack(["+sweep=command", f"sweep.fixed.argv=['{PY}','{PROGRAM}',--mode,'{{mode}}',--lr,'0.5']",
                     "sweep.grid.mode=[report,malformed]", "packing.factors=[2]", "packing.repeats=1",
                     "packing.remeasure=0", f"run_dir={run_dir}"], subprocess_env, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the sweep ran, but not every training completed
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    records = {r["params"]["mode"]: r for r in _records(run_dir)}
    assert records["report"]["status"] == "completed" and records["report"]["metrics"]["val_accuracy"] == 0.5
    bad = records["malformed"]
    assert bad["status"] == "failed" and bad["exit_code"] == 0
    assert "samples='many': is not a whole number >= 0. HINT: write what gpupack.result writes" in bad["error"]


@pytest.mark.parametrize("raw, needle", [
    ([1, 2], "GPUPACK_RESULT=[1, 2]: is no JSON object"),
    ({"samples": "many"}, "GPUPACK_RESULT.samples='many': is not a whole number >= 0"),
    ({"samples": -1}, "GPUPACK_RESULT.samples=-1: is not a whole number >= 0"),
    ({"steps": True}, "GPUPACK_RESULT.steps=True: is not a whole number >= 0"),
    ({"steps": 2.5}, "GPUPACK_RESULT.steps=2.5: is not a whole number >= 0"),
    ({"loop_start": float("nan")}, "GPUPACK_RESULT.loop_start=nan: is not a time in seconds since the epoch"),
    ({"loop_end": "later"}, "GPUPACK_RESULT.loop_end='later': is not a time"),
    ({"metrics": [0.9]}, "GPUPACK_RESULT.metrics=[0.9]: is not an object of metric names to values"),
    ({"metric": {"acc": 1}}, "GPUPACK_RESULT.metric={'acc': 1}: is no key of a result. HINT: did you mean 'metrics'?"),
    ({"loop_start": 10 ** 400}, "GPUPACK_RESULT.loop_start=" + "1" + "0" * 56 + "...: is not a time"),
    ({"loop_start": 5.0, "loop_end": 4.0}, "GPUPACK_RESULT.loop_end=4.0: is before loop_start=5.0"),
])
def test_a_result_file_is_read_key_by_key(raw, needle):
    with pytest.raises(DataError) as err:
        checked_report(raw)
    assert needle in str(err.value) and "HINT: " in str(err.value)


def test_a_result_file_as_gpupack_result_writes_it_reads_whole():
    raw = {"metrics": {"val_accuracy": 0.9}, "samples": 6, "steps": 2, "loop_start": 1, "loop_end": 2.5}
    report = checked_report(raw)
    assert report == raw and isinstance(report["loop_start"], float)
    assert checked_report(None) == {}
    assert checked_report({"samples": None}) == {"loop_start": None, "loop_end": None}


def test_a_result_file_another_language_wrote_reads_as_meant():
    """Counts written as whole floats (R, Julia: 6e+04) are counts; a key of the program's own is left alone."""
    report = checked_report({"samples": 6e4, "steps": 938.0, "notes": "run on the old node"})
    assert report == {"samples": 60000, "steps": 938, "loop_start": None, "loop_end": None}
    assert isinstance(report["samples"], int)


@pytest.mark.parametrize("content, stopped, needle", [
    ("not json at all", False, "its result (r.json) holds no JSON object: 'not json at all'"),
    ("", False, "its result (r.json) holds no JSON object: it is empty"),
    ('{"samples": "many"}', False, "its result (r.json): GPUPACK_RESULT.samples='many'"),
    ("not json at all", True, None),   # pruned mid-write: read as nothing, as it reported nothing
    (None, False, None),               # no file: the program reported nothing
])
def test_a_trainings_result_file_is_read_or_said_in_one_place(tmp_path, content, stopped, needle):
    from gpupack.job.pack import read_result

    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    result, error = read_result(WORKLOAD, {}, path, 100.0, 104.0, stopped=stopped)
    if needle is None:
        assert error is None and result is not None and result["timings"]["split"] is False
    else:
        assert result is None and error is not None and needle in error


# ---------------------------------------------------------------- 6. a program gone between validation and run

def _command_plan(tmp_path, grid, fixed):
    run = RunDir(tmp_path / "run")
    fixed = {**WORKLOAD.defaults(), **fixed}
    plan = make_plan(sweep="t", workload="command", grid=grid, fixed=fixed, factors=[2], modes=["process"],
                     partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    return run, plan.packs[0]


@pytest.mark.parametrize("vanishing", ["program", "cwd"])
def test_program_that_vanished_after_validation_fails_alone(tmp_path, vanishing):
    gone = tmp_path / "gone"
    if vanishing == "program":
        gone.mkdir()
        tool = gone / "tool"
        tool.write_text("#!/bin/sh\nexit 0\n")
        tool.chmod(0o755)
        grid = {"prog": [str(tool), PY]}
        fixed = {"argv": ["{prog}", "-c", "print('hello from ok')"]}
        key = "prog"
    else:
        (gone / "sub").mkdir(parents=True)
        grid = {"where": [str(gone / "sub"), str(tmp_path)]}
        fixed = {"argv": [PY, "-c", "print('hello from ok')"], "cwd": "{where}"}
        key = "where"
    run, pack = _command_plan(tmp_path, grid, fixed)
    for t in pack.trainings:  # both pass validation ...
        WORKLOAD.check(WORKLOAD.params(t.params))
    if vanishing == "program":  # ... then the program (or its working folder) is gone
        (gone / "tool").unlink()
    else:
        (gone / "sub").rmdir()
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    assert rec["n_completed"] == 1 and rec["n_failed"] == 1
    recs = {t.params[key]: read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings}
    bad, ok = recs[grid[key][0]], recs[grid[key][1]]
    assert bad["status"] == "failed" and bad["exit_code"] is None
    assert "could not start" in bad["error"]
    if vanishing == "program":
        assert str(gone / "tool") in bad["error"]
    else:  # the folder is named, not the program (which is still there)
        assert f"working directory '{gone / 'sub'}' does not exist" in bad["error"]
    assert ok["status"] == "completed" and ok["exit_code"] == 0
    ok_out = run.pack_dir(pack.pack_id) / "logs" / f"{ok['training_id']}.out"
    assert ok_out.read_text().strip() == "hello from ok"


# ---------------------------------------------------------------- 7. gpupack.result

def test_result_is_a_no_op_without_gpupack_result(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a stray temp file would land here
    writes = []
    monkeypatch.setattr(result_module, "write_result", lambda *a, **k: writes.append(a))
    result = TrainingResult()
    assert result.active is False
    result.first_step()
    result.step(32)
    result.finish(metrics={"val_accuracy": 0.9}, samples=64)
    report(metrics={"val_accuracy": 0.9}, samples=10)
    assert writes == []
    assert list(tmp_path.iterdir()) == []
    assert result.steps == 1 and result.samples == 64  # it still counts, it only writes nothing


def test_result_with_gpupack_result_writes_valid_json_at_first_step_and_finish(tmp_path, monkeypatch):
    path = tmp_path / "res" / "r.json"
    path.parent.mkdir()
    monkeypatch.setenv(ENV, str(path))
    result = TrainingResult()
    assert result.active is True and result.path == str(path)
    before = time.time()
    result.first_step()
    first = json.loads(path.read_text())
    assert first["metrics"] == {} and first["samples"] == 0 and first["steps"] == 0
    assert before <= first["loop_start"] <= time.time() and first["loop_end"] is None
    for _ in range(3):
        result.step(16)
    assert json.loads(path.read_text()) == first  # step() writes nothing
    result.finish(metrics={"val_accuracy": 0.75, "train_loss": 0.1})
    final = json.loads(path.read_text())
    assert final["metrics"] == {"val_accuracy": 0.75, "train_loss": 0.1}
    assert final["samples"] == 48 and final["steps"] == 3
    assert final["loop_start"] == first["loop_start"] <= final["loop_end"] <= time.time()
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]  # no temp file left behind


def test_result_finish_samples_override_and_step_without_first_step(tmp_path):
    path = tmp_path / "r.json"
    result = TrainingResult(str(path))
    result.step(5)  # no first_step(): the loop starts at the first step
    result.finish(samples=1000)
    data = json.loads(path.read_text())
    assert data["samples"] == 1000 and data["steps"] == 1
    assert data["loop_start"] is not None and data["loop_start"] <= data["loop_end"]


def test_report_alone_gives_metrics_but_no_split(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    monkeypatch.setenv(ENV, str(path))
    report(metrics={"val_accuracy": 0.5}, samples=200)
    data = json.loads(path.read_text())
    assert data["loop_start"] is None and isinstance(data["loop_end"], float)
    out = result_from_report(data, 100.0, 104.0)
    assert out["metrics"] == {"val_accuracy": 0.5}
    assert out["timings"]["split"] is False and out["timings"]["startup_s"] is None
    assert out["throughput"]["samples"] == 200
    assert out["throughput"]["samples_per_s"] == pytest.approx(200 / 4.0)  # over the wall time


def test_result_from_report_splits_when_the_first_step_was_marked():
    raw = {"metrics": {"val_accuracy": 0.8}, "samples": 300, "steps": 10, "loop_start": 102.0, "loop_end": 105.0}
    out = result_from_report(raw, 100.0, 105.5)
    t = out["timings"]
    assert t["split"] is True
    assert t["startup_s"] == pytest.approx(2.0) and t["loop_s"] == pytest.approx(3.0)
    assert t["teardown_s"] == pytest.approx(0.5)
    assert t["spawned_at"] == 100.0 and t["finished"] == 105.5
    assert out["metrics"] == {"val_accuracy": 0.8}
    assert out["throughput"]["samples"] == 300 and out["throughput"]["steps"] == 10
    assert out["throughput"]["samples_per_s"] == pytest.approx(100.0)


def test_result_from_report_of_nothing_keeps_the_wall_time_unsplit():
    out = result_from_report(None, 100.0, 107.0)
    t = out["timings"]
    assert t["split"] is False
    assert t["startup_s"] is None and t["loop_s"] is None and t["teardown_s"] is None
    assert t["finished"] - t["spawned_at"] == pytest.approx(7.0)
    assert out["metrics"] == {} and out["throughput"]["samples"] == 0
    assert out["throughput"]["samples_per_s"] is None


def test_result_file_written_by_the_helper_round_trips_into_split_timings(tmp_path):
    path = tmp_path / "r.json"
    spawned = time.time()
    result = TrainingResult(str(path))
    result.first_step()
    result.step(8)
    result.step(8)
    result.finish(metrics={"val_accuracy": 0.6})
    out = result_from_report(json.loads(path.read_text()), spawned, time.time())
    assert out["timings"]["split"] is True and out["timings"]["startup_s"] >= 0 and out["timings"]["loop_s"] >= 0
    assert out["throughput"]["samples"] == 16 and out["metrics"] == {"val_accuracy": 0.6}


def test_unquoted_booleans_reach_the_program_as_written_and_null_is_refused():
    assert WORKLOAD.typed("argv", ["prog", True, False, 3, 0.5], "sweep.fixed") == ["prog", "true", "false", "3", "0.5"]
    with pytest.raises(ConfigError, match="null"):
        WORKLOAD.typed("argv", ["prog", None], "sweep.fixed")
