"""The pack's sampler: a thread beside the N trainings that samples the device every packing.sample_interval_s, or
less often where a sample costs more than :data:`MAX_OVERHEAD` of a core (:func:`next_wait`).

With NVML (:func:`gpupack.core.monitor._nvml`): utilization, memory used/total and memory per training process.
Always, with psutil: each training's CPU % and resident memory (its children included); and the load from outside the
job (:mod:`gpupack.job.runtime.foreign`). What NVML does not know is recorded as unknown (None), never as 0.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence, TypedDict

import psutil

from gpupack.core import monitor
from gpupack.core.jobenv import job_cpus
from gpupack.core.monitor import Nvml, NvmlHandle
from gpupack.core.store.records import Peaks
from gpupack.job.runtime.foreign import ForeignLoad, handle

MAX_KEPT_SAMPLES = 600  # the pack record keeps at most this many (evenly thinned); statistics use all
MAX_OVERHEAD = 0.01  # the sampler's own CPU, at most this share of a core (34 trainings: 24 ms a sample, H200)
_cpu_time = time.thread_time  # the sampler thread's own CPU seconds (a test's clock replaces it)


def next_wait(interval_s: float, cost_s: float, budget: float = MAX_OVERHEAD) -> float:
    """The wait after a sample costing ``cost_s`` of CPU: ``interval_s``, or more, within ``budget`` of a core. Pure."""
    return max(interval_s, cost_s / budget - cost_s)


class DeviceSample(TypedDict):
    """One device's reading at a sample (None: NVML does not report utilization there)."""
    gpu_util: float | None
    gpu_mem_util: float | None
    gpu_mem_used_mb: float


class TrainingSample(TypedDict, total=False):
    """One training's reading at a sample: its processes' RSS and CPU %, and GPU memory with NVML (None: unknown)."""
    rss_mb: float
    cpu_percent: float
    gpu_mem_mb: float | None


class Sample(TypedDict, total=False):
    """One sample of the pack record's ``sampler.samples``; GPU memory per process id (None: unknown)."""
    gpu_util: float | None
    gpu_mem_util: float | None
    gpu_mem_used_mb: float
    gpu_proc_mem_mb: dict[int, float | None]
    gpu_graphics_mem_mb: dict[int, float | None]
    gpus: list[DeviceSample]  # each device's, in a job of several
    t: float
    gpu_error: str
    trainings: dict[str, TrainingSample]
    foreign_cpu_cores: float
    foreign_gpu_procs: int
    foreign_gpu_mem_mb: float | None


@dataclass
class _Tracked:
    training_id: str
    proc: psutil.Process
    peak_rss_mb: float = 0.0
    cpu_samples: list[float] = field(default_factory=list)
    peak_gpu_mem_mb: float | None = None
    gpu_mem_known: bool = True


