"""This machine, no cluster: submitit's LocalExecutor runs the run's packs as jobs here, one per device at a time, so
that packs never disturb each other's timing. The whole packs go in lanes, one a slot, that run their packs in turn:
a sweep pays one job start per slot, not one per pack. Lanes do not fold their packs."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import psutil
import submitit

from gpupack.core.jobenv import JobEnvironment, job_cores
from gpupack.core.monitor import detect_device, gpu_count
from gpupack.core.plan import Pack, deal
from gpupack.core.store.records import read_json_or_none
from gpupack.core.store.rundir import RunDir, check_name
from gpupack.core.types import PENDING, RUNNING, Capacity, JobForecast, PackResult, PackSettings
from gpupack.core.waits import close_fd, pidfd, wait_readable
from gpupack.errors import ConfigError
from gpupack.submit import (
    ClusterConfig,
    PackJob,
    PackJobHandle,
    ProgressFn,
    Submitter,
    job_outcome,
    job_result,
    progress_state,
)
from gpupack.submit._submitit import CONTROLLER, SessionLocalExecutor

POLL_S = 0.2  # how often the jobs' progress is looked at; a job's end is seen as it comes (its controller's pidfd)
CANCEL_WAIT_S = 5.0  # for each level of a cancelled job's process tree to be gone


@dataclass
class LocalConfig(ClusterConfig):
    """The local backend's options (conf/cluster/local.yaml)."""

    partition: str = "local"  # the partition label recorded with every pack
    max_parallel_packs: Optional[int] = None  # packs run at once; null: one per visible GPU, or one on a CPU


def process_room() -> int | None:
    """Processes this user may still start here: the soft ulimit -u (which counts threads too) and the kernel's pid
    space, less what runs now. None when neither is known."""
    running = len(psutil.pids())
    room = []
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY:
        room.append(soft - running)
    with contextlib.suppress(OSError, ValueError):
        room.append(int(Path("/proc/sys/kernel/pid_max").read_text()) - running)
    return max(0, min(room)) if room else None


def command_pid() -> int | None:
    """In a local job: the gpupack command whose submitit controller started it (its parent's parent), or None."""
    try:
        controller = psutil.Process(os.getppid())
        return (controller.ppid() or None) if CONTROLLER in controller.cmdline() else None
    except psutil.Error:
        return None


def controllers_of(folder: Path | str) -> set[int]:
    """The submitit controllers this process started for ``folder``, found even before it holds their jobs."""
    pids = set()
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if CONTROLLER in (cmd := child.cmdline()) and cmd[-1] == str(folder):
                pids.add(child.pid)
    return pids


def _running(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)  # a killed child of a killed parent lingers as a zombie
    except psutil.NoSuchProcess:
        return False


def process_levels(pids: Iterable[int]) -> list[list[psutil.Process]]:
    """``pids`` and all their descendants, level by level: parents before their children."""
    level: list[psutil.Process] = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            level.append(psutil.Process(pid))
    levels = []
    while level:
        levels.append(level)
        below: list[psutil.Process] = []
        for proc in level:
            with contextlib.suppress(psutil.NoSuchProcess):
                below += proc.children()
        level = below
    return levels


def cancel_jobs(controller_pids: Iterable[int]) -> int:
    """Stop local pack jobs now, with every process under them (trainings lead sessions of their own, and submitit's
    job ignores SIGTERM). The whole tree is listed first (an orphan is re-parented and could no longer be found), then
    SIGKILLed level by level, each level gone before the next, so the packer dies before its trainings and records
    none of them as killed by the cancel: they run again on resume. Returns how many processes it stopped."""
    stopped = 0
    for level in process_levels(controller_pids):
        for proc in level:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()  # psutil checks the pid was not reused since it was listed
                stopped += 1
        deadline = time.time() + CANCEL_WAIT_S
        while any(_running(p) for p in level) and time.time() < deadline:
            time.sleep(0.02)
    return stopped


