"""SLURM: each pack is one array task on one GPU, through submitit's SlurmExecutor.

Packs of one (partition, mode, N) group share one job array. Every SLURM command gpupack runs itself
(sinfo, sacct) goes through :func:`slurm_command`, the one seam to the cluster besides submitit.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
import shutil
import subprocess
import time
from typing import Any, Sequence

import submitit

from gpupack.errors import ConfigError, SubmissionError, nearest
from gpupack.pack import Capacity
from gpupack.pack.job import PackSettings
from gpupack.plan import Pack
from gpupack.submit import PackJob, PackResult, ProgressFn, Submitter, job_result

ACCOUNT_ENV = ("SLURM_ACCOUNT", "SBATCH_ACCOUNT")  # what Alliance users export in their shell
FAILED_STATES = ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                 "PREEMPTED")


def slurm_command(args: Sequence[str], timeout: float = 30) -> str | None:
    """Run a SLURM client command; None when SLURM is not installed or does not answer."""
    if shutil.which(args[0]) is None:
        return None
    try:
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def resources(factor: int, cpus_per_training: float, mem_gb_per_training: float) -> tuple[int, int]:
    """CPUs and memory (MB) one pack of N trainings asks for."""
    return max(1, math.ceil(factor * cpus_per_training)), max(1, math.ceil(factor * mem_gb_per_training * 1024))


def sbatch_parameters(cluster: Any, name: str, partition: Any, factor: int, account: str | None) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for one pack of N trainings on one GPU of ``partition``. Pure."""
    cpus, mem_mb = resources(factor, cluster.cpus_per_training, cluster.mem_gb_per_training)
    params: dict[str, Any] = {
        "time": int(cluster.timeout_min), "nodes": 1, "ntasks_per_node": 1, "cpus_per_task": cpus,
        "mem": f"{mem_mb}M", "job_name": f"gpupack-{name}-n{factor}", "signal_delay_s": int(cluster.signal_delay_s),
        "array_parallelism": int(cluster.array_parallelism),
    }
    if partition.gpu:
        if partition.request == "gres":
            params["gres"] = f"gpu:{partition.gpu}:1"
        else:
            params["gpus_per_node"] = f"{partition.gpu}:1"
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


