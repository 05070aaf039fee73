"""How much memory one training needs, and how many fit on a device: the figures that cap N before anything runs and
size what a pack asks the scheduler for.

The figure for a training comes, first found, from:
  1. earlier records of the same workload and setting (same hyperparameters, any seed): the highest peak seen, in
     this run directory and its siblings (``runs/<sweep>/*``) — GPU memory per process as NVML saw it, else torch's
     own peak plus a CUDA context; host memory as the training's peak RSS;
  2. ``sweep.training_memory_mb`` (the user's word, until something is measured);
  3. a conservative default (1 GB).
:func:`find_measured` reads records (I/O); everything else here is pure.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from gpupack.core.store.journal import Folded, read_folded
from gpupack.core.store.records import COMPLETED, PackRecord, Peaks, TrainingRecord, read_pack, read_training
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import Capacity
from gpupack.errors import ConfigError

DEFAULT_HOST_MB = 1024.0  # nothing measured: a Python + torch training peaks near 0.3-0.8 GB of RSS
DEFAULT_GPU_MB = 1024.0  # nothing measured: a CUDA context (0.3-0.5 GB) and a small model's tensors and workspace
CUDA_CONTEXT_MB = 400.0  # what torch.cuda.max_memory_allocated leaves out: the context of each process
REQUEST_HEADROOM = 1.5  # a SLURM request is the measured peak x this (allocator growth, a longer epoch)
MIN_REQUEST_MB = 512.0
MAX_RECORDS_READ = 4000  # the newest records read for evidence: bounded, so prepare stays quick on a big run
MAX_RUNS_READ = 20


@dataclass(frozen=True)
class Figure:
    """Memory of one training (MB), and where the figure comes from, in words."""

    mb: float
    source: str
    measured: bool = False
    key: str | None = None  # the config key that stated it (sweep.training_memory_mb); None: measured or a default


@dataclass(frozen=True)
class TrainingMemory:
    host: Figure  # resident memory of one training's process
    gpu: Figure  # GPU memory of one training (its process's share as NVML sees it)


@dataclass(frozen=True)
class Measured:
    """The highest peaks seen in earlier records of the same workload and setting (None: none seen)."""

    host_mb: float | None = None
    gpu_mb: float | None = None
    trainings: int = 0
    where: str = ""


def setting_key(params: Mapping[str, object], seed_key: str = "seed") -> str:
    """The hyperparameters that set a training's memory: all but its seed."""
    return json.dumps({k: v for k, v in params.items() if k != seed_key}, sort_keys=True, default=str)


def estimate(stated_mb: float | None, measured: Measured) -> TrainingMemory:
    """The figure for one training, from the records, the user's word, or the default (in that order). Pure."""
    stated = Figure(float(stated_mb), f"sweep.training_memory_mb={stated_mb:g}", key="sweep.training_memory_mb") \
        if stated_mb is not None else None
    return TrainingMemory(
        host=_measured_or(measured.host_mb, measured, stated or Figure(DEFAULT_HOST_MB, "a default: nothing measured")),
        gpu=_measured_or(measured.gpu_mb, measured, stated or Figure(DEFAULT_GPU_MB, "a default: nothing measured")))


def _measured_or(mb: float | None, measured: Measured, fallback: Figure) -> Figure:
    if mb is None:
        return fallback
    return Figure(mb, f"the peak of {measured.trainings} earlier training(s) of this setting in {measured.where}",
                  measured=True)


def fits(budget_mb: float | None, each_mb: float) -> int | None:
    """How many trainings of ``each_mb`` fit in ``budget_mb`` (None: no budget known)."""
    return None if budget_mb is None else max(0, math.floor(budget_mb / each_mb))


