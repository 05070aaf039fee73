"""report.html's builder (gpupack.results.report.html), pure: records written with the library's writers in, HTML out.
What the page must hold for a person who reads it top-down; tests/test_report_browser.py checks the same in Chromium."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from gpupack.core.store.records import pack_record, training_record, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.results.analysis.aggregate import aggregate
from gpupack.results.analysis.occupancy import occupancy
from gpupack.results.report.html import Page, build_report, training_rows
from gpupack.results.report.plots import plot_cost
from gpupack.results.report.text import what_ran
from gpupack.sweep.flow.collect import collect
from tests.conftest import verdict

CONFIG = {"sweep": {"name": "toy", "workload": "w", "grid": {"lr": [0.1, 0.5], "batch_size": [64]}},
          "packing": {"factors": [1, 2], "modes": ["process"], "repeats": 2}, "cluster": {"name": "local"}}


def _pack(run: RunDir, factor: int, index: int, wall: float, statuses: list[str], partition: str = "local",
          job: str = "7", lrs: list[float] | None = None) -> None:
    pack_id = f"{partition}-process-n{factor:02d}-{index:03d}"
    start = 1_790_000_000.0 + 100 * index + 10 * factor
    for i, status in enumerate(statuses):
        tid = f"w-{factor}-{index}-{i}"
        lr = (lrs or [0.1, 0.5])[i % 2]
        write_json_atomic(run.training_record(pack_id, tid), training_record(
            pack_id=pack_id, training_id=tid, workload="w", params={"lr": lr, "batch_size": 64, "seed": 0},
            mode="process", factor=factor, partition=partition, gpu_type="cpu", status=status, started_at=start,
            ended_at=start + wall, timings={"startup_s": 1.0, "loop_s": wall - 1.0},
            throughput={"samples": 1000, "samples_per_s": 10.0}, metrics={"val_accuracy": lr},
            error=None if status == "completed" else "Traceback ...\nRuntimeError: loss is nan"))
        log = run.log(pack_id, tid, "err")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("a log\n")
    write_json_atomic(run.pack_record(pack_id), pack_record(
        pack_id=pack_id, mode="process", factor=factor, partition=partition, gpu_type="cpu", wall_s=wall,
        complete=True, concurrent=len(statuses), started_at=start, ended_at=start + wall, job_id=job,
        busy_s=wall * len(statuses), slots=factor, n_completed=statuses.count("completed")))


def _run(tmp_path: Path, partitions: tuple[str, ...] = ("local",), failed: bool = False) -> RunDir:
    run = RunDir(tmp_path / "run")
    for partition in partitions:
        for i, (w1, w2) in enumerate([(10.0, 12.0), (10.2, 12.4), (9.8, 11.8)]):
            _pack(run, 1, i, w1, ["completed"], partition)
            _pack(run, 2, i, w2, ["completed", "completed"], partition)
    if failed:
        _pack(run, 4, 0, 30.0, ["completed", "failed", "completed", "completed"], lrs=[0.1, 0.5])
    return run


class Cells(HTMLParser):
    """The text of every table cell, and the order the page's sections and images come in."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self.order: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("td", "th"):
            self._in, self.cells = tag, [*self.cells, ""]
        ident = dict(attrs).get("id")
        if tag == "section" and ident:
            self.order.append(ident)
        if tag == "img":
            self.order.append("img")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th"):
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in:
            self.cells[-1] += data


def _page(c, out: Path, figures=()) -> str:
    return build_report(c, Page(about=what_ran(c, {str(out): CONFIG}), figures=list(figures),
                                trainings=training_rows(c, out, {str(out): CONFIG})))


def _parsed(page: str) -> Cells:
    cells = Cells()
    cells.feed(page)
    return cells


@pytest.mark.parametrize("partitions, failed", [(("local",), False), (("p100", "a100"), False), (("local",), True)])
def test_no_cell_says_true_or_false(tmp_path, partitions, failed):
    run = _run(tmp_path, partitions, failed)
    page = _page(aggregate([run.root]), run.root)
    cells = [c.strip() for c in _parsed(page).cells]
    assert cells and not [c for c in cells if c in ("True", "False", "true", "false")]
    assert "chosen" in cells  # the verdict in words


def test_the_page_reads_what_ran_the_answer_and_the_hyperparameters_before_the_evidence(tmp_path):
    from gpupack.results.report.html import Plot

    run = _run(tmp_path)
    page = _page(aggregate([run.root]), run.root, [Plot("a plot", "data:image/png;base64,AAAA")])
    order = _parsed(page).order
    assert order.index("what-ran") < order.index("answer") < order.index("best-hyperparameters") \
        < order.index("evidence") < order.index("img")
    assert re.search(r"<th>date</th><td>\d{4}-\d{2}-\d{2} \d{2}:\d{2}", page)  # the first pack's start
    assert "<th>grid</th><td>lr: 0.1, 0.5; batch_size: 64</td>" in page
    assert "Best packing factor for w on local (cpu), mode process: N=2" in page


