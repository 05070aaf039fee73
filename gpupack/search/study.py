"""The study: Optuna's own ``JournalStorage`` over its file backend in the run directory (``RunDir.study``), the one
truth every lane, resume and collect read; ``optuna.load_study`` and ``optuna-dashboard`` open it while it runs.

Each decision (ask a trial, prune one, tell one) holds the journal's flock (:class:`FlockLock`), cuts back a torn last
line and reads only the lines written since its last decision. The search, the workload and the fixed hyperparameters
are the study's head, ``study.json`` beside it. Numbers are Optuna's, given under the lock, so no two lanes ever get
one; running trials are in the study, so the sampler knows them (TPE's constant liar). No trial is lost or repeated
on resume: a dead lane's next run tells its untold trials (:meth:`Study.fail_dead`), and the next ask tells failed a
trial whose asker was killed mid-ask."""
from __future__ import annotations

import functools
import importlib
import json
import os
import re
import socket
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Literal, Mapping

from gpupack.core.plan import Training, training_id
from gpupack.core.store.claims import Claimant
from gpupack.core.store.journal import cut_torn
from gpupack.core.store.locks import held
from gpupack.core.store.records import file_mode, make_dirs, read_json_or_none, write_text_atomic
from gpupack.core.warm import warm
from gpupack.errors import ConfigError, RunDirError
from gpupack.search.options import OptunaSearch

if TYPE_CHECKING:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.trial import FrozenTrial

STUDY_NAME = "gpupack"  # the one study of a run's journal (optuna.load_study finds it without its name too)
State = Literal["complete", "pruned", "failed", "running"]
COMPLETE: State = "complete"
PRUNED: State = "pruned"
FAILED: State = "failed"
RUNNING: State = "running"
RANK_ORDER: dict[State, int] = {COMPLETE: 0, PRUNED: 1, FAILED: 2, RUNNING: 3}  # after the ranked completed ones
DIED = "died with its lane"
CUT = "its asker was killed mid-ask"  # a trial asked, its claimant never written
PLANNED = "planned"  # the incarnation of a trial the command asked for a lane before its job started
WHO, PRUNED_AT, DEVICE_S, WHY = "gpupack", "pruned", "device_s", "why"  # a trial's user attributes
GROWS = ("n_trials", "device_hours")  # the search's keys a resume may raise, to extend a search
_TRIAL_ID = re.compile(r"^trial(\d+)-")
Param = str | int | float | bool | None
Outcome = tuple[State, float | None, str | None]


def trial_training_id(workload: str, number: int, params: Mapping[str, object]) -> str:
    """A trial's training id: its number (two trials of the same params are two trainings), then the params' hash."""
    return f"trial{number:04d}-{training_id(workload, params)}"


def trial_number(tid: str) -> int | None:
    """The trial number a training id carries (None: not a trial's). Pure."""
    found = _TRIAL_ID.match(tid)
    return int(found.group(1)) if found else None


def head_path(path: Path) -> Path:
    """Where the study's head (the search, the workload, the fixed hyperparameters) is kept: ``study.json``."""
    return path.with_suffix(".json")


@dataclass
class TrialRow:
    """One trial as the study tells it."""

    number: int
    params: dict[str, Param]
    lane: str | None  # who claimed it; None: nobody yet (its asker was killed mid-ask)
    incarnation: str | None
    asked_at: float
    state: State = "running"
    value: float | None = None
    intermediate: dict[int, float] = field(default_factory=dict)
    why: str | None = None
    device_s: float = 0.0
    planned: bool = False  # asked for its lane before the lane's job started, and not yet taken by a run of it
    told: bool = False  # its end is in Optuna's study (a trial pruned by its process is told by its lane after)

    @property
    def waiting(self) -> bool:
        """Planned and not taken: no run of its lane has started it yet."""
        return self.planned and self.state == RUNNING


@dataclass(frozen=True)
class Head:
    """The study's head, ``study.json``: what every lane reads once."""

    search: OptunaSearch
    workload: str
    fixed: dict[str, object]

    def to_json(self) -> dict[str, object]:
        return {"search": self.search.to_json(), "workload": self.workload, "fixed": dict(self.fixed)}

    @staticmethod
    def from_json(data: Mapping[str, object]) -> Head:
        return Head(OptunaSearch.from_json(data["search"]), str(data["workload"]),  # type: ignore[arg-type]
                    dict(data.get("fixed") or {}))  # type: ignore[call-overload]


