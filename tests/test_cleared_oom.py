"""Which OOM records a ``gpupack clear-oom`` entry clears (gpupack.results.analysis.load.cleared_mask): by a table. An
entry clears the records of its own run that ended before it was written and that match each of its keys it names
(partition, mode, factor; None: any). Pure."""
from __future__ import annotations

import pandas as pd
import pytest

from gpupack.results.analysis.load import Cleared, cleared_mask

# the OOM records of two runs: (run_dir, partition, mode, factor, ended_at)
ROWS = pd.DataFrame([("r1", "v100", "process", 2, 10.0), ("r1", "v100", "process", 4, 10.0),
                     ("r1", "a100", "process", 4, 10.0), ("r1", "v100", "fused", 4, 10.0),
                     ("r1", "v100", "process", 4, 30.0), ("r2", "v100", "process", 4, 10.0)],
                    columns=["run_dir", "partition", "mode", "factor", "ended_at"])


def entry(run_dir: str = "r1", partition: str | None = None, mode: str | None = None, factor: int | None = None,
          cleared_at: float = 20.0) -> Cleared:
    return Cleared(run_dir=run_dir, partition=partition, mode=mode, factor=factor, cleared_at=cleared_at)


@pytest.mark.parametrize("entries, cleared", [
    ([], []),
    ([entry()], [0, 1, 2, 3]),  # every OOM of its run before it; row 4 came after it, row 5 is another run's
    ([entry(factor=4)], [1, 2, 3]),  # N=4 only: not N=2
    ([entry(partition="v100", factor=4)], [1, 3]),  # not a100's
    ([entry(partition="v100", mode="process", factor=4)], [1]),  # not the fused one
    ([entry(factor=4, cleared_at=40.0)], [1, 2, 3, 4]),  # cleared later: row 4 ended before it too
    ([entry(run_dir="r2", factor=4)], [5]),
    ([entry(factor=2), entry(run_dir="r2")], [0, 5]),  # two entries: either clears
    ([entry(factor=8)], []),  # an N that never ran out of memory
    ([entry(cleared_at=5.0)], []),  # written before any of them ended
])
def test_a_clear_oom_entry_clears_its_runs_records_that_match_and_ended_before_it(entries: list[Cleared],
                                                                                     cleared: list[int]) -> None:
    assert list(ROWS.index[cleared_mask(ROWS, entries)]) == cleared


def test_a_factor_read_as_a_float_column_still_matches() -> None:
    """A factor column with a missing value reads as floats (4.0): an entry's whole N matches it."""
    rows = ROWS.assign(factor=ROWS["factor"].astype(float))
    rows.loc[0, "factor"] = float("nan")
    assert list(rows.index[cleared_mask(rows, [entry(factor=4)])]) == [1, 2, 3]
