"""A trial's curve read from its program's stdout as it grows (``search.intermediate``: a regular expression whose
one group holds the number): each match is an intermediate value, its step the number of matches so far, reported to
the study (:meth:`gpupack.search.study.Study.report`), which may prune the trial. What a ``command`` program prints is
all gpupack sees of it: its packer follows the log on each look and stops the program on a prune."""
from __future__ import annotations

import re
from pathlib import Path

from gpupack.search.study import Study


class StdoutCurve:
    """Trial ``number``'s curve in its stdout log ``out``: :meth:`follow` reads what was written since the last look."""

    def __init__(self, study: Study, number: int, pattern: str, out: Path) -> None:
        self.study, self.number, self.out = study, number, out
        self.pattern = re.compile(pattern)
        self.steps = 0  # matches reported so far
        self._offset = 0
        self._partial = b""  # a line not ended yet: read whole at the next look

    def follow(self, prune: bool = True) -> tuple[int, float] | None:
        """Report each new match in the lines written since the last look; the (step, value) the pruner stopped the
        trial at, else None. ``prune`` False (the program ended): report what is left without asking the pruner."""
        for value in self._values(ended=not prune):
            self.steps += 1
            if self.study.report(self.number, self.steps, value, prune=prune):
                return self.steps, value
        return None

    def _values(self, ended: bool) -> list[float]:
        try:
            with self.out.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:  # not created yet
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        if ended:  # the program's last line, though it printed no newline after it
            lines, self._partial = [*lines, self._partial], b""
        values = []
        for line in lines:
            for match in self.pattern.finditer(line.decode(errors="replace")):
                try:
                    values.append(float(match.group(1)))
                except (TypeError, ValueError):  # a match that holds no number is no step
                    continue
        return values