@dataclass(frozen=True)
class Journal(Head):
    """What a study holds: its head and its trials by number."""

    trials: dict[int, TrialRow]

    def count(self, *states: str) -> int:
        return sum(1 for t in self.trials.values() if t.state in states)

    @property
    def waiting(self) -> int:
        """Planned trials no run of their lane has taken yet (counted running, as the budget counts them)."""
        return sum(1 for t in self.trials.values() if t.waiting)

    @property
    def untold(self) -> int:
        """Trials whose end Optuna's study has not been told: running, or pruned by their process with no tell yet."""
        return sum(1 for t in self.trials.values() if not t.told)

    @property
    def device_hours(self) -> float:
        return sum(t.device_s for t in self.trials.values()) / 3600

    def stopped(self) -> str | None:
        """Why no more trial is asked (None: the budget is not spent)."""
        return stop_reason(self.search, self.count(COMPLETE, PRUNED, RUNNING), self.count(FAILED), self.device_hours)

    def ranked(self) -> list[TrialRow]:
        """The completed trials, best first, then the pruned, the failed and the running."""
        sign = -1.0 if self.search.direction == "maximize" else 1.0
        return sorted(self.trials.values(), key=lambda t: (0, sign * t.value, t.number)
                      if t.state == COMPLETE and t.value is not None else (1, RANK_ORDER[t.state], t.number))


def stop_reason(search: OptunaSearch, held: int, failed: int, device_hours: float) -> str | None:
    """Why no more trial is asked (None: the budget is not spent); ``held``: trials finished or running. Pure."""
    if held >= search.n_trials:
        return f"the budget of {search.n_trials} trials is met"
    if failed >= search.n_trials:
        return (f"{failed} trials failed, as many as the budget of {search.n_trials}: the search stops (see their "
                "records' errors)")
    if search.device_hours is not None and device_hours >= search.device_hours:
        return f"{device_hours:.3f} device-hours spent, the budget's {search.device_hours}"
    return None


def _write_head(path: Path, head: Head) -> None:
    """The head written whole, its space in the user's order (the order trials' params are said in)."""
    write_text_atomic(head_path(path), json.dumps(head.to_json(), indent=1, default=str) + "\n")


def read_head(path: Path) -> Head | None:
    """The study's head (None: no study there), read without the lock: it is written whole (atomically)."""
    data = read_json_or_none(head_path(path))
    return Head.from_json(data) if data is not None else None


def changes(old: Head, search: OptunaSearch, workload: str, fixed: Mapping[str, object]) -> list[str]:
    """What a resume changes of the run's search (but for a budget that grows), workload and fixed, key by key."""
    was, now = json.loads(json.dumps(old.fixed, default=str)), json.loads(json.dumps(dict(fixed), default=str))
    return (_diff("search", old.search.to_json(), search.to_json(), GROWS)
            + ([f"workload: {old.workload!r} -> {workload!r}"] if workload != old.workload else [])
            + _diff("sweep.fixed", was, now))  # the fixed as the head reads them back


def _diff(prefix: str, was: Mapping[str, object], now: Mapping[str, object], grows: tuple[str, ...] = ()) -> list[str]:
    """``prefix.key: before -> after`` for each key whose value differs, but for a key of ``grows`` that grows."""
    return [f"{prefix}.{k}: {_said(was.get(k))} -> {_said(now.get(k))}" for k in sorted(set(was) | set(now))
            if was.get(k) != now.get(k) and not (k in grows and _grows(was.get(k), now.get(k)))]


def _grows(before: object, after: object) -> bool:
    """A higher budget, or none (no cap where there was one)."""
    return after is None or (isinstance(before, (int, float)) and isinstance(after, (int, float)) and after >= before)


def _said(value: object) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_said(v)}" for k, v in value.items()) + "}"
    return repr(value)


class FlockLock:
    """Optuna's journal lock object: a flock on ``study.lock``, which dies with its holder (Optuna's own outlive a
    killed one a while). Re-entrant in its process; taking it cuts back a torn last line (kept in ``study.torn``)."""

    def __init__(self, journal: Path) -> None:
        self.journal = journal
        self._thread = threading.RLock()
        self._depth = 0
        self._held = ExitStack()  # the flock, then its descriptor, let go in that order

    def acquire(self) -> bool:
        self._thread.acquire()
        if self._depth == 0:
            make_dirs(self.journal.parent)
            lock = self.journal.with_suffix(".lock")
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, file_mode())
            self._held.callback(os.close, fd)
            self._held.enter_context(held(fd, lock, risk="do not run two searches in this run at once"))
            if self.journal.exists():
                cut_torn(self.journal, self.journal.with_suffix(".torn"))
        self._depth += 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._held.close()
        self._thread.release()


