"""The load from outside the job while a pack runs (gpupack.job.runtime.foreign): the pure accounting by tables, the
readings with a faked clock, cores and process tree, and the sampler's figures with a fake NVML at the one seam."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from gpupack.core import monitor
from gpupack.job.runtime.foreign import (
    ForeignLoad,
    LoadSpan,
    ProcTimes,
    descendants,
    foreign_cpu_s,
    foreign_figures,
    tree_cpu_delta,
    tree_times,
    watched_cpus,
)
from gpupack.job.runtime.sampler import Sampler
from tests.fakes import FakeNvml

ROOT, CHILD, GRAND = (1000, 0.0), (1001, 0.0), (1002, 0.0)


def P(ppid: int, self_s: float, reaped_s: float = 0.0) -> ProcTimes:
    return ProcTimes(ppid, self_s, reaped_s)


# (before, now) → the CPU seconds the job's processes spent between the two readings (what they really did)
TREE_CASES = [
    pytest.param({ROOT: P(1, 1), CHILD: P(1000, 5)}, {ROOT: P(1, 2), CHILD: P(1000, 7)}, 3.0, id="both ran"),
    pytest.param({ROOT: P(1, 1)}, {ROOT: P(1, 1), CHILD: P(1000, 0.5)}, 0.5, id="a training began"),
    # the child had 4 s, did 2 more and ended; the root reaped all 6: 2 are new
    pytest.param({ROOT: P(1, 1), CHILD: P(1000, 4)}, {ROOT: P(1, 1, 6)}, 2.0, id="a training ended, reaped"),
    # the grandchild (3 s, +0.5) reaped by the child (2 s, +0.5), the child by the root: 1 s is new
    pytest.param({ROOT: P(1, 1), CHILD: P(1000, 2), GRAND: P(1001, 3)}, {ROOT: P(1, 1, 6)}, 1.0,
                 id="a chain ended, reaped up"),
    # reaped by none of the job's (auto-reaped): nothing came back to take back from
    pytest.param({ROOT: P(1, 1), CHILD: P(1000, 4)}, {ROOT: P(1, 1)}, 0.0, id="an ended child not reaped here"),
    # pid 1001 given again: the old process did 0.2 more and was reaped, the new one did 1
    pytest.param({ROOT: P(1, 1), CHILD: P(1000, 4)}, {ROOT: P(1, 1, 4.2), (1001, 9.0): P(1000, 1)}, 1.2,
                 id="a pid given again"),
    # an orphan (its parent, the training, ended) is still followed: its own time keeps counting
    pytest.param({ROOT: P(1, 1), CHILD: P(1000, 3), GRAND: P(1001, 2)}, {ROOT: P(1, 1, 3.5), GRAND: P(1, 4)}, 2.5,
                 id="an orphan followed"),
]


@pytest.mark.parametrize("before, now, spent", TREE_CASES)
def test_the_jobs_own_cpu_time_between_two_readings(before, now, spent):
    assert tree_cpu_delta(before, now) == pytest.approx(spent)


@pytest.mark.parametrize("busy, own, seconds, cores, foreign", [
    (3.0, 1.0, 1.0, 4, 2.0),
    (1.0, 1.02, 1.0, 4, 0.0),  # the readings' skew: never below 0
    (9.0, 0.0, 1.0, 4, 4.0),  # nor above what the cores could give
])
def test_foreign_cpu_time_is_busy_less_own_within_the_cores(busy, own, seconds, cores, foreign):
    assert foreign_cpu_s(busy, own, seconds, cores) == pytest.approx(foreign)


@pytest.mark.parametrize("cpus, listed, watched", [
    ([0, 1], 2, None),  # every core: the node's total
    ([2, 3], 8, [2, 3]),  # a SLURM job's cores: those alone
    ([5, 9], 8, None),  # a core past the list (cores offline): which line is which is not known
])
def test_the_cores_watched_are_the_jobs(cpus, listed, watched):
    assert watched_cpus(cpus, listed) == watched


FIGURE_CASES = [
    pytest.param([LoadSpan(1.0, 1.0), LoadSpan(1.0, 0.0), LoadSpan(0.5, 0.5)], None,
                 {"foreign_cpu_cores_mean": 0.6, "foreign_cpu_cores_max": 1.0, "foreign_measured_s": 2.5,
                  "foreign_gpu_procs_max": None, "foreign_gpu_mem_mb_max": None}, id="no NVML: GPU unknown"),
    pytest.param([], [(0, 0.0), (0, 0.0)],
                 {"foreign_cpu_cores_mean": None, "foreign_cpu_cores_max": None, "foreign_measured_s": 0.0,
                  "foreign_gpu_procs_max": 0, "foreign_gpu_mem_mb_max": 0.0}, id="never measured CPU; quiet GPU"),
    pytest.param([LoadSpan(1.0, 0.0)], [(0, 0.0), (2, 700.0), (1, 300.0)],
                 {"foreign_cpu_cores_mean": 0.0, "foreign_gpu_procs_max": 2, "foreign_gpu_mem_mb_max": 700.0},
                 id="another process on the GPU"),
    pytest.param([LoadSpan(1.0, 0.0)], [(1, None)], {"foreign_gpu_procs_max": 1, "foreign_gpu_mem_mb_max": None},
                 id="its memory not said: unknown"),
    pytest.param([LoadSpan(1.0, 0.0)], [], {"foreign_gpu_procs_max": None, "foreign_gpu_mem_mb_max": None},
                 id="NVML never answered: unknown"),
]


@pytest.mark.parametrize("intervals, gpu, expected", FIGURE_CASES)
def test_samples_to_figures(intervals, gpu, expected):
    got = foreign_figures(intervals, gpu, host_cores=8, job_cores=2)
    assert got["host_cores"] == 8 and got["job_cores"] == 2
    assert {k: got[k] for k in expected} == expected


class Readings:
    """A fake clock, cores and process tree, each read in turn."""

    def __init__(self, clock, busy, trees):
        self.clock, self.busy, self.trees = list(clock), list(busy), list(trees)
        self.watched: list = []

    def load(self, **kw) -> ForeignLoad:
        return ForeignLoad([0, 1], root=ROOT[0], busy=lambda cpus: self.watched.append(cpus) or self.busy.pop(0),
                           tree=lambda root, follow: self.trees.pop(0), clock=lambda: self.clock.pop(0),
                           host_cores=2, listed=2, **kw)


def test_readings_give_intervals_and_keep_a_too_short_one_for_the_next():
    r = Readings(clock=[0.0, 1.0, 1.1, 2.0], busy=[10.0, 11.5, 11.6, 13.5],
                 trees=[{ROOT: P(1, 1)}, {ROOT: P(1, 1.5)}, {ROOT: P(1, 1.6)}, {ROOT: P(1, 3.5)}])
    load = r.load()
    assert load.read() is None  # a baseline
    assert load.read() == LoadSpan(1.0, 1.0)  # 1.5 s busy, 0.5 s of it the job's
    assert load.read() is None  # 0.1 s: kept for the next
    assert load.read() == LoadSpan(pytest.approx(1.0), pytest.approx(0.0))
    assert r.watched == [None] * 4  # the job may use every core: the node's total
    assert load.figures(None)["foreign_cpu_cores_mean"] == pytest.approx(0.5)


@pytest.mark.parametrize("last, before, judged", [
    (True, False, True),  # a pack of 0.2 s: judged at its end (a hog beside it is named)
    (False, False, False),  # a sample 0.2 s in: kept for the next reading
    (True, True, False),  # an end 0.2 s after a sample: kept out (the pack has its intervals)
])
def test_a_short_pack_is_judged_at_its_end(last, before, judged):
    clock = [0.0, 1.0, 1.2] if before else [0.0, 0.2]
    busy = [0.0, 1.0, 1.2] if before else [0.0, 0.2]  # a core busy the whole time, none of it the job's
    r = Readings(clock=clock, busy=busy, trees=[{ROOT: P(1, 0.0)}] * len(clock))
    load = r.load()
    assert load.read() is None  # the first training's start: a baseline
    if before:
        assert load.read() == LoadSpan(1.0, pytest.approx(1.0))
    span = load.read(last=last)
    assert (span is not None) == judged
    if judged:
        assert span == LoadSpan(pytest.approx(0.2), pytest.approx(0.2))  # a whole core: over the bar


def test_a_sampled_pack_records_the_foreign_load_and_gpu_processes(monkeypatch):
    """Through the sampler, with NVML faked at the one seam: a process of the job (under it), another's process with
    memory, a graphics process NVML does not say the memory of, and one gone before it could be looked up."""
    ours, theirs, drawing, gone = 2001, 4242, 4343, 4444
    fake = FakeNvml(procs=[(ours, 512 * 2**20), (theirs, 300 * 2**20), (gone, 9 * 2**20)],
                    graphics_procs=[(drawing, None)])
    monkeypatch.setattr(monitor, "_nvml", lambda: fake)
    tree = {ROOT: P(1, 1.0)}
    r = Readings(clock=[0.0, 1.0, 2.0, 3.0], busy=[0.0, 1.0, 3.0, 3.0], trees=[tree] * 4)
    parents = {ours: [ours, 3000, ROOT[0]], theirs: [theirs, 1], drawing: [drawing, 1], gone: None}
    load = r.load(ancestors=parents.get)
    sampler = Sampler(gpu="0", log=lambda m: None, foreign=load)
    sampler.register("t", os.getpid())  # the first training's start (a real process): the baseline
    first = sampler.sample_once()
    assert first["foreign_cpu_cores"] == 1.0
    assert (first["foreign_gpu_procs"], first["foreign_gpu_mem_mb"]) == (2, None)  # the graphics one: unknown
    fake.graphics_procs = []
    assert (sampler.sample_once()["foreign_gpu_procs"], sampler.samples[-1]["foreign_gpu_mem_mb"]) == (1, 300.0)
    report = sampler.stop()  # the last interval, up to the end
    assert report["foreign_cpu_cores_mean"] == pytest.approx(1.0)  # 3 core-seconds over 3 s
    assert report["foreign_cpu_cores_max"] == 2.0 and report["foreign_measured_s"] == 3.0
    assert report["foreign_gpu_procs_max"] == 2 and report["foreign_gpu_mem_mb_max"] == 300.0
    assert report["host_cores"] == 2 and report["job_cores"] == 2


def test_without_nvml_the_gpu_figures_are_unknown_not_zero(monkeypatch):
    monkeypatch.setattr(monitor, "_nvml", lambda: FakeNvml(fail_init=RuntimeError("Driver Not Loaded")))
    r = Readings(clock=[0.0, 1.0, 2.0], busy=[0.0, 0.0, 0.0], trees=[{ROOT: P(1, 1.0)}] * 3)
    sampler = Sampler(gpu="0", log=lambda m: None, foreign=r.load())
    sampler.register("t", os.getpid())
    sampler.sample_once()
    report = sampler.stop()
    assert report["foreign_cpu_cores_mean"] == 0.0
    assert report["foreign_gpu_procs_max"] is None and report["foreign_gpu_mem_mb_max"] is None


def test_on_this_machine_a_busy_child_of_the_job_is_its_own_work():
    """For real (psutil, /proc): the CPU a process under the job burns between two readings is the job's own, what
    the cores' busy time is reduced by (others' load on this shared machine may still be foreign)."""
    import psutil

    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 60: pass"])
    try:
        before = tree_times(os.getpid(), ())
        burnt = psutil.Process(child.pid)
        start = sum(burnt.cpu_times()[:2])  # read after ``before``: the child burns no less between the two readings
        deadline = time.monotonic() + 50
        while sum(burnt.cpu_times()[:2]) - start < 0.5 and time.monotonic() < deadline:
            time.sleep(0.1)  # until the child has burnt 0.5 CPU-s, however loaded the machine is
        now = tree_times(os.getpid(), before)
        assert any(pid == child.pid for pid, _ in now)
        assert tree_cpu_delta(before, now) >= 0.5  # at least what the child burnt: it is the job's own work
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("command, foreign", [
    (None, 1.0),  # the command's busy core, seen from the job: load from outside
    (7, 0.0),  # the command named (the local backend's): the run's own
])
def test_the_command_on_the_jobs_host_is_the_runs_own(command, foreign):
    """The job's own processes use nothing; the command that runs the sweep here keeps a core busy for a second."""
    r = Readings(clock=[0.0, 1.0], busy=[0.0, 1.0], trees=[{ROOT: P(1, 0.0)}] * 2)
    seen = iter([5.0, 6.0])
    load = r.load(command=command, command_times=lambda pid: {(pid, 1.0): ProcTimes(1, next(seen), 0.0)})
    assert load.read() is None
    assert load.read() == LoadSpan(1.0, pytest.approx(foreign))


