"""What a submission asks SLURM for: each pack job's sbatch parameters, the job arrays they make, and the #SBATCH
lines and totals a dry run shows. Pure: the submitter and the dry run build from these alone."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TypedDict, TypeVar

from gpupack.core.plan import Pack, deal
from gpupack.core.types import JobForecast, PackRequest
from gpupack.submit._submitit import make_sbatch_string
from gpupack.submit.slurm import commands
from gpupack.submit.slurm.options import PartitionConfig, SlurmConfig

T = TypeVar("T")
DEFAULT_MEM_GB = 2.0  # per training, when cluster.mem_gb_per_training is null and nothing was measured


def resources(factor: int, cpus_per_training: float, mem_gb_per_training: float) -> tuple[int, int]:
    """CPUs and memory (MB) one pack of N trainings asks for."""
    return max(1, math.ceil(factor * cpus_per_training)), max(1, math.ceil(factor * mem_gb_per_training * 1024))


class SbatchParameters(TypedDict, total=False):
    """submitit SlurmExecutor parameters (update_parameters; its _make_sbatch_string's names) of one pack job."""
    time: int
    nodes: int
    ntasks_per_node: int
    cpus_per_task: int
    mem: str
    job_name: str
    signal_delay_s: int
    array_parallelism: int
    gres: str
    gpus_per_node: str
    partition: str
    constraint: str
    account: str
    setup: list[str]
    additional_parameters: dict[str, object]  # cluster.additional_parameters, as sbatch options
    map_count: int  # set by submitit on an array's copy of the executor
    stderr_to_stdout: bool


def sbatch_parameters(cluster: SlurmConfig, name: str, partition: PartitionConfig, factor: int, account: str | None,
                      mem_gb_each: float | None = None, devices: int = 1, gpus: int = 1) -> SbatchParameters:
    """submitit SlurmExecutor parameters for one pack of N trainings on one GPU of ``partition``, or one training
    spread over k (``devices``) GPUs, each of its k sized as one training (``mem_gb_each``), or a lane of packs on G
    (``gpus``) GPUs at once, each sized as one pack. One task: the job starts its processes itself. Pure."""
    each = mem_gb_each if mem_gb_each is not None else cluster.mem_gb_per_training or DEFAULT_MEM_GB
    cpus, mem_mb = resources(factor * devices, cluster.cpus_per_training, each)
    cpus, mem_mb = cpus * gpus, mem_mb * gpus
    suffix = f"k{devices}" if devices > 1 else f"n{factor}" + (f"-g{gpus}" if gpus > 1 else "")
    params: SbatchParameters = {
        "time": int(cluster.timeout_min), "nodes": 1, "ntasks_per_node": 1, "cpus_per_task": cpus,
        "mem": f"{mem_mb}M", "job_name": f"gpupack-{name}-{suffix}",
        "signal_delay_s": int(cluster.signal_delay_s), "array_parallelism": int(cluster.array_parallelism),
    }
    if partition.request != "none":  # k GPUs per pack (1 when packing), G per lane: of the partition's type, or any
        spec = f"{partition.gpu}:{devices * gpus}" if partition.gpu else str(devices * gpus)
        if partition.request == "gres":
            params["gres"] = f"gpu:{spec}"
        else:
            params["gpus_per_node"] = spec
    if partition.slurm_partition:
        params["partition"] = partition.slurm_partition
    if partition.constraint:
        params["constraint"] = partition.constraint
    if account:
        params["account"] = account
    if cluster.setup:
        params["setup"] = list(cluster.setup)
    if cluster.additional_parameters:
        params["additional_parameters"] = dict(cluster.additional_parameters)
    return params

GroupKey = tuple[str, str, int, int]  # what a pack's job asks for: (partition, mode, N, devices)


def array_chunks(tasks: Sequence[T], max_array_size: int | None) -> list[list[T]]:
    """A group's array tasks as the arrays SLURM accepts: at most ``max_array_size`` tasks each (None: one). Pure."""
    size = max_array_size or len(tasks) or 1
    return [list(tasks[i:i + size]) for i in range(0, len(tasks), size)]


def lane_counts(sizes: Sequence[int], at_once: int, allowed: int | None) -> list[int] | None:
    """Jobs (lanes of packs) for groups of ``sizes`` packs: as many as run at once (``at_once``: array_parallelism),
    never more than a group's packs, and all of them within ``allowed`` (the jobs the user may still queue; None: no
    limit), shared out in proportion, at least one a group; None where not even one a group fits. Pure."""
    counts = [min(size, at_once) for size in sizes]
    if allowed is None or sum(counts) <= allowed:
        return counts
    if allowed < len(counts):
        return None
    shares = [max(1, c * allowed // sum(counts)) for c in counts]
    while sum(shares) > allowed:  # the max(1, ...) may take one too many: from the largest share
        shares[shares.index(max(shares))] -= 1
    return shares


@dataclass(frozen=True)
class ArrayJob:
    """One sbatch call: a (partition, mode, N, k) group's lanes as one job array, and its executor parameters."""

    key: GroupKey
    lanes: list[list[Pack]]
    parameters: SbatchParameters
    in_turn: bool  # its jobs run lanes of packs (or streaming lanes), folded into their journals

    @property
    def tasks(self) -> int:
        return len(self.lanes)


def sbatch_lines(folder: str | os.PathLike[str], parameters: SbatchParameters, tasks: int) -> list[str]:
    """The #SBATCH lines submitit writes for ``tasks`` jobs submitted in one batch (an array where more). Pure."""
    params = parameters.copy()
    if tasks > 1:
        params["map_count"] = tasks
    text = make_sbatch_string(Path(folder).expanduser().absolute(), **params)
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


def over_limit(forecast: JobForecast, key: str) -> str:
    """The line for a submission of more jobs than the site lets the user queue now (``key``: its stated limit's)."""
    return (f"this submission needs {forecast.jobs} job(s) at the least (one lane of packs for each (partition, mode, "
            f"N) of its {forecast.packs} pack(s)) and the site lets you queue {forecast.allowed} more now "
            f"({forecast.limit}; {forecast.queued_text()}): nothing was submitted. HINT: wait "
            "for some of your jobs to end, or run fewer N or partitions per run and resume the same run_dir later "
            f"(it submits only what is left); {key} sets the site's stated limit")


def block_label(arrays: Sequence[ArrayJob]) -> str:
    """Which jobs one block of #SBATCH lines is for, e.g. "a100, N=3 (process): 2 jobs in 1 array". Pure."""
    partitions = sorted({a.key[0] for a in arrays})
    what = sorted({f"k={a.key[3]}" if a.key[3] > 1 else f"N={a.key[2]}" for a in arrays})
    modes = sorted({a.key[1] for a in arrays})
    jobs = sum(a.tasks for a in arrays)
    in_arrays = [a for a in arrays if a.tasks > 1]
    packs = sum(len(lane) for a in arrays for lane in a.lanes)
    how = f"{jobs} job{'s' if jobs > 1 else ''}" + (
        f" in {len(in_arrays)} arra{'ys' if len(in_arrays) > 1 else 'y'}" if in_arrays else " (no array)")
    return (f"{', '.join(partitions)}, {', '.join(what)} ({', '.join(modes)}): {how}"
            + (f", {packs} packs in lanes" if packs > jobs else ""))


def limit_lines(forecast: JobForecast, arrays: Sequence[ArrayJob], limits: commands.SiteLimits,
                sinfo_silent: str | None) -> list[str]:
    """The totals of a submission against the site's limits, each with where it comes from. Pure."""
    silent = limits.unanswered

    def unknown(command: str) -> str:
        return f"unknown ({command} not reachable: {silent[command]})"

    if limits.max_submit is not None:
        per_user = f"{limits.max_submit:,}, {limits.submit_from} ({limits.submit_source})"
        if "sacctmgr" in silent and limits.submit_from != "read from the cluster (sacctmgr)":
            per_user += f"; SLURM's own: {unknown('sacctmgr')}"
    else:
        per_user = unknown("sacctmgr") if "sacctmgr" in silent else \
            "none (sacctmgr names no MaxSubmitJobs for you or your QOS, and the preset states none)"
    largest = max((a.tasks for a in arrays), default=0)
    size = (f"{limits.max_array_size:,} tasks, read from the cluster (scontrol show config)"
            if limits.max_array_size is not None else
            unknown("scontrol") if "scontrol" in silent else "not set (scontrol show config names none)")
    queued = unknown("squeue") if limits.queued is None else f"{limits.queued:,} (squeue)"
    return ["against the site's limits:",
            f"  jobs: {forecast.jobs:,} (each array task counts one); per-user job limit: {per_user}",
            f"  job arrays: {len(arrays):,}, the largest of {largest:,} task(s); MaxArraySize: {size}",
            f"  queued now: {queued}",
            f"  sinfo partition check: skipped (sinfo not reachable: {sinfo_silent}): the preset's partitions and GPU "
            "types are taken as they are" if sinfo_silent is not None else
            "  sinfo partition check: each partition and GPU type exists (sinfo)"]


def job_gpus(cluster: SlurmConfig, key: GroupKey) -> int:
    """GPUs one job of a group holds: the partition's gpus_per_job for packs of N, a spread training's k. Pure."""
    partition, _mode, _factor, devices = key
    return devices if devices > 1 else int(cluster.partitions[partition].gpus_per_job)


def packs_at_once(cluster: SlurmConfig, key: GroupKey) -> int:
    """Packs one job of a group runs at once: one on each of its GPUs for packs of N, one spread training. Pure."""
    return 1 if key[3] > 1 else job_gpus(cluster, key)


def job_lanes(cluster: SlurmConfig, packs: Sequence[Pack], limits: commands.SiteLimits,
              ) -> tuple[JobForecast, list[tuple[GroupKey, list[list[Pack]]]]]:
    """The jobs submitting ``packs`` makes: each (partition, mode, N) group's packs dealt to its lanes (one pack a GPU
    where the group runs at once), against the site's ``limits``; no lanes where they cannot fit. Pure."""
    by_key: dict[GroupKey, list[Pack]] = {}  # a job array each, in the plan's order
    for p in packs:
        by_key.setdefault((p.partition, p.mode, p.factor, p.devices), []).append(p)
    groups = list(by_key.items())
    allowed = None if limits.max_submit is None else max(0, limits.max_submit - (limits.queued or 0))
    counts = lane_counts([-(-len(group) // packs_at_once(cluster, key)) for key, group in groups],
                         int(cluster.array_parallelism), allowed)
    lanes = [(key, deal(group, k)) for (key, group), k in zip(groups, counts)] if counts is not None else []
    arrays = sum(len(array_chunks(group_lanes, limits.max_array_size)) for _, group_lanes in lanes)
    gpus = sum(len(group_lanes) * job_gpus(cluster, key) for key, group_lanes in lanes)
    idle = sum(max(0, packs_at_once(cluster, key) - len(lane)) for key, group_lanes in lanes for lane in group_lanes)
    forecast = JobForecast(jobs=sum(counts) if counts is not None else len(groups), packs=len(packs), arrays=arrays,
                           max_array_size=limits.max_array_size, allowed=allowed, limit=limits.submit_source,
                           queued=limits.queued, queue_why=limits.unanswered.get("squeue", ""), gpus=gpus,
                           idle_gpus=idle)
    return forecast, lanes


def array_jobs(cluster: SlurmConfig, packs: Sequence[Pack], limits: commands.SiteLimits, account: str | None,
               mem_gb_each: Callable[[int], float | None]) -> tuple[JobForecast, list[ArrayJob]]:
    """The sbatch calls submitting ``packs`` makes, in order: each group's lanes as job arrays (one job, where one
    lane), with submitit's SlurmExecutor parameters for each (``mem_gb_each``: a training's memory at N). Pure."""
    forecast, lanes = job_lanes(cluster, packs, limits)
    arrays = []
    for key, group_lanes in lanes:
        partition, _mode, factor, devices = key
        lane_gpus = packs_at_once(cluster, key)  # the job's GPUs a lane's packs take one each (a spread: all k)
        for chunk in array_chunks(group_lanes, forecast.max_array_size):
            # jobs of lanes of packs, and streaming lanes: folded into their journals
            in_turn = lane_gpus > 1 or any(len(lane) > 1 or lane[0].stream is not None for lane in chunk)
            params = sbatch_parameters(cluster, partition, cluster.partitions[partition], factor, account,
                                       mem_gb_each(factor), devices=devices, gpus=lane_gpus)
            params["stderr_to_stdout"] = in_turn  # a file a job less where files per job count
            arrays.append(ArrayJob(key=key, lanes=chunk, parameters=params, in_turn=in_turn))
    return forecast, arrays


def request_lines(folder: str | os.PathLike[str], forecast: JobForecast, arrays: Sequence[ArrayJob],
                  limits: commands.SiteLimits, sinfo_silent: str | None, request: Callable[[int], PackRequest],
                  limit_key: str) -> list[str]:
    """The #SBATCH lines of each kind of job ``arrays`` make, where each --mem comes from, then the totals. Pure."""
    blocks: dict[tuple[str, ...], list[ArrayJob]] = {}
    for array in arrays:  # arrays whose lines are the same (two modes of one N) show once
        lines = tuple(sbatch_lines(folder, array.parameters, array.tasks))
        blocks.setdefault(lines, []).append(array)
    out = [f"request: the #SBATCH lines submitit will write ({len(arrays)} sbatch call(s)):"] if arrays else \
        ["request: none: " + over_limit(forecast, limit_key)]
    for lines, same in blocks.items():
        out.append(f"  {block_label(same)}:")
        out += [f"    {line}" for line in lines]
        out += [f"    {line}" for line in mem_lines(same, request)]
    return out + limit_lines(forecast, arrays, limits, sinfo_silent)


def mem_lines(arrays: Sequence[ArrayJob], request: Callable[[int], PackRequest]) -> list[str]:
    """Where the --mem of one block of #SBATCH lines comes from, per training: one line a distinct figure. Pure."""
    reqs = [request(factor) for factor in sorted({a.key[2] for a in arrays})]
    return list(dict.fromkeys(f"--mem: {round((r.mem_gb_each or 0) * 1024)} MB per training, "
                              + (f"as set ({r.mem_key}={r.mem_gb_each:g})" if r.mem_why == "as set" else r.mem_why)
                              for r in reqs))
