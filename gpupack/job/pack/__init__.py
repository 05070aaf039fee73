"""Packing modes: how N trainings share one device inside one job.

Each mode is one module ``gpupack/job/pack/<mode>.py`` exposing ``PACKER``, a :class:`Packer`. Modes
never know about SLURM; the job body (:mod:`gpupack.job.body`) hands them the trainings and writes
the records from what they return.
"""
from __future__ import annotations

import importlib
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Hashable, Mapping, Protocol, Sequence, TypeVar, cast

from gpupack.core.memory.figures import MemoryShare
from gpupack.core.placement import Placement
from gpupack.core.plan import Pack, Training
from gpupack.core.registry import exported, module_names, require_known
from gpupack.core.store.records import read_json_or_none
from gpupack.core.store.rundir import RunDir, check_name
from gpupack.core.types import Capacity, Options, PackSettings, TrainingOutcome
from gpupack.core.workload import Workload
from gpupack.errors import GpupackError

if TYPE_CHECKING:  # a training's spec, as the worker reads it
    from gpupack.job.runtime.worker import WorkerSpec


class Wait:
    """A stream's answer when the next training does not fit the device's memory yet: ask again later."""

    def __repr__(self) -> str:
        return "WAIT"


WAIT = Wait()
T = TypeVar("T")


class Curve(Protocol):
    """Where a streamed trial's intermediate values go (its study), whose verdict the packer answers it with."""

    metric: str  # what the study ranks trials by: a Python training reports a curve of it (TrainingContext.ranks_by)
    pattern: str | None  # search.intermediate: a regular expression whose group is a value in its stdout; None: none

    def report(self, step: int, value: float, prune: bool = True) -> bool:
        """The value at ``step``; True: the pruner stops the training now (never without ``prune``)."""


class Stream(Protocol):
    """Where a streaming lane's freed slots take their next training (gpupack.job.stream.Lane)."""

    @property
    def queue(self) -> Sequence[Training]:
        """Every training of the queue (any may come to this lane)."""

    def next(self) -> Training | Wait | None:
        """The next training this lane claimed; :data:`WAIT`: none fits now; None: no more."""

    def ended(self, training_id: str, wall_s: float) -> None:
        """A training of this lane ended after ``wall_s`` (before its slot asks for the next)."""

    def home(self, training_id: str) -> str:
        """The lane the plan dealt the training to (its record's ``home``)."""

    def where(self, training_id: str) -> str:
        """The pack whose folder holds the training's record and logs while it runs."""

    def curve(self, training_id: str) -> Curve | None:
        """Where the training's curve goes (a search's trial); None: it reports none."""

    def judge(self, rec: dict[str, object]) -> dict[str, object]:
        """The training's record as it ended, before it is written (the lane may mark it a victim)."""

    def recorded(self, training_id: str) -> None:
        """The training's record is written (the lane may fold it now)."""