class LocalSubmitter(Submitter[LocalConfig]):
    Config = LocalConfig

    @classmethod
    def job_environment(cls) -> JobEnvironment:
        """submitit's local job, the GPUs it may see, the command that runs it, and temporary space of its own."""
        job_id = submitit.JobEnvironment().job_id
        tmp = job_temp_dir(job_id)
        os.makedirs(tmp, exist_ok=True)
        return JobEnvironment(job_id=job_id, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                              command_pid=command_pid(), tmp_dir=tmp)

    @classmethod
    def launcher_config(cls, options: Mapping[str, Any], key: str) -> LocalConfig:
        """hydra/launcher=gpupack_local: timeout_min and max_parallel_packs, as they are."""
        return LocalConfig(name="gpupack_local", backend="local", timeout_min=int(options["timeout_min"]),
                           partition="local", max_parallel_packs=options.get("max_parallel_packs"))

    def resolve_partitions(self, requested: Sequence[str]) -> tuple[str, ...]:
        label = check_name(self.key("partition"), self.cluster.partition)
        if list(requested) not in ([], [label]):
            raise ConfigError("partitions", list(requested), f"the {self.cluster.name} cluster has one partition, "
                              f"{label!r}", f"partitions=[{label}] (or a SLURM cluster, cluster=slurm, to compare "
                              "partitions)")
        return (label,)

    def check(self, partitions: Sequence[str]) -> None:
        super().check(partitions)
        if (slots := self.cluster.max_parallel_packs) is not None and slots < 1:
            raise ConfigError(self.key("max_parallel_packs"), slots, "must be >= 1 or null",
                              f"{self.key('max_parallel_packs')}=null for one pack per device")

    def capacities(self, partitions: Sequence[str]) -> dict[str, Capacity]:
        """This machine: NVML's device (or none), the cores this process may use, its memory."""
        info = detect_device()
        gpus = gpu_count() if info.kind == "gpu" else 0
        cap = Capacity(has_gpu=info.kind == "gpu", gpu_memory_mb=info.memory_total_mb, max_cpus=job_cores(),
                       max_mem_mb=psutil.virtual_memory().total / 2**20, max_processes=process_room(),
                       # this machine is the node: a training may spread over its GPUs, or over its cores on a CPU
                       node_gpus=gpus or None, node_cpus=job_cores(), node_mem_mb=psutil.virtual_memory().total / 2**20,
                       device=info.name if info.kind == "gpu" else "cpu")
        return {name: cap for name in partitions}

    def slots(self) -> list[list[int]]:
        """The devices packs may use at once: one GPU each, or one CPU-wide slot."""
        gpus = gpu_count()
        n = self.cluster.max_parallel_packs or max(gpus, 1)
        return [[i % gpus] for i in range(n)] if gpus else [[] for _ in range(n)]

    def stream_jobs(self, partition: str) -> int:
        return len(self.slots())

    def job_forecast(self, packs: Sequence[Pack]) -> JobForecast:
        return JobForecast(jobs=len(local_lanes(packs, len(self.slots()))), packs=len(packs), folds=False)

    def request_lines(self, packs: Sequence[Pack]) -> list[str]:
        slots = self.slots()
        where = ", ".join(f"GPU {s[0]}" for s in slots) if slots[0] else f"{len(slots)} CPU-wide slot(s)"
        return [f"request: no sbatch here: submitit's LocalExecutor runs {len(local_lanes(packs, len(slots)))} "
                f"job(s) (lanes of packs, in turn) on this machine, {len(slots)} at a time, one a slot ({where}), "
                f"each pack within {self.key('timeout_min')}={self.cluster.timeout_min}"]

    def run_packs(self, packs: Sequence[Pack], settings: PackSettings, progress: ProgressFn) -> list[PackResult]:
        executor = SessionLocalExecutor(folder=str(self.run.submitit_folder))
        lock = self.lock.fd if self.lock is not None else None
        executor.inherit = (lock,) if lock is not None else ()
        running: list[LaneJob] = []
        try:
            return self._run(executor, packs, settings, progress, running)
        except BaseException:  # stopped (Ctrl-C, or a signal the CLI turned into one) or broken: these jobs run under
            # this process, and none may outlive it
            cancel_jobs({int(lane.job.job_id) for lane in running} | controllers_of(executor.folder))
            raise
        finally:
            for lane in running:  # cancelled: ended above
                lane.release()

    def _run(self, executor: submitit.LocalExecutor, packs: Sequence[Pack], settings: PackSettings,
             progress: ProgressFn, running: list[LaneJob]) -> list[PackResult]:
        """Submit lanes as slots free up and wait for all; ``running`` holds the jobs not yet finished."""
        free = self.slots()
        n_slots, n_gpus = len(free), gpu_count()
        queue = local_lanes(packs, n_slots)
        results: list[PackResult] = []
        for p in packs:
            progress(p, PENDING)
        while queue or running:
            while queue and (taken := take_slots(queue[0][0], free, n_slots, n_gpus)) is not None:
                running.append(self._submit(executor, queue.pop(0), taken, settings))
                progress(running[-1].packs[0], RUNNING)
            wait_readable([lane.ended_fd for lane in running], POLL_S)
            for lane in running:
                results += lane.look(self.run, progress)
            for lane in [r for r in running if r.job.done()]:
                running.remove(lane)
                free += lane.slots
                lane.release()
                results += lane.finish(self.run, progress)
        return results

    def _submit(self, executor: submitit.LocalExecutor, packs: list[Pack], taken: list[list[int]],
                settings: PackSettings) -> LaneJob:
        """One job for a lane's packs on the slots ``taken``. Each pack keeps its own limit, timeout_min: its trainings
        are stopped past it (where packing.training_timeout_s is unset), so a pack that hangs ends alone and the lane
        goes on; the job's own limit is one pack's more than its packs' (their preloads)."""
        gpus = spread_gpus(packs[0], taken)
        submitted_at = time.time()
        executor.update_parameters(timeout_min=self.cluster.timeout_min * (len(packs) + 1), gpus_per_node=len(gpus),
                                   visible_gpus=gpus, name=packs[0].pack_id)
        lane_settings = dataclasses.replace(  # no claim limit: nothing here requeues a lane that stopped claiming
            settings, claim_until_s=None,
            training_timeout_s=settings.training_timeout_s or self.cluster.timeout_min * 60.0)
        job = executor.submit(PackJob(type(self)), str(self.run.root),
                              packs[0].pack_id if len(packs) == 1 else [p.pack_id for p in packs], lane_settings)
        if self.lock is not None:  # its controller holds the run's lock with this command: a refusal names it
            self.lock.add_job(int(job.job_id))
        return LaneJob(packs, taken, job, submitted_at, ended_fd=pidfd(int(job.job_id)))  # a local job's id: its pid


