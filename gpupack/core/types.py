"""The types every layer shares (a partition's capacity, a pack job's settings and request, how a training and a
pack job ended), at the bottom so that the modules that use them import downward only."""
from __future__ import annotations

from dataclasses import Field, dataclass, field
from typing import ClassVar, Mapping, Protocol, TypeVar


@dataclass
class TrainingOutcome:
    """How one training ended, as the packer saw it."""

    training_id: str
    started_at: float
    ended_at: float
    exit_code: int | None  # None when the training did not run as its own process
    signal: int | None = None
    error: str | None = None  # last lines of the training's stderr or exception
    # What the training reported (gpupack.job.runtime.worker.TrainingResult; None if it never finished).
    result: Mapping[str, object] | None = None
    extra: dict[str, object] = field(default_factory=dict)  # the record's fields a mode adds (timed_out, ...)


@dataclass(frozen=True)
class Capacity:
    """What a backend says one pack job on a partition can have, asked once before anything runs (None: unknown)."""

    has_gpu: bool | None = None
    gpu_memory_mb: float | None = None
    max_cpus: int | None = None  # CPUs one single-GPU job may get (site guidance, or the largest node)
    max_mem_mb: float | None = None  # host memory one job may get
    max_processes: int | None = None  # processes a job may still start (ulimit -u, kernel.threads-max)
    # One node as sinfo reports it, to tell when a pack's request leaves a node's GPUs idle.
    node_gpus: int | None = None
    node_cpus: int | None = None
    node_mem_mb: float | None = None
    # What one GPU (or MIG slice) here is billed against (gpupack.core.cost.billing).
    bundle_cores: float | None = None
    bundle_mem_gb: float | None = None
    # The most devices one job may ask for, where the site says, with the rule's words.
    max_devices_per_job: int | None = None
    devices_rule: str | None = None
    # The device model a pack here runs on: "cpu", or a GPU model (A100-1g.5gb; NVML's name locally). None: unknown.
    device: str | None = None


class Options(Protocol):
    """A mode's or strategy's own options: a dataclass whose fields are config keys, refusing a bad value itself."""

    __dataclass_fields__: ClassVar[dict[str, Field[object]]]

    def check(self) -> None:
        """Raise ConfigError naming the key, the value and the fix."""


OptionsT = TypeVar("OptionsT", bound=Options)


@dataclass(frozen=True)
class PackSettings:
    """What the job needs besides the plan; pickled by submitit with the call."""

    device: str = "auto"  # auto | cpu | cuda
    threads_per_training: int | None = None
    warmup_steps: int = 10
    training_timeout_s: float | None = None
    memory_limit_gb_per_training: float | None = None
    gpu_model: str | None = None  # the RGU table's name of the partition's GPU, where NVML cannot name it
    sample_interval_s: float = 1.0
    mode_options: Mapping[str, Options] = field(default_factory=dict)  # mode → its Options instance
    # A streaming lane claims no training it could not finish within this many seconds of its start (the job's time
    # limit less the requeue signal's delay); None: no limit.
    claim_until_s: float | None = None
    # What this job asked and what one GPU here is billed against (gpupack.core.cost.billing); empty: not known.
    billing: Mapping[str, object] = field(default_factory=dict)
    training_estimate_s: float | None = None  # sweep.training_estimate_s, until a lane has measured its own
    job_gpus: int = 1  # a lane of packs runs one pack on each of the job's GPUs at once (gpupack.job.turns)
    fold: bool = False  # a lane of packs folds each pack it ends into its journal (gpupack.core.store.journal)
    # packing.memory_fraction, split among a pack's trainings and enforced per training (gpupack.job.runtime.memshare);
    # None: packing.memory_share=off.
    memory_share: float | None = None
    memory_margin: float = 0.25  # packing.memory_margin (gpupack.core.memory.figures.memory_shares)
    # packing.admission (gpupack.core.memory.admission): the lane's budget is memory_fraction of its GPU's memory, or
    # on a CPU host_memory_mb (None: memory_fraction of the host's); training_memory_mb is sweep.training_memory_mb.
    admission: bool = True
    memory_fraction: float = 0.8
    host_memory_mb: float | None = None
    training_memory_mb: float | None = None

    def options(self, mode: str, kind: type[OptionsT]) -> OptionsT:
        """``mode``'s own options as these settings carry them, else its defaults (``kind()``)."""
        given = self.mode_options.get(mode)
        if given is None:
            return kind()
        if not isinstance(given, kind):
            raise TypeError(f"the settings carry {type(given).__name__} for mode {mode}, not {kind.__name__}")
        return given


# gpupack's words for where a pack's job stands; each backend maps its queue's states onto these.
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
PACK_STATES = (PENDING, RUNNING, DONE, FAILED)


class PackState(str):
    """A pack's state as progress is told it, with why it failed where known (``why``): a ``str`` equal to the
    state's name, so a library user's progress callback still compares it with "failed"."""

    why: str | None

    def __new__(cls, state: str, why: str | None = None) -> PackState:
        made = super().__new__(cls, state)
        made.why = why
        return made


@dataclass
class PackResult:
    pack_id: str
    partition: str
    job_id: str | None
    ok: bool  # the job ran to its end (its trainings may still have failed: see the records)
    error: str | None = None
    record: Mapping[str, object] | None = None  # the pack's record (gpupack.core.store.records.PackRecord)


@dataclass(frozen=True)
class JobForecast:
    """The jobs a submission of some packs makes, against what the site lets the user have (a backend's answer)."""

    jobs: int  # a lane of packs each (an array task each on SLURM); at the least possible where over the limit
    packs: int = 0  # the packs they run
    arrays: int = 0  # SLURM job arrays they go in (0: no arrays)
    max_array_size: int | None = None  # tasks per array at most (MaxArraySize)
    allowed: int | None = None  # more jobs the user may queue now (the limit less those queued); None: no limit known
    limit: str = ""  # which limit ``allowed`` comes from, e.g. "your association's MaxSubmitJobs=1000"
    queued: int | None = 0  # the user's jobs already queued or running; None: the queue did not answer
    queue_why: str = ""  # why the queue did not answer, in its own words
    gpus: int = 0  # GPUs the jobs hold in all (0: not told; one a job, a spread training's k)
    idle_gpus: int = 0  # GPUs of jobs of several that no pack of theirs will use (fewer packs than GPUs)
    folds: bool = True  # a lane of packs folds them into its journal (a cluster's shared filesystem)

    @property
    def over(self) -> bool:
        return self.allowed is not None and self.jobs > self.allowed

    def queued_text(self) -> str:
        """The user's jobs in the queue now, as a line says them: never 0 where the queue did not answer."""
        if self.queued is None:
            return f"queued now: unknown (squeue not reachable: {self.queue_why or 'no answer'})"
        return f"{self.queued:,} queued"


@dataclass(frozen=True)
class PackRequest:
    """What one pack job of N trainings asks the scheduler for, and the config keys that set it (for errors)."""

    cpus: int | None
    mem_mb: int | None
    cpus_key: str = ""
    mem_key: str = ""
    cpus_each: float | None = None  # per training, as the user gave it
    mem_gb_each: float | None = None
    mem_why: str = "as set"  # where mem_gb_each comes from: as set, the measured peak with headroom, or a default