class LaneResources:
    """What the packs a lane runs one after another on one device share (process mode: its fork server), started once
    for them all, outside each pack's wall, and closed when the lane ends. ``trainings``: every training of them."""

    def __init__(self, run: RunDir, lane: str, trainings: Sequence[Training] = ()) -> None:
        self.run, self.lane, self.trainings = run, lane, list(trainings)
        self._kept: dict[Hashable, object] = {}
        self._closers: dict[Hashable, Callable[[], None]] = {}
        self._logs: list[Path] = []

    def log(self, name: str) -> Path:
        """Where a shared process of the lane logs (no pack's folder: a lane that folds removes it)."""
        path = self.run.lanes / f"{check_name('lane', self.lane)}.{check_name('name', name)}.err"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._logs.append(path)
        return path

    def get(self, key: Hashable, make: Callable[[], T], close: Callable[[T], None] | None = None,
            alive: Callable[[T], bool] | None = None) -> T:
        """What ``make`` made for ``key`` (``close``d at the lane's end), made again where ``alive`` says it is not."""
        if key in self._kept and alive is not None and not alive(cast(T, self._kept[key])):
            self._closers.pop(key, lambda: None)()
            del self._kept[key]
        if key not in self._kept:
            made = self._kept[key] = make()
            if close is not None:
                self._closers[key] = lambda: close(made)
        return cast(T, self._kept[key])  # made by a ``make`` of T: one key, one kind

    def close(self) -> None:
        try:
            while self._closers:
                self._closers.popitem()[1]()
        finally:
            for path in self._logs:
                if path.is_file() and path.stat().st_size == 0:
                    path.unlink()

    def __enter__(self) -> "LaneResources":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class PackContext:
    run: RunDir
    pack: Pack
    device: str  # "cpu" or "cuda"
    threads: int  # per training
    env: Mapping[str, str]  # the job's environment, which trainings inherit
    settings: PackSettings | None = None  # the sweep's (mode options: mps, TF memory budget, ...)
    gpu_memory_total_mb: float | None = None  # the job's GPU, from NVML; None on a CPU
    warmup_steps: int = 10
    training_timeout_s: float | None = None  # per training (None: none)
    memory_limit_bytes: int | None = None  # RLIMIT_AS per training: one cannot take the host's memory from the others
    on_finished: Callable[["TrainingOutcome"], None] = lambda outcome: None  # as each ends: its record written at once
    on_started: Callable[[str, int], None] = lambda training_id, pid: None  # (id, pid): the sampler follows it
    spread: Placement | None = None  # one training spread over k devices (gpupack/job/spread/); None: packing
    stream: Stream | None = None  # a streaming lane: its freed slots take their next training from it
    # Each training's share of the GPU's memory (packing.memory_share), enforced in its process; None: none. A
    # training's own share where earlier records measured its setting (memory_shares) replaces the equal split.
    memory_share: MemoryShare | None = None
    memory_shares: Mapping[str, MemoryShare] = field(default_factory=dict)
    resources: LaneResources | None = None  # what the lane's packs on this device share; None: the pack runs alone
    tmp_dir: str = field(default_factory=tempfile.gettempdir)  # the job's own (MPS's pipes, DDP's rendezvous)
    work_dir: str | None = None  # specs and results, in the job's node-local space (None: the pack's folder)

    def share_of(self, training_id: str) -> MemoryShare | None:
        """The training's share of the GPU's memory (None: none)."""
        return self.memory_shares.get(training_id, self.memory_share)

    def home(self, training_id: str) -> str:
        """The pack whose folder holds the training's record and logs: the pack's, or where its stream says."""
        return self.stream.where(training_id) if self.stream is not None else self.pack.pack_id

    def work(self, name: str, what: str) -> Path:
        """The spec, result or error file of ``name`` (a training, a DDP rank, a shared process) while the pack runs."""
        if self.work_dir is None:
            return self.run.work(self.home(name), name, what)
        return work_file(self.work_dir, name, what)


def work_prefix(pack_id: str) -> str:
    return f"gpupack-{pack_id}-"


def work_file(work_dir: Path | str, name: str, what: str) -> Path:
    """``name``'s spec, result or error file in a pack's work folder. Pure."""
    return Path(work_dir) / f"{check_name('training_id', name)}.{what}.json"


class Packer(ABC):
    name: ClassVar[str]
    # How the report names this mode beside another (None: by name), and its curves' matplotlib line style.
    split_label: ClassVar[str | None] = None
    line_style: ClassVar[str] = ":"
    groups: ClassVar[bool] = False  # a pack's trainings must share a group key (fused: same shapes)
    streams: ClassVar[bool] = False  # a freed slot can take another training while the others run (packing.stream)
    solo: ClassVar[bool] = False  # a pack of one is a training in its own process, as alone (:func:`solo_mode`)
    one_process: ClassVar[bool] = False  # N trainings in one process: time per training can fall as 1/N, CPU too
    Options: ClassVar[type[Options] | None] = None  # its packing.<mode>.<field> options (None: none)

    def check(self, workload: Workload, factor: int, capacity: Capacity, settings: PackSettings) -> None:
        """Refuse, before submission, a workload, N or option this mode cannot host (raise ConfigError)."""

    def group_key(self, workload: Workload, params: Mapping[str, object]) -> Hashable:
        """With ``groups``: the key trainings of one pack share (raise ConfigError for a training it cannot host)."""
        return None

    def start_note(self, workload: Workload, params: Sequence[Mapping[str, object]], settings: PackSettings) -> str:
        """How this mode starts a pack's trainings, for the run's header: one line, fresh or forked and why."""
        return f"one process per pack runs its N trainings ({self.name})"

    def watches_mps(self, settings: PackSettings) -> bool:
        """True when, with these settings, this mode runs a pack's trainings under CUDA MPS (the sampler lists them)."""
        return False

    @abstractmethod
    def run(self, trainings: Sequence[Training], ctx: PackContext) -> list[TrainingOutcome]:
        """Start all trainings at once, calling ctx.on_started and ctx.on_finished as each starts and ends, and say how
        each ended. One training failing must never stop the others."""