def _storage(path: Path, lock: FlockLock) -> JournalStorage:
    import warnings

    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return JournalStorage(JournalFileBackend(str(path), lock_obj=lock))  # type: ignore[arg-type]


def _row(trial: FrozenTrial, order: Mapping[str, object]) -> TrialRow:
    """A trial of Optuna's study as gpupack tells it, its params in the space's ``order`` (Optuna sorts them). Pure."""
    from optuna.trial import TrialState

    attrs = trial.user_attrs
    who = attrs.get(WHO) or {}
    params = {k: _plain(trial.params[k]) for k in order if k in trial.params}
    row = TrialRow(trial.number, {**params, **{k: _plain(v) for k, v in trial.params.items()}}, who.get("lane"),
                   who.get("incarnation"), trial.datetime_start.timestamp() if trial.datetime_start else 0.0,
                   intermediate=dict(trial.intermediate_values), why=attrs.get(WHY),
                   device_s=float(attrs.get(DEVICE_S, 0.0)), planned=bool(who.get("planned")),
                   told=trial.state.is_finished())
    if trial.state == TrialState.COMPLETE:
        row.state, row.value = COMPLETE, trial.value
    elif trial.state == TrialState.PRUNED or (trial.state == TrialState.RUNNING and attrs.get(PRUNED_AT)):
        row.state = PRUNED
        row.value = trial.value if trial.value is not None else (attrs.get(PRUNED_AT) or {}).get("value")
    elif trial.state == TrialState.FAIL:
        row.state = FAILED
    return row


def _journal(head: Head, trials: list[FrozenTrial]) -> Journal:
    return Journal(head.search, head.workload, dict(head.fixed), {t.number: _row(t, head.search.space) for t in trials})


def read_journal(path: Path) -> Journal | None:
    """The study as it stands, read without its lock and writing nothing (a run in progress, or copied read-only): a
    torn last line is left out. None: no study there."""
    head = read_head(path)
    if head is None:
        return None
    if not path.is_file():
        return _journal(head, [])
    storage = _storage(path, FlockLock(path))  # never taken: reading takes no lock
    studies = storage.get_all_studies()
    return _journal(head, storage.get_all_trials(studies[0]._study_id, deepcopy=False) if studies else [])