def test_a_failure_is_named_by_its_hyperparameters_with_its_log(tmp_path):
    run = _run(tmp_path, failed=True)
    page = _page(aggregate([run.root]), run.root)
    failures = page[page.index("id='failures'"):]
    link = os.path.relpath(run.log("local-process-n04-000", "w-4-0-1", "err"), run.root)
    assert "lr=0.5, batch_size=64 (N=4, failed): RuntimeError: loss is nan" in failures
    assert f"<a href='{link}'>err</a>" in failures and (run.root / link).is_file()


def test_cost_is_drawn_only_with_partitions_to_compare(tmp_path):
    one = aggregate([_run(tmp_path / "one").root], weights={"cpu": 1.0})
    two = aggregate([_run(tmp_path / "two", ("p100", "a100")).root], weights={"cpu": 1.0})
    assert len(one.cost) == 1 and plot_cost(one, tmp_path / "one.png") is None
    assert plot_cost(two, tmp_path / "two.png") is not None and (tmp_path / "two.png").stat().st_size > 0


def test_jobs_are_counted_by_job_id_as_the_run_header_counts_them(tmp_path):
    run = _run(tmp_path)  # every pack ran in one job (a lane of packs in turn), as the run header's "jobs: 1"
    occ = occupancy(aggregate([run.root]).records.packs).set_index("factor")
    assert occ.loc[1, "packs"] == 3 and occ.loc[1, "jobs"] == 1 and occ.loc[2, "jobs"] == 1
    assert ("jobs and packs", "6 pack(s) run by 1 job(s)") in what_ran(aggregate([run.root]), {})


def test_a_table_of_a_wide_summary_keeps_its_columns_few(tmp_path):
    page = _page(aggregate([_run(tmp_path).root]), tmp_path / "run")
    first = page[page.index("id='evidence'"):]
    header = re.findall(r"<th>([^<]*)</th>", first[:first.index("</table>")])
    assert len(header) <= 9, header
    assert pd.Series(header).is_unique


SEARCHPATH = f"hydra.searchpath=[file://{Path(__file__).resolve().parent / 'conf'}]"


def sweep(run_dir: Path, env: dict[str, str], *overrides: str) -> None:
    """One small real sweep of the test workload (its report collected at its end: the preset leaves it out)."""
    proc = subprocess.run([sys.executable, "-m", "gpupack", SEARCHPATH, "+sweep=probe_pack", f"run_dir={run_dir}",
                           "collect.plots=true", *overrides], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_collect_of_a_parent_folder_compares_its_runs_with_a_run_column(tmp_path, subprocess_env):
    for name, lrs in (("first", "[0.1,0.2]"), ("second", "[0.3,0.4]")):  # one sweep run twice: the same rows
        sweep(tmp_path / "runs" / name, subprocess_env, f"sweep.grid.lr={lrs}")
    console = Console(record=True, width=200)
    c, written = collect([tmp_path / "runs"], console=console)
    page = (tmp_path / "runs" / "comparison.html").read_text()
    assert tmp_path / "runs" / "comparison.html" in written and not (tmp_path / "runs" / "report.html").exists()
    assert list(c.summary["run"].unique()) == ["first", "second"]
    rows = [tuple(r) for r in c.summary[["run", "partition", "mode", "factor"]].itertuples(index=False)]
    assert len(rows) == len(set(rows)) == 4  # each run's N apart, never pooled into one row
    table = page[page.index("id='evidence'"):]
    header = re.findall(r"<th>([^<]*)</th>", table[:table.index("</table>")])
    assert header[0] == "run" and "<td>first</td>" in table and "<td>second</td>" in table
    for name in ("first", "second"):  # each run keeps its own report, linked from the comparison
        assert (tmp_path / "runs" / name / "report.html").is_file() and f"href='{name}/report.html'" in page
    assert f"Comparison of 2 runs: {tmp_path / 'runs' / 'comparison.html'}" in console.export_text()


@pytest.mark.slow
def test_a_run_without_plots_writes_its_tables_and_a_later_collect_writes_the_report(tmp_path, subprocess_env):
    """collect.plots=false: a run's end writes the summary and the records' table, no plot and no report.html (nor
    says one); `collect RUN_DIR` writes them afterwards from the same records."""
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "gpupack", SEARCHPATH, "+sweep=probe_pack", f"run_dir={run_dir}",
                           "collect.plots=false"], capture_output=True, text=True, env=subprocess_env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (run_dir / "summary.csv").is_file() and (run_dir / "trainings.parquet").is_file()
    assert not (run_dir / "report.html").exists() and not (run_dir / "plots").exists()
    assert "report.html" not in proc.stdout and re.search(verdict("tests.fake_workloads", "local"), proc.stdout)
    later = subprocess.run([sys.executable, "-m", "gpupack", "collect", str(run_dir)], capture_output=True, text=True,
                           env=subprocess_env, timeout=300)
    assert later.returncode == 0, later.stdout + later.stderr
    assert (run_dir / "report.html").is_file() and any((run_dir / "plots").glob("*.png"))