def check_memory(factors: Sequence[int], capacities: Mapping[str, Capacity], memory: TrainingMemory,
                 fraction: float, key: Callable[[int], str]) -> None:
    """Each N must fit each partition's device: N x the GPU figure within fraction x the GPU's memory, N x the host
    figure within fraction x the host memory one job may have; N processes within what the job may start. Pure."""
    for name, cap in capacities.items():
        gpu_budget = cap.gpu_memory_mb * fraction if cap.has_gpu and cap.gpu_memory_mb else None
        host_budget = cap.max_mem_mb * fraction if cap.max_mem_mb else None
        for i, n in enumerate(factors):
            if gpu_budget is not None and n * memory.gpu.mb > gpu_budget:
                _refuse(key(i), n, name, "GPU", memory.gpu, gpu_budget, cap.gpu_memory_mb, fraction)
            if host_budget is not None and n * memory.host.mb > host_budget:
                _refuse(key(i), n, name, "host", memory.host, host_budget, cap.max_mem_mb, fraction)
            if cap.max_processes is not None and n > cap.max_processes:
                raise ConfigError(key(i), n, f"{n} trainings are {n} processes, but a job on {name} may start "
                                  f"{cap.max_processes} more (ulimit -u, kernel.threads-max)",
                                  f"lower N to at most {cap.max_processes}")


def _refuse(key: str, n: int, partition: str, where: str, figure: Figure, budget_mb: float, total_mb: float | None,
            fraction: float) -> None:
    most = fits(budget_mb, figure.mb)
    if most == 0 and figure.key is not None:  # not even one fits: the stated figure is what is wrong, not N
        over = f"one training of {figure.mb:g} MB is more than {partition}'s {where} memory budget of " \
               f"{budget_mb:.0f} MB ({fraction:.0%} of {(total_mb or 0):.0f} MB), so no N fits"
        if total_mb and figure.mb > total_mb and figure.mb / 2 ** 20 >= 1:  # more than the device holds: bytes?
            raise ConfigError(figure.key, figure.mb, f"{over}; it looks like bytes",
                              f"{figure.key}={round(figure.mb / 2 ** 20)} ({figure.mb:g} bytes in MB)")
        raise ConfigError(figure.key, figure.mb, over, f"{figure.key}={math.floor(budget_mb)} (MB: at most the "
                          "budget), or null for gpupack's default")
    if most == 0 and total_mb and figure.mb <= total_mb:  # a measured or default figure: only a larger share fits
        raise ConfigError("packing.memory_fraction", fraction, f"one training ({figure.mb:.0f} MB, {figure.source}) "
                          f"is more than {partition}'s {where} memory budget of {budget_mb:.0f} MB "
                          f"({fraction:.0%} of {total_mb:.0f} MB), so no N fits",
                          f"packing.memory_fraction={math.ceil(figure.mb / total_mb * 100) / 100:g}")
    raise ConfigError(key, n, f"{n} trainings x {figure.mb:.0f} MB ({figure.source}) = {n * figure.mb / 1024:.1f} GB "
                      f"of {where} memory, but {partition}'s budget is {budget_mb / 1024:.1f} GB "
                      f"({fraction:.0%} of {(total_mb or 0) / 1024:.1f} GB)",
                      f"lower N to at most {most}" + ("" if figure.measured else
                                                      ", or state sweep.training_memory_mb=MB (or run N=1 first: "
                                                      "measured figures replace the default)")
                      + ", or raise packing.memory_fraction")


def request_mb(measured_host_mb: float | None, given_gb: float | None, default_gb: float) -> tuple[float, str]:
    """Host memory a pack asks for per training (MB), and why: the user's setting, else the measured peak with
    headroom, else the default. Pure."""
    if given_gb is not None:
        return given_gb * 1024.0, "as set"
    if measured_host_mb is not None:
        return math.ceil(max(MIN_REQUEST_MB, measured_host_mb * REQUEST_HEADROOM)), \
            f"measured peak {measured_host_mb:.0f} MB x {REQUEST_HEADROOM:g}"
    return default_gb * 1024.0, "default: nothing measured yet"


# ---------------- evidence from earlier records (I/O) ----------------

def candidate_runs(run_root: Path) -> list[Path]:
    """This run directory and its siblings (runs/<sweep>/<date>_<time>), newest first, at most MAX_RUNS_READ."""
    siblings = [p for p in run_root.parent.glob("*") if RunDir(p).plan.exists()] if run_root.parent.is_dir() else []
    ordered = sorted(set(siblings) - {run_root}, key=lambda p: p.stat().st_mtime, reverse=True)
    return ([run_root] if RunDir(run_root).plan.exists() else []) + ordered[:MAX_RUNS_READ]


