"""Submission backends: the only place that knows about executors and clusters. Each backend is a module
``gpupack/submit/<backend>.py`` exposing ``SUBMITTER``, a :class:`Submitter` subclass whose ``Config`` is registered as
``cluster/<backend>_schema``. A backend answers once what each partition can hold (:meth:`Submitter.capacities`), so
that validation stays pure, and hands each pack to the one job body, :class:`PackJob`."""
from __future__ import annotations

import importlib
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Generic, Mapping, Sequence, TypedDict, TypeVar, cast

import submitit

from gpupack.core.jobenv import JobEnvironment
from gpupack.core.memory.figures import Figure
from gpupack.core.plan import Pack, Plan
from gpupack.core.registry import exported, module_names, require_known
from gpupack.core.store.records import PackRecord, read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir, RunLock
from gpupack.core.store.storage import failure_line, storage_faults, write_fault
from gpupack.core.types import (
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    Capacity,
    JobForecast,
    PackRequest,
    PackResult,
    PackSettings,
    PackState,
)
from gpupack.errors import ConfigError, SubmissionError
from gpupack.job.body import run_pack
from gpupack.job.lanes import run_lane
from gpupack.job.turns import InTurn, run_in_turn


@dataclass
class ClusterConfig:
    """What every backend's config has; each backend extends it (LocalConfig, SlurmConfig)."""

    name: str = "local"
    backend: str = "local"  # the module under gpupack/submit/ that runs packs
    timeout_min: int = 60  # time limit of one pack job (minutes)


class SubmittedJob(TypedDict, total=False):
    """A pack's job in the run directory's jobs.json; ``history``: its earlier jobs."""
    job_id: str
    partition: str
    backend: str
    submitted_at: float
    history: list[str]


JobRecord = PackRecord | InTurn  # what a pack's job returns: its pack record, or a lane of whole packs' records
PackJobHandle = submitit.Job[JobRecord]  # a submitted pack's job, as submitit follows it
ProgressFn = Callable[[Pack, str], None]  # called with (pack, state): "pending" → "running" → "done" | "failed"


class PackJob(submitit.helpers.Checkpointable):
    """The job body as submitit runs it, for ``submitter`` (which says what job the pack runs in). Checkpointable:
    when SLURM signals the time limit, submitit requeues the same call, which runs only what has no record."""

    def __init__(self, submitter: type[Submitter[ClusterConfig]]) -> None:
        self.submitter = submitter

    def __call__(self, run_root: str, pack_id: str | list[str], settings: PackSettings) -> JobRecord:
        """One pack (its id), a streaming lane (its pack id), or a lane of whole packs run in turn (their ids). A write
        the run directory refuses ends the job with a StorageError, whose one line is the pack's failure."""
        with storage_faults(run_root):
            from gpupack.search.lane import lane_kind  # a job's own: the command imports submit too

            job = self.submitter.job_environment()
            plan = Plan.from_json(read_json(RunDir(Path(run_root)).plan))  # read once: the job body is handed it
            record: JobRecord
            if isinstance(pack_id, list):
                record = run_in_turn(run_root, pack_id, settings, job=job, plan=plan, kind=lane_kind)
            elif plan.pack(pack_id).stream is None:
                return run_pack(run_root, pack_id, settings, job=job, plan=plan)
            else:  # a lane: a grid's claims its queue, a search's asks its study (gpupack.job.lanes)
                record = run_lane(run_root, pack_id, settings, job=job, plan=plan, kind=lane_kind)
            if record.get("stopped_claiming") and record.get("unclaimed") and self.submitter.requeues:
                # Near its time limit with trainings left: requeue now, as SLURM's signal would a little later.
                os.kill(os.getpid(), self.submitter.requeue_signal())
            return record


ConfigT = TypeVar("ConfigT", bound=ClusterConfig, covariant=True)


