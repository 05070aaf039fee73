"""Fakes shared by the fast tests: NVML at its one seam (gpupack.core.monitor._nvml), a submission backend that
answers from a table, and canned sinfo/sacct text for the SLURM backend's one seam
(gpupack.submit.slurm.commands.slurm_command).

    monkeypatch.setattr(monitor, "_nvml", lambda: FakeNvml(names=["Tesla T4"]))
    made = use_fake_submitter(monkeypatch, {"v100": Capacity(has_gpu=True, gpu_memory_mb=16384, max_cpus=8)})
    monkeypatch.setattr(gpupack.submit.slurm.commands, "slurm_command", canned_slurm(sinfo=SINFO))
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from gpupack.core.jobenv import JobEnvironment
from gpupack.core.memory.figures import Figure
from gpupack.core.plan import Pack
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import Capacity, PackRequest, PackResult, PackSettings
from gpupack.errors import ConfigError, nearest
from gpupack.job.body import run_pack
from gpupack.submit import ClusterConfig, ProgressFn, Submitter, progress_state

MB = 2**20

# ---------------- NVML ----------------


class FakeNvmlError(Exception):
    pass


class FakeNotFound(FakeNvmlError):
    pass


class FakeNotSupported(FakeNvmlError):
    pass


@dataclass
class FakeMig:
    name: str
    uuid: str
    total_mb: float
    gi: int  # GPU instance ID
    ci: int  # compute instance ID


@dataclass
class FakeGpu:
    name: str
    uuid: str
    total_mb: float
    migs: dict[int, FakeMig] | None = None  # MIG device index -> slice; None: no MIG (before Ampere)
    mig_mode: bool = False
    # This GPU's own figures; None: the FakeNvml's (util, used_mb, procs).
    util: tuple[int, int] | None = None
    used_mb: float | None = None
    procs: Sequence[tuple[int, int | None]] | None = None


H100_1G = FakeMig("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "MIG-1c1f9a3e-6b2d-5f0c-9d7e-2a4b8c6d0e11", 9984, 9, 0)
H100_3G = FakeMig("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "MIG-3c3f9a3e-6b2d-5f0c-9d7e-2a4b8c6d0e33", 40448, 2, 0)
A100_1G = FakeMig("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "MIG-a1a1d2c4-0e5f-5a6b-8c7d-9e0f1a2b3c4d", 9728, 13, 0)
MACHINE = [  # NVML index order
    FakeGpu("Tesla V100-SXM2-16GB", "GPU-0a0b0c0d-1111-2222-3333-444455556666", 16384),
    # MIG device indices 0 and 2 exist, 1 does not: the max count is how many may exist, not how many do
    FakeGpu("NVIDIA H100 80GB HBM3", "GPU-h100h100-7777-8888-9999-aaaabbbbcccc", 81559, {0: H100_1G, 2: H100_3G}, True),
    FakeGpu("NVIDIA A100-SXM4-80GB", "GPU-a100a100-dddd-eeee-ffff-000011112222", 81920, {0: A100_1G}, True),
    FakeGpu("NVIDIA A100-SXM4-40GB", "GPU-a140a140-3333-4444-5555-666677778888", 40960, {}, False),  # MIG off
]
V100, H100, A100_80, A100_40 = MACHINE


def gpus_named(names: Sequence[str], total_mb: float = 16384) -> list[FakeGpu]:
    """Whole GPUs (no MIG) of these names, 16 GB each."""
    return [FakeGpu(name, f"GPU-{i:08x}-0000-4000-8000-000000000000", total_mb) for i, name in enumerate(names)]


class FakeNvml:
    """Answers like nvidia-ml-py over ``gpus`` (a handle is ("gpu", i) or ("mig", i, j)): names (as bytes, as older
    bindings return them), UUIDs, MIG slices, memory, utilization and each device's compute (or MPS) processes.

    ``names``: whole 16 GB GPUs of these names instead of ``gpus``. ``driver="recent"``: nvmlDeviceGetHandleByUUID
    finds GPUs, MIG UUIDs and the MIG-GPU-<uuid>/<gi>/<ci> form; ``"old"``: only whole GPUs by their full UUID.
    ``fail_init``: nvmlInit raises it (no driver). ``procs``/``mps_procs``/``graphics_procs``: (pid, usedGpuMemory
    bytes or None).
    ``calls`` records "shutdown" and each process listing ("compute <handle>", "mps <handle>")."""

    NVMLError = FakeNvmlError
    NVMLError_NotFound = FakeNotFound
    NVMLError_NotSupported = FakeNotSupported
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, gpus: Sequence[FakeGpu] | None = None, *, names: Sequence[str] | None = None,
                 driver: str = "recent", procs: Sequence[tuple[int, int | None]] = (),
                 mps_procs: Sequence[tuple[int, int | None]] | None = None, util: tuple[int, int] = (37, 12),
                 used_mb: float = 3000, fail_init: BaseException | None = None,
                 graphics_procs: Sequence[tuple[int, int | None]] = ()) -> None:
        self.gpus = list(gpus) if gpus is not None else gpus_named(names if names is not None else ["Tesla T4"])
        self.driver, self.procs, self.mps_procs = driver, list(procs), mps_procs
        self.util, self.used_mb, self.fail_init = util, used_mb, fail_init
        self.graphics_procs = list(graphics_procs)
        self.calls: list[str] = []

    @property
    def shutdowns(self) -> int:
        return self.calls.count("shutdown")

    def _dev(self, h):
        return self.gpus[h[1]] if h[0] == "gpu" else self.gpus[h[1]].migs[h[2]]

    def _procs(self, h, default):
        own = getattr(self._dev(h), "procs", None)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in (own if own is not None else default)]

    def nvmlInit(self):
        if self.fail_init:
            raise self.fail_init

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if i >= len(self.gpus):
            raise FakeNvmlError("Invalid Argument")
        return ("gpu", i)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, g in enumerate(self.gpus):
            if g.uuid == uuid:
                return ("gpu", i)
            for j, m in (g.migs or {}).items():
                legacy = f"MIG-{g.uuid}/{m.gi}/{m.ci}"
                if self.driver == "recent" and uuid in (m.uuid, legacy):
                    return ("mig", i, j)
        raise FakeNotFound("Not Found")

    def nvmlDeviceGetMigMode(self, h):
        g = self._dev(h)
        if h[0] == "mig" or g.migs is None:
            raise FakeNotSupported("Not Supported")
        return [int(g.mig_mode), int(g.mig_mode)]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        g = self._dev(h)
        if h[0] == "mig" or g.migs is None:
            raise FakeNotSupported("Not Supported")
        return 7 if g.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        if j not in (self._dev(h).migs or {}):
            raise FakeNotFound("Not Found")
        return ("mig", h[1], j)

    def nvmlDeviceGetGpuInstanceId(self, h):
        if h[0] != "mig":
            raise FakeNotSupported("Not Supported")
        return self._dev(h).gi

    def nvmlDeviceGetComputeInstanceId(self, h):
        if h[0] != "mig":
            raise FakeNotSupported("Not Supported")
        return self._dev(h).ci

    def nvmlDeviceGetUUID(self, h):
        return self._dev(h).uuid

    def nvmlDeviceGetName(self, h):
        return self._dev(h).name.encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, h):
        dev = self._dev(h)
        used = getattr(dev, "used_mb", None)
        used_mb = self.used_mb if used is None else used
        return SimpleNamespace(total=int(dev.total_mb * MB), used=used_mb * MB, free=(dev.total_mb - used_mb) * MB)

    def nvmlDeviceGetUtilizationRates(self, h):
        if h[0] == "mig":  # what NVML answers on a MIG device handle
            raise FakeNotSupported("Not Supported")
        gpu, memory = self._dev(h).util or self.util
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self.calls.append(f"compute {h}")
        return self._procs(h, self.procs)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h):
        self.calls.append(f"mps {h}")
        return self._procs(h, self.mps_procs or [])

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self.graphics_procs]


def mig_nvml(driver: str = "recent", procs: Sequence[tuple[int, int | None]] = (), used_mb: float = 1500) -> FakeNvml:
    """A node with MIG slices (MACHINE): a V100, an H100 and an A100-80 in MIG mode, an A100-40 with MIG off."""
    return FakeNvml(MACHINE, driver=driver, procs=procs, util=(55, 20), used_mb=used_mb)


# ---------------- a submission backend ----------------

# Capacity of one pack job on each partition of the fake cluster: a 16 GB V100 with 8 cores and 40 GB of host memory
# per GPU (the Alliance's guidance), a CPU partition, a node of 4 H100 80 GB.
CAPACITIES = {
    "v100": Capacity(has_gpu=True, gpu_memory_mb=16 * 1024, max_cpus=8, max_mem_mb=40 * 1024, node_gpus=4,
                     node_cpus=32, node_mem_mb=160 * 1024),
    "cpu": Capacity(has_gpu=False, max_cpus=16, max_mem_mb=64 * 1024, node_cpus=16, node_mem_mb=64 * 1024),
    "h100": Capacity(has_gpu=True, gpu_memory_mb=80 * 1024, max_cpus=12, max_mem_mb=120 * 1024, node_gpus=4,
                     node_cpus=48, node_mem_mb=480 * 1024),
}


@dataclass
class FakeConfig(ClusterConfig):
    """The fake backend's options: its partitions, and what one pack asks for (None: nothing)."""

    name: str = "fake"
    backend: str = "fake"
    default_partitions: List[str] = field(default_factory=lambda: ["v100"])
    cpus_per_training: Optional[float] = 1.0
    mem_gb_per_training: Optional[float] = 2.0
    # True: each pack runs in this process through the real job body (gpupack.job.body.run_pack); False: packs are
    # only recorded (in FakeSubmitter.ran) and reported done without a record.
    run_packs: bool = True


