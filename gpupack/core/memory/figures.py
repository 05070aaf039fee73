"""How much memory one training needs, and how many fit on a device: the figures that cap N before anything runs and
size what a pack asks the scheduler for.

The figure for a training comes, first found, from:
  1. the highest peak of earlier records of the same workload and setting (any seed) measured on the same device
     model, in this run directory and its siblings: GPU memory per process as NVML saw it, else torch's own peak
     plus a CUDA context; host memory as the peak RSS;
  2. ``sweep.training_memory_mb`` (the user's word, until something is measured);
  3. a conservative default (1 GB).

Only the same device model (:func:`same_device`): a CPU-only run's RSS is half a CUDA process's, so a figure measured
on one device never sizes another; partitions of different models use no measured figure. Every figure says where it
was measured and what was left aside (:class:`Measured`). The evidence readers do I/O; everything else is pure.
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Iterable, Iterator, Mapping, NamedTuple, Sequence

from gpupack.core.store.journal import Folded, read_folded
from gpupack.core.store.records import COMPLETED, PackRecord, Peaks, TrainingRecord, read_pack, read_training
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import Capacity
from gpupack.errors import ConfigError

DEFAULT_HOST_MB = 1024.0  # nothing measured: a Python + torch training peaks near 0.3-0.8 GB of RSS
DEFAULT_GPU_MB = 1024.0  # nothing measured: a CUDA context (0.4-0.8 GB) and a small model's tensors and workspace
# What torch's own peak leaves out where NVML cannot say the process's figure: its CUDA context (with cuBLAS's
# workspace). On an H200 with torch 2.11+cu130, NVML counted 808 MB for an MNIST training whose torch peak was 74 MB;
# 400 MB, an older CUDA's figure, sized 11 of 21 MPS clients' limits below what they held.
CUDA_CONTEXT_MB = 750.0
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
    looked: str = ""  # not measured: what earlier records said (:meth:`Measured.looked`)


@dataclass(frozen=True)
class TrainingMemory:
    host: Figure  # resident memory of one training's process
    gpu: Figure  # GPU memory of one training (its process's share as NVML sees it)


@dataclass(frozen=True)
class Measured:
    """The highest peaks of earlier records of the setting on the same device (None: none), and what was left aside."""

    host_mb: float | None = None
    gpu_mb: float | None = None
    trainings: int = 0
    where: str = ""
    device: str | None = None  # the device model the peaks were measured on (its label: a100, a100 1g.5gb, cpu)
    aside: tuple[tuple[str, int], ...] = ()  # records of these settings on another device, not used: (label, count)
    why_none: str = ""  # why no record could be used, whatever they hold (the partitions' devices differ, or unknown)
    frameworks: tuple[str, ...] = ()  # what the peaks were measured with ("torch 2.13.0+cpu"), where recorded

    def source(self) -> str:
        """Where the peaks come from, in words: how many trainings, on which device, with which framework, where."""
        on = f" on {self.device}" if self.device else ""
        with_ = f" with {', '.join(self.frameworks)}" if self.frameworks else ""
        return f"the peak of {self.trainings} earlier training(s) of this setting{on}{with_} in {self.where}"

    def aside_text(self) -> str:
        """The records of another device not used, e.g. "3 cpu record(s) not used: another device"; "" if none."""
        aside = ", ".join(f"{n} {label} record(s)" for label, n in self.aside)
        return f"{aside} not used: another device" if aside else ""

    def looked(self) -> str:
        """What the records said where they gave no figure (or the figure left one out), in words."""
        said = self.why_none or ("nothing measured" + (f" on {self.device}" if self.device else ""))
        return "; ".join(s for s in (said, self.aside_text()) if s)


def gpu_peak_mb(memory: Mapping[str, object] | None, sampled_mb: object = None) -> float | None:
    """A training's whole-process GPU peak (MB): NVML's where it covers torch's own (a sample may miss the peak), else
    torch's plus :data:`CUDA_CONTEXT_MB`; ``sampled_mb``: its pack sampler's, for an older record; None. Pure."""
    memory = memory or {}
    own, nvml = memory.get("peak_gpu_mem_mb"), memory.get("process_gpu_mem_mb", sampled_mb)
    filled = memory.get("from_sampler")
    if isinstance(filled, Sequence) and "peak_gpu_mem_mb" in filled:  # the record's own figure is NVML's already
        own, nvml = None, own
    own_mb = float(own) if isinstance(own, (int, float)) and own > 0 else None
    nvml_mb = float(nvml) if isinstance(nvml, (int, float)) and nvml > 0 else None
    if nvml_mb is not None and (own_mb is None or nvml_mb > own_mb):
        return nvml_mb
    return None if own_mb is None else own_mb + CUDA_CONTEXT_MB


def host_peak_mb(memory: Mapping[str, object] | None, sampled_mb: object = None) -> float | None:
    """A training's own resident peak (MB): its record's, else its pack's sampler's (``sampled_mb``). None where it
    shared its process (``shared_by``: a fused pack's peak is the whole pack's) or neither is known. Pure."""
    memory = memory or {}
    shared = memory.get("shared_by")
    if isinstance(shared, int) and shared > 1:
        return None
    value = memory.get("peak_rss_mb") or sampled_mb
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def setting_key(params: Mapping[str, object], seed_key: str = "seed") -> str:
    """The hyperparameters that set a training's memory: all but its seed."""
    return json.dumps({k: v for k, v in params.items() if k != seed_key}, sort_keys=True, default=str)


