"""The command line's own pieces: the progress view."""
from __future__ import annotations

from gpupack.core.plan import make_plan


def test_progress_view_counts_per_partition():
    from rich.console import Console

    from gpupack.cli.show import ProgressView

    plan = make_plan(sweep="s", workload="w", grid={"lr": [0.1, 0.2]}, fixed={}, factors=[1], modes=["process"],
                     partitions=["p100", "v100"], repeats=1)
    console = Console(record=True, width=300, force_terminal=False)
    with ProgressView(console, plan.packs) as view:
        p100 = [p for p in plan.packs if p.partition == "p100"]
        view(p100[0], "running")
        view(p100[0], "running")  # no change, no line
        view(p100[0], "done")
        view(p100[1], "failed")
    lines = console.export_text().splitlines()
    assert len(lines) == 3
    assert lines[-1].endswith("(p100: pending 0, running 0, done 1, failed 1; v100: pending 2, running 0, done 0, "
                              "failed 0)")
    assert lines[-1].lstrip().startswith("[2/4]")
