"""SLURM: each pack is one array task on one GPU, through submitit's SlurmExecutor.

Packs of one (partition, mode, N) group share one job array. What gpupack asks SLURM itself (sinfo, sacct), and
how it reads the answers, is in :mod:`gpupack.submit.slurm.commands`, the one seam to the cluster besides submitit.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import difflib
import getpass
import math
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TypedDict, TypeVar, cast

import submitit

from gpupack.core.memory.figures import Figure, request_mb
from gpupack.core.plan import Pack, deal
from gpupack.core.store.journal import RunRecords, make_journals
from gpupack.core.types import Capacity, JobForecast, PackRequest, PackResult, PackSettings
from gpupack.errors import (
    ConfigError,
    SubmissionError,
    nearest,
    require_memory,
    require_positive,
    require_unique,
)
from gpupack.job.oom import record_job_oom
from gpupack.runtime.jobenv import JobEnvironment
from gpupack.submit import (
    ClusterConfig,
    PackJob,
    PackJobHandle,
    ProgressFn,
    Submitter,
    job_result,
    progress_state,
)
from gpupack.submit._submitit import QuietSlurmExecutor, make_sbatch_string
from gpupack.submit.slurm import commands

T = TypeVar("T")
ACCOUNT_ENV = ("SLURM_ACCOUNT", "SBATCH_ACCOUNT")  # what Alliance users export in their shell
REQUEST_FORMS = ("gpus_per_node", "gres", "none")
DEFAULT_MEM_GB = 2.0  # per training, when cluster.mem_gb_per_training is null and nothing was measured
FINISH_POLL_S = 0.2  # how soon a finished pack is seen: a stat of its result file
LAUNCHER_GRES = re.compile(r"^gpu(?::([^:,]+))?:(\d+)$")  # a Hydra launcher's gres: gpu:1, gpu:v100:1
LAUNCHER_LABEL = "default"  # the Hydra launcher's one partition, when it names no SLURM partition


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
    """submitit SlurmExecutor parameters for one pack of N trainings on one GPU of ``partition``, or (``devices`` = k
    > 1) of one training spread over k GPUs of one node: k processes or replicas, each sized as one training (memory
    per training: ``mem_gb_each``, else cluster.mem_gb_per_training), or (``gpus`` = G > 1) for a lane of packs of N
    on G GPUs of one node at once, each GPU's share sized as one pack's. The job starts its processes itself, so it is
    one task. Pure."""
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


@dataclass
class PartitionConfig:
    """One kind of GPU a cluster offers, and how to ask SLURM for one of it."""

    # Model specifier for --gpus-per-node=<gpu>:1 (or --gres=gpu:<gpu>:1); null: one GPU of any type.
    gpu: Optional[str] = None
    # How to ask: "gpus_per_node" (the Alliance's recommended form), "gres" (older sites), or "none" (a CPU
    # partition: no GPU is asked for).
    request: str = "gpus_per_node"
    # SLURM partition to submit to, where the site routes GPU types by partition; null: the site's default.
    slurm_partition: Optional[str] = None
    constraint: Optional[str] = None
    # Name in the RGU table (e.g. V100-16gb), for cost comparisons.
    model: Optional[str] = None
    # The most CPUs and host memory one single-GPU job should get here (the site's per-GPU guidance).
    max_cpus: Optional[int] = None
    max_mem_gb: Optional[float] = None
    # The cores and memory (GB) that come with one GPU (or MIG slice) here, which a job is charged against: the
    # largest of its RGU, its cores over bundle_cores and its memory over bundle_mem_gb bills it
    # (gpupack.core.cost.billing).
    # null: this site bills the GPU alone (as far as gpupack knows).
    bundle_cores: Optional[float] = None
    bundle_mem_gb: Optional[float] = None
    # GPUs one job holds, each running its own pack of N at once (a lane of packs, each GPU taking the next pack as
    # its last ends): a whole node where the site gives GPUs by the node. A spread training's job keeps its k.
    gpus_per_job: int = 1
    # Where the site gives a job exactly 1 GPU or whole nodes of this many (Trillium: 4), gpus_per_job must be one
    # of the two; null: any count up to a node's.
    whole_node_gpus: Optional[int] = None
    # Retired hardware, kept so earlier measurements can still be labelled and compared.
    retired: bool = False
    # A MIG slice (one GPU instance of a larger GPU), not a whole GPU: where the site allows one slice per job
    # (rules.one_mig_per_job), its jobs ask for exactly one.
    mig: bool = False


@dataclass
class SiteRule:
    """One rule the site states, recorded with its words and where they are written, so that a refusal quotes them.
    A rule without words is none: the preset records no such rule."""

    quote: str = ""  # the site's own words; "": no such rule here
    source: str = ""  # where they are written (its page)
    since: Optional[str] = None  # the day it took effect (YYYY-MM-DD); null: not dated there
    in_force: bool = True  # false: announced but not yet applied (recorded, not checked)


@dataclass
class SiteRules:
    """The site's rules on what one job may ask, checked before anything is submitted."""

    # One MIG slice per job: a partition with mig=true keeps gpus_per_job=1.
    one_mig_per_job: SiteRule = field(default_factory=SiteRule)
    # Every GPU request names a model (--gpus-per-node=h100:1): a GPU partition's gpu is set.
    gpu_model: SiteRule = field(default_factory=SiteRule)
    # 1 GPU or a whole node: the words for a partition's whole_node_gpus (checked with or without them).
    whole_node: SiteRule = field(default_factory=SiteRule)


