"""A typo in any config group's key gets the nearest key of that group in its HINT, written as the override to type
(issue 43, item 4); ``sweep=NAME`` without its ``+`` and an empty ``partitions=[]`` are refused in one line. Each row
runs the real CLI: one line, exit 2, nothing written."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupack.cli import main

# (overrides, what the one line must hold: the key as given, and the HINT's fix)
ROWS = [
    # cluster=local has no account: the key is a SLURM cluster's, and the HINT says so
    (["+sweep=mnist_pack", "cluster.accout=def-someone"],
     ["cluster.accout='def-someone'", "HINT: did you mean cluster.account=def-someone?", "cluster=slurm"]),
    (["+sweep=mnist_pack", "cluster.cpus_per_trainig=0.25"],
     ["cluster.cpus_per_trainig='0.25'", "HINT: did you mean cluster.cpus_per_training=0.25?"]),
    (["+sweep=mnist_pack", "cluster=narval", "cluster.accout=def-someone"],
     ["cluster.accout='def-someone'", "HINT: did you mean cluster.account=def-someone?"]),
    (["+sweep=mnist_pack", "cluster=slurm", "cluster.cpus_per_trainig=0.25"],
     ["HINT: did you mean cluster.cpus_per_training=0.25"]),
    # a partition's keys: cluster.partitions.X.*
    (["+sweep=mnist_pack", "cluster=narval", "cluster.partitions.a100.bundle_core=12"],
     ["cluster.partitions.a100.bundle_core='12'", "HINT: did you mean cluster.partitions.a100.bundle_cores=12 "]),
    (["+sweep=mnist_pack", "cluster.partitions.a100.gpu=a100"],
     ["cluster.partitions.a100.gpu='a100'", "HINT: cluster.partitions is a key of clusters with backend slurm"]),
    # packing.*, a mode's packing.<mode>.*, packing.auto.*
    (["+sweep=mnist_pack", "packing.factorz=[1,2]"],
     ["packing.factorz='[1,2]'", "HINT: did you mean packing.factors=[1,2]?"]),
    (["+sweep=mnist_pack", "packing.process.mpz=on"], ["HINT: did you mean packing.process.mps=on?"]),
    (["+sweep=mnist_pack", "packing.auto.min_gian=0.1"], ["HINT: did you mean packing.auto.min_gain=0.1?"]),
    # collect.*, sweep.*, rgu.*, the top level
    (["+sweep=mnist_pack", "collect.metrik=train_loss"],
     ["collect.metrik='train_loss'", "HINT: did you mean collect.metric=train_loss?"]),
    (["+sweep=mnist_pack", "sweep.training_estimat_s=60"],
     ["HINT: did you mean sweep.training_estimate_s=60 "]),
    (["+sweep=mnist_pack", "sweep.gridd.lr=[0.1]"],
     ["sweep.gridd.lr='[0.1]'", "HINT: did you mean sweep.grid.lr=[0.1]?"]),
    (["+sweep=mnist_pack", "rgu.sourc=x"], ["HINT: did you mean rgu.source=x?"]),
    (["+sweep=mnist_pack", "partitons=[local]"], ["HINT: did you mean partitions=[local]?"]),
    # a key added with + where its node declares its keys: Hydra appends it past the struct flag; refused the same
    # (dry_run=true: were it let through, the row ends at once, exit 0)
    (["+sweep=mnist_pack", "+cluster.accout=def-someone", "dry_run=true"],
     ["cluster.accout='def-someone'", "HINT: did you mean cluster.account=def-someone?", "cluster=slurm"]),
    (["+sweep=mnist_pack", "cluster=narval", "+cluster.partitions.a100.bundle_core=12", "dry_run=true"],
     ["cluster.partitions.a100.bundle_core='12'", "HINT: did you mean cluster.partitions.a100.bundle_cores=12"]),
    (["+sweep=mnist_pack", "+packing.auto.min_gian=0.1", "dry_run=true"],
     ["HINT: did you mean packing.auto.min_gain=0.1?"]),
    (["+sweep=mnist_pack", "+dry_rn=true", "dry_run=true"], ["dry_rn='true'", "HINT: did you mean dry_run=true"]),
    # the + forgotten, and an empty list of partitions
    (["sweep=mnist_pack"], ["sweep='mnist_pack'", "HINT: write +sweep=mnist_pack"]),
    (["+sweep=mnist_pack", "partitions=[]"], ["partitions=[]", "chooses no partition", "partitions=null"]),
    (["+sweep=mnist_pack", "cluster=slurm", "partitions=[]"], ["partitions=[]", "chooses no partition"]),
]


@pytest.mark.parametrize("overrides, needles", ROWS, ids=[" ".join(r[0]) for r in ROWS])
def test_a_typo_is_one_line_naming_the_key_meant(tmp_path: Path, capsys: Any, overrides: list[str],
                                                  needles: list[str]) -> None:
    run_dir = tmp_path / "run"
    code = main([*overrides, f"run_dir={run_dir}"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("gpupack: error: "), err
    assert "Traceback" not in err and "nothing is available" not in err, err
    for needle in needles:
        assert needle in err, err
    assert not run_dir.exists()  # refused before anything was written, so before anything was submitted


# The HINT's override is itself accepted: applied in place of the typo, the same command plans (a dry run).
FIXES = [  # (the other overrides, the typo, the HINT's fix)
    (["cluster=narval"], "cluster.accout=def-someone", "cluster.account=def-someone"),
    (["cluster=slurm"], "cluster.cpus_per_trainig=0.25", "cluster.cpus_per_training=0.25"),
    ([], "packing.factorz=[1,2]", "packing.factors=[1,2]"),
    (["collect.goal=min"], "collect.metrik=train_loss", "collect.metric=train_loss"),
]


@pytest.mark.parametrize("others, typo, fix", FIXES, ids=[f[2] for f in FIXES])
def test_the_hinted_key_is_accepted(tmp_path: Path, capsys: Any, monkeypatch: Any, others: list[str], typo: str,
                                    fix: str) -> None:
    from gpupack.submit.slurm import commands

    monkeypatch.setattr(commands, "slurm_command", lambda *args, **kwargs: None)  # away from any cluster
    base = ["+sweep=mnist_pack", f"run_dir={tmp_path / 'run'}", *others]
    assert main([*base, typo]) == 2
    assert f"did you mean {fix}" in capsys.readouterr().err  # the nearest key first
    assert main([*base, fix, "dry_run=true"]) == 0, capsys.readouterr().err