class Study:
    """A search's study, kept in Optuna's journal at ``path`` (its head beside it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = FlockLock(path)
        self._store: JournalStorage | None = None
        self._head: Head | None = None
        self._id: int | None = None

    @contextmanager
    def _decision(self) -> Iterator[JournalStorage]:
        """The journal locked, its torn last line cut back, and the storage caught up with what others wrote."""
        self._lock.acquire()
        try:
            if self._store is None:
                self._store = _storage(self.path, self._lock)
            yield self._store
        finally:
            self._lock.release()

    def head(self) -> Head:
        if self._head is None:
            self._head = read_head(self.path)
            if self._head is None:
                raise FileNotFoundError(f"{head_path(self.path)} holds no study")
        return self._head

    def _study_id(self, storage: JournalStorage) -> int:
        if self._id is None:  # a study's id never changes: asked once
            self._id = storage.get_study_id_from_name(STUDY_NAME)
        return self._id

    def _view(self, storage: JournalStorage) -> Journal:
        return _journal(self.head(), storage.get_all_trials(self._study_id(storage), deepcopy=False))

    def create(self, search: OptunaSearch, workload: str, fixed: Mapping[str, object]) -> list[str]:
        """Write the study's head and create Optuna's study, unless the run has them: a resume keeps its own and is
        refused if its search changed, but for :data:`GROWS`, which may grow (what grew, as lines)."""
        old_format = self.path.with_name("study.jsonl")
        if old_format.exists():
            raise RunDirError(f"{self.path.parent}: its search was kept in {old_format.name}, the format of gpupack "
                              "before Optuna's journal storage, which this gpupack does not resume. HINT: collect "
                              "it with the gpupack that ran it, and run this search in a new run_dir=")
        with self._decision() as storage:
            old = read_head(self.path)
            grew: list[str] = []
            if old is None:
                self._head = Head(search, workload, dict(fixed))
                _write_head(self.path, self._head)
            else:
                changed = changes(old, search, workload, fixed)
                if changed:
                    raise ConfigError("search", "; ".join(changed), "this run_dir's search ran with these values, "
                                      "and its trials were chosen for them (only search.n_trials and "
                                      "search.device_hours may grow, to extend it)",
                                      "give the values it ran with, or a new run_dir=")
                grew = [f"search.{k}: {getattr(old.search, k)} -> {getattr(search, k)}" for k in GROWS
                        if getattr(old.search, k) != getattr(search, k)]
                self._head = Head(search, old.workload, old.fixed)
                if grew:
                    _write_head(self.path, self._head)
            if not any(s.study_name == STUDY_NAME for s in storage.get_all_studies()):  # once: a resume appends
                import optuna  # nothing (Optuna's create_study writes its create before it finds the study there)

                optuna.create_study(storage=storage, study_name=STUDY_NAME, direction=search.direction)
            return grew

    def read(self) -> Journal:
        """The study as it stands (read under the lock: every line whole)."""
        with self._decision() as storage:
            return self._view(storage)

    def row(self, number: int) -> TrialRow | None:
        """Trial ``number`` as it stands (None: no such trial): one trial, not a view of them all."""
        with self._decision() as storage:
            trial = self._trial(storage, number)
            return _row(trial, self.head().search.space) if trial is not None else None

    def ask(self, who: Claimant) -> TrialRow | str:
        """The next trial for ``who``'s lane, written as asked; or why none is (the budget spent)."""
        from optuna.trial import TrialState

        with self._decision() as storage:
            trials = storage.get_all_trials(self._study_id(storage), deepcopy=False)
            self._fail_cut(storage, trials)
            failed = sum(1 for t in trials if t.state == TrialState.FAIL)  # one pass each, no view: every ask does it
            spent = sum(float(t.user_attrs.get(DEVICE_S, 0.0)) for t in trials) / 3600
            if (why := stop_reason(self.head().search, len(trials) - failed, failed, spent)) is not None:
                return why
            return self._ask(storage, len(trials), who)

    def _fail_cut(self, storage: JournalStorage, trials: list[FrozenTrial]) -> None:
        """Tell failed (:data:`CUT`) each trial running with no claimant: every ask writes both in one decision under
        the lock, so its asker was killed mid-ask, and it would hold a place of the budget for ever. In place."""
        from optuna.trial import TrialState

        for i, trial in enumerate(trials):
            if trial.state == TrialState.RUNNING and WHO not in trial.user_attrs:
                self._tell(storage, trial.number, FAILED, None, CUT, 0.0)  # as fail_dead tells a dead lane's
                trials[i] = storage.get_trial(trial._trial_id)

    def _optuna(self, storage: JournalStorage, number: int) -> optuna.Study:
        """Optuna's study over the storage, with the sampler of trial ``number`` and the search's pruner."""
        import optuna

        search = self.head().search
        return optuna.Study(STUDY_NAME, storage, sampler=search.make_sampler(number), pruner=search.make_pruner())

    def _ask(self, storage: JournalStorage, number: int, who: Claimant, planned: bool = False) -> TrialRow:
        space = self.head().search.space
        trial = self._optuna(storage, number).ask(fixed_distributions={k: d.distribution() for k, d in space.items()})
        if trial.number != number:  # numbers are given under the lock: another writer ignored it
            raise RuntimeError(f"{self.path}: trial {trial.number} asked where {number} was next: is another "
                               "search writing this study without its lock?")
        storage.set_trial_user_attr(trial._trial_id, WHO, {**asdict(who), "planned": planned})
        return TrialRow(number, {k: _plain(v) for k, v in trial.params.items()}, who.lane, who.incarnation,
                        time.time(), planned=planned)

    def plan_first(self, lanes: Mapping[str, int]) -> list[int]:
        """A fresh study's first trials' numbers (none where it has some), asked by the command before any lane's job
        starts (``lanes``: pack id → slots), so that a lane starts them at once and imports Optuna meanwhile."""
        with self._decision() as storage:
            journal = self._view(storage)
            if journal.trials:
                return []
            numbers: list[int] = []
            for lane, slots in lanes.items():
                who = Claimant(lane, PLANNED, None, socket.gethostname(), os.getpid())
                for _ in range(slots):
                    if journal.stopped() is None:
                        row = self._ask(storage, len(journal.trials), who, planned=True)
                        journal.trials[row.number] = row
                        numbers.append(row.number)
            return numbers

    def _trial(self, storage: JournalStorage, number: int) -> FrozenTrial | None:
        try:  # Optuna's own lookup by number
            return storage.get_trial(storage.get_trial_id_from_study_id_trial_number(self._study_id(storage), number))
        except KeyError:
            return None

    def take_planned(self, who: Claimant) -> list[TrialRow]:
        """The trials planned for ``who``'s lane that no run of it has taken, now this run's, by number."""
        with self._decision() as storage:
            journal = self._view(storage)
            rows = sorted((t for t in journal.trials.values() if t.waiting and t.lane == who.lane),
                          key=lambda t: t.number)
            trials = storage.get_all_trials(self._study_id(storage), deepcopy=False)
            for row in rows:
                storage.set_trial_user_attr(trials[row.number]._trial_id, WHO, {**asdict(who), "planned": False})
                row.incarnation, row.planned = who.incarnation, False
            return rows

    def report(self, number: int, step: int, value: float, prune: bool = True) -> bool:
        """Trial ``number``'s ``value`` at ``step``, written; True where the pruner prunes it now (if ``prune``)."""
        with self._decision() as storage:
            trial = self._trial(storage, number)
            if trial is None or trial.state.is_finished():
                return False
            storage.set_trial_intermediate_value(trial._trial_id, step, value)
            if not prune or trial.user_attrs.get(PRUNED_AT):
                return False
            study = self._optuna(storage, number)
            if not study.pruner.prune(study, storage.get_trial(trial._trial_id)):
                return False
            # marked by its own process: its lane records it pruned, tells Optuna so, and no other end replaces it
            storage.set_trial_user_attr(trial._trial_id, PRUNED_AT, {"step": step, "value": value})
            return True

    def tell(self, number: int, state: State, value: float | None, why: str | None = None,
             device_s: float = 0.0) -> None:
        """How trial ``number`` ended (a trial told already keeps its first end; one its process pruned is pruned)."""
        with self._decision() as storage:
            self._tell(storage, number, state, value, why, device_s)

    def _tell(self, storage: JournalStorage, number: int, state: State, value: float | None, why: str | None,
              device_s: float) -> None:
        from optuna.trial import TrialState

        trial = self._trial(storage, number)
        if trial is None or trial.state.is_finished():
            return
        mark = trial.user_attrs.get(PRUNED_AT)
        if mark:
            state, value, why = PRUNED, float(mark["value"]), None
        if state == COMPLETE and value is None:  # a completed trial without its metric: a failure to Optuna
            state, why = FAILED, why or "no value"
        storage.set_trial_user_attr(trial._trial_id, DEVICE_S, device_s)
        if why is not None:
            storage.set_trial_user_attr(trial._trial_id, WHY, why)
        states = {COMPLETE: TrialState.COMPLETE, PRUNED: TrialState.PRUNED, FAILED: TrialState.FAIL}
        values = [value] if value is not None and state in (COMPLETE, PRUNED) else None
        storage.set_trial_state_values(trial._trial_id, states[state], values)

    def fail_dead(self, who: Claimant, from_record: Callable[[TrialRow], Outcome | None] | None = None,
                  ) -> list[tuple[int, State]]:
        """Tell the trials an earlier run of ``who``'s lane asked and never told (that run is dead: the caller holds
        the lane's lock): from their record where ``from_record`` finds one, else failed. Their numbers and states."""
        with self._decision() as storage:
            journal = self._view(storage)
            told: list[tuple[int, State]] = []
            for row in journal.trials.values():  # a planned one waits to be taken
                if row.told or row.waiting or row.lane != who.lane or row.incarnation == who.incarnation:
                    continue
                outcome = from_record(row) if from_record is not None else None
                state, value, why = outcome or (FAILED, None, DIED)
                self._tell(storage, row.number, state, value, why, 0.0)
                told.append((row.number, PRUNED if row.state == PRUNED else state))
            return told


def search_left(path: Path) -> bool:
    """A run's search has trials to run or to tell (its lanes run again). Read without the lock, writing nothing."""
    journal = read_journal(path)
    return journal is not None and (journal.stopped() is None or journal.untold > 0)


def import_optuna_meanwhile() -> threading.Thread:
    """Optuna imported in a thread (about a second): a lane that started its planned trials asks its next without it."""
    return warm([functools.partial(importlib.import_module, "optuna")], name="gpupack-import-optuna")


def _plain(value: object) -> Param:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def trial_training(journal: Head, trial: TrialRow) -> Training:
    """The training that runs ``trial``: the workload with the trial's params over the fixed ones."""
    params = {**journal.fixed, **trial.params}
    return Training(trial_training_id(journal.workload, trial.number, params), journal.workload, params,
                    grid_index=trial.number)
