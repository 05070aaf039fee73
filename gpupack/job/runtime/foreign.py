"""Load from outside the pack while it ran: the CPU time other processes took on the job's cores, and the processes
on its GPU that are not the job's. The pack's sampler (:mod:`gpupack.job.runtime.sampler`) reads it at every sample.

CPU: between two readings, the busy time of the job's cores (its affinity only: other jobs on other cores of a shared
node do not slow it) less the CPU time of the job's own processes, the job process and all under it
(:func:`tree_cpu_delta`). GPU: the processes NVML lists on the job's devices that are not the job's
(:meth:`ForeignLoad.foreign_gpu`); unknown (None) without NVML, never 0. The readings (:func:`busy_s`,
:func:`tree_times`, :func:`lineage`) are what a test fakes, handed to :class:`ForeignLoad`.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import psutil

# What /proc/stat counts as a core's busy time (not iowait nor idle; guest time is inside user already).
BUSY_FIELDS = ("user", "system", "nice", "irq", "softirq", "steal")
# Shorter intervals wait for the next reading: the kernel counts CPU time in 10 ms ticks, whose rounding would read as
# load over a tenth of a second.
MIN_INTERVAL_S = 0.25
# The end of a pack with no interval yet reads down to this, or a short pack would never be judged at all.
MIN_LAST_INTERVAL_S = 0.15

Key = tuple[int, float]  # (pid, create time): a pid the kernel gives again later is another process


@dataclass(frozen=True)
class ProcTimes:
    """One process's CPU time so far, as ``psutil.Process.cpu_times`` reads it."""
    ppid: int
    self_s: float  # user + system: the process itself, all its threads
    reaped_s: float  # children_user + children_system: the descendants it waited for, once they ended

    @property
    def total_s(self) -> float:
        return self.self_s + self.reaped_s


@dataclass(frozen=True)
class LoadSpan:
    """One interval between two readings: its length, and the CPU time others took in it on the job's cores."""
    seconds: float
    foreign_cpu_s: float

    @property
    def cores(self) -> float:
        return self.foreign_cpu_s / self.seconds


def tree_cpu_delta(before: Mapping[Key, ProcTimes], now: Mapping[Key, ProcTimes]) -> float:
    """The CPU seconds the job's processes spent between two readings of them (``before``, ``now``). Pure.

    A process new since ``before`` counts whole. One that ended between them landed its whole time in its reaper's
    ``reaped_s``: what was counted of it at the last reading is taken back from its first ancestor still here, at
    most by what that ancestor's reaped time grew. Every process of the job is under the live job process and reaped
    by its parent, so an ended one's time moves into an ancestor that is read: only an orphan's last interval can
    escape (its time goes to init), and the cap keeps the take-back within what was counted."""
    delta = sum(proc.total_s - (before[key].total_s if key in before else 0.0) for key, proc in now.items())
    here = {key[0]: key for key in now}
    known = {key[0]: key for key in before}
    owed: dict[Key, float] = {}
    for key, proc in before.items():
        if key in now:
            continue
        ppid, seen = proc.ppid, set()  # its first ancestor still the same process now: where its time went
        while ppid in known and ppid not in seen:
            seen.add(ppid)
            if here.get(ppid) == (up := known[ppid]):
                owed[up] = owed.get(up, 0.0) + proc.total_s
                break
            ppid = before[up].ppid  # the parent ended too: its time went on up, to its own parent
    for key, amount in owed.items():
        grew = now[key].reaped_s - before[key].reaped_s
        delta -= min(amount, max(grew, 0.0))
    return delta


def foreign_cpu_s(busy_s: float, own_s: float, seconds: float, cores: int) -> float:
    """The cores' busy time less the job's own, within what the cores could give. Pure."""
    return min(max(busy_s - own_s, 0.0), seconds * cores)