def test_the_commands_own_time_leaves_out_what_it_reaped():
    """What a command reaped (a lane's ended job, under its controller) is not its own work."""
    from gpupack.job.runtime.foreign import own_times

    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)  # a child of ours, reaped
    ((pid, _), times), = own_times(os.getpid()).items()
    assert pid == os.getpid() and times.reaped_s == 0.0 and times.self_s > 0


def test_the_jobs_processes_are_listed_from_the_kernels_children_lists_as_psutil_finds_them(tmp_path):
    """A child, a grandchild under it and a process that forked from a thread: the kernel's lists
    (/proc/<pid>/task/<tid>/children) find what psutil's scan of the whole host finds. The thread lives on: a
    thread's children are listed under it, not under its process's first thread, until it ends."""
    code = ("import subprocess, sys, threading, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
            "threading.Thread(target=lambda: (subprocess.Popen(['sleep', '30']), time.sleep(30))).start()\n"
            "time.sleep(30)\n")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        me = psutil.Process()
        assert wait_for_count(lambda: len(me.children(recursive=True)), 3)
        found = descendants(os.getpid())
        assert found is not None and sorted(found) == sorted(p.pid for p in me.children(recursive=True))
    finally:
        for p in psutil.Process(child.pid).children(recursive=True) + [psutil.Process(child.pid)]:
            p.kill()
        child.wait()


def test_without_the_kernels_children_lists_the_job_is_found_by_psutil(tmp_path):
    assert descendants(os.getpid(), proc=tmp_path) is None  # a /proc without them: tree_times asks psutil
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import gpupack.job.runtime.foreign as foreign

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(foreign, "PROC", tmp_path)
            assert wait_for_count(lambda: len(tree_times(os.getpid(), ())), 2)
    finally:
        child.kill()
        child.wait()


def wait_for_count(count, wanted: int, timeout_s: float = 20) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if count() >= wanted:
            return True
        time.sleep(0.05)
    return False


def test_a_process_kept_between_readings_is_let_go_once_it_ends():
    """The psutil handles kept from one reading to the next hold only the job's living processes: a lane that runs
    thousands of trainings does not keep one per training that ever ran."""
    import gpupack.job.runtime.foreign as foreign

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert wait_for_count(lambda: int(child.pid in {pid for pid, _ in tree_times(os.getpid(), ())}), 1)
        assert child.pid in foreign._KNOWN
    finally:
        child.kill()
        child.wait()
    tree_times(os.getpid(), ())
    assert child.pid not in foreign._KNOWN and os.getpid() in foreign._KNOWN