class SlurmSubmitter(Submitter):
    detachable = True

    # ---------------- checks before anything is submitted ----------------

    def resolve_partitions(self, requested: Sequence[str]) -> tuple[str, ...]:
        names = list(requested) or list(self.cluster.default_partitions)
        known = list(self.cluster.partitions)
        if not names:
            raise ConfigError("partitions", [], f"no partition chosen for {self.cluster.name}",
                              f"name some, e.g. partitions=[{','.join(known[:3])}]")
        for i, name in enumerate(names):
            if name not in self.cluster.partitions:
                raise ConfigError(f"partitions[{i}]", name, f"{self.cluster.name} has no such GPU type/partition",
                                  nearest(name, known))
        if len(set(names)) != len(names):
            raise ConfigError("partitions", names, "a partition is listed twice", "list each once")
        return tuple(names)

    def capacity(self, partition: str) -> Capacity:
        """From the preset: a GPU if the partition asks for one, its memory from the model name (V100-16gb)."""
        part = self.cluster.partitions[partition]
        m = re.search(r"(\d+)gb$", part.model or "", re.IGNORECASE)
        return Capacity(has_gpu=bool(part.gpu), gpu_memory_mb=float(m.group(1)) * 1024 if m else None)

    def account(self) -> str | None:
        return self.cluster.account or next((os.environ[v] for v in ACCOUNT_ENV if os.environ.get(v)), None)

    def check(self, factors: Sequence[int], partitions: Sequence[str]) -> None:
        if self.cluster.account_required and not self.account():
            raise ConfigError("cluster.account", None, f"the {self.cluster.name} cluster needs an allocation account",
                              "add cluster.account=def-yourpi (or export SLURM_ACCOUNT=def-yourpi)")
        for key in ("timeout_min", "array_parallelism", "max_num_timeout"):
            if getattr(self.cluster, key) < (0 if key == "max_num_timeout" else 1):
                raise ConfigError(f"cluster.{key}", getattr(self.cluster, key), "is too small", "use 1 or more")
        for key in ("cpus_per_training", "mem_gb_per_training"):
            if not getattr(self.cluster, key) > 0:
                raise ConfigError(f"cluster.{key}", getattr(self.cluster, key), "must be > 0",
                                  "give each training a share of the job, e.g. 0.5")
        for name in partitions:
            part = self.cluster.partitions[name]
            if part.request not in ("gpus_per_node", "gres"):
                raise ConfigError(f"cluster.partitions.{name}.request", part.request, "unknown request form",
                                  "use gpus_per_node or gres")
        live = self._live_limits(partitions)
        for name in partitions:
            part = self.cluster.partitions[name]
            max_cpus = part.max_cpus or live.get(name, {}).get("cpus")
            max_mem_mb = (part.max_mem_gb * 1024 if part.max_mem_gb else None) or live.get(name, {}).get("mem_mb")
            for i, n in enumerate(factors):
                cpus, mem_mb = resources(n, self.cluster.cpus_per_training, self.cluster.mem_gb_per_training)
                if max_cpus and cpus > max_cpus:
                    raise ConfigError(f"packing.factors[{i}]", n,
                                      f"{n} trainings x cluster.cpus_per_training={self.cluster.cpus_per_training} "
                                      f"= {cpus} CPUs, but one {name} GPU job gets at most {max_cpus}",
                                      f"lower N, or set cluster.cpus_per_training={max_cpus / n:.2g} so N trainings "
                                      "share the cores")
                if max_mem_mb and mem_mb > max_mem_mb:
                    raise ConfigError(f"packing.factors[{i}]", n,
                                      f"{n} trainings x cluster.mem_gb_per_training={self.cluster.mem_gb_per_training}"
                                      f" = {mem_mb / 1024:.1f} GB, but a {name} node has {max_mem_mb / 1024:.1f} GB",
                                      "lower N or cluster.mem_gb_per_training")

    def _live_limits(self, partitions: Sequence[str]) -> dict[str, dict[str, int]]:
        """Where SLURM answers: check each partition and GPU type exists; return node CPUs and memory."""
        out = slurm_command(["sinfo", "-h", "-o", "%P|%c|%m|%G"])
        if out is None:
            return {}  # not on the cluster (e.g. preparing a sweep elsewhere): the preset is all we know
        rows = [line.split("|") for line in out.splitlines() if line.count("|") == 3]
        by_partition: dict[str, list[list[str]]] = {}
        for row in rows:
            by_partition.setdefault(row[0].rstrip("*"), []).append(row)
        limits: dict[str, dict[str, int]] = {}
        for name in partitions:
            part = self.cluster.partitions[name]
            scope = by_partition.get(part.slurm_partition, []) if part.slurm_partition else rows
            if part.slurm_partition and not scope:
                raise ConfigError(f"cluster.partitions.{name}.slurm_partition", part.slurm_partition,
                                  "SLURM (sinfo) has no such partition", nearest(part.slurm_partition, by_partition))
            if part.gpu and not any(f"gpu:{part.gpu}:" in r[3] or r[3].endswith(f"gpu:{part.gpu}") for r in scope):
                where = f"partition {part.slurm_partition}" if part.slurm_partition else "this cluster"
                types = sorted({g.split(":")[1] for r in scope for g in r[3].split(",") if g.startswith("gpu:")
                                and g.count(":") >= 2})
                raise ConfigError(f"cluster.partitions.{name}.gpu", part.gpu, f"{where} has no GPU of this type "
                                  "(sinfo)", nearest(part.gpu, types))
            limits[name] = {"cpus": max(int(r[1].rstrip("+")) for r in scope),
                            "mem_mb": max(int(r[2].rstrip("+")) for r in scope)}
        return limits

    # ---------------- submission ----------------

    def _executor(self) -> submitit.SlurmExecutor:
        return submitit.SlurmExecutor(folder=str(self.run.submitit / "%j"),
                                      max_num_timeout=int(self.cluster.max_num_timeout))

    def submit(self, packs: Sequence[Pack], settings: PackSettings) -> list[tuple[Pack, submitit.Job]]:
        """One job array per (partition, mode, N); returns each pack with its job."""
        account = self.account()
        out: list[tuple[Pack, submitit.Job]] = []
        key = lambda p: (p.partition, p.mode, p.factor)  # noqa: E731
        for (partition, _mode, factor), group in itertools.groupby(sorted(packs, key=key), key=key):
            group = list(group)
            executor = self._executor()
            executor.update_parameters(**sbatch_parameters(self.cluster, partition,
                                                           self.cluster.partitions[partition], factor, account))
            try:
                labelled = dataclasses.replace(settings, gpu_model=self.cluster.partitions[partition].model)
                with executor.batch():
                    jobs = [executor.submit(PackJob(), str(self.run.root), p.pack_id, labelled) for p in group]
            except Exception as err:  # sbatch refused: say which group and why, keep what was submitted
                self.remember({p.pack_id: (str(j.job_id), p.partition) for p, j in out})
                raise SubmissionError(f"sbatch refused the {partition} N={factor} array: {err}".strip()) from None
            out += list(zip(group, jobs))
        self.remember({p.pack_id: (str(j.job_id), p.partition) for p, j in out})
        return out

    def detach(self, packs: Sequence[Pack], settings: PackSettings) -> dict[str, str]:
        return {p.pack_id: str(j.job_id) for p, j in self.submit(packs, settings)}

    def run_packs(self, packs: Sequence[Pack], settings: PackSettings, progress: ProgressFn) -> list[PackResult]:
        submitted = self.submit(packs, settings)
        for pack, _ in submitted:
            progress(pack, "pending")
        shown: dict[str, str] = {}
        results: list[PackResult] = []
        waiting = list(submitted)
        while waiting:
            time.sleep(self.cluster.poll_s)
            for pack, job in list(waiting):
                if job.done():
                    waiting.remove((pack, job))
                    results.append(job_result(pack, job))
                    progress(pack, "done" if results[-1].ok else "failed")
                elif job.state.split(" ")[0] == "RUNNING" and shown.get(pack.pack_id) != "running":
                    shown[pack.pack_id] = "running"
                    progress(pack, "running")
        return results

    def job_states(self, job_ids: Sequence[str]) -> dict[str, str]:
        if not job_ids:
            return {}
        out = slurm_command(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)])
        if out is None:
            return {}
        states: dict[str, str] = {}
        for line in out.splitlines():
            job_id, _, state = line.partition("|")
            states[job_id] = state  # the last line for an id is its latest (requeued) run
        return states


SUBMITTER = SlurmSubmitter
