"""Each mode's and strategy's options dataclass checks its own values: every value the user gave is checked, whether or
not this sweep uses that mode or strategy, and a bad one is refused in one line (exit 2) naming the key, the value
and a HINT, before anything is written or submitted."""
from __future__ import annotations

from typing import Any

import pytest

from gpupack.cli import main
from gpupack.errors import ConfigError
from gpupack.job.pack.process import ProcessOptions
from gpupack.job.pack.tf_logical import TfLogicalOptions
from gpupack.job.spread.ddp import DdpOptions
from tests.fakes import FakeConfig, use_fake_submitter

BASE = ["+sweep=mnist_pack", "partitions=[v100]"]

# (overrides, what the one error line must hold: the key and the bad value, then the hint's words). The modes and the
# strategy these options belong to are not used unless the case says so.
BAD = [
    (["packing.modes=[fused]", "packing.process.start=bogus"],
     ["packing.process.start='bogus'", "unknown start method", "HINT: valid: auto, fork, fresh"]),
    (["packing.modes=[fused]", "packing.process.start=frsh"], ["packing.process.start='frsh'", "did you mean 'fresh'"]),
    (["packing.modes=[process]", "packing.process.start=bogus"], ["packing.process.start='bogus'", "valid: auto"]),
    (["packing.tf_logical.gpu_memory_reserve_mb=-5"],
     ["packing.tf_logical.gpu_memory_reserve_mb=-5", "must be a number of MB >= 0", "gpu_memory_reserve_mb=1024"]),
    (["packing.tf_logical.gpu_memory_budget_mb=0"],
     ["packing.tf_logical.gpu_memory_budget_mb=0", "must be a number of MB > 0 or null", "gpu_memory_budget_mb=8000"]),
    (["packing.modes=[fused]", "packing.tf_logical.gpu_memory_budget_mb=-1"],
     ["packing.tf_logical.gpu_memory_budget_mb=-1", "must be a number of MB > 0 or null"]),
    (["spread.ddp_backend=[gloo,xyz]"], ["spread.ddp_backend='xyz'", "unknown DDP backend", "valid: gloo, nccl"]),
    (["spread.ddp_backend=ncl"], ["spread.ddp_backend='ncl'", "did you mean 'nccl'"]),
    (["spread.ddp_backend=[]"], ["spread.ddp_backend=[]", "no DDP backend", "spread.ddp_backend=gloo"]),
    (["spread.ddp_backend=[gloo,gloo]"], ["spread.ddp_backend=['gloo', 'gloo']", "twice", "list each backend once"]),
    (["spread.strategy=mirrored", "spread.ddp_backend=[gloo,xyz]"], ["spread.ddp_backend='xyz'", "nccl"]),
]


@pytest.mark.parametrize("overrides, needles", BAD, ids=[" ".join(c[0]) for c in BAD])
def test_a_bad_option_is_refused_even_when_unused(tmp_path: Any, capsys: Any, monkeypatch: Any,
                                                  overrides: list[str], needles: list[str]) -> None:
    made = use_fake_submitter(monkeypatch, config=FakeConfig(run_packs=False))  # were it let through: no training
    run_dir = tmp_path / "run"
    code = main(BASE + overrides + [f"run_dir={run_dir}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("gpupack: error: "), err
    assert "HINT: " in err, err
    for needle in needles:
        assert needle in err, err
    assert not run_dir.exists()  # nothing written
    assert [b.ran for b in made] == [[]]  # the backend was asked what it has, and ran nothing


GOOD = [
    ["packing.modes=[fused]", "packing.process.start=fresh"],
    ["packing.process.start=fork", "packing.process.cpu_affinity=true"],
    ["packing.tf_logical.gpu_memory_reserve_mb=0", "packing.tf_logical.gpu_memory_budget_mb=4000"],
    ["packing.tf_logical.gpu_memory_budget_mb=null"],
    ["spread.ddp_backend=[gloo,nccl]"],
    ["spread.ddp_backend=nccl"],
]


@pytest.mark.parametrize("overrides", GOOD, ids=[" ".join(c) for c in GOOD])
def test_a_good_option_is_accepted(tmp_path: Any, capsys: Any, monkeypatch: Any, overrides: list[str]) -> None:
    made = use_fake_submitter(monkeypatch)
    code = main(BASE + overrides + ["dry_run=true", f"run_dir={tmp_path / 'run'}"])
    out, err = capsys.readouterr()
    assert code == 0 and "dry run: nothing was written" in out, out + err
    assert [b.ran for b in made] == [[]]


# The dataclasses on their own: (options, the key and the value of the ConfigError; None: accepted).
DIRECT = [
    (ProcessOptions(), None),
    (ProcessOptions(start="fresh", mps=True, cpu_affinity=True), None),
    (ProcessOptions(start="spawn"), ("packing.process.start", "spawn")),
    (TfLogicalOptions(), None),
    (TfLogicalOptions(gpu_memory_budget_mb=1, gpu_memory_reserve_mb=0), None),
    (TfLogicalOptions(gpu_memory_budget_mb=0), ("packing.tf_logical.gpu_memory_budget_mb", 0)),
    (TfLogicalOptions(gpu_memory_reserve_mb=-5), ("packing.tf_logical.gpu_memory_reserve_mb", -5)),
    (DdpOptions(), None),
    (DdpOptions(backend=["gloo", "nccl"]), None),
    (DdpOptions(backend="mpi"), ("spread.ddp_backend", "mpi")),
    (DdpOptions(backend=["gloo", "xyz"]), ("spread.ddp_backend", "xyz")),
]


@pytest.mark.parametrize("options, refused", DIRECT, ids=[repr(c[0]) for c in DIRECT])
def test_each_options_dataclass_checks_itself(options: Any, refused: tuple[str, Any] | None) -> None:
    if refused is None:
        options.check()
        return
    with pytest.raises(ConfigError) as err:
        options.check()
    assert (err.value.key, err.value.value) == refused and err.value.hint, err.value