def job_temp_dir(job_id: str) -> str:
    """A local job's own temporary space (as SLURM gives a job node-local space), named by its id so that the command
    that watches the job finds it and removes it once the job has ended, however it ended."""
    return os.path.join(tempfile.gettempdir(), f"gpupack-job-{job_id}")


def local_lanes(packs: Sequence[Pack], slots: int) -> list[list[Pack]]:
    """The jobs a run here makes: its whole packs dealt to a lane a slot, then a job for each other pack. Pure."""
    whole = [p for p in packs if p.stream is None and p.devices <= 1]
    return deal(whole, min(slots, len(whole))) + [[p] for p in packs if p.stream is not None or p.devices > 1]


@dataclass
class LaneJob:
    """A job running here: its packs (a lane in turn, or one), the slots it holds, and what progress showed."""

    packs: list[Pack]
    slots: list[list[int]]
    job: PackJobHandle
    submitted_at: float  # a pack record from before (an earlier run's, a reused pid's job id) is not this job's
    ended: list[str] = field(default_factory=list)  # the lane's packs that ended while it goes on, in turn
    ended_fd: int | None = None  # its controller's pidfd: readable once the job has ended

    def release(self) -> None:
        """What the ended job held here: its controller's pidfd and its temporary space (:func:`job_temp_dir`)."""
        close_fd(self.ended_fd)
        shutil.rmtree(job_temp_dir(self.job.job_id), ignore_errors=True)

    def look(self, run: RunDir, progress: ProgressFn) -> list[PackResult]:
        """The lane's packs that ended since the last look, in turn, from their records (this job's), shown done with
        the next running while the job goes on. A lane of one pack ends with its job."""
        out: list[PackResult] = []
        while 1 < len(self.packs) > len(self.ended):
            pack = self.packs[len(self.ended)]
            record = read_json_or_none(run.pack_record(pack.pack_id))
            if record is None or str(record.get("job_id")) != str(self.job.job_id) \
                    or float(record.get("started_at") or 0) < self.submitted_at:  # not yet, or an earlier run's
                break
            self.ended.append(pack.pack_id)
            out.append(PackResult(pack.pack_id, pack.partition, str(self.job.job_id), ok=True, record=record))
            progress(pack, progress_state(out[-1]))
            if len(self.ended) < len(self.packs):
                progress(self.packs[len(self.ended)], RUNNING)
        return out

    def finish(self, run: RunDir, progress: ProgressFn) -> list[PackResult]:
        """How the job ended for each of its packs: the records they left, then the job's result for the rest."""
        out = self.look(run, progress)
        left = [p for p in self.packs if p.pack_id not in self.ended]
        outcome = job_outcome(self.job, run) if left else None  # once for the lane: each ask may wait for a result
        for pack in left:
            out.append(job_result(pack, self.job, run, outcome))
            progress(pack, progress_state(out[-1]))
        return out


def take_slots(pack: Pack, free: list[list[int]], n_slots: int, n_gpus: int) -> list[list[int]] | None:
    """The free slots a pack starts on, removed from ``free``; None while it must wait. One slot; a training spread over
    k GPUs takes slots of k distinct GPUs (slots repeat GPUs where max_parallel_packs is above the GPU count), or,
    where the slots name fewer than k GPUs, every slot. On a CPU machine a slot is the whole machine."""
    if not free:
        return None
    if not (n_gpus and pack.devices > 1):
        return [free.pop(0)]
    if len({g for slot in free for g in slot}) < pack.devices:
        if n_slots > len(free):
            return None  # not enough distinct GPUs free yet
        every = list(free)  # every slot is free and still too few GPUs: hold them all
        free.clear()
        return every
    taken: list[list[int]] = []
    seen: set[int] = set()
    for slot in list(free):
        if len(seen) == pack.devices:
            break
        if not set(slot) & seen:
            seen.update(slot)
            taken.append(slot)
            free.remove(slot)
    return taken


def spread_gpus(pack: Pack, taken: Sequence[list[int]]) -> list[int]:
    """The GPUs a pack's job sees: its slots', or, holding every slot of fewer than k GPUs, the machine's first k."""
    gpus = sorted({g for slot in taken for g in slot})
    if pack.devices > 1 and gpus and len(gpus) < pack.devices:
        return list(range(pack.devices))
    return gpus


SUBMITTER = LocalSubmitter