def foreign_figures(intervals: Sequence[LoadSpan], gpu: Sequence[tuple[int, float | None]] | None,
                    host_cores: int, job_cores: int) -> dict[str, object]:
    """The pack record's figures of load from outside the job. Pure. ``gpu``: at each GPU sample, the foreign
    processes and their memory in MB (None: NVML did not say); None without NVML (the GPU figures unknown)."""
    measured = sum(i.seconds for i in intervals)
    out: dict[str, object] = {
        # time-weighted: the last interval (up to the pack's end) is shorter than the others
        "foreign_cpu_cores_mean": round(sum(i.foreign_cpu_s for i in intervals) / measured, 3) if measured else None,
        "foreign_cpu_cores_max": round(max(i.cores for i in intervals), 3) if intervals else None,
        "foreign_measured_s": round(measured, 3), "host_cores": host_cores, "job_cores": job_cores,
        "foreign_gpu_procs_max": None, "foreign_gpu_mem_mb_max": None,
    }
    if gpu:  # None or no GPU reading at all (every one failed): unknown
        procs = max(n for n, _ in gpu)
        mems = [mb for n, mb in gpu if n and mb is not None]
        out["foreign_gpu_procs_max"] = procs
        # none: 0; some whose memory NVML did not say: the largest known, or unknown when none was
        out["foreign_gpu_mem_mb_max"] = 0.0 if not procs else round(max(mems), 1) if mems else None
    return out


def _busy(times: object) -> float:
    """``times``: psutil's cpu_times(), a named tuple whose fields differ by platform (read by name, 0 if absent)."""
    return float(sum(getattr(times, name, 0.0) for name in BUSY_FIELDS))


def busy_s(cpus: Sequence[int] | None) -> float:
    """The busy CPU seconds so far of ``cpus`` (None: every core of the node)."""
    if cpus is None:
        return _busy(psutil.cpu_times())
    per_cpu = psutil.cpu_times(percpu=True)
    return sum(_busy(per_cpu[i]) for i in cpus)


def watched_cpus(cpus: Sequence[int], listed: int) -> list[int] | None:
    """The cores to watch for ``cpus`` (the job's affinity) when /proc/stat lists ``listed`` cores; None (the whole
    node) where they are all of them, or a number is past the list (cores offline: lines no longer match cores)."""
    if len(set(cpus)) >= listed or not cpus or max(cpus) >= listed:
        return None
    return sorted(set(cpus))


PROC = Path("/proc")