def cite(rule: SiteRule) -> str:
    """A :class:`SiteRule` (or its DictConfig) as a refusal quotes it: ("its words", its page, since its date)."""
    return f'("{rule.quote}", {rule.source}' + (f", since {rule.since}" if rule.since else "") + ")"


def in_force(rule: SiteRule) -> bool:
    """Whether a :class:`SiteRule` (or its DictConfig) is recorded and applies now."""
    return bool(rule.quote) and bool(rule.in_force)


def check_partition(part: PartitionConfig, key: str, rules: SiteRules | None = None, site: str = "this site",
                    others: Sequence[str] = ()) -> None:
    """A partition's fields (a :class:`PartitionConfig`, or its DictConfig), on their own and against the site's
    ``rules`` (:class:`SiteRules`; None: none): one ConfigError naming ``key.field``."""
    if part.request not in REQUEST_FORMS:
        raise ConfigError(f"{key}.request", part.request, "unknown request form", nearest(part.request, REQUEST_FORMS))
    require_positive(part.max_cpus, f"{key}.max_cpus", f"{key}.max_cpus=12, or null where the site gives none",
                     whole=True)
    require_positive(part.bundle_cores, f"{key}.bundle_cores",
                     f"{key}.bundle_cores=12, or null where the site bills the GPU alone")
    for field_name in ("max_mem_gb", "bundle_mem_gb"):
        require_memory(getattr(part, field_name), f"{key}.{field_name}", "GB",
                       f"{key}.{field_name}=124.5, or null where the site gives none")
    require_positive(part.whole_node_gpus, f"{key}.whole_node_gpus", f"{key}.whole_node_gpus=4", whole=True)
    require_positive(part.gpus_per_job, f"{key}.gpus_per_job", f"{key}.gpus_per_job=1", whole=True,
                     allow_none=False)
    if part.gpus_per_job > 1 and part.request == "none":
        raise ConfigError(f"{key}.gpus_per_job", part.gpus_per_job, "a CPU partition (request=none) has no GPUs",
                          f"{key}.gpus_per_job=1")
    check_partition_rules(part, key, rules or SiteRules(), site, others)


def check_partition_rules(part: PartitionConfig, key: str, rules: SiteRules, site: str,
                          others: Sequence[str] = ()) -> None:
    """A partition against the site's rules (a :class:`SiteRules` or its DictConfig): one ConfigError that quotes
    the rule, naming ``key.field``. ``others``: the gpu of the preset's other partitions, for the hint. Pure."""
    if part.whole_node_gpus and part.gpus_per_job not in (1, part.whole_node_gpus):
        said = f" {cite(rules.whole_node)}" if in_force(rules.whole_node) else ""
        raise ConfigError(f"{key}.gpus_per_job", part.gpus_per_job,
                          f"this site gives a job 1 GPU or a whole node of {part.whole_node_gpus}{said}",
                          f"{key}.gpus_per_job=1 (or {part.whole_node_gpus})")
    if in_force(rules.one_mig_per_job) and part.mig and part.gpus_per_job > 1:
        raise ConfigError(f"{key}.gpus_per_job", part.gpus_per_job,
                          f"{site} allows one MIG instance per job {cite(rules.one_mig_per_job)}",
                          f"{key}.gpus_per_job=1 (a pack on one slice); for more GPU per job, a larger slice or a "
                          "full GPU's partition, whose gpus_per_job may be 2")
    if in_force(rules.gpu_model) and part.request != "none" and not part.gpu:
        name = key.rpartition(".")[2]
        example = name if re.fullmatch(r"[a-z]+\d+[a-z]*", name) else \
            next(iter(difflib.get_close_matches(name, others, n=1, cutoff=0)), "h100")
        raise ConfigError(f"{key}.gpu", part.gpu, f"{site} refuses a GPU request that names no model "
                          f"{cite(rules.gpu_model)}",
                          f"{key}.gpu={example} (its model specifier, as in --gpus-per-node={example}:1)")