class Sampler:
    def __init__(self, interval_s: float = 1.0, mps: bool = False, no_gpu_reason: str = "",
                 log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True),
                 gpu: str | None = None, more_gpus: Sequence[str] = (), foreign: ForeignLoad | None = None,
                 command_pid: int | None = None) -> None:
        """``gpu``: the device as CUDA_VISIBLE_DEVICES names it ("0", "GPU-…", "MIG-…"); None: no GPU, for
        ``no_gpu_reason``. ``more_gpus``: a spread job's other devices (utilization averaged, memory summed, each under
        ``gpus``). ``foreign``: what reads the load from outside the job (else the job's cores, with ``command_pid``,
        the gpupack command on this host, counted as the run's own)."""
        self.interval_s = interval_s
        self.mps = mps
        self.log = log
        self.tracked: dict[int, _Tracked] = {}
        self._holders: dict[str, _Tracked] = {}  # training id → the entry holding its figures (its first process)
        self.samples: list[Sample] = []
        self.cpu_time_s = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_at = self._stopped_at = 0.0
        self.nvml: Nvml = None  # None: no NVML (CPU figures only)
        self.handle: NvmlHandle = None
        self.source, self.note, self.memory_total_mb = "cpu", "", None
        self.mig = False
        self._util_supported = True  # NVML does not report utilization on a MIG slice (NotSupported)
        self.more_handles: list[NvmlHandle] = []
        self.foreign = foreign if foreign is not None else ForeignLoad(job_cpus(), command=command_pid)
        self._open_nvml(gpu, no_gpu_reason)
        self._open_more(more_gpus)

    # ---- NVML, through the one seam ----

    def _open_nvml(self, gpu: str | None, no_gpu_reason: str) -> None:
        if gpu is None:
            self.note = f"{no_gpu_reason or 'no GPU in this job'}: sampling the CPU instead"
        else:
            nvml: Nvml = None
            try:
                nvml = monitor._nvml()
                nvml.nvmlInit()
                # The same lookup as detect_device's: a MIG slice is sampled as itself, not as its parent GPU.
                visible = monitor.resolve_visible({"CUDA_VISIBLE_DEVICES": gpu}, nvml)
                if visible is None:
                    raise LookupError(f"CUDA_VISIBLE_DEVICES={gpu!r} hides every GPU")
                self.memory_total_mb = nvml.nvmlDeviceGetMemoryInfo(visible.handle).total / 2**20
                self.handle, self.mig, self.nvml, self.source = visible.handle, visible.mig, nvml, "nvml"
            except LookupError as err:  # no such device: said, never another device sampled in its place
                self.note = f"{err}: sampling the CPU instead"
            except Exception as err:  # no library, no driver
                self.note = f"NVML unavailable ({err.__class__.__name__}: {err}): sampling the CPU instead"
            if self.nvml is None and nvml is not None:
                with contextlib.suppress(Exception):
                    nvml.nvmlShutdown()
        if self.note:
            self.log(f"gpupack sampler: {self.note}")  # said once, not at every sample

    def _open_more(self, gpus: Sequence[str]) -> None:
        """The other GPUs of a spread job, by the same lookup; one NVML does not know is said and left out."""
        if self.nvml is None:
            return
        for gpu in gpus:
            try:
                visible = monitor.resolve_visible({"CUDA_VISIBLE_DEVICES": gpu}, self.nvml)
                if visible is None:
                    raise LookupError(f"CUDA_VISIBLE_DEVICES={gpu!r} hides every GPU")
                self.more_handles.append(visible.handle)
                self.memory_total_mb = (self.memory_total_mb or 0.0) + \
                    self.nvml.nvmlDeviceGetMemoryInfo(visible.handle).total / 2**20
            except Exception as err:
                note = f"GPU {gpu!r} of this job not sampled ({err})"
                self.note = f"{self.note}; {note}" if self.note else note
                self.log(f"gpupack sampler: {note}")

    def _utilization(self, handle: NvmlHandle) -> tuple[float | None, float | None]:
        """NVML's utilization rates in % (GPU, memory); None, None once NVML said it does not report them here."""
        if not self._util_supported:
            return None, None
        try:
            rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
            return float(rates.gpu), float(rates.memory)
        except Exception as err:
            not_supported = getattr(self.nvml, "NVMLError_NotSupported", None)
            if not_supported is None or not isinstance(err, not_supported):
                raise  # a driver hiccup: this sample records gpu_error, as any other
            self._util_supported = False
            note = (f"NVML does not report GPU utilization on this {'MIG slice' if self.mig else 'device'}: "
                    "recorded as unknown (None), memory still sampled")
            self.note = f"{self.note}; {note}" if self.note else note
            self.log(f"gpupack sampler: {note}")  # once: later samples do not ask again
            return None, None

    def _gpu_sample(self) -> Sample:
        nvml = self.nvml
        list_procs = (nvml.nvmlDeviceGetMPSComputeRunningProcesses if self.mps
                      else nvml.nvmlDeviceGetComputeRunningProcesses)
        devices: list[DeviceSample] = []
        per_pid: dict[int, float | None] = {}
        graphics: dict[int, float | None] = {}
        for h in [self.handle, *self.more_handles]:
            util, mem_util = self._utilization(h)
            devices.append({"gpu_util": util, "gpu_mem_util": mem_util,
                            "gpu_mem_used_mb": nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20})
            for p in list_procs(h):  # a process on several GPUs (a DDP rank's context) is summed over them
                used = None if p.usedGpuMemory is None else p.usedGpuMemory / 2**20
                total = per_pid.get(p.pid, 0.0)
                per_pid[p.pid] = None if total is None or used is None else total + used  # unknown stays unknown
            # another's display or renderer (the job's trainings compute); none where NVML cannot list them
            with contextlib.suppress(Exception):
                for p in list(nvml.nvmlDeviceGetGraphicsRunningProcesses(h)):
                    graphics[p.pid] = None if p.usedGpuMemory is None else p.usedGpuMemory / 2**20
        utils = [u for d in devices if (u := d["gpu_util"]) is not None]
        mem_utils = [u for d in devices if (u := d["gpu_mem_util"]) is not None]
        out: Sample = {"gpu_util": sum(utils) / len(utils) if utils else None,
               "gpu_mem_util": sum(mem_utils) / len(mem_utils) if mem_utils else None,
               "gpu_mem_used_mb": sum(d["gpu_mem_used_mb"] for d in devices), "gpu_proc_mem_mb": per_pid}
        if graphics:
            out["gpu_graphics_mem_mb"] = graphics
        if len(devices) > 1:
            out["gpus"] = devices
        return out

    # ---- trainings ----

    def register(self, training_id: str, pid: int) -> None:
        try:
            proc = psutil.Process(pid)
            proc.cpu_percent(None)  # primes the counter: the first real reading covers one interval
        except psutil.Error:
            return
        with self._lock:
            first = not self.tracked
            self.tracked[pid] = _Tracked(training_id, proc)
            self._holders.setdefault(training_id, self.tracked[pid])  # keeps the training's figures (sample_once)
        if first:  # the load from outside is measured from the pack's first start, as its wall is
            self.foreign.read()

    def sample_once(self) -> Sample:
        sample: Sample = {"t": time.time()}
        if self.nvml is not None:
            try:
                sample.update(self._gpu_sample())
            except Exception as err:  # a driver hiccup must not take the pack down
                sample["gpu_error"] = str(err)
        with self._lock:
            tracked = list(self.tracked.values())
        interval = self.foreign.read()  # after NVML's list: a training it names has begun by then (foreign_gpu)
        sample["trainings"] = {training_id: self._training_entry(training_id, members, sample)
                               for training_id, members in self._families(tracked).items()}
        if interval is not None:
            sample["foreign_cpu_cores"] = round(interval.cores, 3)
        if "gpu_proc_mem_mb" in sample:
            listed = {**sample.get("gpu_graphics_mem_mb", {}), **sample["gpu_proc_mem_mb"]}
            sample["foreign_gpu_procs"], sample["foreign_gpu_mem_mb"] = self.foreign.foreign_gpu(listed)
        self.samples.append(sample)
        return sample

    def _families(self, tracked: Sequence[_Tracked]) -> dict[str, list[tuple[_Tracked, list[psutil.Process]]]]:
        """Each training's processes (a spread one's ranks too), from the tree the load reading has just walked."""
        families: dict[str, list[tuple[_Tracked, list[psutil.Process]]]] = {}
        kids: dict[int, list[psutil.Process]] = {}  # the job's processes by parent
        for key, times in self.foreign.latest.items():
            proc = handle(key)  # the reading's own handle: each process's made once
            if proc is not None:
                kids.setdefault(times.ppid, []).append(proc)
        below = {proc.pid for of_parent in kids.values() for proc in of_parent}
        for t in tracked:  # the training's process and its descendants; none once it ended
            if t.proc.pid in below:
                family, todo = [t.proc], [t.proc.pid]
                while todo:
                    for child in kids.get(todo.pop(), ()):
                        family.append(child)
                        todo.append(child.pid)
            else:  # not under the job (a test's, a reparented one): walked by psutil alone
                try:
                    family = [t.proc, *t.proc.children(recursive=True)] if t.proc.is_running() else []
                except psutil.Error:
                    family = []
            if family:
                families.setdefault(t.training_id, []).append((t, family))
        return families

    def _training_entry(self, training_id: str, members: Sequence[tuple[_Tracked, list[psutil.Process]]],
                        sample: Sample) -> TrainingSample:
        """One training's figures in this sample, its peaks kept on its first process's entry."""
        rss = cpu = 0.0
        pids: set[int] = set()
        for t, family in members:
            pids |= {p.pid for p in family}
            for p in family:
                try:
                    rss += p.memory_info().rss / 2**20
                    cpu += p.cpu_percent(None) if p is t.proc else 0.0
                except psutil.Error:
                    continue
        first = self._holders[training_id]
        first.peak_rss_mb = max(first.peak_rss_mb, rss)
        first.cpu_samples.append(cpu)
        entry: TrainingSample = {"rss_mb": round(rss, 1), "cpu_percent": round(cpu, 1)}
        if "gpu_proc_mem_mb" in sample:
            mems = [m for pid, m in sample["gpu_proc_mem_mb"].items() if pid in pids]
            known = [m for m in mems if m is not None]
            if len(known) < len(mems):
                first.gpu_mem_known = False  # NVML could not say: unknown, never 0
                entry["gpu_mem_mb"] = None
            elif known:
                entry["gpu_mem_mb"] = sum(known)
                first.peak_gpu_mem_mb = max(first.peak_gpu_mem_mb or 0.0, sum(known))
        return entry

    # ---- the thread ----

    def _run(self) -> None:
        while not self._stop.is_set():
            began = _cpu_time()
            if self.tracked:  # nothing to attribute before the first training starts
                self.sample_once()
            cost = _cpu_time() - began
            self.cpu_time_s += cost
            self._stop.wait(next_wait(self.interval_s, cost))

    def start(self) -> "Sampler":
        self._started_at = time.time()
        self._thread = threading.Thread(target=self._run, name="gpupack-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, object]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._stopped_at = time.time()
        if self.tracked:  # the last interval, up to the pack's end
            self.foreign.read(last=True)
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
        return self.report()

    def _figures(self, t: _Tracked) -> Peaks:
        return {
            # Never sampled (ended between two samples): unknown, not 0.
            "peak_rss_mb": round(t.peak_rss_mb, 1) if t.cpu_samples else None,
            "cpu_percent_mean": round(sum(t.cpu_samples) / len(t.cpu_samples), 1) if t.cpu_samples else None,
            "peak_gpu_mem_mb": t.peak_gpu_mem_mb if t.gpu_mem_known else None,
            "gpu_mem_known": t.gpu_mem_known if self.source == "nvml" else None,
        }

    def figures(self, training_id: str) -> Peaks:
        """What the samples so far say of one training (None: unknown, never 0); empty if never registered."""
        with self._lock:
            tracked = self._holders.get(training_id)
            return self._figures(tracked) if tracked is not None else {}

    def report(self) -> dict[str, object]:
        """The pack record's ``sampler`` (gpupack.core.store.records.Sampled): the samples kept, their statistics
        (``interval_mean_s``: between samples as taken, longer where samples cost more), and the load from outside."""
        def stat(key: Literal["gpu_util", "gpu_mem_used_mb"], fn: Callable[[list[float]], float]) -> float | None:
            values = [v for s in self.samples if (v := s.get(key)) is not None]
            return round(fn(values), 2) if values else None

        wall = max(self._stopped_at - self._started_at, 1e-9) if self._started_at else None
        step = max(1, len(self.samples) // MAX_KEPT_SAMPLES + (len(self.samples) % MAX_KEPT_SAMPLES > 0))
        cpu_totals = [sum(e["cpu_percent"] for e in s["trainings"].values()) for s in self.samples if s["trainings"]]
        return {
            "source": self.source, "note": self.note, "interval_s": self.interval_s,
            "interval_mean_s": round((self.samples[-1]["t"] - self.samples[0]["t"]) / (len(self.samples) - 1), 3)
            if len(self.samples) > 1 else None, "mps": self.mps,
            "n_samples": len(self.samples), "samples": self.samples[::step],
            "gpu_util_mean": stat("gpu_util", lambda v: sum(v) / len(v)), "gpu_util_max": stat("gpu_util", max),
            "gpu_mem_used_peak_mb": stat("gpu_mem_used_mb", max), "gpu_mem_total_mb": self.memory_total_mb,
            "cpu_percent_mean": round(sum(cpu_totals) / len(cpu_totals), 1) if cpu_totals else None,
            "per_training": {t.training_id: self._figures(t) for t in self._holders.values()},
            "overhead_cpu_s": round(self.cpu_time_s, 4),
            "overhead_fraction": round(self.cpu_time_s / wall, 5) if wall else None,
            **self.foreign.figures([(s["foreign_gpu_procs"], s["foreign_gpu_mem_mb"]) for s in self.samples
                                    if "foreign_gpu_procs" in s] if self.source == "nvml" else None),
        }