class Submitter(ABC, Generic[ConfigT]):
    """One backend: where packs run. ``cluster``: its ``Config``, or a DictConfig of it (which reads the same)."""

    Config: ClassVar[type[ClusterConfig]]
    detachable: ClassVar[bool] = False  # can submit and return (wait=false): jobs outlive this process
    requeues: ClassVar[bool] = False  # a job signalled near its time limit is requeued (submitit's checkpoint)

    def __init__(self, cluster: ConfigT, run: RunDir, key_prefix: str = "cluster",
                 key_names: Mapping[str, str] | None = None) -> None:
        self.cluster: ConfigT = cluster
        self.run = run
        # Where the user set these options, for error messages: cluster.*, or the Hydra launcher's own names.
        self.key_prefix = key_prefix
        self.key_names = dict(key_names or {})
        self.measured_host_mb: Figure | None = None  # one training's host memory figure, set by prepare
        self.lock: RunLock | None = None  # the run's lock, held by the command and the local backend's jobs

    def key(self, name: str) -> str:
        return f"{self.key_prefix}.{self.key_names.get(name, name)}"

    @classmethod
    @abstractmethod
    def job_environment(cls) -> JobEnvironment:
        """Inside one of this backend's jobs: the job as the pack record names it."""

    @classmethod
    def launcher_config(cls, options: Mapping[str, Any], key: str) -> ConfigT:
        """This backend's Config from a Hydra launcher's options; an error names ``key``.<option>."""
        raise ConfigError(key, cls.__module__.rpartition(".")[2], "no Hydra launcher runs on this backend",
                          "use hydra/launcher=gpupack_local or hydra/launcher=gpupack_slurm")

    @classmethod
    def launcher_names(cls, cluster: ClusterConfig) -> dict[str, str]:
        """The launcher's name of each of this backend's options that it names otherwise (for :meth:`key`)."""
        return {}

    @abstractmethod
    def resolve_partitions(self, requested: Sequence[str]) -> tuple[str, ...]:
        """The partitions a sweep runs on, from what the user asked (empty: the backend's default)."""

    def check(self, partitions: Sequence[str]) -> None:
        """Every option of this backend's config, used by this run or not (raise ConfigError)."""
        if self.cluster.timeout_min < 1:
            raise ConfigError(self.key("timeout_min"), self.cluster.timeout_min, "must be >= 1 (minutes)",
                              f"give each pack job at least a minute, e.g. {self.key('timeout_min')}=60")

    @abstractmethod
    def capacities(self, partitions: Sequence[str]) -> dict[str, Capacity]:
        """What one pack job on each partition can have. May ask the cluster (sinfo) or NVML, once."""

    @classmethod
    def requeue_signal(cls) -> int:
        """The signal that makes one of this backend's jobs checkpoint and requeue (requeues=True)."""
        raise NotImplementedError(f"{cls.__name__} does not requeue")

    def stream_jobs(self, partition: str) -> int:
        """How many streaming lanes of one (partition, mode, N) may run at once here (packing.jobs=null)."""
        return 1

    def claim_until_s(self) -> float | None:
        """Seconds after a job starts past which a streaming lane claims nothing it could not finish."""
        return float(self.cluster.timeout_min) * 60

    def request(self, factor: int, measured_host_mb: Figure | None = None) -> PackRequest:
        """What one pack of ``factor`` trainings asks for, from one training's host memory figure. Pure."""
        return PackRequest(cpus=None, mem_mb=None)

    def job_forecast(self, packs: Sequence[Pack]) -> JobForecast:
        """The jobs submitting ``packs`` makes, against the site's limits where the backend knows them."""
        return JobForecast(jobs=len(packs), packs=len(packs))

    @abstractmethod
    def request_lines(self, packs: Sequence[Pack]) -> list[str]:
        """What submitting ``packs`` asks of the scheduler, as a dry run says it."""

    @abstractmethod
    def run_packs(self, packs: Sequence[Pack], settings: PackSettings, progress: ProgressFn) -> list[PackResult]:
        """Run every pack as one job on one device, wait for all, and say how each job ended."""

    def require_reachable(self) -> None:
        """Before a run writes anything: raise UnreachableError where this backend's scheduler does not answer."""

    def require_detachable(self) -> None:
        if not self.detachable:
            raise ConfigError("wait", False, f"the {self.cluster.name} backend runs jobs in this process",
                              "use wait=false with a SLURM cluster (cluster=slurm, cluster=fir, ...)")

    def detach(self, packs: Sequence[Pack], settings: PackSettings) -> dict[str, str]:
        """Submit and return at once: pack id → job id."""
        self.require_detachable()
        return {}

    def pack_states(self, job_ids: Sequence[str]) -> dict[str, str] | None:
        """gpupack's state (PACK_STATES) of each job id the queue knows; None when the queue cannot be asked."""
        return {}

    def jobs(self) -> dict[str, SubmittedJob]:
        """The run directory's record of submitted jobs (jobs.json)."""
        return read_json(self.run.jobs) if self.run.jobs.exists() else {}

    def remember(self, submitted: Mapping[str, tuple[str, str]]) -> None:
        """Add pack id → (job id, partition); an earlier job of the same pack stays in its history."""
        jobs = self.jobs()
        for pack_id, (job_id, partition) in submitted.items():
            earlier = jobs.get(pack_id)
            history = (earlier.get("history", []) + [earlier["job_id"]]) if earlier else []
            jobs[pack_id] = {"job_id": job_id, "partition": partition, "backend": self.cluster.backend,
                             "submitted_at": time.time(), "history": history}
        write_json_atomic(self.run.jobs, jobs)

    def active_packs(self) -> dict[str, str]:
        """Packs whose job is still queued or running: pack id → job id. Fails closed: when the queue cannot be
        asked, a pack that may still run is not submitted twice."""
        jobs = self.jobs()
        if not jobs:
            return {}
        states = self.pack_states([j["job_id"] for j in jobs.values()])
        if states is None:
            raise SubmissionError(f"run_dir={str(self.run.root)!r}: the queue did not answer, so gpupack cannot tell "
                                  "which of its packs still run; nothing was submitted again. HINT: retry when "
                                  "sacct answers, or check with squeue -u $USER")
        return {p: j["job_id"] for p, j in jobs.items() if states.get(j["job_id"]) in (PENDING, RUNNING)}


