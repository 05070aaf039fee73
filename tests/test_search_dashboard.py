"""A running search's study opened in Optuna's own dashboard (issue 52, item 2), as the README says to watch one:
``optuna-dashboard RUN_DIR/search/study.log``, its page in headless Chromium (tier ``browser``): every trial is
listed with its state, the running one among them, and a trial's lane is among its user attributes."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpupack.core.store.claims import Claimant
from gpupack.search.options import read_search
from gpupack.search.study import COMPLETE, FAILED, Study, TrialRow
from tests.test_report_browser import CHROMIUM

pytestmark = [pytest.mark.browser]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_optuna_dashboard_lists_a_running_searchs_trials(tmp_path: Path) -> None:
    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed: pip install -e '.[test]'")
    sync_api = pytest.importorskip("playwright.sync_api", exc_type=ImportError,
                                   reason="playwright is not installed: pip install -e '.[test]'")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    study = Study(tmp_path / "run" / "search" / "study.log")
    study.create(read_search({"space": {"lr": "tag(log, interval(1e-3, 1))"}, "n_trials": 8, "pruner": "none"},
                             None, "max", None), "probe", {})
    lane = Claimant.here("local-process-n04-s000", None)
    rows = [study.ask(lane) for _ in range(3)]
    assert all(isinstance(r, TrialRow) for r in rows)
    study.tell(0, COMPLETE, 0.8651, device_s=2.0)
    study.tell(1, FAILED, None, "boom")  # trial 2 still runs
    port = free_port()
    command = [str(Path(sys.executable).parent / "optuna-dashboard"), "--host", "127.0.0.1", "--port", str(port),
               str(study.path)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2).read()
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            try:
                tab = browser.new_page(viewport={"width": 1280, "height": 900})
                tab.goto(f"http://127.0.0.1:{port}/dashboard/studies/0/trials", wait_until="networkidle")
                tab.get_by_text("Trial 2", exact=False).first.wait_for(timeout=20_000)
                text = tab.inner_text("body")
            finally:
                browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "gpupack" in text  # the study's name
    for shown in ("Trial 0", "Trial 1", "Trial 2", "Complete", "Fail", "Running",  # each trial, with its state
                  "0.8651", "local-process-n04-s000", "device_s"):  # the first one's value, lane and device time
        assert shown in text, text[:2000]