def descendants(root: int, proc: Path = PROC) -> list[int] | None:
    """The pids under ``root``, from each thread's ``/proc/<pid>/task/<tid>/children`` (the job's processes only,
    where psutil's ``children`` reads every process of the host); None where the kernel has no such list."""
    if not (proc / str(root) / "task" / str(root) / "children").exists():
        return None
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(proc / str(pid) / "task")
        except OSError:  # ended since its parent listed it
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in (proc / str(pid) / "task" / task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


# The job's processes as psutil.Process, kept between readings (making one costs a third of a sample at N=34). A pid
# the kernel gives again makes ppid() raise NoSuchProcess at the next reading; the samplers of a job share it.
_KNOWN: dict[int, psutil.Process] = {}
_KNOWN_LOCK = threading.Lock()


def _process(pid: int) -> psutil.Process:
    with _KNOWN_LOCK:
        proc = _KNOWN.get(pid)
    if proc is None:
        proc = psutil.Process(pid)
        with _KNOWN_LOCK:
            proc = _KNOWN.setdefault(pid, proc)
    return proc


def handle(key: Key) -> psutil.Process | None:
    """The kept handle of the process ``key`` names; None where it is gone or its pid went to another."""
    try:
        proc = _process(key[0])
    except psutil.Error:
        return None
    return proc if proc.create_time() == key[1] else None


def _under(top: psutil.Process) -> list[psutil.Process]:
    """Every process under ``top``: from the kernel's lists of children where it keeps them, else from psutil."""
    pids = descendants(top.pid, PROC)
    if pids is None:
        return list(top.children(recursive=True))
    procs = []
    for pid in pids:
        try:
            procs.append(_process(pid))
        except psutil.Error:
            continue
    return procs


def tree_times(root: int, follow: Iterable[Key]) -> dict[Key, ProcTimes]:
    """The CPU time of ``root``, every process under it, and those of ``follow`` now orphaned (still the job's)."""
    out: dict[Key, ProcTimes] = {}
    try:
        top = _process(root)
        procs = [top, *_under(top)]
    except psutil.Error:
        return out
    under = {p.pid for p in procs}
    procs += [proc for key in follow if key[0] not in under and (proc := handle(key)) is not None]
    for proc in procs:
        try:
            out.update(_times(proc, reaped=True))
        except psutil.Error:  # ended since it was listed: its parent's reaped time has it at the next reading
            continue
    read = {pid for pid, _ in out}
    with _KNOWN_LOCK:  # let go of the handles of processes this reading did not read: ended
        for pid in [pid for pid in _KNOWN if pid not in read]:
            del _KNOWN[pid]
    return out


def _times(proc: psutil.Process, reaped: bool) -> dict[Key, ProcTimes]:
    """One process's reading; with ``reaped``, the time of the descendants it waited for too."""
    with proc.oneshot():
        t = proc.cpu_times()
        return {(proc.pid, proc.create_time()): ProcTimes(
            proc.ppid(), t.user + t.system, t.children_user + t.children_system if reaped else 0.0)}


def own_times(pid: int) -> dict[Key, ProcTimes]:
    """The CPU time of ``pid`` itself, without what it reaped (another job's); empty where it is gone."""
    try:
        return _times(psutil.Process(pid), reaped=False)
    except psutil.Error:
        return {}


def lineage(pid: int) -> list[int] | None:
    """``pid`` and its ancestors, nearest first; None where it is gone (or this namespace does not have it)."""
    try:
        proc = psutil.Process(pid)
        return [pid, *(p.pid for p in proc.parents())]
    except psutil.Error:
        return None


@dataclass
class ForeignLoad:
    """The readings of one pack's sampler, at its first training's start, at every sample and at its end."""

    cpus: Sequence[int]  # the job's cores (its affinity)
    root: int = field(default_factory=os.getpid)  # the job process: the sampler runs in it
    busy: Callable[[Sequence[int] | None], float] = busy_s
    tree: Callable[[int, Iterable[Key]], dict[Key, ProcTimes]] = tree_times
    ancestors: Callable[[int], list[int] | None] = lineage
    clock: Callable[[], float] = time.monotonic
    # The gpupack command that runs the sweep, where it shares the job's host (local backend): not foreign load.
    command: int | None = None
    command_times: Callable[[int], dict[Key, ProcTimes]] = own_times
    host_cores: int = field(default_factory=lambda: psutil.cpu_count(logical=True) or 1)
    listed: int | None = None  # cores /proc/stat lists (None: asked here)
    intervals: list[LoadSpan] = field(default_factory=list)

    def __post_init__(self) -> None:
        listed = self.listed if self.listed is not None else len(psutil.cpu_times(percpu=True))
        self.watched = watched_cpus(self.cpus, listed)
        self.job_cores = len(self.watched) if self.watched is not None else self.host_cores
        self._lock = threading.Lock()
        self._last: tuple[float, float, dict[Key, ProcTimes]] | None = None
        self._ours: set[int] = set()  # every pid seen under the job process
        self.latest: dict[Key, ProcTimes] = {}  # the job's processes at the last reading (the sampler's families)

    def read(self, last: bool = False) -> LoadSpan | None:
        """The interval since the last reading; None at the first and where it is shorter than
        :data:`MIN_INTERVAL_S` (:data:`MIN_LAST_INTERVAL_S` for the ``last`` of a pack with no interval yet)."""
        with self._lock:
            at = self.clock()
            busy = self.busy(self.watched)
            procs = self.tree(self.root, self._last[2] if self._last is not None else ())
            self._ours |= {pid for pid, _ in procs}
            if self.command is not None:  # counted with the job's, never a family of a training (the sampler's)
                procs = {**procs, **self.command_times(self.command)}
            self.latest = procs
            if self._last is None:
                self._last = (at, busy, procs)
                return None
            was_at, was_busy, was_procs = self._last
            seconds = at - was_at
            if seconds < (MIN_LAST_INTERVAL_S if last and not self.intervals else MIN_INTERVAL_S):
                return None
            self._last = (at, busy, procs)
            own = tree_cpu_delta(was_procs, procs)
            interval = LoadSpan(seconds, foreign_cpu_s(busy - was_busy, own, seconds, self.job_cores))
            self.intervals.append(interval)
            return interval

    def foreign_gpu(self, listed: Mapping[int, float | None]) -> tuple[int, float | None]:
        """Of the processes NVML lists on the job's devices (pid → MB or None), how many are not the job's, and their
        memory (None where one's is unknown). One gone or outside this namespace is not called foreign."""
        with self._lock:
            ours = set(self._ours)
        foreign = [mb for pid, mb in listed.items()
                   if pid not in ours and (chain := self.ancestors(pid)) is not None and self.root not in chain]
        return len(foreign), (None if any(mb is None for mb in foreign) else round(sum(m or 0.0 for m in foreign), 1))

    def figures(self, gpu: Sequence[tuple[int, float | None]] | None) -> dict[str, object]:
        with self._lock:
            intervals = list(self.intervals)
        return foreign_figures(intervals, gpu, self.host_cores, self.job_cores)
