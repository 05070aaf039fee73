"""The documentation site as a reader sees it: built strictly into a temporary folder and opened in headless Chromium
(Playwright) at 1280x900. Tier `browser`; it needs Debian's chromium and playwright, and skips with the reason where
either is missing."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.test_docs_site import REPO, _nav_pages
from tests.test_report_browser import CHROMIUM, HEIGHT, WIDTH

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="the test extra installs mkdocs")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=REPO,
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return out


@pytest.fixture(scope="module")
def browser(site: Path) -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", exc_type=ImportError,
                                   reason="playwright is not installed: pip install -e '.[test]'")
    if not Path(CHROMIUM).is_file() and shutil.which("chromium") is None:
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium"))
        try:
            yield chromium
        finally:
            chromium.close()


def test_every_page_is_reached_from_the_home_pages_navigation(site: Path, browser: Any) -> None:
    tab = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    tab.goto((site / "index.html").as_uri(), wait_until="load")
    shown = "[...document.querySelectorAll('nav a')].filter(a => a.offsetParent !== null)"  # visible, not in a menu
    links = tab.evaluate(f"{shown}.map(a => a.href)")
    reached = {Path(href.split("#")[0].removeprefix("file://")).resolve() for href in links}
    folders = {r if r.suffix != ".html" else r.parent for r in reached}  # directory URLs: a page is its folder
    pages = _nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    where = {page: (site if page == "index.md" else site / Path(page).stem).resolve() for page in pages}
    missing = [page for page, folder in where.items() if folder not in folders]
    assert not missing, (missing, sorted(map(str, folders)))


def test_a_task_page_reads_at_1280_px(site: Path, browser: Any, tmp_path: Path) -> None:
    """The search page: its title, its commands in code blocks, no sideways scroll bar; a screenshot is taken."""
    tab = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    tab.goto((site / "search" / "index.html").as_uri(), wait_until="load")
    assert "Search" in tab.title()
    code = tab.evaluate("[...document.querySelectorAll('pre code')].map(c => c.textContent)")
    assert any("python -m gpupack" in c and "search=optuna" in c for c in code), code
    assert tab.evaluate("document.documentElement.scrollWidth") <= WIDTH  # no sideways scroll bar
    shot = tmp_path / "search.png"
    tab.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000  # a page drawn, not a blank one
