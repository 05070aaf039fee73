"""report.html as a person sees it: opened in headless Chromium (Playwright) at 1280x900, after one small real sweep
of the test workload. Tier `browser` (pytest -m browser); it needs Debian's chromium (/usr/bin/chromium, .ci/run
installs it) and playwright (the test extra), and skips with the reason where either is missing."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import REPO
from tests.test_report_page import sweep

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.quiet]  # a report made by a real run, its answer
CHROMIUM = "/usr/bin/chromium"
WIDTH, HEIGHT = 1280, 900


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small sweep's report.html (two grid points, N in [1, 2]), built once for the module."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    run = tmp_path_factory.mktemp("browser") / "run"
    sweep(run, env, "+sweep.grid.seed=[0]")
    return run / "report.html"


@pytest.fixture(scope="module")
def page(request: pytest.FixtureRequest) -> Iterator[Any]:
    """report.html open in Chromium at 1280x900, every disclosure opened (checked for a browser before the sweep
    runs)."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", exc_type=ImportError,
        reason="playwright is not installed: pip install -e '.[test]' (the browser tier opens report.html in Chromium "
               "through it)")
    if not Path(CHROMIUM).is_file() and shutil.which("chromium") is None:
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (the browser tier opens report.html "
                    "in it)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium"))
        try:
            tab = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            tab.goto(request.getfixturevalue("report").as_uri(), wait_until="load")
            tab.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")  # every table shown
            yield tab
        finally:
            browser.close()


def test_no_table_is_wider_than_the_page(page):
    column = page.evaluate("document.body.clientWidth")
    widths = page.evaluate("[...document.querySelectorAll('table')].map(t => t.scrollWidth)")
    assert widths and column <= WIDTH and max(widths) <= column, (widths, column)
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH  # no sideways scroll bar


def test_no_cell_says_true_or_false(page):
    cells = page.evaluate("[...document.querySelectorAll('td, th')].map(c => c.textContent.trim())")
    assert cells and not [c for c in cells if c.lower() in ("true", "false")]
    assert "chosen" in cells


def test_the_date_and_what_ran_come_first(page):
    said = page.evaluate("Object.fromEntries([...document.querySelectorAll('#what-ran tr')]"
                         ".map(r => [r.cells[0].textContent, r.cells[1].textContent]))")
    assert said["sweep"] == "probe_pack" and said["grid"] == "lr: 0.1, 0.2; seed: 0"
    # N=1's 2 packs and 2 more at its 1-thread set-up (this CPU gives N=1 two threads), N=2's pack of 2, the check
    assert said["date"][:2] == "20" and said["trainings"].startswith("7 completed, 0 failed")


def test_the_answer_and_the_best_hyperparameters_come_before_the_first_plot(page):
    before = page.evaluate("""() => {
        const img = document.querySelector('img');
        const ahead = id => !!(document.getElementById(id).compareDocumentPosition(img)
                               & Node.DOCUMENT_POSITION_FOLLOWING);
        return img ? [ahead('what-ran'), ahead('answer'), ahead('best-hyperparameters')] : [];
    }""")
    assert before == [True, True, True]
    assert page.locator("#answer p.best").first.inner_text().startswith("Best packing factor for")


def test_every_image_loads_and_every_log_link_names_a_file(page, report):
    images = page.evaluate("[...document.images].map(i => [i.alt, i.complete && i.naturalWidth])")
    assert len(images) >= 2 and all(width > 0 for _, width in images), images
    links = page.evaluate("[...document.querySelectorAll('#evidence a')].map(a => [a.closest('tr').cells[0]"
                          ".textContent, a.getAttribute('href')])")
    names = {name for name, _ in links}  # the grid's points, and new seeds of them (N=1's second set-up)
    assert {"lr=0.1, seed=0", "lr=0.2, seed=0"} <= names, names
    assert all(name.startswith(("lr=0.1, seed=", "lr=0.2, seed=")) for name in names), names
    assert all((report.parent / href).is_file() for _, href in links), links


def test_a_screenshot_of_the_page_is_kept_beside_it(page, report):
    """What the reader saw, kept: the whole page as Chromium drew it at 1280 px (report-browser.png beside the
    report), for a person to look at when a check above goes red."""
    shot = report.parent / "report-browser.png"
    page.screenshot(path=str(shot), full_page=True)
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(head[16:20], "big") == WIDTH