def available_modes() -> list[str]:
    return module_names(__path__)


def solo_mode() -> str:
    """The mode whose pack of one is a training alone in its own process (``Packer.solo``)."""
    solo = [mode for mode in available_modes() if load_packer(mode).solo]
    if len(solo) != 1:
        raise TypeError(f"exactly one packing mode may say solo = True, not {solo}")
    return solo[0]


def load_packer(mode: str, key: str = "packing.modes") -> Packer:
    require_known(mode, available_modes(), key, "packing mode")
    # an abstract class as the kind to check against (python/mypy#4717)
    return exported(importlib.import_module(f"{__name__}.{mode}"), "PACKER", Packer)  # type: ignore[type-abstract]


def threads_for(cores: int, factor: int, override: int | None = None) -> int:
    """Threads per training: the override, else the job's cores shared out (never oversubscribed)."""
    return override if override else max(1, cores // factor)


PACK_SIZE_ENV = "GPUPACK_N"  # what a process mode training is told: how many share its device (N; a lane's slots)


def worker_env(base: Mapping[str, str], threads: int) -> dict[str, str]:
    """The environment of one training process: the job's, with thread pools capped to its share."""
    pools = dict.fromkeys(("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"),
                          str(threads))
    # TensorFlow must not reserve the whole GPU, or the second of N trainings fails with out-of-memory
    return {**base, **pools, "PYTHONUNBUFFERED": "1", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


TIMED_OUT = "stopped after packing.training_timeout_s; "


def ended_outcome(training_id: str, started: float, ended: float, code: int | None, *, error: str | None,
                  result: Mapping[str, object] | None, timed_out: bool = False,
                  extra: Mapping[str, object] | None = None) -> TrainingOutcome:
    """How a training's child ended, as its outcome (process mode's, DDP's, a shared process's). ``code``: its exit
    status (< 0: killed by that signal; None: never started); exiting 0 with no result fails. Pure."""
    if code == 0 and error is None and result is None:
        error = "exited 0 but wrote no result"
    if timed_out:
        error = TIMED_OUT + (error or "")
    signal = -code if code is not None and code < 0 else None
    return TrainingOutcome(training_id, started, ended, code, signal, error, result,
                           extra={"timed_out": timed_out, **(extra or {})})


def read_result(workload: Workload, params: Mapping[str, object], path: Path, started: float, ended: float,
                stdout: Path | None = None, stopped: bool = False) -> tuple[Mapping[str, object] | None, str | None]:
    """The result a training's program wrote at ``path``, read by its workload, or why it could not be (never raised:
    it must not take the pack down). No JSON object is said, unless the training was ``stopped`` (pruned) mid-write."""
    raw = read_json_or_none(path)
    if raw is None and not stopped and path.is_file():  # gpupack writes it whole (atomically): the program did not
        try:
            with open(path, "rb") as f:
                head = f.read(61)
            text = head[:60].decode(errors="replace")
            start = (repr(text) + (" ..." if len(head) > 60 else "")) if text else "it is empty"
        except OSError as err:
            start = f"unreadable ({err.strerror or err})"
        return None, f"its result ({path.name}) holds no JSON object: {start}"
    try:
        return workload.result(params, raw, started, ended, stdout), None
    except GpupackError as err:  # what the program wrote is not a result: said in gpupack's words
        return None, f"its result ({path.name}): {err}"
    except Exception as err:  # noqa: BLE001 - a workload's own reader failed: this training fails, alone
        return None, f"its result ({path.name}) could not be read: {type(err).__name__}: {err}"


def worker_spec(training: Training, ctx: PackContext, spawned_at: float) -> WorkerSpec:
    spec: WorkerSpec = {
        "workload": training.workload, "params": dict(training.params), "device": ctx.device, "threads": ctx.threads,
        "warmup_steps": ctx.warmup_steps, "spawned_at": spawned_at,
        "result_path": str(ctx.work(training.training_id, "result")),
        "logs": [str(ctx.run.log(ctx.home(training.training_id), training.training_id, s)) for s in ("out", "err")],
    }
    if ctx.spread is not None:
        spec["spread"] = ctx.spread.to_json()
    return spec
