"""A search's report.html as a person sees it (issue 46, item 5): a real search of 24 trials at N=4, its page opened
in headless Chromium at 1280x900 (tier `browser`, as tests/test_report_browser.py): the search's best trial and its
ranked trials come right after what ran, the table fits the page, the history plot is drawn."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

from tests.conftest import REPO
from tests.test_report_browser import page as page  # noqa: F401 (the fixture: report.html open in Chromium)
from tests.test_search import search_cmd

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # a report made by a real run


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The report.html of a search of 24 trials (more than the table's top 20: the rest behind a disclosure)."""
    run = tmp_path_factory.mktemp("search-browser") / "run"
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(search_cmd(run, 24, "collect.plots=true"), env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    yield run / "report.html"


def test_the_search_comes_after_what_ran_and_before_the_answer(page: "Page") -> None:
    order = page.evaluate("""() => [...document.querySelectorAll('section')].map(s => s.id)""")
    assert order[:3] == ["what-ran", "search", "answer"], order
    best = page.inner_text("#search .answer p.best")
    assert best.startswith("Best trial: sleep_s=") and "→ val_accuracy" in best
    assert page.is_visible("#search table")


def test_the_ranked_trials_fit_the_page_and_hold_every_trial(page: "Page") -> None:
    column = page.evaluate("document.body.clientWidth")
    widths = page.evaluate("[...document.querySelectorAll('#search table')]"
                           ".map(t => t.getBoundingClientRect().right)")
    assert len(widths) == 2 and max(widths) <= column, (widths, column)
    trials = page.evaluate("[...document.querySelectorAll('#search tbody tr')]"
                           ".map(r => +r.cells[0].textContent)")
    assert sorted(trials) == list(range(24))


def test_the_history_plot_is_drawn(page: "Page") -> None:
    size = page.evaluate("""() => { const img = document.querySelector('#search figure img');
                                    return img ? [img.naturalWidth, img.getBoundingClientRect().width] : []; }""")
    assert size and size[0] > 0 and 0 < size[1] <= 1280, size
