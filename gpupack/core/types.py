"""The types every layer shares: what a backend says a partition holds, what a pack's job is told and asks for,
how a training and a pack job ended. Defined here, at the bottom, so that the modules that use them import
downward only."""
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
    # One node as the scheduler reports it (sinfo), to tell when a pack's request leaves a node's GPUs idle.
    node_gpus: int | None = None
    node_cpus: int | None = None
    node_mem_mb: float | None = None
    # What one GPU (or MIG slice) of this partition is billed against (gpupack.core.cost.billing): its cores and memory.
    bundle_cores: float | None = None
    bundle_mem_gb: float | None = None
    # The most devices one job may ask for, where the site says (one MIG instance per job), with the rule's words.
    max_devices_per_job: int | None = None
    devices_rule: str | None = None
    # The device model a pack here runs on: "cpu", or a GPU model (the preset's A100-40gb, A100-1g.5gb; NVML's name
    # locally); memory measured on another is not used here (gpupack.core.memory.figures.same_device). None: unknown.
    device: str | None = None



class Options(Protocol):
    """A mode's or a strategy's own options (its ``Options`` dataclass: packing.<mode>.*, spread.<strategy>_*), which
    refuse a bad value themselves, whether or not the sweep uses them. A dataclass: its fields are the config keys."""

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
    # The RGU table's name of the GPU this pack's partition gives (from the cluster preset), used when NVML
    # cannot name the device itself.
    gpu_model: str | None = None
    sample_interval_s: float = 1.0
    # Each mode's own options (mode → its Options dataclass instance: packing.process.*, packing.tf_logical.*).
    mode_options: Mapping[str, Options] = field(default_factory=dict)
    # A streaming lane claims no training it could not finish within this many seconds of its start (the job's time
    # limit less the requeue signal's delay; set by the backend); None: no limit.
    claim_until_s: float | None = None
    # What this pack's job asked and what one GPU here is billed against, for the pack record
    # (gpupack.core.cost.billing): gpus, cpus, mem_gb, bundle_cores, bundle_mem_gb. Empty: not known (a local run).
    billing: Mapping[str, object] = field(default_factory=dict)
    # One training's wall as the sweep estimates it (sweep.training_estimate_s), until a lane has measured its own.
    training_estimate_s: float | None = None
    # GPUs this job holds (set by the backend): a lane of packs runs one pack on each of them at once, each pack on
    # its GPU alone (gpupack.job.turns).
    job_gpus: int = 1
    # A lane of packs folds each pack it ends into the lane's journal (gpupack.core.store.journal): a few files per job
    # on the shared filesystem instead of five per training. Set by the backend for the lanes it deals.
    fold: bool = False
    # The share of a GPU's memory a pack's trainings may fill together (packing.memory_fraction), split among them
    # and enforced per training (gpupack.job.runtime.memshare); None: packing.memory_share=off.
    memory_share: float | None = None
    # A training whose setting was measured gets its peak x (1 + this) instead, where they fit
    # (packing.memory_margin: gpupack.core.memory.figures.memory_shares).
    memory_margin: float = 0.25
    # A streaming lane's freed slot takes a training only when the memory it is expected to peak at fits
    # (packing.admission: gpupack.core.memory.admission): the lane's budget is memory_fraction of its GPU's memory, or
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
    """A pack's state as progress is told it, with why it failed where that is known (``why``: one line). A ``str``
    equal to the state's name, so a progress callback of two arguments, (pack, state), as a library user writes it,
    still compares it with "failed" and prints it as before; a front-end that shows the reason reads ``why``."""

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

