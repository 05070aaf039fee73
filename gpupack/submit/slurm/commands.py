"""The SLURM backend's questions to the scheduler (sinfo, sacct, its submit limits) and how it reads the answers.
Every SLURM command gpupack runs goes through :func:`slurm_command`, the one seam to the cluster besides submitit."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from gpupack.core.types import DONE, FAILED, PENDING, RUNNING
from gpupack.errors import ConfigError, UnreachableError, nearest

if TYPE_CHECKING:
    from gpupack.submit.slurm.options import PartitionConfig

# sacct / squeue states → gpupack's pack states (anything else that is not active counts as failed).
QUEUE_STATES = {
    "PENDING": PENDING, "REQUEUED": PENDING, "REQUEUE_HOLD": PENDING, "REQUEUE_FED": PENDING, "CONFIGURING": PENDING,
    "SUSPENDED": PENDING, "RESIZING": PENDING,
    "RUNNING": RUNNING, "COMPLETING": RUNNING, "STAGE_OUT": RUNNING, "SIGNALING": RUNNING,
    "COMPLETED": DONE,
    "OUT_OF_MEMORY": FAILED,  # stopped by SLURM's cgroup for memory: its trainings killed for it are oom
}
# What SLURM writes in a job's stderr when its cgroup killed a process for memory ("slurmstepd: error: Detected 1
# oom-kill event(s) ...", "srun: error: n1: task 0: Out Of Memory"): only SLURM's own lines are evidence.
OOM_STDERR = re.compile(r"^(?:slurmstepd|srun): .*(?:oom-kill event|out of memory|exceeded (?:job )?memory limit)",
                        re.IGNORECASE | re.MULTILINE)


def slurm_command(args: Sequence[str], timeout: float = 30, why: list[str] | None = None) -> str | None:
    """A SLURM client command's stdout; None when SLURM is not installed or does not answer, its reason then appended
    to ``why`` in the command's own words (its last line on stderr)."""
    out, said = slurm_answer(args, timeout)
    if out is None and why is not None:
        lines = [line.strip() for line in said.splitlines() if line.strip()]
        why.append(lines[-1] if lines else f"{args[0]} is not installed")
    return out


def slurm_answer(args: Sequence[str], timeout: float = 30) -> tuple[str | None, str]:
    """(its stdout, "") where a SLURM client command answered; (None, its stderr) where it did not, in ``timeout``;
    (None, "") where SLURM is not installed. A SLURM_CONF naming no file is not read: clients retry it for 60 s."""
    conf = os.environ.get("SLURM_CONF")
    if shutil.which(args[0]) is None:
        return None, ""
    if conf and not os.path.isfile(conf):
        return None, f"{args[0]}: error: not run: SLURM_CONF names no file"
    try:
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as late:  # what it said before it was stopped
        said = late.stderr.decode(errors="replace") if isinstance(late.stderr, bytes) else late.stderr or ""
        return None, said or f"{args[0]}: error: no answer within {timeout:g} s"
    except OSError as err:
        return None, f"{args[0]}: error: {err.strerror}"
    return (proc.stdout, "") if proc.returncode == 0 else (None, proc.stderr)


# What SLURM's clients say when no scheduler answers here: its config unreadable, or its controller not reached.
UNREACHABLE = re.compile(r"Unable to contact slurm controller|Unable to process configuration file|cannot stat file"
                         r"|SLURM_CONF names no file|failed to fetch config|Unable to establish controller",
                         re.IGNORECASE)


def one_line(command: str, said: str) -> str:
    """What a SLURM client said on stderr as one line, each thing once, without its repeated "sbatch: error: "."""
    texts = (re.sub(rf"^{re.escape(command)}: (?:error|fatal): ", "", line.strip()) for line in said.splitlines())
    return f"{command}: {'; '.join(dict.fromkeys(text for text in texts if text))}"


def unreachable(command: str, said: str) -> UnreachableError:
    """The one line for a SLURM client that ``said`` it cannot reach SLURM: its words, the SLURM_CONF, the fix."""
    conf = os.environ.get("SLURM_CONF")
    return UnreachableError(f"SLURM does not answer here: {one_line(command, said)}",
                            f"SLURM_CONF={conf}" if conf else "SLURM_CONF not set",
                            "run gpupack on a login node of the cluster, or set SLURM_CONF to the cluster's "
                            "slurm.conf")


def sbatch_refusal(err: BaseException) -> UnreachableError | None:
    """The one line for an sbatch that failed because SLURM does not answer here; None where it refused the job."""
    if isinstance(err, FileNotFoundError):
        return unreachable("sbatch", "sbatch: error: command not found")
    said = str(err)
    return unreachable("sbatch", said) if UNREACHABLE.search(said) else None


def require_reachable() -> None:
    """Raise :class:`UnreachableError` unless sbatch is installed and sinfo answers."""
    if shutil.which("sbatch") is None:
        raise unreachable("sbatch", "sbatch: error: command not found (SLURM's clients are not installed here)")
    out, said = slurm_answer(["sinfo", "-h", "-o", "%P"])
    if out is None:
        raise unreachable("sinfo", said or "sinfo: error: command not found")


def gpus_in(gres: str, gpu: str | None) -> int:
    """GPUs of type ``gpu`` (any type: None) in one sinfo %G field, e.g. "gpu:v100:4(S:0-1),gpu:t4:2"."""
    return sum(int(count) for kind, count in re.findall(r"gpu:(?:([^:,(]+):)?(\d+)", gres)
               if gpu is None or kind == gpu)


def pack_state(queue_state: str) -> str:
    """gpupack's state of one sacct State field ("CANCELLED by 0" → failed)."""
    return QUEUE_STATES.get(queue_state.split(" ")[0], FAILED)


