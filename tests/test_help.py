"""--help and --info as a user reads them: every config group with a line saying what it does (search included), the
overrides most runs change, and what is installed for each optional part."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(flag: str) -> str:
    done = subprocess.run([sys.executable, "-m", "gpupack", flag], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_lists_every_config_group_with_a_line_and_the_overrides_most_runs_change():
    out = _run("--help")
    groups = sorted(d.name for d in (REPO / "conf").iterdir() if d.is_dir() and not d.name.startswith("_"))
    assert "search" in groups
    listed = out.partition("Config groups")[2].partition("The overrides")[0].splitlines()
    for group in groups:  # "  search: what it does", then its options on the next line
        at = next(i for i, line in enumerate(listed) if line.startswith(f"  {group}: "))
        assert len(listed[at]) > len(f"  {group}: ") + 20, listed[at]
        options = sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml") if not p.stem.endswith("_schema"))
        assert all(o in listed[at + 1] for o in options), (group, listed[at + 1])
    said = out.partition("The overrides most runs change:")[2].splitlines()[1:4]
    assert [line.split()[0] for line in said] == ["packing.factors=[1,2,4]", "run_dir=PATH", "dry_run=true"], said


def test_info_says_what_is_installed_for_search_and_the_browser_tier():
    out = _run("--info")
    assert f"search=optuna: Optuna {importlib.metadata.version('optuna')}" in out, out
    assert "the browser tier (pytest -m browser): chromium " in out and ", playwright " in out, out
    assert "  search: optuna" in out.partition("Config groups:")[2], out