def estimate(stated_mb: float | None, measured: Measured) -> TrainingMemory:
    """The figure for one training, from the records, the user's word, or the default (in that order). Pure."""
    looked = measured.looked()
    stated = Figure(float(stated_mb), f"sweep.training_memory_mb={stated_mb:g}", key="sweep.training_memory_mb",
                    looked=looked) if stated_mb is not None else None
    return TrainingMemory(
        host=_measured_or(measured.host_mb, measured, stated or Figure(DEFAULT_HOST_MB, f"a default: {looked}",
                                                                       looked=looked)),
        gpu=_measured_or(measured.gpu_mb, measured, stated or Figure(DEFAULT_GPU_MB, f"a default: {looked}",
                                                                     looked=looked)))


def _measured_or(mb: float | None, measured: Measured, fallback: Figure) -> Figure:
    if mb is None:
        return fallback
    aside = measured.aside_text()
    return Figure(mb, measured.source() + (f" ({aside})" if aside else ""), measured=True)


def fits(budget_mb: float | None, each_mb: float) -> int | None:
    """How many trainings of ``each_mb`` fit in ``budget_mb`` (None: no budget known)."""
    return None if budget_mb is None else max(0, math.floor(budget_mb / each_mb))


def check_memory(factors: Sequence[int], capacities: Mapping[str, Capacity], memory: TrainingMemory,
                 fraction: float, key: Callable[[int], str]) -> None:
    """Each N within each partition's GPU and host memory budgets (``fraction`` of each) and process limit. Pure."""
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


def request_mb(host: Figure | None, given_gb: float | None, default_gb: float) -> tuple[float, str]:
    """Host memory a pack asks per training (MB), and why: as set, else the measured peak x headroom, else a default."""
    if given_gb is not None:
        return given_gb * 1024.0, "as set"
    if host is not None and host.measured:
        return math.ceil(max(MIN_REQUEST_MB, host.mb * REQUEST_HEADROOM)), \
            f"measured peak {host.mb:.0f} MB x {REQUEST_HEADROOM:g}: {host.source}"
    looked = host.looked if host is not None and host.looked else "nothing measured yet"
    return default_gb * 1024.0, f"default: {looked}"


# ---------------- which device a figure was measured on ----------------

# A GPU's family: a letter or two, digits, maybe a letter (v100, gh200, l40s, t4), unlike sxm4, hbm3, pcie or 40gb.
_FAMILY = re.compile(r"^[a-z]{1,2}\d{1,4}[a-z]?$")
_MIG = re.compile(r"(\d+)g\.(\d+)gb")  # a MIG profile: 1g.5gb, 3g.40gb
_BRAND = {"nvidia", "tesla"}


def device_model(name: str | None) -> tuple[str, str | None] | None:
    """(GPU family, MIG profile or None) of a device name as NVML, a preset or a SLURM specifier says it; ("cpu", None)
    for "cpu"; None for no name. A name of no known family is its words less brand and sizes. Pure."""
    low = (name or "").strip().lower()
    if not low:
        return None
    if low == "cpu":
        return "cpu", None
    mig = _MIG.search(low)
    words = [w for w in re.split(r"[^a-z0-9.]+", low) if w and w not in _BRAND]
    family = next((w for w in words if _FAMILY.match(w)), None) or \
        " ".join(w for w in words if not _MIG.fullmatch(w) and not re.fullmatch(r"\d+gb", w) and w != "mig")
    return (family, f"{mig[1]}g.{mig[2]}gb" if mig else None) if family else None


def same_device(measured_on: str | None, target: str | None) -> bool:
    """Whether a record measured on ``measured_on`` (its gpu_type) ran on ``target``'s device model (a partition's
    :attr:`Capacity.device`): the same GPU family and MIG profile; "cpu" only "cpu"; unknown matches nothing. Pure."""
    model = device_model(measured_on)
    return model is not None and model == device_model(target)


