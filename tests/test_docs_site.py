"""The documentation: a README read in minutes, and a site (mkdocs.yml over docs/) whose every page is in its
navigation and whose links hold. The README's test command builds the site with --strict; these tests say what
that build refuses, on a copy."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

import gpupack

REPO = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200


def test_the_readme_is_read_in_minutes() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail to a page of docs/"


def _nav_pages(nav: object) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_nav_pages(item) for item in nav)) if nav else set()
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(value) for value in nav.values()))
    return set()


def test_every_page_is_in_the_navigation_and_every_readme_link_to_docs_holds() -> None:
    generated = {"changelog.md", "getting-started.md"}  # the root's CHANGELOG.md and README.md (mkdocs_hooks)
    nav = _nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]) - generated
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert pages == nav, f"in docs/ but not in the nav: {pages - nav}; in the nav but not in docs/: {nav - pages}"
    readme = (REPO / "README.md").read_text()
    linked = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert linked and all((REPO / target).exists() for target in linked), linked


def _build(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(root / "site")], cwd=root,
                          capture_output=True, text=True)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    pytest.importorskip("mkdocs", reason="the test extra installs mkdocs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "mkdocs_hooks.py", tmp_path / "scripts")
    shutil.copy(REPO / "CHANGELOG.md", tmp_path / "CHANGELOG.md")
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    for package in ("gpupack", "hydra_plugins"):  # what the API reference reads
        (tmp_path / package).symlink_to(REPO / package)
    return tmp_path


@pytest.mark.parametrize("breakage, said", [
    (None, None),
    ("\n[a page that is not there](no-such-page.md)\n", "no-such-page.md"),
    ("\n[an anchor that is not there](search.md#no-such-heading)\n", "no-such-heading"),
    ("\n::: gpupack.no_such_module\n", "gpupack.no_such_module"),  # an API reference to nothing
])
def test_the_strict_build_refuses_a_dead_link(copy: Path, breakage: str | None, said: str | None) -> None:
    if breakage is not None:
        with open(copy / "docs" / "gpu.md", "a") as page:
            page.write(breakage)
    built = _build(copy)
    if said is None:
        assert built.returncode == 0, built.stderr
        assert (copy / "site" / "search" / "index.html").exists()
        assert "Unreleased" in (copy / "site" / "changelog" / "index.html").read_text()  # the root CHANGELOG.md
        assert "Make it small" in (copy / "site" / "getting-started" / "index.html").read_text()  # and README.md
        api = (copy / "site" / "api" / "index.html").read_text()  # the public surface, from its docstrings
        assert "TrainingContext" in api and "Aggregate the records of one or more runs" in api
    else:
        assert built.returncode != 0 and said in built.stderr, built.stderr


def test_a_page_left_out_of_the_navigation_fails_the_build(copy: Path) -> None:
    (copy / "docs" / "orphan.md").write_text("# An orphan\n")
    built = _build(copy)
    assert built.returncode != 0 and "orphan.md" in built.stderr, built.stderr


def test_the_changelog_keeps_a_changelogs_form_and_the_version_has_one_home() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[([^\]]+)\](.*)$", text, flags=re.M)
    assert releases and releases[0][0] == "Unreleased", releases
    for version, date in releases[1:]:
        assert re.fullmatch(r"\d+\.\d+\.\d+", version) and re.fullmatch(r" - \d{4}-\d{2}-\d{2}", date), (version, date)
    newest = [tuple(map(int, v.split("."))) for v, _ in releases[1:]]
    assert all(v <= tuple(map(int, gpupack.__version__.split("."))) for v in newest), (newest, gpupack.__version__)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gpupack.__version__"}
