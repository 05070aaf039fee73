"""Slice partitions are named without dots (issue 43, item 2), so their keys are addressable from the command
line; an old dotted name is refused with its new one."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupack.cli import main

REPO = Path(__file__).resolve().parent.parent
BASE = ["+sweep=mnist_pack", "cluster.account=def-x", "dry_run=true"]


def run(argv: list[str], tmp_path: Path, capsys: Any, monkeypatch: Any) -> tuple[int, str, str]:
    """The CLI away from any cluster (no sinfo on PATH): the preset alone is checked. (exit code, stdout, stderr)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    code = main(BASE + argv + [f"run_dir={tmp_path / 'run'}"])
    out, err = capsys.readouterr()
    return code, out, err.strip()


def refused_line(code: int, err: str, run_dir: Path) -> str:
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("gpupack: error: "), err
    assert "HINT: " in err and "Traceback" not in err, err
    assert not run_dir.exists()  # nothing written, so nothing submitted
    return err


# ---------------- slice partitions: named without dots ----------------

OLD_NAMES = [
    (["cluster=rorqual", "partitions=[h100,h100_1g.10gb]"],
     ["partitions[1]='h100_1g.10gb'", "named without dots", "HINT: partitions=[h100,h100_1g_10gb]"]),
    (["cluster=narval", "partitions=[a100_3g.20gb]"], ["HINT: partitions=[a100_3g_20gb]"]),
    (["cluster=fir", "partitions=[h100_1g_10gb]", "cluster.partitions.h100_1g.10gb.gpus_per_job=2"],
     ["cannot parse", "HINT: cluster.partitions.h100_1g_10gb.gpus_per_job=2 (a partition's name has no dot)"]),
]


@pytest.mark.parametrize("overrides, needles", OLD_NAMES, ids=[" ".join(r[0]) for r in OLD_NAMES])
def test_an_old_dotted_slice_name_is_refused_with_its_new_name(tmp_path: Path, capsys: Any, monkeypatch: Any,
                                                               overrides: list[str], needles: list[str]) -> None:
    line = refused_line(*run(overrides, tmp_path, capsys, monkeypatch)[::2], tmp_path / "run")
    for needle in needles:
        assert needle in line, line


def test_no_preset_names_a_partition_with_a_dot() -> None:
    from gpupack.setup.compose import compose_config

    for preset in sorted(p.stem for p in (REPO / "conf" / "cluster").glob("*.yaml")):
        cfg = compose_config(["+sweep=mnist_pack", f"cluster={preset}"])
        names = list(cfg.cluster.get("partitions", {}))
        assert not [n for n in names if "." in n], (preset, names)
