"""The SLURM backend's options: a cluster's partitions and how to ask for them, the checks of every key before
anything is submitted, what a partition can hold, and a Hydra launcher's options mapped to them. Pure."""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from gpupack.core.types import Capacity
from gpupack.errors import ConfigError, nearest, require_memory, require_positive, require_unique
from gpupack.submit import ClusterConfig
from gpupack.submit.slurm.rules import SiteRules, check_rules, cite, in_force

REQUEST_FORMS = ("gpus_per_node", "gres", "none")
LAUNCHER_GRES = re.compile(r"^gpu(?::([^:,]+))?:(\d+)$")  # a Hydra launcher's gres: gpu:1, gpu:v100:1
LAUNCHER_LABEL = "default"  # the Hydra launcher's one partition, when it names no SLURM partition


@dataclass
class PartitionConfig:
    """One kind of GPU a cluster offers, and how to ask SLURM for one of it."""

    gpu: Optional[str] = None  # model specifier for --gpus-per-node=<gpu>:1; null: one GPU of any type
    # How to ask: "gpus_per_node" (the Alliance's form), "gres" (older sites), or "none" (a CPU partition).
    request: str = "gpus_per_node"
    slurm_partition: Optional[str] = None  # where the site routes GPU types by partition; null: its default
    constraint: Optional[str] = None
    model: Optional[str] = None  # its name in the RGU table (e.g. V100-16gb), for cost comparisons
    # The most CPUs and host memory one single-GPU job should get here (the site's per-GPU guidance).
    max_cpus: Optional[int] = None
    max_mem_gb: Optional[float] = None
    # The cores and memory (GB) that come with one GPU (or MIG slice), which a job is billed against
    # (gpupack.core.cost.billing); null: this site bills the GPU alone (as far as gpupack knows).
    bundle_cores: Optional[float] = None
    bundle_mem_gb: Optional[float] = None
    # GPUs one job holds, each running its own lane of packs of N (a spread training's job keeps its k): a whole
    # node where the site gives GPUs by the node.
    gpus_per_job: int = 1
    # Where the site gives a job exactly 1 GPU or whole nodes of this many (Trillium: 4), gpus_per_job must be one
    # of the two; null: any count up to a node's.
    whole_node_gpus: Optional[int] = None
    retired: bool = False  # retired hardware, kept so earlier measurements can still be labelled and compared
    # A MIG slice, not a whole GPU: where the site allows one slice per job (rules.one_mig_per_job), a job asks one.
    mig: bool = False


def check_partition(part: PartitionConfig, key: str, rules: SiteRules, site: str, others: Sequence[str]) -> None:
    """A partition's fields, on their own and against the site's ``rules`` (quoted): one ConfigError naming
    ``key.field``. ``others``: the gpu of the preset's other partitions, for a hint. Pure."""
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
    default_partitions: List[str] = field(default_factory=list)  # used when the command line names none
    # SLURM account (--account); null: $SLURM_ACCOUNT or $SBATCH_ACCOUNT, as the Alliance documents.
    account: Optional[str] = None
    account_required: bool = False
    # Resources one pack job asks for, scaled by N: ceil(N * cpus_per_training) CPUs, N * mem_gb_per_training GB.
    cpus_per_training: float = 1.0
    # null: the peak RSS of earlier trainings of the same setting x 1.5, or 2 GB when none was measured yet.
    mem_gb_per_training: Optional[float] = None
    array_parallelism: int = 64  # array tasks of one (partition, mode, N) group running at once
    signal_delay_s: int = 90  # seconds before the time limit at which a pack is signalled to requeue
    max_num_timeout: int = 3  # how many times a pack may be requeued after reaching its time limit
    setup: List[str] = field(default_factory=list)  # shell lines run before each job ("module load python/3.11")
    additional_parameters: Dict[str, Any] = field(default_factory=dict)  # more sbatch options, as they are
    poll_s: float = 5.0  # seconds between two looks at the queue while waiting
    # Jobs you may have queued or running at once, array tasks counting one each, as the site states it (Narval,
    # Rorqual: 1000); the lowest of it and SLURM's own limits is kept. null: SLURM's only.
    max_jobs_per_user: Optional[int] = None
    # True where the cluster's nodes are one machine (scripts/local_slurm.sh), so packs share its cores whatever
    # their partition. false on a real cluster.
    nodes_share_one_host: bool = False
    # The site's stated rules on what one job may ask, each with its words and page (conf/cluster/fir.yaml).
    rules: SiteRules = field(default_factory=SiteRules)


MAX_SIGNAL_DELAY_S = 65535  # sbatch --signal's largest sig_time


def check_options(cluster: SlurmConfig, key: Callable[[str], str]) -> None:
    """Every field of a :class:`SlurmConfig`, used by this run or not: one ConfigError naming ``key(field)``. Pure."""
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
    check_rules(cluster.rules, key)
    for name, part in cluster.partitions.items():  # every preset partition, chosen for this run or not
        others = [str(p.gpu) for other, p in cluster.partitions.items() if p.gpu and other != name]
        check_partition(part, key(f"partitions.{name}"), cluster.rules, cluster.name, others)


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
    """A MIG slice partition's name without the dot a key's path would split on (h100_1g.10gb: h100_1g_10gb)."""
    return str(name).replace(".", "_")


def launcher_gpu_request(options: Mapping[str, object], key: str) -> tuple[str | None, str]:
    """(GPU type or None for any, request form) from a Hydra launcher's gres / gpus_per_node: one GPU, or none."""
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


def launcher_config(options: Mapping[str, Any], key: str) -> SlurmConfig:
    """hydra/launcher=gpupack_slurm: one partition; cpus_per_task and mem_gb of ONE job (null: 1 CPU, 2 GB); qos,
    comment and exclude as sbatch options."""
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


def partition_capacity(cluster: SlurmConfig, name: str, live: Mapping[str, int], key: Callable[[str], str]) -> Capacity:
    """What one partition of ``cluster`` can hold, from the preset and ``live``, what sinfo said of its nodes; on a
    slice partition where the site enforces one MIG instance a job, one device a job, with its words. Pure."""
    part = cluster.partitions[name]
    rule = cluster.rules.one_mig_per_job
    one_mig = part.mig and in_force(rule)
    node_gpus = live.get("node_gpus")
    if node_gpus and part.gpus_per_job > node_gpus:
        field_key = key(f"partitions.{name}.gpus_per_job")
        raise ConfigError(field_key, part.gpus_per_job, f"{name}'s nodes hold {node_gpus} GPUs (sinfo), and a job's "
                          "GPUs are on one node", f"use {field_key}={node_gpus} (a whole node) or fewer")
    m = re.search(r"(\d+)gb$", part.model or "", re.IGNORECASE)
    return Capacity(has_gpu=part.request != "none", gpu_memory_mb=float(m.group(1)) * 1024 if m else None,
                    max_cpus=part.max_cpus or live.get("cpus"),
                    max_mem_mb=(part.max_mem_gb * 1024 if part.max_mem_gb else None) or live.get("mem_mb"),
                    node_gpus=node_gpus, node_cpus=live.get("node_cpus"), node_mem_mb=live.get("node_mem_mb"),
                    bundle_cores=part.bundle_cores, bundle_mem_gb=part.bundle_mem_gb,
                    device=(part.model or part.gpu) if part.request != "none" else "cpu",
                    max_devices_per_job=1 if one_mig else None,
                    devices_rule=f"{cluster.name} allows one MIG instance per job {cite(rule)}" if one_mig else None)
