"""The run's header says how its trainings start: forked from a preloaded server, or fresh and why (issue 28)."""
from __future__ import annotations

import pytest

from gpupack import sweep
from gpupack.cli import main

ARGV = "sweep.fixed.argv=[{python},examples/train.py,--lr,{lr}]"


@pytest.mark.parametrize("overrides, expected", [
    (["+sweep=mnist_pack"], {"process": "fork: each training is forked from one server per pack"}),
    (["+sweep=mnist_pack", "packing.process.start=fresh"],
     {"process": "fresh: a new interpreter per training (packing.process.start=fresh)"}),
    (["+sweep=command", ARGV, "sweep.grid.lr=[0.1]"],
     {"process": "fresh: a new interpreter per training (a program starts fresh unless sweep.fixed.start=fork"}),
    (["+sweep=command", ARGV, "sweep.grid.lr=[0.1]", "sweep.fixed.start=fork"],
     {"process": "fork: each training is forked"}),
    (["+sweep=mnist_tf_pack"],
     {"process": "fresh: a new interpreter per training (TensorFlow starts threads at import)",
      "tf_logical": "one process per pack runs its N trainings (tf_logical)"}),
    (["+sweep=mnist_pack", "packing.modes=[process,fused]"],
     {"process": "fork:", "fused": "one process per pack runs its N trainings (fused)"}),
])
def test_each_mode_says_how_its_trainings_start(overrides, expected):
    spec = sweep.prepare(overrides).spec
    assert spec is not None
    notes = spec.start_notes()
    assert set(notes) == set(expected)
    for mode, start in expected.items():
        assert notes[mode].startswith(start), notes[mode]


def test_the_header_prints_it_before_anything_runs(tmp_path, capsys):
    code = main(["+sweep=command", ARGV, "sweep.grid.lr=[0.1]", "sweep.fixed.start=fork", "dry_run=true",
                 f"run_dir={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert code == 0
    assert "trainings start (process): fork: each training is forked from one server per pack" in " ".join(out.split())