def find_measured(runs: Iterable[Path], workload: str, settings: set[str], seed_key: str = "seed") -> Measured:
    """The highest host and GPU peaks of earlier trainings of ``workload`` whose setting is one of ``settings``."""
    return _highest(list(_peaks(runs, workload, settings, seed_key)))


def measured_by_setting(runs: Iterable[Path], workload: str, settings: set[str],
                        seed_key: str = "seed", completed_only: bool = False) -> dict[str, Measured]:
    """As :func:`find_measured`, each of ``settings`` apart (a streaming lane's admission: a training's own peak).
    ``completed_only``: the peaks of trainings that completed alone (what a share is sized by: a training cut short,
    by its share or a neighbour, peaked at no more than it was let, a lower bound of its need, not a measure)."""
    by: dict[str, list[tuple[str, float | None, float | None, str]]] = {}
    for seen in _peaks(runs, workload, settings, seed_key, completed_only):
        by.setdefault(seen[0], []).append(seen)
    return {setting: _highest(seen) for setting, seen in by.items()}


def _peaks(runs: Iterable[Path], workload: str, settings: set[str], seed_key: str,
           completed_only: bool = False) -> Iterator[tuple[str, float | None, float | None, str]]:
    """(setting, host peak, GPU peak, run) of each earlier training of ``workload`` in one of ``settings`` that
    recorded a peak: GPU memory per process as NVML saw it, else torch's own peak plus a CUDA context."""
    read = 0
    for run in runs:
        folded = read_folded(RunDir(run))  # what its lanes folded, read once for its packs and its trainings
        sampled = _sampled_peaks(run, folded)
        for rec in _newest_first(RunDir(run), folded):
            if read >= MAX_RECORDS_READ:
                return
            read += 1
            setting = setting_key(rec.get("params") or {}, seed_key) if rec else ""
            if not rec or rec.get("workload") != workload or setting not in settings \
                    or (completed_only and rec.get("status") != COMPLETED):
                continue
            own = rec.get("memory") or {}
            by_sampler = sampled.get(str(rec.get("training_id")), {})
            rss = own.get("peak_rss_mb") or by_sampler.get("peak_rss_mb")
            nvml = by_sampler.get("peak_gpu_mem_mb")
            torch_peak = own.get("peak_gpu_mem_mb")
            gpu = float(nvml) if nvml else float(torch_peak) + CUDA_CONTEXT_MB if torch_peak else None
            if rss or gpu:
                yield setting, float(rss) if rss else None, gpu, str(run)


def _highest(seen: Sequence[tuple[str, float | None, float | None, str]]) -> Measured:
    host = [h for _, h, _, _ in seen if h is not None]
    gpu = [g for _, _, g, _ in seen if g is not None]
    seen_in = list(dict.fromkeys(run for *_, run in seen))
    where = ", ".join(seen_in[:2]) + (" ..." if len(seen_in) > 2 else "")
    return Measured(host_mb=max(host) if host else None, gpu_mb=max(gpu) if gpu else None,
                    trainings=len(host) or len(gpu), where=where)


def _newest_first(run: RunDir, folded: Folded) -> Iterator[TrainingRecord | None]:
    """The run's training records, newest first: those in packs' folders (by mtime), then those lanes folded (by
    their end)."""
    for path in sorted(run.training_records(), key=lambda p: p.stat().st_mtime, reverse=True):
        yield read_training(path)
    yield from sorted((h[-1] for h in folded.trainings.values()), key=lambda r: -float(r.get("ended_at") or 0))


def _sampled_peaks(run: Path, folded: Folded) -> dict[str, Peaks]:
    """Per training id, the sampler's peaks (pack records: in packs' folders, and those lanes folded): what a program
    that reports nothing itself is known by."""
    out: dict[str, Peaks] = {}
    pack_recs: list[PackRecord] = [read_pack(path) or {} for path in RunDir(run).pack_records()]
    for rec in [*(h[-1] for h in folded.packs.values()), *pack_recs]:
        out.update(((rec.get("sampler") or {}).get("per_training") or {}))
    return out