def device_label(name: str | None) -> str:
    """A device model as figures name it: "a100", "a100 1g.5gb", "cpu"; "an unknown device". Pure."""
    model = device_model(name)
    return "an unknown device" if model is None else model[0] + (f" {model[1]}" if model[1] else "")


def record_device(rec: Mapping[str, object]) -> str | None:
    """The device a training record's peaks were measured on: "cpu", else its GPU's name; None: not recorded."""
    if rec.get("device") == "cpu" or rec.get("gpu_type") == "cpu":
        return "cpu"
    name = rec.get("gpu_type") or rec.get("device_name")
    return str(name) if name else None


# ---------------- evidence from earlier records (I/O) ----------------

def candidate_runs(run_root: Path) -> list[Path]:
    """This run directory and its siblings (runs/<sweep>/<date>_<time>), newest first, at most MAX_RUNS_READ."""
    siblings = [p for p in run_root.parent.glob("*") if RunDir(p).plan.exists()] if run_root.parent.is_dir() else []
    ordered = sorted(set(siblings) - {run_root}, key=lambda p: p.stat().st_mtime, reverse=True)
    return ([run_root] if RunDir(run_root).plan.exists() else []) + ordered[:MAX_RUNS_READ]


def find_measured(runs: Iterable[Path], workload: str, settings: set[str], seed_key: str = "seed", *,
                  devices: Collection[str | None]) -> Measured:
    """The highest peaks of earlier trainings of ``workload`` in one of ``settings`` measured on the partitions' device
    model; partitions of different or unknown models use none (the default then says why)."""
    models = {device_model(d) for d in devices}
    if None in models or not models:
        return Measured(why_none="nothing measured used: the partition's device model is not known")
    labels = sorted({device_label(d) for d in devices})
    if len(labels) > 1:
        return Measured(why_none=f"nothing measured used: the partitions run on different devices "
                                 f"({', '.join(labels)}), and a figure of one sizes none of the others")
    target = next(d for d in devices if d is not None)
    return _on_device(list(_peaks(runs, workload, settings, seed_key)), target)


def measured_by_setting(runs: Iterable[Path], workload: str, settings: set[str],
                        seed_key: str = "seed", completed_only: bool = False, *,
                        device: str) -> dict[str, Measured]:
    """As :func:`find_measured`, each of ``settings`` apart, on the job's own ``device`` alone. ``completed_only``:
    of completed trainings alone (one cut short peaked at no more than it was let: a lower bound, not a measure)."""
    by: dict[str, list[_Seen]] = {}
    for seen in _peaks(runs, workload, settings, seed_key, completed_only):
        by.setdefault(seen.setting, []).append(seen)
    measured = {setting: _on_device(seen, device) for setting, seen in by.items()}
    return {setting: m for setting, m in measured.items() if m.trainings}


class _Seen(NamedTuple):
    """One earlier training's peaks, as :func:`_peaks` finds them."""

    setting: str
    host: float | None
    gpu: float | None
    run: str
    device: str | None  # where it was measured (record_device)
    framework: str | None = None  # with what (the record's framework: "torch 2.13.0+cpu")


def _on_device(seen: Sequence[_Seen], target: str) -> Measured:
    """The highest peaks of those of ``seen`` measured on ``target``'s device model; the others counted aside."""
    used = [s for s in seen if same_device(s.device, target)]
    aside = Counter(device_label(s.device) for s in seen if not same_device(s.device, target))
    host = [s.host for s in used if s.host is not None]
    gpu = [s.gpu for s in used if s.gpu is not None]
    seen_in = list(dict.fromkeys(s.run for s in used))
    where = ", ".join(seen_in[:2]) + (" ..." if len(seen_in) > 2 else "")
    frameworks = tuple(sorted({s.framework for s in used if s.framework}))
    return Measured(host_mb=max(host) if host else None, gpu_mb=max(gpu) if gpu else None,
                    trainings=len(host) or len(gpu), where=where, device=device_label(target),
                    aside=tuple(sorted(aside.items())), frameworks=frameworks)


def _peaks(runs: Iterable[Path], workload: str, settings: set[str], seed_key: str,
           completed_only: bool = False) -> Iterator[_Seen]:
    """Each earlier training of ``workload`` in one of ``settings`` that recorded a peak, as a :class:`_Seen`."""
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
            rss = host_peak_mb(own, by_sampler.get("peak_rss_mb"))
            gpu = gpu_peak_mb(own, by_sampler.get("peak_gpu_mem_mb"))
            if rss or gpu:
                yield _Seen(setting, float(rss) if rss else None, gpu, str(run), record_device(rec),
                            rec.get("framework"))