@dataclass
class SlurmConfig(ClusterConfig):
    """The SLURM backend's options (conf/cluster/slurm.yaml and the Alliance presets)."""

    # GPU types / partitions this cluster offers, by the name used in `partitions=[...]`.
    partitions: Dict[str, PartitionConfig] = field(default_factory=dict)
    # Partitions used when the command line names none.
    default_partitions: List[str] = field(default_factory=list)
    # SLURM account (--account); null: $SLURM_ACCOUNT or $SBATCH_ACCOUNT, as the Alliance documents.
    account: Optional[str] = None
    account_required: bool = False
    # Resources one pack job asks for, scaled by N: ceil(N * cpus_per_training) CPUs, N * mem_gb_per_training GB.
    cpus_per_training: float = 1.0
    # null: the peak RSS of earlier trainings of the same setting x 1.5 (gpupack/core/memory/figures.py), or 2 GB when
    # none was measured yet, so a pack does not ask for memory it never uses (and leave a node's other GPUs idle).
    mem_gb_per_training: Optional[float] = None
    # Array tasks of one (partition, mode, N) group running at once.
    array_parallelism: int = 64
    # Seconds before the time limit at which the pack is signalled to checkpoint and requeue.
    signal_delay_s: int = 90
    # How many times a pack may be requeued after reaching its time limit.
    max_num_timeout: int = 3
    # Shell lines run before each job (e.g. "module load python/3.11", "source ~/venv/bin/activate").
    setup: List[str] = field(default_factory=list)
    # More sbatch options, passed as they are (e.g. {"qos": "high"}).
    additional_parameters: Dict[str, Any] = field(default_factory=dict)
    # Seconds between two looks at the queue while waiting.
    poll_s: float = 5.0
    # Jobs you may have queued or running at once, array tasks counting one each, as the site states it (the
    # Alliance's Narval and Rorqual: 1000). SLURM's own limits are read too (MaxArraySize; sacctmgr's MaxSubmitJobs of
    # your association and QOS) and the lowest kept: what would pass it is never submitted. null: SLURM's only.
    max_jobs_per_user: Optional[int] = None
    # True where the cluster's nodes are one machine (scripts/local_slurm.sh: a slurmd per GPU type on one host), so
    # packs share its cores whatever their partition, and the report says so. false on a real cluster.
    nodes_share_one_host: bool = False
    # The site's stated rules on what one job may ask, each with its words and page (conf/cluster/fir.yaml), checked
    # before anything is submitted: a refusal quotes them.
    rules: SiteRules = field(default_factory=SiteRules)


MAX_SIGNAL_DELAY_S = 65535  # sbatch --signal's largest sig_time