class FakeSubmitter(Submitter):
    """A backend without executors or a cluster: partitions and their capacities from a table (CAPACITIES), packs
    run one after another in this process through gpupack.job.body.run_pack, or only recorded.

    ``asked``: each capacities() question (the partitions asked about); ``ran``: (pack id, settings) of each pack."""

    Config = FakeConfig

    def __init__(self, cluster: Any, run: RunDir, key_prefix: str = "cluster",
                 key_names: Mapping[str, str] | None = None,
                 capacities: Mapping[str, Capacity] | None = None) -> None:
        super().__init__(cluster, run, key_prefix, key_names)
        self.table: Dict[str, Capacity] = dict(CAPACITIES if capacities is None else capacities)
        self.asked: list[tuple[str, ...]] = []
        self.ran: list[tuple[str, PackSettings]] = []

    @classmethod
    def loader(cls, capacities: Mapping[str, Capacity] | None = None, config: FakeConfig | None = None,
               made: list[FakeSubmitter] | None = None) -> Callable[..., FakeSubmitter]:
        """A stand-in for gpupack.submit.load_submitter (patch it where the flow imported it): a FakeSubmitter over
        ``config`` (default: FakeConfig(), whatever cluster= composed); each one made is appended to ``made``."""

        def load(backend: str, cluster: Any, run: RunDir, key: str = "cluster.backend", **keys: Any) -> FakeSubmitter:
            sub = cls(config if config is not None else FakeConfig(), run, capacities=capacities, **keys)
            if made is not None:
                made.append(sub)
            return sub

        return load

    @classmethod
    def job_environment(cls) -> JobEnvironment:
        return JobEnvironment(job_id="fake", cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))

    def resolve_partitions(self, requested: Sequence[str]) -> tuple[str, ...]:
        names = list(requested) or list(self.cluster.default_partitions)
        for i, name in enumerate(names):
            if name not in self.table:
                raise ConfigError(f"partitions[{i}]", name, f"the {self.cluster.name} cluster has no such partition",
                                  nearest(name, list(self.table)))
        return tuple(names)

    def capacities(self, partitions: Sequence[str]) -> dict[str, Capacity]:
        self.asked.append(tuple(partitions))
        return {name: self.table[name] for name in partitions}

    def request(self, factor: int, measured_host_mb: Figure | None = None) -> PackRequest:
        cpus_each, mem_each = self.cluster.cpus_per_training, self.cluster.mem_gb_per_training
        return PackRequest(cpus=math.ceil(factor * cpus_each) if cpus_each else None,
                           mem_mb=math.ceil(factor * mem_each * 1024) if mem_each else None,
                           cpus_key=self.key("cpus_per_training"), mem_key=self.key("mem_gb_per_training"),
                           cpus_each=cpus_each, mem_gb_each=mem_each)

    def request_lines(self, packs: Sequence[Pack]) -> list[str]:
        return [f"request: the fake backend runs {len(packs)} pack(s) in this process"]

    def run_packs(self, packs: Sequence[Pack], settings: PackSettings, progress: ProgressFn) -> list[PackResult]:
        results = []
        for pack in packs:
            progress(pack, "pending")
            self.ran.append((pack.pack_id, settings))
            progress(pack, "running")
            job_id = f"fake-{len(self.ran)}"
            if not self.cluster.run_packs:
                result = PackResult(pack.pack_id, pack.partition, job_id, ok=True)
            else:
                try:
                    job = JobEnvironment(job_id=job_id, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
                    record = run_pack(str(self.run.root), pack.pack_id, settings, job=job)
                    result = PackResult(pack.pack_id, pack.partition, job_id, ok=True, record=record)
                except Exception as err:  # what submitit re-raises from a job that died
                    result = PackResult(pack.pack_id, pack.partition, job_id, ok=False, error=str(err)[-2000:])
            results.append(result)
            progress(pack, progress_state(result))
        return results


class FakeQueue:
    """A scheduler's queue that outlives each gpupack call, which the test drains: each submitted pack waits
    (pending) until :meth:`drain` runs it through the real job body, in this process."""

    def __init__(self) -> None:
        self.waiting: dict[str, tuple[str, str, PackSettings]] = {}  # job id -> (run root, pack id, settings)
        self.ended: dict[str, str] = {}  # job id -> pack id
        self.submitted = 0

    def submit(self, run: RunDir, pack_id: str, settings: PackSettings) -> str:
        self.submitted += 1
        job_id = f"queued-{self.submitted}"
        self.waiting[job_id] = (str(run.root), pack_id, settings)
        return job_id

    def drain(self) -> list[str]:
        """Run every waiting pack through the job's own entry (a pack, or a lane: a grid's or a search's); each as <its
        run directory's name>/<pack id>, in the order they were submitted."""
        from gpupack.submit import PackJob

        ran = []
        for job_id, (root, pack_id, settings) in list(self.waiting.items()):
            PackJob(_QueuedJob(job_id))(root, pack_id, settings)  # type: ignore[arg-type]
            del self.waiting[job_id]
            self.ended[job_id] = pack_id
            ran.append(f"{os.path.basename(root)}/{pack_id}")
        return ran


class _QueuedJob:
    """What a job's entry (gpupack.submit.PackJob) asks of its backend, for one job of a :class:`FakeQueue`."""

    requeues = False

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id

    def job_environment(self) -> JobEnvironment:
        return JobEnvironment(job_id=self.job_id, cuda_visible_devices=None)


class DetachedFakeSubmitter(FakeSubmitter):
    """A FakeSubmitter whose jobs outlive gpupack (wait=false): submitted to a :class:`FakeQueue`."""

    detachable = True
    queue: FakeQueue = FakeQueue()

    def detach(self, packs: Sequence[Pack], settings: PackSettings) -> dict[str, str]:
        submitted = {p.pack_id: self.queue.submit(self.run, p.pack_id, settings) for p in packs}
        self.remember({p.pack_id: (submitted[p.pack_id], p.partition) for p in packs})
        return submitted

    def pack_states(self, job_ids: Sequence[str]) -> dict[str, str] | None:
        return {j: "pending" if j in self.queue.waiting else "done" for j in job_ids}


def use_fake_submitter(monkeypatch: Any, capacities: Mapping[str, Capacity] | None = None,
                       config: FakeConfig | None = None, queue: FakeQueue | None = None) -> list[FakeSubmitter]:
    """Every flow (run, auto, status) loads a FakeSubmitter instead of cluster.backend's (with ``queue``: one whose
    jobs outlive each call, in that queue); returns those made."""
    import gpupack.sweep.flow.auto
    import gpupack.sweep.flow.run
    import gpupack.sweep.flow.status

    made: list[FakeSubmitter] = []
    if queue is not None:
        monkeypatch.setattr(DetachedFakeSubmitter, "queue", queue)
    load = (FakeSubmitter if queue is None else DetachedFakeSubmitter).loader(capacities, config, made)
    for module in (gpupack.sweep.flow.run, gpupack.sweep.flow.status):  # auto builds its steps through flow.run
        monkeypatch.setattr(module, "load_submitter", load)
    return made


# ---------------- canned SLURM answers ----------------

# `sinfo -h -o %P|%c|%m|%G` on a small cluster: a default partition of V100 and T4 nodes (one node line is in two
# partitions), a partition "gpubase" of 4-GPU A100 nodes (CPU counts with SLURM's "+" for "at least"), a CPU partition.
SINFO = """\
gpu*|32|191000|gpu:v100:4(S:0-1)
gpu*|16|64000|gpu:t4:2,gpu:v100:1
gpubase|64+|510000+|gpu:a100:4(S:0-3)
cpu|48|187000|(null)
"""

# `sacct -X -n -P -o JobID,State -j ...`: a requeued job appears once per run, its last line the latest.
SACCT = """\
101|COMPLETED
102_0|RUNNING
102_1|PENDING
103|CANCELLED by 0
104|REQUEUED
104|RUNNING
105|OUT_OF_MEMORY
"""


def canned_slurm(sinfo: str | None = SINFO, sacct: str | None = SACCT,
                 asked: list[list[str]] | None = None,
                 more: Mapping[str, str | None] | None = None) -> Callable[..., str | None]:
    """A stand-in for gpupack.submit.slurm.commands.slurm_command: the canned text of each command (None: it did not
    answer, as away from the cluster); ``asked`` collects each command line. ``more``: other commands' answers, by
    the command and its first words ("scontrol show", "sacctmgr show assoc", "sacctmgr show qos", "squeue")."""

    def slurm_command(args: Sequence[str], timeout: float = 30, why: list[str] | None = None) -> str | None:
        if asked is not None:
            asked.append(list(args))
        answer = answer_of(args)
        if answer is None and why is not None:
            why.append(f"{args[0]}: canned silence")
        return answer

    def answer_of(args: Sequence[str]) -> str | None:
        if args[0] in ("sinfo", "sacct"):
            return {"sinfo": sinfo, "sacct": sacct}[args[0]]
        words = [a for a in args if not a.startswith("-")]
        for n in (3, 2, 1):
            if more and " ".join(words[:n]) in more:
                return more[" ".join(words[:n])]
        return None

    return slurm_command