def out_of_memory(queue_state: str | None, stderr: str | None = None) -> bool:
    """True when sacct says OUT_OF_MEMORY, or SLURM said so in the job's stderr (sacct may lag, or be absent)."""
    return (queue_state or "").split(" ")[0] == "OUT_OF_MEMORY" or bool(OOM_STDERR.search(stderr or ""))


def live_limits(configured: Mapping[str, PartitionConfig], partitions: Sequence[str],
                key: Callable[[str], str], why: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Check with sinfo that each of ``partitions`` and its GPU type exist; their nodes' most CPUs and memory, and the
    GPUs, CPUs and memory of their nodes with the most GPUs of its type. {} where sinfo does not answer (``why``)."""
    out = slurm_command(["sinfo", "-h", "-o", "%P|%c|%m|%G"], why=why)
    if out is None:
        return {}  # not on the cluster (e.g. preparing a sweep elsewhere): the preset is all we know
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 3]
    by_partition: dict[str, list[list[str]]] = {}
    for row in rows:
        by_partition.setdefault(row[0].rstrip("*"), []).append(row)
    limits: dict[str, dict[str, int]] = {}
    for name in partitions:
        part = configured[name]
        scope = by_partition.get(part.slurm_partition, []) if part.slurm_partition else rows
        if part.slurm_partition and not scope:
            raise ConfigError(key(f"partitions.{name}.slurm_partition"), part.slurm_partition,
                              "SLURM (sinfo) has no such partition", nearest(part.slurm_partition, by_partition))
        if part.gpu and not any(f"gpu:{part.gpu}:" in r[3] or r[3].endswith(f"gpu:{part.gpu}") for r in scope):
            where = f"partition {part.slurm_partition}" if part.slurm_partition else "this cluster"
            types = sorted({g.split(":")[1] for r in scope for g in r[3].split(",") if g.startswith("gpu:")
                            and g.count(":") >= 2})
            raise ConfigError(key(f"partitions.{name}.gpu"), part.gpu, f"{where} has no GPU of this type "
                              "(sinfo)", nearest(part.gpu, types))
        nodes = [(gpus_in(r[3], part.gpu), int(r[1].rstrip("+")), int(r[2].rstrip("+"))) for r in scope]
        limits[name] = {"cpus": max(n[1] for n in nodes), "mem_mb": max(n[2] for n in nodes)}
        if gpu_nodes := [n for n in nodes if n[0]]:  # the nodes with the most GPUs of this type: idle GPUs are worst
            limits[name].update(zip(("node_gpus", "node_cpus", "node_mem_mb"), max(gpu_nodes)))
    return limits


def queue_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """sacct's State of each job id (e.g. "CANCELLED by 0"); None when sacct does not answer."""
    if not job_ids:
        return {}
    out = slurm_command(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)])
    if out is None:
        return None
    # the last line for an id is its latest (requeued) run
    return {job_id: state for job_id, _, state in (line.partition("|") for line in out.splitlines())}


@dataclass(frozen=True)
class SiteLimits:
    """What SLURM lets one user submit, as it says itself (None: no limit, or SLURM did not say)."""

    max_array_size: int | None = None  # scontrol's MaxArraySize: the most tasks an array holds
    # Jobs the user may have queued or running at once, array tasks counting one each, and which limit that is
    max_submit: int | None = None
    submit_source: str = ""
    submit_from: str = "read from the cluster (sacctmgr)"  # or from the preset's stated limit
    queued: int | None = None  # the user's jobs in the queue now (array tasks each); None: squeue did not answer
    unanswered: Mapping[str, str] = field(default_factory=dict)  # each question SLURM did not answer: why


def _whole(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def site_limits(user: str, qos: str | None = None) -> SiteLimits:
    """MaxArraySize (scontrol), the user's submit limit (sacctmgr: its associations' MaxSubmitJobs, and
    MaxSubmitJobsPerUser of ``qos``, else of its associations' default QOS, else of every QOS they allow) and its
    queued jobs (squeue). A question SLURM does not answer leaves its figure None, and says why (``unanswered``)."""
    unanswered: dict[str, str] = {}

    def ask(args: list[str]) -> str | None:
        why: list[str] = []
        out = slurm_command(args, why=why)
        if out is None and args[0] not in unanswered:
            unanswered[args[0]] = why[0] if why else "no answer"
        return out

    config = ask(["scontrol", "show", "config"]) or ""
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", config, re.MULTILINE)
    limits: list[tuple[int, str]] = []
    qos_names: set[str] = {qos} if qos else set()
    assoc = ask(["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}",
                           "format=MaxSubmit,DefaultQOS,QOS"]) or ""
    for line in assoc.splitlines():
        fields = (line.split("|") + ["", "", ""])[:3]
        if (most := _whole(fields[0])) is not None:
            limits.append((most, f"your association's MaxSubmitJobs={most}"))
        if not qos:
            qos_names |= {fields[1]} if fields[1] else {q for q in fields[2].split(",") if q}
    if qos_names:
        qos_table = ask(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxSubmitPU"]) or ""
        for line in qos_table.splitlines():
            name, _, most_text = line.partition("|")
            if name in qos_names and (most := _whole(most_text)) is not None:
                limits.append((most, f"QOS {name}'s MaxSubmitJobsPerUser={most}"))
    queue = ask(["squeue", "-h", "-r", "-u", user, "-o", "%i"])
    lowest = min(limits) if limits else None
    return SiteLimits(max_array_size=int(found.group(1)) if found else None,
                      max_submit=lowest[0] if lowest else None, submit_source=lowest[1] if lowest else "",
                      queued=len(queue.split()) if queue is not None else None, unanswered=unanswered)
