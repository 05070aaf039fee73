"""The study: an append-only journal of a search's trials in the run directory (``RunDir.study``), the one truth every
lane, resume and collect read; Optuna decides from it and keeps nothing.

Optuna's own journal storage (3.1 on) is not there for the optuna 2 hydra-optuna-sweeper pins, and a database needs a
server: so each decision (ask a trial, prune one) takes the journal's flock, cuts back a torn last line (a writer
killed mid-append), rebuilds an in-memory study from the lines (``add_trial``), decides, appends its line and lets
go. It works on a shared filesystem, from any lane on any node, with any Optuna version. Its lines:

- ``study``: the search (:class:`gpupack.search.options.OptunaSearch`), the workload and the fixed hyperparameters;
- ``asked``: a trial's number, its params and who runs it (its lane's :class:`Claimant`): numbers count the asked
  lines, under the lock, so no two lanes ever get one number; each ask's sampler is seeded by (seed, number). A fresh
  study's first trials are asked by the command before the lanes' jobs start (``planned``, :meth:`Study.plan_first`):
  each lane starts them at once and imports Optuna while they run;
- ``taken``: a planned trial's lane has started it (its run's :class:`Claimant`);
- ``reported``: an intermediate value at a step (:meth:`Study.report`, from the training's own process);
- ``told``: how it ended: complete (its value), pruned (its last intermediate value) or failed (why).

The budget is ``n_trials`` finished trials (complete or pruned); a failed trial does not count, but ``n_trials``
failures stop the search, as ``device_hours`` spent does. A trial asked and never told whose lane's run died is told
failed by that lane's next run (:meth:`Study.fail_dead`), so resume neither loses nor repeats one; a planned trial
no run of its lane has taken waits for the lane's next run.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Iterator, Literal, Mapping, TypedDict

from gpupack.core.plan import Training, training_id
from gpupack.core.store.claims import Claimant
from gpupack.core.store.journal import cut_torn
from gpupack.core.store.locks import held
from gpupack.core.store.records import file_mode, make_dirs
from gpupack.search.options import OptunaSearch

if TYPE_CHECKING:
    import optuna

STUDY_ENV, TRIAL_ENV = "GPUPACK_STUDY", "GPUPACK_TRIAL"  # a trial's process: where its study is, and its number
State = Literal["complete", "pruned", "failed", "running"]
COMPLETE: State = "complete"
PRUNED: State = "pruned"
FAILED: State = "failed"
RUNNING: State = "running"
STATES: dict[str, State] = {COMPLETE: COMPLETE, PRUNED: PRUNED, FAILED: FAILED}
RANK_ORDER: dict[State, int] = {COMPLETE: 0, PRUNED: 1, FAILED: 2, RUNNING: 3}  # after the ranked completed ones
DIED = "died with its lane"
PLANNED = "planned"  # the incarnation of a trial the command asked for a lane before its job started
_TRIAL_ID = re.compile(r"^trial(\d+)-")
Param = str | int | float | bool | None


def trial_training_id(workload: str, number: int, params: Mapping[str, object]) -> str:
    """A trial's training id: its number first (two trials with the same params are two trainings), then the hash of
    its workload and params."""
    return f"trial{number:04d}-{training_id(workload, params)}"


def trial_number(tid: str) -> int | None:
    """The trial number a training id carries (None: not a trial's). Pure."""
    found = _TRIAL_ID.match(tid)
    return int(found.group(1)) if found else None


def trial_env(study: Path, tid: str) -> dict[str, str]:
    """What a trial's process is told (:data:`STUDY_ENV`, :data:`TRIAL_ENV`): where its study is and its number, so
    ``TrainingContext.report`` can report its curve and be pruned; nothing for a training that is no trial."""
    number = trial_number(tid)
    return {} if number is None else {STUDY_ENV: os.path.abspath(study), TRIAL_ENV: str(number)}


@dataclass
class TrialRow:
    """One trial as the journal tells it."""

    number: int
    params: dict[str, Param]
    lane: str
    incarnation: str
    asked_at: float
    state: State = "running"
    value: float | None = None
    intermediate: dict[int, float] = field(default_factory=dict)
    why: str | None = None
    device_s: float = 0.0
    told_at: float | None = None
    planned: bool = False  # asked for its lane before the lane's job started, and not yet taken by a run of it

    @property
    def waiting(self) -> bool:
        """Planned and not taken: no run of its lane has started it yet."""
        return self.planned and self.state == RUNNING

    @property
    def finished(self) -> bool:
        return self.state in (COMPLETE, PRUNED)


class Event(TypedDict, total=False):
    """One line of the journal."""

    event: str  # study | asked | reported | told
    at: float
    search: dict[str, object]
    workload: str
    fixed: dict[str, object]
    number: int
    params: dict[str, Param]
    claimant: dict[str, object]
    step: int
    value: float | None
    state: str
    why: str | None
    device_s: float
    planned: bool


@dataclass
class Journal:
    """What a study's journal holds: its head and its trials by number."""

    search: OptunaSearch
    workload: str
    fixed: dict[str, object]
    trials: dict[int, TrialRow]

    def count(self, *states: str) -> int:
        return sum(1 for t in self.trials.values() if t.state in states)

    @property
    def waiting(self) -> int:
        """Planned trials no run of their lane has taken yet (counted running, as the budget counts them)."""
        return sum(1 for t in self.trials.values() if t.waiting)

    @property
    def device_hours(self) -> float:
        return sum(t.device_s for t in self.trials.values()) / 3600

    def stopped(self) -> str | None:
        """Why no more trial is asked (None: the budget is not spent): n_trials finished or running, n_trials
        failed, or device_hours spent."""
        s = self.search
        if self.count(COMPLETE, PRUNED, RUNNING) >= s.n_trials:
            return f"the budget of {s.n_trials} trials is met"
        if self.count(FAILED) >= s.n_trials:
            return (f"{self.count(FAILED)} trials failed, as many as the budget of {s.n_trials}: the search stops "
                    "(see their records' errors)")
        if s.device_hours is not None and self.device_hours >= s.device_hours:
            return f"{self.device_hours:.3f} device-hours spent, the budget's {s.device_hours}"
        return None

    def ranked(self) -> list[TrialRow]:
        """The completed trials, best first, then the pruned, the failed and the running."""
        sign = -1.0 if self.search.direction == "maximize" else 1.0
        done = sorted((t for t in self.trials.values() if t.state == COMPLETE and t.value is not None),
                      key=lambda t: (sign * (t.value or 0.0), t.number))
        first = {t.number for t in done}
        rest = sorted((t for t in self.trials.values() if t.number not in first),
                      key=lambda t: (RANK_ORDER[t.state], t.number))
        return done + rest


def _apply(journal: Journal | None, ev: Event) -> Journal | None:
    """The journal with one more line read. Pure (but for the rows it updates)."""
    kind = ev.get("event")
    if kind == "study":
        return journal or Journal(OptunaSearch.from_json(ev["search"]), ev["workload"], dict(ev["fixed"]), {})
    if journal is None:
        return None
    number = int(ev.get("number", -1))
    row = journal.trials.get(number)
    if kind == "asked" and row is None:
        who = ev["claimant"]
        journal.trials[number] = TrialRow(number, dict(ev["params"]), str(who.get("lane")),
                                          str(who.get("incarnation")), float(ev.get("at", 0.0)),
                                          planned=bool(ev.get("planned")))
    elif kind == "taken" and row is not None and row.waiting:
        who = ev["claimant"]
        row.lane, row.incarnation, row.planned = str(who.get("lane")), str(who.get("incarnation")), False
    elif kind == "reported" and row is not None and ev.get("value") is not None:
        row.intermediate[int(ev["step"])] = float(ev["value"] or 0.0)
    elif kind == "told" and row is not None and row.state == PRUNED and ev.get("state") == PRUNED:
        row.device_s = float(ev.get("device_s", row.device_s))  # its lane's tell after its own: the device time
    elif kind == "told" and row is not None and row.state == RUNNING:
        row.state = STATES.get(ev["state"], FAILED)
        row.value, row.why = ev.get("value"), ev.get("why")
        row.device_s, row.told_at = float(ev.get("device_s", 0.0)), ev.get("at")
    return journal


def _journal(data: bytes) -> Journal | None:
    """The journal its bytes tell, line by line; a line that is no JSON (a torn last line, a writer mid-append) is
    left out. Pure."""
    journal: Journal | None = None
    for line in data.splitlines():
        try:
            event = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if event is not None:
            journal = _apply(journal, event)
    return journal


def _read(f: IO[bytes]) -> Journal | None:
    f.seek(0)
    return _journal(f.read())


def read_journal(path: Path) -> Journal | None:
    """The journal as it stands, read without its lock and without writing (collect reads runs in progress, or copied
    read-only): a torn last line (a writer mid-append) is left out. None: no study there."""
    return _journal(path.read_bytes()) if path.is_file() else None


class Study:
    """A search's study, kept in its journal at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def _held(self) -> Iterator[IO[bytes]]:
        """The journal open and flocked, its torn last line (a writer killed mid-append) cut back."""
        make_dirs(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, file_mode())
        with os.fdopen(fd, "r+b") as f, held(f.fileno(), self.path, risk="do not run two searches in this run at once"):
            cut_torn(self.path, self.path.with_suffix(".torn"))  # kept aside, as a lane's journal's are
            yield f

    @staticmethod
    def _append(f: IO[bytes], ev: Event) -> None:
        f.seek(0, os.SEEK_END)
        f.write((json.dumps({**ev, "at": time.time()}, default=str) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())

    def create(self, search: OptunaSearch, workload: str, fixed: Mapping[str, object]) -> None:
        """Write the study's head, unless it has one (a resume keeps its own)."""
        with self._held() as f:
            if _read(f) is None:
                self._append(f, Event(event="study", search=search.to_json(), workload=workload, fixed=dict(fixed)))

    def read(self) -> Journal:
        """The journal as it stands (read under the lock: every line whole)."""
        with self._held() as f:
            journal = _read(f)
        if journal is None:
            raise FileNotFoundError(f"{self.path} holds no study")
        return journal

    def ask(self, who: Claimant) -> TrialRow | str:
        """The next trial for ``who``'s lane, written as asked; or why none is (the budget spent)."""
        with self._held() as f:
            journal = _read(f)
            if journal is None:
                return f"{self.path} holds no study"
            if (why := journal.stopped()) is not None:
                return why
            return self._ask(f, journal, who)

    def _ask(self, f: IO[bytes], journal: Journal, who: Claimant, planned: bool = False) -> TrialRow:
        number = len(journal.trials)
        study = rebuild(journal, number)
        from gpupack.search.space import distributions

        trial = study.ask(fixed_distributions=distributions(journal.search.space))
        params: dict[str, Param] = {k: _plain(v) for k, v in trial.params.items()}
        event = Event(event="asked", number=number, params=params, claimant=asdict(who))
        if planned:
            event["planned"] = True
        self._append(f, event)
        row = TrialRow(number, params, who.lane, who.incarnation, time.time(), planned=planned)
        journal.trials[number] = row
        return row

    def plan_first(self, lanes: Mapping[str, int]) -> list[int]:
        """A fresh study's first trials, asked by the command before any lane's job starts (``lanes``: each lane's
        pack id and its slots): a lane then starts them at once (:meth:`take_planned`) and imports Optuna, about a
        second, while they run. The trials the budget allows, in the lanes' order; none where the study has trials (a
        resume's lanes ask for themselves). Their numbers."""
        with self._held() as f:
            journal = _read(f)
            if journal is None or journal.trials:
                return []
            numbers: list[int] = []
            for lane, slots in lanes.items():
                who = Claimant(lane, PLANNED, None, socket.gethostname(), os.getpid())
                for _ in range(slots):
                    if journal.stopped() is None:
                        numbers.append(self._ask(f, journal, who, planned=True).number)
            return numbers

    def take_planned(self, who: Claimant) -> list[TrialRow]:
        """The trials planned for ``who``'s lane that no run of it has taken, now this run's (written as taken: should
        it die, the lane's next run tells them failed, as any trial it asked), by number."""
        with self._held() as f:
            journal = _read(f)
            rows = sorted((t for t in journal.trials.values() if t.waiting and t.lane == who.lane),
                          key=lambda t: t.number) if journal is not None else []
            for row in rows:
                self._append(f, Event(event="taken", number=row.number, claimant=asdict(who)))
                row.incarnation, row.planned = who.incarnation, False
            return rows

    def report(self, number: int, step: int, value: float, prune: bool = True) -> bool:
        """Trial ``number``'s intermediate ``value`` at ``step``, written; True where the pruner prunes it now (never
        without ``prune``: what a program printed before it ended, kept for the curves later trials are judged by)."""
        with self._held() as f:
            self._append(f, Event(event="reported", number=number, step=step, value=value))
            if not prune:
                return False
            journal = _read(f)
            if journal is None or number not in journal.trials or journal.trials[number].state != RUNNING:
                return False
            study = rebuild(journal, len(journal.trials))
            if not study.pruner.prune(study, study.trials[number]):
                return False
            # told pruned at once, by its own process: its lane records it so, and no other end replaces it
            self._append(f, Event(event="told", number=number, state=PRUNED, value=value, why=f"pruned at step {step}"))
            return True

    def tell(self, number: int, state: State, value: float | None, why: str | None = None,
             device_s: float = 0.0) -> None:
        """How trial ``number`` ended (a trial told already keeps its first end)."""
        with self._held() as f:
            self._append(f, Event(event="told", number=number, state=state, value=value, why=why,
                                  device_s=device_s))

    def fail_dead(self, who: Claimant) -> list[int]:
        """Tell failed ("died with its lane") the trials an earlier run of ``who``'s lane asked and never told: that run
        is dead (the caller holds the lane's lock). Their numbers."""
        with self._held() as f:
            journal = _read(f)
            dead = [t.number for t in (journal.trials.values() if journal else ())  # a planned one waits to be taken
                    if t.state == RUNNING and not t.planned and t.lane == who.lane and t.incarnation != who.incarnation]
            for number in dead:
                self._append(f, Event(event="told", number=number, state=FAILED, value=None, why=DIED))
            return dead


def search_left(path: Path) -> bool:
    """A run's search has trials to run or to tell (its lanes run again): its budget not met, or trials asked and
    never told (a dead lane's, which its next run tells failed). Read as collect reads it, without the lock and
    writing nothing: a dry run and the runs beside a new one ask it too."""
    journal = read_journal(path)
    return journal is not None and (journal.stopped() is None or journal.count(RUNNING) > 0)


def import_optuna_meanwhile() -> threading.Thread:
    """Optuna imported in a thread (about a second of scipy, sqlalchemy, matplotlib): a lane that started its planned
    trials asks its next one without that wait, once the import is done (an ``import optuna`` meanwhile waits for it).
    Not a daemon: a job that ends first lets it finish rather than stop it holding the import lock."""
    thread = threading.Thread(target=importlib.import_module, args=("optuna",), name="gpupack-import-optuna")
    thread.start()
    return thread


def _plain(value: object) -> Param:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def rebuild(journal: Journal, asked: int) -> optuna.study.Study:
    """An in-memory Optuna study holding the journal's first ``asked`` trials (running ones as running), with the
    sampler of trial number ``asked`` and the search's pruner: what the next decision is made from."""
    import warnings

    import optuna
    from optuna.trial import TrialState, create_trial

    from gpupack.search.space import distributions

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    search = journal.search
    study = optuna.create_study(direction=search.direction, sampler=search.make_sampler(asked),
                                pruner=search.make_pruner())
    dists = distributions(search.space)
    states = {COMPLETE: TrialState.COMPLETE, PRUNED: TrialState.PRUNED, FAILED: TrialState.FAIL,
              RUNNING: TrialState.RUNNING}
    for number in range(asked):
        row = journal.trials[number]
        value = row.value if row.state in (COMPLETE, PRUNED) else None
        if row.state == COMPLETE and value is None:  # a completed trial without its metric: a failure to Optuna
            state, value = TrialState.FAIL, None
        else:
            state = states[row.state]
        study.add_trial(create_trial(state=state, value=value, params=dict(row.params), distributions=dists,
                                     intermediate_values=dict(row.intermediate)))
    return study


def trial_training(journal: Journal, trial: TrialRow) -> Training:
    """The training that runs ``trial``: the workload with the trial's params over the fixed ones."""
    params = {**journal.fixed, **trial.params}
    return Training(trial_training_id(journal.workload, trial.number, params), journal.workload, params,
                    grid_index=trial.number)