def check_options(cluster: SlurmConfig, key: Callable[[str], str]) -> None:
    """Every field of a :class:`SlurmConfig` (or its DictConfig) on its own and against the others, used by this run
    or not: one ConfigError naming ``key(field)`` (cluster.<field>, or a Hydra launcher's name of it). Pure."""
    require_positive(cluster.max_jobs_per_user, key("max_jobs_per_user"),
                     f"{key('max_jobs_per_user')}=1000, or null for SLURM's own limits", whole=True)
    require_positive(cluster.array_parallelism, key("array_parallelism"), f"{key('array_parallelism')}=64",
                     whole=True, allow_none=False)
    count = cluster.max_num_timeout
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigError(key("max_num_timeout"), count, "must be a whole number >= 0 (requeues after a time limit)",
                          f"e.g. {key('max_num_timeout')}=3")
    require_positive(cluster.cpus_per_training, key("cpus_per_training"), f"{key('cpus_per_training')}=0.5 (each "
                     "training's share of the job's CPUs)", allow_none=False)
    require_memory(cluster.mem_gb_per_training, key("mem_gb_per_training"), "GB",
                   f"{key('mem_gb_per_training')}=2, or null to size it from measured peaks")
    require_positive(cluster.poll_s, key("poll_s"), f"{key('poll_s')}=5", allow_none=False)
    delay, limit_s = cluster.signal_delay_s, int(cluster.timeout_min) * 60
    fitting = max(1, min(90, limit_s // 2))  # submitit's 90 s, or half a short time limit
    require_positive(delay, key("signal_delay_s"), f"{key('signal_delay_s')}={fitting} (seconds before the time "
                     "limit)", whole=True, allow_none=False)
    if delay >= limit_s or delay > MAX_SIGNAL_DELAY_S:
        raise ConfigError(key("signal_delay_s"), delay, f"the warning signal must come before the time limit "
                          f"({key('timeout_min')}={cluster.timeout_min}: {limit_s} s), or every job is requeued "
                          f"at its start until {key('max_num_timeout')} is spent",
                          f"{key('signal_delay_s')}={fitting}")
    check_default_partitions(cluster, key)
    rules = cluster.rules
    check_rules(rules, key)
    for name, part in cluster.partitions.items():  # every preset partition, chosen for this run or not
        others = [str(p.gpu) for other, p in cluster.partitions.items() if p.gpu and other != name]
        check_partition(part, key(f"partitions.{name}"), rules, cluster.name, others)


def check_rules(rules: SiteRules, key: Callable[[str], str]) -> None:
    """Each rule of a :class:`SiteRules` (or its DictConfig) that the preset records (its words given): its page
    given and its date a day (YYYY-MM-DD), so that a refusal can quote it; a page or date without words is refused
    too (no rule would be checked). Pure."""
    for name in (f.name for f in dataclasses.fields(SiteRules)):
        rule, quote, source, since = (getattr(rules, name), key(f"rules.{name}.quote"), key(f"rules.{name}.source"),
                                      key(f"rules.{name}.since"))
        if not str(rule.quote).strip() and (rule.source or rule.since):
            raise ConfigError(quote, rule.quote, "a site rule is recorded by its words, and these are empty: no rule "
                              "would be checked", f"{quote}='...' (the site's words)")
        if rule.quote and not str(rule.source).strip():
            raise ConfigError(source, rule.source, "a site rule is quoted with the page it is written on",
                              f"{source}='...' (the page)")
        if rule.since is not None and not is_day(str(rule.since)):
            raise ConfigError(since, rule.since, "must be a day, YYYY-MM-DD, or null", f"e.g. {since}=2026-04-06")


def is_day(text: str) -> bool:
    """``text`` a calendar day written YYYY-MM-DD. Pure."""
    try:
        return _dt.date.fromisoformat(text).isoformat() == text
    except ValueError:
        return False


def check_default_partitions(cluster: SlurmConfig, key: Callable[[str], str]) -> None:
    """default_partitions: each a partition of the preset, each once. Pure."""
    known = list(cluster.partitions)
    defaults = list(cluster.default_partitions)
    for i, name in enumerate(defaults):
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
            raise ConfigError(f"{key('default_partitions')}[{i}]", name, f"{cluster.name} has no such partition "
                              f"({nearest(str(name), known)})",
                              f"{key('default_partitions')}=[{(close or known or ['NAME'])[0]}]")
    require_unique(defaults, key("default_partitions"), "a partition", "partition")


def undotted(name: str) -> str:
    """A MIG slice partition's name as the presets write it, without the dot that a key's path would split on
    (h100_1g.10gb: h100_1g_10gb). Pure."""
    return str(name).replace(".", "_")


def launcher_gpu_request(options: Mapping[str, object], key: str) -> tuple[str | None, str]:
    """(GPU type or None for any, request form) for one pack from a Hydra launcher's gres / gpus_per_node: packs share
    exactly one GPU, or run on CPUs. An error names ``key``.<option>."""
    gres, per_node = options.get("gres"), options.get("gpus_per_node")
    if gres:
        m = LAUNCHER_GRES.match(str(gres))
        if not m or int(m.group(2)) != 1:
            raise ConfigError(f"{key}.gres", gres, "a pack's jobs share one GPU, so a pack asks for exactly one",
                              f"e.g. {key}.gres=gpu:v100:1 (or gpu:1), and {key}.pack=N for N jobs on it")
        return m.group(1), "gres"
    if per_node in (None, 0):
        return None, "none"
    if per_node != 1:
        raise ConfigError(f"{key}.gpus_per_node", per_node, "a pack's jobs share one GPU",
                          f"use {key}.gpus_per_node=1 and {key}.pack=N; for one job on several GPUs keep "
                          "hydra-submitit-launcher")
    return None, "gpus_per_node"


def slurm_job_environment(job_id: str | None, env: Mapping[str, str]) -> JobEnvironment:
    """A SLURM job as its variables describe it. Pure."""
    start = env.get("SLURM_JOB_START_TIME", "")
    return JobEnvironment(job_id=job_id, cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
                          started_at=float(start) if start.isdigit() else None, tmp_dir=env.get("SLURM_TMPDIR"),
                          scheduler={"slurm_job_gpus": env.get("SLURM_JOB_GPUS"),
                                     "slurm_partition": env.get("SLURM_JOB_PARTITION")})


# What a pack's job asks for: (partition, mode, N, devices).
GroupKey = tuple[str, str, int, int]


def array_groups(packs: Sequence[Pack]) -> dict[GroupKey, list[Pack]]:
    """Packs by what their job asks for, (partition, mode, N, devices): a job array each, in the plan's order. Pure."""
    groups: dict[GroupKey, list[Pack]] = {}
    for p in packs:
        groups.setdefault((p.partition, p.mode, p.factor, p.devices), []).append(p)
    return groups


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
    """One sbatch call of a submission: a (partition, mode, N, k) group's lanes as one job array (one job where one
    lane), and submitit's SlurmExecutor parameters for it (update_parameters)."""

    key: GroupKey
    lanes: list[list[Pack]]
    parameters: SbatchParameters
    in_turn: bool  # its jobs run lanes of packs (or streaming lanes), folded into their journals

    @property
    def tasks(self) -> int:
        return len(self.lanes)


def sbatch_lines(folder: str | os.PathLike[str], parameters: SbatchParameters, tasks: int) -> list[str]:
    """The #SBATCH lines of the submission.sh submitit writes for ``tasks`` jobs submitted in one batch with
    ``parameters`` into ``folder``: submitit's own script (:func:`~gpupack.submit._submitit.make_sbatch_string`, as its
    SlurmExecutor writes it). A batch of more than one is an array:
    submitit sets map_count on its copy of the executor (SlurmExecutor._internal_process_submissions). Pure."""
    params = parameters.copy()
    if tasks > 1:
        params["map_count"] = tasks
    text = make_sbatch_string(Path(folder).expanduser().absolute(), **params)
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


def over_limit(forecast: JobForecast, key: str) -> str:
    """The line for a submission that needs more jobs than the site lets the user queue now, even at one lane of
    packs per (partition, mode, N) (``key``: the config key of the site's stated limit)."""
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
    """The totals of a submission against the site's limits, each with where it comes from (read from the cluster,
    from the preset, or unknown where SLURM did not answer: its words), and whether sinfo checked the partitions.
    Pure."""
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


class SlurmSubmitter(Submitter[SlurmConfig]):
    Config = SlurmConfig
    detachable = True
    requeues = True
    _limits: commands.SiteLimits | None = None  # asked once per submitter (site_limits)
    _oom_records: dict[str, RunRecords] | None = None  # a job that ran out of memory: the run's records, read once
    _sinfo_silent: str | None = None  # why sinfo did not answer when capacities asked it (its partition check skipped)
    _reached = False  # SLURM answered here (require_reachable, asked once)

    @classmethod
    def requeue_signal(cls) -> int:
        """The signal submitit asks SLURM to send before the time limit (--signal, USR2 unless
        SUBMITIT_PREEMPT_SIGNAL names another); its handler checkpoints the call and requeues the job."""
        name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
        return int(getattr(signal, f"SIG{name}", signal.SIGUSR2))

    def stream_jobs(self, partition: str) -> int:
        return int(self.cluster.array_parallelism)

    def claim_until_s(self) -> float | None:
        return max(0.0, float(self.cluster.timeout_min) * 60 - float(self.cluster.signal_delay_s))

    @classmethod
    def job_environment(cls) -> JobEnvironment:
        """submitit's SLURM job (its id, array task included: 1234_5), when it started (SLURM_JOB_START_TIME, an
        epoch, Slurm 21.08 and later: a streaming lane's time limit counts from it) and what SLURM gave it, to
        cross-check with sacct's gres/gpu."""
        return slurm_job_environment(submitit.JobEnvironment().job_id, os.environ)

    # ---------------- a Hydra launcher's options ----------------

    @classmethod
    def launcher_config(cls, options: Mapping[str, Any], key: str) -> SlurmConfig:
        """hydra/launcher=gpupack_slurm: one partition (its SLURM partition, gres or gpus_per_node, constraint,
        gpu_model); cpus_per_task and mem_gb of ONE job (null: 1 CPU, 2 GB); qos, comment and exclude as sbatch
        options."""
        gpu, request = launcher_gpu_request(options, key)
        label = options.get("partition") or LAUNCHER_LABEL
        extra = {k: options[k] for k in ("qos", "comment", "exclude") if options.get(k)}
        return SlurmConfig(
            name="gpupack_slurm", backend="slurm", timeout_min=int(options["timeout_min"]),
            partitions={label: PartitionConfig(gpu=gpu, request=request, slurm_partition=options.get("partition"),
                                               constraint=options.get("constraint"), model=options.get("gpu_model"))},
            default_partitions=[label], account=options.get("account"),
            cpus_per_training=float(options.get("cpus_per_task") or 1),
            # unset: null, so the request is the default and says so (not "as set")
            mem_gb_per_training=None if options.get("mem_gb") is None else float(options["mem_gb"]),
            array_parallelism=int(options["array_parallelism"]),
            signal_delay_s=int(options["signal_delay_s"]), max_num_timeout=int(options["max_num_timeout"]),
            setup=list(options.get("setup") or []),
            additional_parameters={**extra, **(options.get("additional_parameters") or {})},
            poll_s=float(options["poll_s"]))

    @classmethod
    def launcher_names(cls, cluster: ClusterConfig) -> dict[str, str]:
        label = next(iter(cast(SlurmConfig, cluster).partitions))  # launcher_config's
        return {"cpus_per_training": "cpus_per_task", "mem_gb_per_training": "mem_gb", "partition": "partition",
                f"partitions.{label}.gpu": "gres", f"partitions.{label}.slurm_partition": "partition",
                f"partitions.{label}.request": "gpus_per_node"}

    # ---------------- checks before anything is submitted ----------------

    def resolve_partitions(self, requested: Sequence[str]) -> tuple[str, ...]:
        names = list(requested) or list(self.cluster.default_partitions)
        known = list(self.cluster.partitions)
        if not names:
            raise ConfigError("partitions", [], f"no partition chosen for {self.cluster.name}",
                              f"name some, e.g. partitions=[{','.join(known[:3])}]")
        if not requested:  # the preset's own list, refused as the preset's key
            check_default_partitions(self.cluster, self.key)
        renamed = [undotted(name) if undotted(name) in known else name for name in names]
        for i, name in enumerate(names):
            if name != renamed[i]:  # a slice's name before issue 43: refused, so records keep one name per slice
                raise ConfigError(f"partitions[{i}]", name, f"slice partitions are named without dots, so that "
                                  f"cluster.partitions.<name>.<key> addresses them: {name} is {renamed[i]}",
                                  f"partitions=[{','.join(renamed)}]")
            if name not in self.cluster.partitions:
                raise ConfigError(f"partitions[{i}]", name, f"{self.cluster.name} has no such GPU type/partition",
                                  nearest(name, known))
        require_unique(names, "partitions", "a partition", "partition")
        return tuple(names)

    def account(self) -> str | None:
        return self.cluster.account or next((os.environ[v] for v in ACCOUNT_ENV if os.environ.get(v)), None)

    def check(self, partitions: Sequence[str]) -> None:
        super().check(partitions)
        if self.cluster.account_required and not self.account():
            raise ConfigError(self.key("account"), None, f"the {self.cluster.name} cluster needs an allocation "
                              "account", f"add {self.key('account')}=def-yourpi (or export SLURM_ACCOUNT=def-yourpi)")
        check_options(self.cluster, self.key)

    def request(self, factor: int, measured_host_mb: Figure | None = None) -> PackRequest:
        measured = measured_host_mb if measured_host_mb is not None else self.measured_host_mb
        each_mb, why = request_mb(measured, self.cluster.mem_gb_per_training, DEFAULT_MEM_GB)
        cpus, mem_mb = resources(factor, self.cluster.cpus_per_training, each_mb / 1024)
        return PackRequest(cpus=cpus, mem_mb=mem_mb, cpus_key=self.key("cpus_per_training"),
                           mem_key=self.key("mem_gb_per_training"), cpus_each=self.cluster.cpus_per_training,
                           mem_gb_each=each_mb / 1024, mem_why=why)  # exact: sbatch asks the same MB

    def capacities(self, partitions: Sequence[str]) -> dict[str, Capacity]:
        """From the preset (GPU memory from the model name, V100-16gb; per-GPU guidance) and, where SLURM
        answers, sinfo: each partition and GPU type must exist; node CPUs and memory bound the rest."""
        why: list[str] = []
        live = commands.live_limits(self.cluster.partitions, partitions, self.key, why=why)
        self._sinfo_silent = why[0] if why else None
        out = {}
        for name in partitions:
            part = self.cluster.partitions[name]
            node_gpus = live.get(name, {}).get("node_gpus")
            if node_gpus and part.gpus_per_job > node_gpus:
                key = self.key(f"partitions.{name}.gpus_per_job")
                raise ConfigError(key, part.gpus_per_job, f"{name}'s nodes hold {node_gpus} GPUs (sinfo), and a job's "
                                  "GPUs are on one node", f"use {key}={node_gpus} (a whole node) or fewer")
            m = re.search(r"(\d+)gb$", part.model or "", re.IGNORECASE)
            out[name] = Capacity(has_gpu=part.request != "none", gpu_memory_mb=float(m.group(1)) * 1024 if m else None,
                                 max_cpus=part.max_cpus or live.get(name, {}).get("cpus"),
                                 max_mem_mb=(part.max_mem_gb * 1024 if part.max_mem_gb else None)
                                 or live.get(name, {}).get("mem_mb"),
                                 node_gpus=live.get(name, {}).get("node_gpus"),
                                 node_cpus=live.get(name, {}).get("node_cpus"),
                                 node_mem_mb=live.get(name, {}).get("node_mem_mb"),
                                 bundle_cores=part.bundle_cores, bundle_mem_gb=part.bundle_mem_gb,
                                 device=(part.model or part.gpu) if part.request != "none" else "cpu",
                                 **self._devices_rule(part))
        return out

    def _devices_rule(self, part: PartitionConfig) -> _DevicesRule:
        """The one-MIG-instance rule as a capacity, for what asks a job for k devices besides gpus_per_job
        (spread.devices): on a slice partition where the site enforces it, one device a job, with its words."""
        rule = self.cluster.rules.one_mig_per_job
        if not (part.mig and in_force(rule)):
            return {}
        return {"max_devices_per_job": 1,
                "devices_rule": f"{self.cluster.name} allows one MIG instance per job {cite(rule)}"}

    # ---------------- submission ----------------

    def require_reachable(self) -> None:
        """SLURM answers here (sbatch is installed, sinfo answers), else one line in its own words with the fix."""
        if self._reached:
            return
        silent = self._sinfo_silent  # the partition check's sinfo found no controller: each try costs SLURM's timeout
        if silent and commands.UNREACHABLE.search(silent) and shutil.which("sbatch") is not None:
            raise commands.unreachable("sinfo", silent)
        commands.require_reachable()
        self._reached = True

    def _executor(self) -> submitit.SlurmExecutor:
        return QuietSlurmExecutor(folder=str(self.run.submitit_folder),
                                  max_num_timeout=int(self.cluster.max_num_timeout))

    def site_limits(self) -> commands.SiteLimits:
        """What SLURM lets this user submit (asked once), with the site's stated job limit where it is lower."""
        if self._limits is None:
            live = commands.site_limits(getpass.getuser(), self.cluster.additional_parameters.get("qos"))
            stated = self.cluster.max_jobs_per_user
            if stated is not None and (live.max_submit is None or stated < live.max_submit):
                live = dataclasses.replace(live, max_submit=stated, submit_source=f"{self.key('max_jobs_per_user')}="
                                           f"{stated}, the site's stated limit", submit_from="from the preset")
            self._limits = live
        return self._limits

    def job_gpus(self, key: GroupKey) -> int:
        """GPUs one job of a (partition, mode, N, k) group holds: the partition's gpus_per_job for packs of N, a
        spread training's k."""
        partition, _mode, _factor, devices = key
        return devices if devices > 1 else int(self.cluster.partitions[partition].gpus_per_job)

    def packs_at_once(self, key: GroupKey) -> int:
        """Packs one job of a group runs at once: one on each of its GPUs for packs of N, one spread training."""
        return 1 if key[3] > 1 else self.job_gpus(key)

    def lanes(self, packs: Sequence[Pack]) -> tuple[JobForecast, list[tuple[GroupKey, list[list[Pack]]]]]:
        """The jobs submitting ``packs`` makes: each (partition, mode, N) group's packs dealt to its lanes (one pack
        a GPU where the group runs at once), against the site's limits; no lanes where they cannot fit."""
        limits = self.site_limits()
        groups = list(array_groups(packs).items())
        allowed = None if limits.max_submit is None else max(0, limits.max_submit - (limits.queued or 0))
        counts = lane_counts([-(-len(group) // self.packs_at_once(key)) for key, group in groups],
                             int(self.cluster.array_parallelism), allowed)
        lanes = [(key, deal(group, k)) for (key, group), k in zip(groups, counts)] if counts is not None else []
        arrays = sum(len(array_chunks(group_lanes, limits.max_array_size)) for _, group_lanes in lanes)
        gpus = sum(len(group_lanes) * self.job_gpus(key) for key, group_lanes in lanes)
        idle = sum(max(0, self.packs_at_once(key) - len(lane)) for key, group_lanes in lanes for lane in group_lanes)
        forecast = JobForecast(jobs=sum(counts) if counts is not None else len(groups), packs=len(packs),
                               arrays=arrays, max_array_size=limits.max_array_size, allowed=allowed,
                               limit=limits.submit_source, queued=limits.queued,
                               queue_why=limits.unanswered.get("squeue", ""), gpus=gpus,
                               idle_gpus=idle)
        return forecast, lanes

    def job_forecast(self, packs: Sequence[Pack]) -> JobForecast:
        return self.lanes(packs)[0]

    def array_jobs(self, packs: Sequence[Pack]) -> tuple[JobForecast, list[ArrayJob]]:
        """The sbatch calls submitting ``packs`` makes, in order, each with the executor parameters it is submitted
        with: what :meth:`submit` submits and a dry run shows (:meth:`request_lines`), from this one builder."""
        forecast, lanes = self.lanes(packs)
        account = self.account()
        return forecast, [self.array_job(key, chunk, account) for key, group_lanes in lanes
                          for chunk in array_chunks(group_lanes, forecast.max_array_size)]

    def array_job(self, key: GroupKey, lanes: list[list[Pack]], account: str | None) -> ArrayJob:
        """One job array (one job, where one lane) of a (partition, mode, N, k) group's ``lanes``: submitit's
        SlurmExecutor parameters for it. Pure, given the measured memory (self.measured_host_mb)."""
        partition, _mode, factor, devices = key
        lane_gpus = self.packs_at_once(key)  # the job's GPUs a lane's packs take one each (a spread: all k)
        # jobs of lanes of packs, and streaming lanes: folded into their journals
        in_turn = lane_gpus > 1 or any(len(lane) > 1 or lane[0].stream is not None for lane in lanes)
        params = sbatch_parameters(self.cluster, partition, self.cluster.partitions[partition], factor, account,
                                   self.request(factor).mem_gb_each, devices=devices, gpus=lane_gpus)
        params["stderr_to_stdout"] = in_turn  # a file a job less where files per job count
        return ArrayJob(key=key, lanes=lanes, parameters=params, in_turn=in_turn)

    def request_lines(self, packs: Sequence[Pack]) -> list[str]:
        """The #SBATCH lines of each kind of job submitting ``packs`` makes, as submitit will write them (from the
        parameters :meth:`submit` sets: :meth:`array_jobs`), then the totals against the site's limits and where each
        limit comes from."""
        forecast, arrays = self.array_jobs(packs)
        blocks: dict[tuple[str, ...], list[ArrayJob]] = {}
        for array in arrays:  # arrays whose lines are the same (two modes of one N) show once
            lines = tuple(sbatch_lines(self.run.submitit_folder, array.parameters, array.tasks))
            blocks.setdefault(lines, []).append(array)
        out = [f"request: the #SBATCH lines submitit will write ({len(arrays)} sbatch call(s)):"] if arrays else \
            ["request: none: " + over_limit(forecast, self.key("max_jobs_per_user"))]
        for lines, same in blocks.items():
            out.append(f"  {block_label(same)}:")
            out += [f"    {line}" for line in lines]
            out += [f"    {line}" for line in self.mem_lines(same)]
        return out + limit_lines(forecast, arrays, self.site_limits(), self._sinfo_silent)

    def mem_lines(self, arrays: Sequence[ArrayJob]) -> list[str]:
        """Where the --mem of one block of #SBATCH lines comes from: per training, as set, from the peak measured on
        the partitions' device with its headroom, or a default with what the records held (one line a distinct
        figure: a block's arrays of one N ask alike)."""
        lines = []
        for factor in sorted({a.key[2] for a in arrays}):
            req = self.request(factor)
            why = f"as set ({req.mem_key}={req.mem_gb_each:g})" if req.mem_why == "as set" else req.mem_why
            line = f"--mem: {round((req.mem_gb_each or 0) * 1024)} MB per training, {why}"
            if line not in lines:
                lines.append(line)
        return lines

    def submit(self, packs: Sequence[Pack], settings: PackSettings) -> list[tuple[Pack, PackJobHandle]]:
        """One job array per (partition, mode, N), split where it would pass MaxArraySize, submitted in the plan's
        order (interleaved N): each array's tasks in the order their packs were planned. When they run is then the
        scheduler's choice; each pack record keeps its start time and host. A submission of more jobs than the site
        lets the user queue now is refused whole, before any sbatch. Returns each pack with its job."""
        forecast, arrays = self.array_jobs(packs)
        if forecast.over:
            raise SubmissionError(over_limit(forecast, self.key("max_jobs_per_user")))
        out: list[tuple[Pack, PackJobHandle]] = []
        for array in arrays:
            key, group, in_turn = array.key, array.lanes, array.in_turn
            partition, _mode, factor, devices = key
            part, req, gpus = self.cluster.partitions[partition], self.request(factor), self.job_gpus(key)
            lane_gpus = self.packs_at_once(key)  # the job's GPUs a lane's packs take one each (a spread: all k)
            executor = self._executor()
            executor.update_parameters(**array.parameters)  # the dry run shows the same (request_lines)
            if in_turn:  # a streaming lane reads its queue's journals by name: they exist before any job starts
                make_journals(self.run, [p.pack_id for lane in group for p in lane if p.stream is not None])
            try:  # what the job asked, billed as its GPUs' bundles (gpupack.core.cost.billing)
                asked = {"gpus": gpus, "cpus": req.cpus * gpus if req.cpus else None,
                         "mem_gb": req.mem_mb * gpus / 1024 if req.mem_mb else None,
                         "bundle_cores": part.bundle_cores, "bundle_mem_gb": part.bundle_mem_gb}
                labelled = dataclasses.replace(settings, gpu_model=part.model, claim_until_s=self.claim_until_s(),
                                               billing=asked, job_gpus=lane_gpus, fold=in_turn)
                with executor.batch():  # a lane of one pack runs it as before; of more, in turn (on each GPU)
                    jobs = [executor.submit(PackJob(type(self)), str(self.run.root),
                                            lane[0].pack_id if len(lane) == 1 and lane_gpus == 1
                                            else [p.pack_id for p in lane], labelled) for lane in group]
            except Exception as err:  # sbatch refused: say which group and why, keep what was submitted
                self.remember({p.pack_id: (str(j.job_id), p.partition) for p, j in out})
                unreachable = commands.sbatch_refusal(err)  # no SLURM answers here: its one line and fix
                if unreachable is not None:
                    raise unreachable from None
                what = f"k={devices}" if devices > 1 else f"N={factor}"
                raise SubmissionError(f"sbatch refused the {partition} {what} array: "
                                      f"{commands.one_line('sbatch', str(err))}") from None
            out += [(p, job) for lane, job in zip(group, jobs) for p in lane]
        self.remember({p.pack_id: (str(j.job_id), p.partition) for p, j in out})
        return out

    def detach(self, packs: Sequence[Pack], settings: PackSettings) -> dict[str, str]:
        return {p.pack_id: str(j.job_id) for p, j in self.submit(packs, settings)}

    def run_packs(self, packs: Sequence[Pack], settings: PackSettings, progress: ProgressFn) -> list[PackResult]:
        """Submit, then wait: a pack's end is seen from its result file within FINISH_POLL_S (a stat, no queue
        call); the queue is asked whether pending packs started only every cluster.poll_s."""
        since = time.time()  # records of trainings started from now on are this submission's
        submitted = self.submit(packs, settings)
        for pack, _ in submitted:
            progress(pack, "pending")
        shown: dict[str, str] = {}
        results: list[PackResult] = []
        waiting = list(submitted)
        next_queue_look = time.time() + self.cluster.poll_s
        while waiting:
            time.sleep(FINISH_POLL_S)
            look = time.time() >= next_queue_look
            if look:
                next_queue_look = time.time() + self.cluster.poll_s
            for pack, job in list(waiting):
                if job.done():
                    waiting.remove((pack, job))
                    results.append(self.ended(pack, job, since))
                    progress(pack, progress_state(results[-1]))
                elif look and shown.get(pack.pack_id) != "running" and job.state.split(" ")[0] == "RUNNING" \
                        and self.run.pack_dir(pack.pack_id).is_dir():  # its job body began (a lane: its turn came)
                    shown[pack.pack_id] = "running"
                    progress(pack, "running")
        return results

    def ended(self, pack: Pack, job: PackJobHandle, since: float) -> PackResult:
        """How a pack's job ended. When SLURM says it ran out of memory, the trainings its cgroup killed are recorded as
        oom (gpupack.job.oom.record_job_oom), so their N is infeasible; any it cannot record are named in the error."""
        result = job_result(pack, job, self.run)
        if not commands.out_of_memory(job.state, (job.stderr() or "") + (job.stdout() or "")):  # merged: a lane's
            return result
        why = f"SLURM: job {job.job_id} ran out of memory (its cgroup killed a process)"
        self._oom_records = self._oom_records or {}  # a lane's packs end with its job: its journals read once
        records = self._oom_records.setdefault(str(job.job_id), RunRecords(self.run))
        unrecorded = record_job_oom(self.run, pack.pack_id, since, why, records)
        if unrecorded:
            result.ok = False
            result.error = (f"{why}; training(s) {', '.join(unrecorded)} left no record. HINT: raise "
                            f"{self.key('mem_gb_per_training')} or lower N")
        return result

    def queue_states(self, job_ids: Sequence[str]) -> dict[str, str] | None:
        """sacct's State of each job id (e.g. "CANCELLED by 0"); None when sacct does not answer."""
        return commands.queue_states(job_ids)

    def pack_states(self, job_ids: Sequence[str]) -> dict[str, str] | None:
        states = self.queue_states(job_ids)
        return None if states is None else {j: commands.pack_state(s) for j, s in states.items()}


class _DevicesRule(TypedDict, total=False):
    """A partition's limit on the devices of one job, where the site states one (PartitionFacts' fields)."""
    max_devices_per_job: int
    devices_rule: str


SUBMITTER = SlurmSubmitter