def job_failure(text: str, run: RunDir | None) -> str:
    """Why a job failed, in one line where it can be told: the gpupack error that ended it, else why the run directory
    refuses a write now (a full disk: the job could write neither its result nor its log), else submitit's text."""
    line = failure_line(text)
    if line is not None:
        return line
    fault = write_fault(run.root) if run is not None and "has not produced any output" in text else None
    return str(fault) if fault is not None else text[-2000:]


def available_backends() -> list[str]:
    return module_names(__path__)


def backend_class(backend: str) -> type[Submitter[ClusterConfig]]:
    require_known(backend, available_backends(), "cluster.backend", "submission backend")
    submitter = exported(importlib.import_module(f"{__name__}.{backend}"), "SUBMITTER", type)
    if not issubclass(submitter, Submitter):
        raise TypeError(f"gpupack/submit/{backend}.py's SUBMITTER is no Submitter class")
    return submitter


def backend_configs() -> dict[str, type]:
    """Each backend's config dataclass, by backend name (registered in Hydra's ConfigStore)."""
    return {name: backend_class(name).Config for name in available_backends()}


def load_submitter(backend: str, cluster: ClusterConfig, run: RunDir) -> Submitter[ClusterConfig]:
    return backend_class(backend)(cluster, run)


def progress_state(result: PackResult) -> str:
    """How a finished pack shows: done only when its job ran to its end and no training failed; else failed, why."""
    if result.ok and not (result.record or {}).get("n_failed"):
        return DONE
    return PackState(FAILED, None if result.ok else result.error)


def job_outcome(job: PackJobHandle, run: RunDir | None = None) -> JobRecord | str:
    """What a finished submitit job returned, or why it failed (ask once a job: submitit may wait for a result)."""
    try:
        return job.result()
    except Exception as err:
        return job_failure(str(err), run)


def job_result(pack: Pack, job: PackJobHandle, run: RunDir | None = None,
               outcome: JobRecord | str | None = None) -> PackResult:
    """How a finished job ended for ``pack``: its record, or why not; ``outcome``: the job's, where asked already."""
    record = job_outcome(job, run) if outcome is None else outcome
    if not isinstance(record, str) and "in_turn" in record:  # a lane of whole packs (run_in_turn): only it says so
        lane = cast(InTurn, record)
        record = lane["records"][pack.pack_id] if pack.pack_id in lane["records"] else \
            f"its lane left it unrun: {lane.get('stopped_claiming') or 'no time left'}"
    if isinstance(record, str):
        return PackResult(pack.pack_id, pack.partition, str(job.job_id), ok=False, error=record)
    return PackResult(pack.pack_id, pack.partition, str(job.job_id), ok=True, record=record)