@dataclass(frozen=True)
class MemoryShare:
    """One training's share of its device's memory (``packing.memory_share``): ``fraction`` of the device and its
    ``mb``, and where it comes from (``source``, in words). Enforced in the training's process where the platform can
    (gpupack.runtime.memshare)."""

    fraction: float
    mb: float
    source: str = "packing.memory_fraction / N"

    def mps_limit(self) -> str:
        """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for a client that sees its GPU as device 0 (whole MB)."""
        return f"0={int(self.mb)}M"

    def to_record(self) -> dict[str, float | str]:
        return {"fraction": round(self.fraction, 6), "mb": round(self.mb, 1), "source": self.source}


def memory_share(fraction: float | None, device_total_mb: float | None, slots: int) -> MemoryShare | None:
    """Each of ``slots`` trainings' share of a device of ``device_total_mb`` that they may fill to ``fraction``
    together; None: sharing off (``fraction`` None), or no GPU to share (a CPU: host memory is bounded by
    ``packing.memory_limit_gb_per_training`` and the caps of N). Pure."""
    if fraction is None or device_total_mb is None or slots < 1:
        return None
    each = fraction / slots
    return MemoryShare(each, each * device_total_mb, f"packing.memory_fraction={fraction:g} / N={slots}")


def memory_shares(fraction: float | None, device_total_mb: float | None, peaks: Sequence[Figure | None],
                  margin: float, stated_mb: float | None = None) -> list[MemoryShare] | None:
    """Each of a pack's trainings' share of ``fraction`` of the device (one per ``peaks``: what earlier records
    measured of its setting; None, or a figure not measured: nothing measured). Pure.

    - Nothing measured: the equal split, ``fraction`` / N (:func:`memory_share`).
    - Every training measured, their peaks within the fraction: the whole of it dealt in proportion to them, so none
      gets less than its peak and none is left unshared (memory left over would only turn a training that grows past
      its measure into an OOM, and an OOM rules its N out).
    - Some measured: each of those gets its peak x (1 + ``margin``) (``packing.memory_margin``), the others split the
      rest, provided each of them keeps at least what an unmeasured training is expected to need (``stated_mb``,
      sweep.training_memory_mb, else :data:`DEFAULT_GPU_MB`; never more than the equal split); where that takes some
      of the margin, the measured ones give it up (never going below their peak).
    - Otherwise (the measured peaks alone pass the fraction, or leave too little for the others): the equal split, and
      each share says why. None: sharing off, or no GPU.
    """
    equal = memory_share(fraction, device_total_mb, len(peaks))
    if equal is None or fraction is None or device_total_mb is None:
        return None
    budget = fraction * device_total_mb
    measured = [p.mb if p is not None and p.measured else None for p in peaks]
    need = sum(m for m in measured if m is not None)
    others = sum(m is None for m in measured)
    if need == 0:
        return [equal] * len(peaks)
    floor = min(equal.mb, stated_mb if stated_mb is not None else DEFAULT_GPU_MB)  # each unmeasured one's least
    if not others:
        scale = budget / need if need <= budget else None
    elif budget - need * (1 + margin) >= others * floor:
        scale = 1 + margin
    elif budget - need >= others * floor:
        scale = (budget - others * floor) / need  # some of the margin given up for the unmeasured (>= 1)
    else:
        scale = None
    if scale is None:
        why = (f"{equal.source}: the measured peaks ({need:.0f} MB) "
               + (f"leave less than {floor:.0f} MB for each of {others} unmeasured" if need <= budget else
                  f"pass {fraction:g} x the device ({budget:.0f} MB)"))
        return [MemoryShare(equal.fraction, equal.mb, why)] * len(peaks)
    rest = (budget - need * scale) / others if others else 0.0
    out = []
    for p, m in zip(peaks, measured):
        if m is not None and p is not None:
            how = (f"x (1 + packing.memory_margin={margin:g})" if others and scale == 1 + margin else
                   f"x {scale:.3g}: " + ("all of packing.memory_fraction, in proportion to the measured peaks"
                                         if not others else f"the margin cut for {floor:.0f} MB to each unmeasured"))
            out.append(MemoryShare(m * scale / device_total_mb, m * scale, f"{p.source}: {m:.0f} MB {how}"))
        else:
            out.append(MemoryShare(rest / device_total_mb, rest, f"the rest of packing.memory_fraction={fraction:g} "
                                   f"after {len(peaks) - others} measured share(s), over {others} unmeasured"))
    return out
