"""The ranking a run remembers: the metric, goal and stdout pattern ``collect --metric/--goal/--pattern`` was given,
kept in RUN_DIR/rank.json (never in the records) so a later collect ranks the same way; and the pure rule that
chooses between what is asked now and what the run keeps."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from gpupack.core.store.records import read_json_or_none, write_json_atomic
from gpupack.core.store.rundir import RunDir

KEYS = ("metric", "goal", "pattern")


@dataclass(frozen=True)
class RankChoice:
    """How hyperparameters are ranked: ``metric`` (None: val_accuracy or the one reported), ``goal`` and ``pattern``."""

    metric: str | None = None
    goal: str | None = None
    pattern: str | None = None

    @staticmethod
    def of(data: Mapping[str, object]) -> RankChoice:
        """From rank.json or a config's collect section: its known keys that hold text; anything else left out."""
        return RankChoice(**{k: str(data[k]) for k in KEYS if isinstance(data.get(k), str) and data[k]})

    def given(self) -> tuple[str, ...]:
        """The keys set, in :data:`KEYS` order."""
        return tuple(k for k in KEYS if getattr(self, k) is not None)

    def as_json(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in self.given()}


def choose(asked: RankChoice, kept: RankChoice) -> tuple[RankChoice, tuple[str, ...]]:
    """What collect ranks by: each key asked, else ``kept``'s, but not a kept goal or pattern for another metric than
    the kept one (a loss's min would rank an accuracy upside down); and the keys taken from ``kept``. Pure."""
    if asked.metric is not None and asked.metric != kept.metric:
        kept = RankChoice()
    chosen = RankChoice(**{k: getattr(asked, k) or getattr(kept, k) for k in KEYS})
    return chosen, tuple(k for k in chosen.given() if getattr(asked, k) is None)


def read_rank(run: RunDir) -> RankChoice | None:
    """What the run remembers (None: no rank.json, or one torn or not an object: as if none, the records decide)."""
    data = read_json_or_none(run.rank_choice)
    return RankChoice.of(data) if data is not None else None


def remember(run: RunDir, choice: RankChoice) -> bool:
    """Keep ``choice`` in the run's rank.json, atomically, unless it holds that already. True where it wrote."""
    if read_rank(run) == choice:
        return False
    write_json_atomic(run.rank_choice, choice.as_json())
    return True

