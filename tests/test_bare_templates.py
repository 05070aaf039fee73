"""Overrides as users write them: a bare {name} in an argv list is a template, not Hydra's dict syntax; a value of
the wrong type is told the type its key takes (issue 28)."""
from __future__ import annotations

import pytest

from gpupack import sweep
from gpupack.errors import ConfigError
from gpupack.sweep.setup.compose import quote_fields


@pytest.mark.parametrize("given, expected", [
    # as the shell hands it over after stripping the user's single quotes
    ("sweep.fixed.argv=[{python},train.py,--lr,{lr}]", 'sweep.fixed.argv=["{python}",train.py,--lr,"{lr}"]'),
    ("+sweep.fixed.argv=[{python}, {seed} ,{x!r}]", '+sweep.fixed.argv=["{python}", "{seed}" ,"{x!r}"]'),
    ("sweep.fixed.argv=[{lr:.0e}]", "sweep.fixed.argv=[{lr:.0e}]"),  # a dict to Hydra: it needs its quotes
    ("+sweep.grid.opt={a:1}", "+sweep.grid.opt={a:1}"),  # a dict, refused as a hyperparameter further on
    ('sweep.fixed.argv=["{python}",t.py]', 'sweep.fixed.argv=["{python}",t.py]'),  # quoted already: unchanged
    ("sweep.fixed.cwd={lr}", 'sweep.fixed.cwd="{lr}"'),
    ("sweep.fixed.argv=[python,runs/{lr}]", "sweep.fixed.argv=[python,runs/{lr}]"),  # mixed: left to the HINT
    ("sweep.grid.tag=[{a},b]", 'sweep.grid.tag=["{a}",b]'),
    ("packing.factors=[1,2]", "packing.factors=[1,2]"),  # not a free key: Hydra's grammar as it is
    ("hydra.job.env_set={a:1}", "hydra.job.env_set={a:1}"),
])
def test_bare_template_items_are_quoted_for_the_free_keys_only(given, expected):
    assert quote_fields(given) == expected


def test_a_bare_python_and_lr_reach_the_command_workload_as_templates(tmp_path):
    prepared = sweep.prepare(["+sweep=command", "sweep.fixed.argv=[{python},examples/train.py,--lr,{lr}]",
                              "sweep.grid.lr=[0.1,0.03]", "packing.factors=[1]", f"run_dir={tmp_path / 'run'}"])
    argv = {tuple(t.params["argv"]) for p in prepared.plan.packs for t in p.trainings}
    assert argv == {("{python}", "examples/train.py", "--lr", "{lr}")}


@pytest.mark.parametrize("override, needle", [
    ("packing.repeats=two", "HINT: packing.repeats takes a whole number"),
    ("dry_run=maybe", "HINT: dry_run takes true or false"),
    ("packing.memory_fraction=lots", "HINT: packing.memory_fraction takes a number"),
])
def test_a_value_of_the_wrong_type_is_told_its_type(override, needle):
    with pytest.raises(ConfigError) as err:
        sweep.prepare(["+sweep=mnist_pack", override])
    assert needle in str(err.value) and "gpupack/sweep/setup/config.py" not in str(err.value), str(err.value)


def test_the_help_s_command_example_plans_as_pasted(tmp_path, monkeypatch):
    """--help's `command` line, split as a shell splits it, plans the sweep it shows (from the repo, where it runs)."""
    import shlex
    from pathlib import Path

    from gpupack.cli import help_text

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    line = next(text for text in help_text([]).splitlines() if "+sweep=command" in text)
    words = shlex.split(line, comments=True)
    assert words[:3] == ["python", "-m", "gpupack"]  # a whole command, as tests/test_doc_commands.py runs it
    words = words[3:]
    prepared = sweep.prepare([*words, "packing.factors=[1]", f"run_dir={tmp_path / 'run'}"])
    assert {t.params["lr"] for p in prepared.plan.packs for t in p.trainings} == {0.1, 0.03}
    assert {tuple(t.params["argv"]) for p in prepared.plan.packs for t in p.trainings} == {
        ("{python}", "examples/train.py", "--lr", "{lr}")}


def test_a_dry_run_prints_the_first_training_s_real_command_line(tmp_path, capsys, monkeypatch):
    import sys
    from pathlib import Path

    from gpupack.cli import main

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    assert main(["+sweep=command", "sweep.fixed.argv=[{python},examples/train.py,--lr,{lr}]", "sweep.grid.lr=[0.1]",
                 "packing.factors=[1]", "dry_run=true", f"run_dir={tmp_path / 'run'}"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    import tempfile

    # its spec and result in the job's node-local work folder, not the run directory
    work = f"{tempfile.gettempdir()}/gpupack-local-process-n01-000-XXXXXXXX/"  # mkdtemp's folder, its suffix unknown
    assert f"its command line: GPUPACK_RESULT={work}" in out, out
    assert f"{sys.executable} examples/train.py --lr 0.1" in out and "{lr}" not in out.split("command line:")[1], out
    assert not (tmp_path / "run").exists()  # named, not written
