"""The site's rules as data in the presets (issue 43, item 2): each preset's ``rules:`` is checked before anything is
submitted, dry runs included, and a refusal is one line quoting the rule (its words, page and date), the key and
the value, with a HINT; what the site allows is accepted. Slice partitions are named without dots, so their keys
are addressable from the command line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpupack.cli import main
from gpupack.core.store.rundir import RunDir
from gpupack.errors import ConfigError
from gpupack.submit.slurm import PartitionConfig, SiteRule, SiteRules, SlurmConfig, SlurmSubmitter, is_day

REPO = Path(__file__).resolve().parent.parent
BASE = ["+sweep=mnist_pack", "cluster.account=def-x", "dry_run=true"]
MIG_WORDS = '("requesting more than one MIG instance in a job is not permitted", Alliance "Multi-Instance GPU"'


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


# (overrides, refused: the needles of its one line; accepted: None)
MIG = [
    # one MIG instance per job, in force on Fir and Nibi since 2026-04-06 and Rorqual since 2026-04-17
    (["cluster=fir", "partitions=[h100_1g_10gb]", "cluster.partitions.h100_1g_10gb.gpus_per_job=2"],
     ["cluster.partitions.h100_1g_10gb.gpus_per_job=2: fir allows one MIG instance per job", MIG_WORDS,
      "since 2026-04-06)", "HINT: cluster.partitions.h100_1g_10gb.gpus_per_job=1"]),
    (["cluster=nibi", "partitions=[h100_3g_40gb]", "cluster.partitions.h100_3g_40gb.gpus_per_job=4"],
     ["cluster.partitions.h100_3g_40gb.gpus_per_job=4: nibi allows one MIG instance per job", MIG_WORDS,
      "since 2026-04-06)"]),
    (["cluster=rorqual", "partitions=[h100_2g_20gb]", "cluster.partitions.h100_2g_20gb.gpus_per_job=2"],
     ["cluster.partitions.h100_2g_20gb.gpus_per_job=2: rorqual allows one MIG instance per job", MIG_WORDS,
      "since 2026-04-17)"]),
    # a slice not chosen for this run is checked too: its value is refused where it is declared
    (["cluster=fir", "partitions=[h100]", "cluster.partitions.h100_1g_10gb.gpus_per_job=2"],
     ["cluster.partitions.h100_1g_10gb.gpus_per_job=2", MIG_WORDS]),
    # Narval: announced, not in force; set in force, it refuses
    (["cluster=narval", "partitions=[a100_1g_5gb]", "cluster.partitions.a100_1g_5gb.gpus_per_job=2",
      "packing.factors=[1]"], None),
    (["cluster=narval", "partitions=[a100_1g_5gb]", "cluster.partitions.a100_1g_5gb.gpus_per_job=2",
      "packing.factors=[1]", "cluster.rules.one_mig_per_job.in_force=true"],
     ["cluster.partitions.a100_1g_5gb.gpus_per_job=2: narval allows one MIG instance per job", MIG_WORDS]),
    # a full GPU may be 2 a job; one slice a job is what the rule allows
    (["cluster=fir", "partitions=[h100]", "cluster.partitions.h100.gpus_per_job=2"], None),
    (["cluster=rorqual", "partitions=[h100]", "cluster.partitions.h100.gpus_per_job=2"], None),
    (["cluster=fir", "partitions=[h100_1g_10gb]", "packing.factors=[1]"], None),
    # one training spread over 2 slices asks one job for 2 of them: refused too; over a full GPU's partition, not
    (["cluster=fir", "partitions=[h100_1g_10gb]", "packing.factors=[1]", "spread.devices=[1,2]"],
     ["spread.devices[1]=2: on partition h100_1g_10gb: fir allows one MIG instance per job", MIG_WORDS,
      "HINT: spread.devices=[1]"]),
    (["cluster=fir", "partitions=[h100]", "packing.factors=[1]", "spread.devices=[1,2]"], None),
    # a partition the user marks as a slice is held to the rule; the generic preset records no rule
    (["cluster=fir", "partitions=[h100]", "cluster.partitions.h100.mig=true",
      "cluster.partitions.h100.gpus_per_job=2"], ["cluster.partitions.h100.gpus_per_job=2", MIG_WORDS]),
    (["cluster=slurm", "partitions=[a100]", "cluster.partitions.a100.mig=true",
      "cluster.partitions.a100.gpus_per_job=2"], None),
]

MODEL = [
    (["cluster=nibi", "cluster.partitions.h100.gpu=null"],
     ["cluster.partitions.h100.gpu=None: nibi refuses a GPU request that names no model",
      '("every GPU request must name a GPU model", Alliance "Scheduling policy updates" (2026))',
      "HINT: cluster.partitions.h100.gpu=h100"]),
    (["cluster=narval", "partitions=[a100_1g_5gb]", "cluster.partitions.a100_1g_5gb.gpu=null"],
     ["cluster.partitions.a100_1g_5gb.gpu=None: narval refuses", "HINT: cluster.partitions.a100_1g_5gb.gpu=a100_"]),
    (["cluster=trillium", "cluster.partitions.h100.gpu=null"], ["cluster.partitions.h100.gpu=None: trillium"]),
    (["cluster=slurm", "partitions=[v100]", "cluster.partitions.v100.gpu=null"], None),  # any GPU: no rule here
    (["cluster=fir", "cluster.partitions.h100.gpu=null", "cluster.rules.gpu_model.in_force=false"], None),
]

WHOLE_NODE = [  # Trillium: 1 GPU or a whole node of 4, its words quoted
    (["cluster=trillium", "cluster.partitions.h100.gpus_per_job=2"],
     ["cluster.partitions.h100.gpus_per_job=2", "1 GPU or a whole node of 4",
      '("1 GPU or multiples of 4", Alliance "Trillium")', "HINT: cluster.partitions.h100.gpus_per_job=1 (or 4)"]),
    (["cluster=trillium", "cluster.partitions.h100.gpus_per_job=4", "packing.factors=[8]"], None),
    (["cluster=trillium", "packing.factors=[8]"], None),
]

RULE_VALUES = [  # a rule's own keys, checked on any preset
    (["cluster=fir", "cluster.rules.one_mig_per_job.since=6 April 2026"],
     ["cluster.rules.one_mig_per_job.since='6 April 2026'", "YYYY-MM-DD", "since=2026-04-06"]),
    (["cluster=fir", "cluster.rules.gpu_model.source="], ["cluster.rules.gpu_model.source=''", "page"]),
    (["cluster=slurm", "cluster.rules.whole_node.since=2026-01-01"], ["cluster.rules.whole_node.quote=''", "words"]),
]

TABLES = MIG + MODEL + WHOLE_NODE + RULE_VALUES


@pytest.mark.parametrize("overrides, needles", TABLES, ids=[" ".join(r[0]) for r in TABLES])
def test_a_site_rule_refuses_in_one_line_quoting_it_and_accepts_what_the_site_allows(
        tmp_path: Path, capsys: Any, monkeypatch: Any, overrides: list[str], needles: list[str] | None) -> None:
    code, out, err = run(overrides, tmp_path, capsys, monkeypatch)
    if needles is None:
        assert code == 0 and "dry run: nothing was written or submitted." in out, err
        return
    line = refused_line(code, err, tmp_path / "run")
    for needle in needles:
        assert needle in line, line


# The check itself, pure: (partition, rules, the key its refusal names or None where allowed)
MIG_RULE = SiteRules(one_mig_per_job=SiteRule(quote="one slice", source="page", since="2026-04-06"))
MODEL_RULE = SiteRules(gpu_model=SiteRule(quote="name a model", source="page"))
PURE = [
    (PartitionConfig(gpu="s", mig=True, gpus_per_job=2), MIG_RULE, "gpus_per_job"),
    (PartitionConfig(gpu="s", mig=True, gpus_per_job=1), MIG_RULE, None),
    (PartitionConfig(gpu="h100", gpus_per_job=2), MIG_RULE, None),  # a whole GPU
    (PartitionConfig(gpu="s", mig=True, gpus_per_job=2), SiteRules(), None),  # no rule recorded
    (PartitionConfig(gpu="s", mig=True, gpus_per_job=2),
     SiteRules(one_mig_per_job=SiteRule(quote="one slice", source="page", in_force=False)), None),  # announced
    (PartitionConfig(gpu=None), MODEL_RULE, "gpu"),
    (PartitionConfig(gpu=""), MODEL_RULE, "gpu"),
    (PartitionConfig(gpu=None, request="gres"), MODEL_RULE, "gpu"),
    (PartitionConfig(gpu=None, request="none"), MODEL_RULE, None),  # a CPU partition asks for no GPU
    (PartitionConfig(gpu=None), SiteRules(), None),
]


@pytest.mark.parametrize("part, rules, refused", PURE)
def test_the_rule_check_refuses_exactly_what_the_rule_forbids(tmp_path: Path, part: PartitionConfig,
                                                              rules: SiteRules, refused: str | None) -> None:
    sub = SlurmSubmitter(SlurmConfig(name="site", backend="slurm", partitions={"p": part}, rules=rules),
                         RunDir(tmp_path))
    if refused is None:
        sub.check(["p"])
        return
    with pytest.raises(ConfigError) as err:
        sub.check(["p"])
    assert err.value.key == f"cluster.partitions.p.{refused}", err.value
    rule = rules.one_mig_per_job if refused == "gpus_per_job" else rules.gpu_model
    assert f'("{rule.quote}", {rule.source}' in str(err.value) and "HINT: " in str(err.value)


@pytest.mark.parametrize("text, day", [("2026-04-06", True), ("2026-4-6", False), ("2026-02-30", False),
                                       ("April 6", False), ("", False)])
def test_a_rules_date_is_a_calendar_day(text: str, day: bool) -> None:
    assert is_day(text) is day


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


@pytest.mark.slow
def test_no_preset_names_a_partition_with_a_dot() -> None:
    from gpupack.sweep.setup.compose import compose_config

    for preset in sorted(p.stem for p in (REPO / "conf" / "cluster").glob("*.yaml")):
        cfg = compose_config(["+sweep=mnist_pack", f"cluster={preset}"])
        names = list(cfg.cluster.get("partitions", {}))
        assert not [n for n in names if "." in n], (preset, names)


# ---------------- from outside: python -m gpupack ----------------

def gpupack(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(REPO)}  # no sinfo: away from any cluster
    env.pop("SLURM_ACCOUNT", None)
    return subprocess.run([sys.executable, "-m", "gpupack", *args, f"run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


@pytest.mark.slow
def test_a_slice_partitions_key_parses_from_the_command_line_and_the_rule_refuses_it(tmp_path: Path) -> None:
    proc = gpupack(["+sweep=mnist_pack", "cluster=fir", "cluster.account=def-x", "partitions=[h100_1g_10gb]",
                    "cluster.partitions.h100_1g_10gb.gpus_per_job=2", "dry_run=true"], tmp_path)
    line = refused_line(proc.returncode, proc.stderr.strip(), tmp_path / "run")
    assert line.startswith("gpupack: error: cluster.partitions.h100_1g_10gb.gpus_per_job=2: fir allows one MIG "
                           "instance per job " + MIG_WORDS + ", since 2026-04-06). HINT: "), line
    assert proc.stdout == ""  # refused before the plan is printed
    proc = gpupack(["+sweep=mnist_pack", "cluster=narval", "cluster.account=def-x", "partitions=[a100_1g_5gb]",
                    "cluster.partitions.a100_1g_5gb.gpus_per_job=2", "packing.factors=[1]", "dry_run=true"],
                   tmp_path)
    assert proc.returncode == 0 and "dry run: nothing was written or submitted." in proc.stdout, proc.stderr
    assert not (tmp_path / "run").exists()