def _newest_first(run: RunDir, folded: Folded) -> Iterator[TrainingRecord | None]:
    """The run's training records, newest first: those in packs' folders (by mtime), then those lanes folded."""
    for path in sorted(run.training_records(), key=lambda p: p.stat().st_mtime, reverse=True):
        yield read_training(path)
    yield from sorted((h[-1] for h in folded.trainings.values()), key=lambda r: -float(r.get("ended_at") or 0))


def _sampled_peaks(run: Path, folded: Folded) -> dict[str, Peaks]:
    """Per training id, the sampler's peaks from the run's pack records (in folders and folded)."""
    out: dict[str, Peaks] = {}
    pack_recs: list[PackRecord] = [read_pack(path) or {} for path in RunDir(run).pack_records()]
    for rec in [*(h[-1] for h in folded.packs.values()), *pack_recs]:
        out.update(((rec.get("sampler") or {}).get("per_training") or {}))
    return out


@dataclass(frozen=True)
class MemoryShare:
    """One training's share of its device's memory, and its source; enforced where it can be (job.runtime.memshare)."""

    fraction: float
    mb: float
    source: str = "packing.memory_fraction / N"

    def mps_limit(self) -> str:
        """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for a client that sees its GPU as device 0 (whole MB)."""
        return f"0={int(self.mb)}M"

    def to_record(self) -> dict[str, float | str]:
        return {"fraction": round(self.fraction, 6), "mb": round(self.mb, 1), "source": self.source}


def memory_share(fraction: float | None, device_total_mb: float | None, slots: int) -> MemoryShare | None:
    """Each of ``slots`` trainings' equal share of ``fraction`` of the device; None: sharing off, or no GPU. Pure."""
    if fraction is None or device_total_mb is None or slots < 1:
        return None
    each = fraction / slots
    return MemoryShare(each, each * device_total_mb, f"packing.memory_fraction={fraction:g} / N={slots}")


def memory_shares(fraction: float | None, device_total_mb: float | None, peaks: Sequence[Figure | None],
                  margin: float, stated_mb: float | None = None) -> list[MemoryShare] | None:
    """Each of a pack's trainings' share of ``fraction`` of the device (one per ``peaks``: what earlier records
    measured of its setting; None, or a figure not measured: nothing measured). Pure.

    - Nothing measured: the equal split, ``fraction`` / N (:func:`memory_share`).
    - Every training measured, their peaks within the fraction: all of it dealt in proportion to them (memory left
      over would only turn a training that grows past its measure into an OOM).
    - Some measured: each of those gets its peak x (1 + ``margin``), the others split the rest, each keeping at least
      ``stated_mb`` (else :data:`DEFAULT_GPU_MB`; at most the equal split), the margin given up for it if need be.
    - Otherwise: the equal split, each share saying why. None: sharing off, or no GPU.
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
    scale = _share_scale(budget, need, others, floor, margin)
    if scale is None:
        why = (f"{equal.source}: the measured peaks ({need:.0f} MB) "
               + (f"leave less than {floor:.0f} MB for each of {others} unmeasured" if need <= budget else
                  f"pass {fraction:g} x the device ({budget:.0f} MB)"))
        return [MemoryShare(equal.fraction, equal.mb, why)] * len(peaks)
    rest = (budget - need * scale) / others if others else 0.0
    how = (f"x (1 + packing.memory_margin={margin:g})" if others and scale == 1 + margin else
           f"x {scale:.3g}: " + ("all of packing.memory_fraction, in proportion to the measured peaks"
                                 if not others else f"the margin cut for {floor:.0f} MB to each unmeasured"))
    unmeasured = MemoryShare(rest / device_total_mb, rest, f"the rest of packing.memory_fraction={fraction:g} after "
                             f"{len(peaks) - others} measured share(s), over {others} unmeasured")
    return [MemoryShare(m * scale / device_total_mb, m * scale, f"{p.source}: {m:.0f} MB {how}")
            if m is not None and p is not None else unmeasured for p, m in zip(peaks, measured)]


def _share_scale(budget: float, need: float, others: int, floor: float, margin: float) -> float | None:
    """What each measured peak is multiplied by in its share of ``budget``; None: the peaks leave too little. Pure."""
    if not others:
        return budget / need if need <= budget else None
    if budget - need * (1 + margin) >= others * floor:
        return 1 + margin
    if budget - need >= others * floor:
        return (budget - others * floor) / need  # some of the margin given up for the unmeasured (>= 1)
    return None
