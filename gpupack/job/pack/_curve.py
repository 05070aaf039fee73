"""A streamed training's curve as its packer follows it at each look: the values its program prints
(``search.intermediate``: its step is the matches so far) and those its process reports
(:mod:`gpupack.core.store.curves`), each given to its lane's :class:`gpupack.job.pack.Curve`, which may prune it.
"""
from __future__ import annotations

import re
from pathlib import Path

from gpupack.core.store.curves import CurveSpec, NewLines, PrunedAt, points, write_verdict
from gpupack.job.pack import Curve


class CurveFollower:
    """One training's curve: ``out``, its stdout log (read where the lane's curve has a pattern), and ``files``, where
    its process reports and is answered."""

    def __init__(self, curve: Curve, files: CurveSpec, out: Path) -> None:
        self.curve, self.files = curve, files
        self.pattern = re.compile(curve.pattern) if curve.pattern is not None else None
        self.printed = NewLines(out)
        self.reported = NewLines(Path(files["points"]))
        self.steps = 0  # printed matches so far

    def follow(self, prune: bool = True) -> PrunedAt | None:
        """Give the lane each value written since the last look; where it prunes, the step and value. ``prune`` False
        (the training ended): give what is left without asking the pruner."""
        if self.pattern is not None:
            for value in matched(self.pattern, self.printed.read(ended=not prune)):
                self.steps += 1
                if self.curve.report(self.steps, value, prune=prune):
                    return {"step": self.steps, "value": value}
        for step, value in points(self.reported.read()):
            pruned: PrunedAt | None = None
            if self.curve.report(step, value, prune=prune):
                pruned = {"step": step, "value": value}
            if prune:  # its process waits for this answer
                write_verdict(Path(self.files["verdict"]), {"step": step, "pruned": pruned})
            if pruned is not None:
                return pruned
        return None


def matched(pattern: re.Pattern[str], lines: list[bytes]) -> list[float]:
    """The numbers ``pattern``'s group holds in ``lines``, in order (a match that holds no number is no step). Pure."""
    values = []
    for line in lines:
        for match in pattern.finditer(line.decode(errors="replace")):
            try:
                values.append(float(match.group(1)))
            except (TypeError, ValueError):
                continue
    return values
