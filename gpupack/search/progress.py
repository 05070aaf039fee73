"""Where a search stands, from its study's journal: finished trials against the budget, failed, running, waiting,
and why it stopped asking: what a run's last line, its exit status and ``gpupack status`` say of a search. Pure."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpupack.search.study import COMPLETE, FAILED, PRUNED, RUNNING, Journal, read_journal


@dataclass(frozen=True)
class SearchProgress:
    n_trials: int  # the budget: finished trials the search runs to
    completed: int
    pruned: int
    failed: int
    running: int  # asked and not told: a lane runs them, or its run died and its next run tells them failed
    waiting: int  # planned for a lane whose job has not started them yet (Study.plan_first)
    stopped: str | None  # why the study asks no more (None: trials are left to ask)
    budget_spent: bool  # n_trials finished, or search.device_hours spent: the search is done, not cut short

    @property
    def finished(self) -> int:
        return self.completed + self.pruned

    @property
    def ended(self) -> bool:
        """Nothing is left to ask nor to tell."""
        return self.stopped is not None and self.running == 0 and self.waiting == 0

    @property
    def ok(self) -> bool:
        """Ended on its budget (not on as many failures as the budget)."""
        return self.ended and self.budget_spent

    @property
    def left(self) -> int:
        """Trials still to finish for the budget (running ones count as left until told)."""
        return 0 if self.ended else max(0, self.n_trials - self.finished)

    def line(self, runs: bool = True) -> str:
        """What the search stands at; ``runs`` False: nothing of the run runs now, so no trial is running."""
        running = f"{self.running} running" if runs or not self.running else \
            (f"{self.running} asked by a lane that no longer runs (told when the run resumes: from their records "
             "where written, else failed)")
        head = (f"search: {self.finished} of {self.n_trials} trials finished ({self.completed} completed, "
                f"{self.pruned} pruned), {self.failed} failed, {running}"
                + (f", {self.waiting} waiting for their lane's job" if self.waiting else ""))
        if self.ok:
            return f"{head}: done, {self.stopped}"
        if self.ended:
            return f"{head}: stopped, {self.stopped}"
        return f"{head}: {self.left} left to finish"


def progress_of(journal: Journal) -> SearchProgress:
    s = journal.search
    finished = journal.count(COMPLETE, PRUNED)
    spent = finished >= s.n_trials or (s.device_hours is not None and journal.device_hours >= s.device_hours)
    return SearchProgress(n_trials=s.n_trials, completed=journal.count(COMPLETE), pruned=journal.count(PRUNED),
                          failed=journal.count(FAILED), running=journal.count(RUNNING) - journal.waiting,
                          waiting=journal.waiting, stopped=journal.stopped(), budget_spent=spent)


def read_progress(path: Path) -> SearchProgress | None:
    """The progress of the study at ``path`` (None: the run holds no search), read without its lock."""
    journal = read_journal(path)
    return progress_of(journal) if journal is not None else None
