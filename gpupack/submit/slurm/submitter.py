"""The SLURM submitter: checks a run against the cluster, submits its packs as job arrays, and follows them."""
from __future__ import annotations

import dataclasses
import getpass
import os
import shutil
import signal
import time
from typing import Any, Mapping, Sequence, cast

import submitit

from gpupack.core.jobenv import JobEnvironment
from gpupack.core.memory.figures import Figure, request_mb
from gpupack.core.plan import Pack
from gpupack.core.store.journal import RunRecords, make_journals
from gpupack.core.types import Capacity, JobForecast, PackRequest, PackResult, PackSettings
from gpupack.errors import ConfigError, SubmissionError, nearest, require_unique
from gpupack.job.oom import record_job_oom
from gpupack.submit import ClusterConfig, PackJob, PackJobHandle, ProgressFn, Submitter, job_result, progress_state
from gpupack.submit._submitit import QuietSlurmExecutor
from gpupack.submit.slurm import commands
from gpupack.submit.slurm.options import (
    SlurmConfig,
    check_default_partitions,
    check_options,
    launcher_config,
    partition_capacity,
    undotted,
)
from gpupack.submit.slurm.request import (
    DEFAULT_MEM_GB,
    ArrayJob,
    GroupKey,
    array_jobs,
    job_gpus,
    job_lanes,
    over_limit,
    packs_at_once,
    request_lines,
    resources,
)

ACCOUNT_ENV = ("SLURM_ACCOUNT", "SBATCH_ACCOUNT")  # what Alliance users export in their shell
FINISH_POLL_S = 0.2  # how soon a finished pack is seen: a stat of its result file


def slurm_job_environment(job_id: str | None, env: Mapping[str, str]) -> JobEnvironment:
    """A SLURM job as its variables describe it. Pure."""
    start = env.get("SLURM_JOB_START_TIME", "")
    return JobEnvironment(job_id=job_id, cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
                          started_at=float(start) if start.isdigit() else None, tmp_dir=env.get("SLURM_TMPDIR"),
                          scheduler={"slurm_job_gpus": env.get("SLURM_JOB_GPUS"),
                                     "slurm_partition": env.get("SLURM_JOB_PARTITION")})


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
        """The signal submitit asks SLURM to send before the time limit: USR2 unless SUBMITIT_PREEMPT_SIGNAL says."""
        name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
        return int(getattr(signal, f"SIG{name}", signal.SIGUSR2))

    def stream_jobs(self, partition: str) -> int:
        return int(self.cluster.array_parallelism)

    def claim_until_s(self) -> float | None:
        return max(0.0, float(self.cluster.timeout_min) * 60 - float(self.cluster.signal_delay_s))

    @classmethod
    def job_environment(cls) -> JobEnvironment:
        """submitit's SLURM job (its id, array task included: 1234_5), when it started (SLURM_JOB_START_TIME, Slurm
        21.08 and later: a streaming lane's time limit counts from it) and what SLURM gave it."""
        return slurm_job_environment(submitit.JobEnvironment().job_id, os.environ)

    @classmethod
    def launcher_config(cls, options: Mapping[str, Any], key: str) -> SlurmConfig:
        return launcher_config(options, key)

    @classmethod
    def launcher_names(cls, cluster: ClusterConfig) -> dict[str, str]:
        label = next(iter(cast(SlurmConfig, cluster).partitions))  # launcher_config's
        return {"cpus_per_training": "cpus_per_task", "mem_gb_per_training": "mem_gb", "partition": "partition",
                f"partitions.{label}.gpu": "gres", f"partitions.{label}.slurm_partition": "partition",
                f"partitions.{label}.request": "gpus_per_node"}

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
            if name != renamed[i]:  # a slice's dotted name: refused, so records keep one name per slice
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
        """From the preset and, where SLURM answers, sinfo (each partition and GPU type must exist)."""
        why: list[str] = []
        live = commands.live_limits(self.cluster.partitions, partitions, self.key, why=why)
        self._sinfo_silent = why[0] if why else None
        return {name: partition_capacity(self.cluster, name, live.get(name, {}), self.key) for name in partitions}

    def require_reachable(self) -> None:
        """SLURM answers here (sbatch is installed, sinfo answers), else one line in its own words with the fix."""
        if self._reached:
            return
        silent = self._sinfo_silent  # the partition check's sinfo found no controller: each try costs SLURM's timeout
        if silent and commands.UNREACHABLE.search(silent) and shutil.which("sbatch") is not None:
            raise commands.unreachable("sinfo", silent)
        commands.require_reachable()
        self._reached = True

    def _executor(self) -> submitit.SlurmExecutor:  # tests stand in for it
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

    def lanes(self, packs: Sequence[Pack]) -> tuple[JobForecast, list[tuple[GroupKey, list[list[Pack]]]]]:
        return job_lanes(self.cluster, packs, self.site_limits())

    def job_forecast(self, packs: Sequence[Pack]) -> JobForecast:
        return self.lanes(packs)[0]

    def array_jobs(self, packs: Sequence[Pack]) -> tuple[JobForecast, list[ArrayJob]]:
        """The sbatch calls submitting ``packs`` makes, in order: what :meth:`submit` submits and a dry run shows."""
        return array_jobs(self.cluster, packs, self.site_limits(), self.account(),
                          lambda factor: self.request(factor).mem_gb_each)

    def request_lines(self, packs: Sequence[Pack]) -> list[str]:
        forecast, arrays = self.array_jobs(packs)
        return request_lines(self.run.submitit_folder, forecast, arrays, self.site_limits(), self._sinfo_silent,
                             lambda factor: self.request(factor), self.key("max_jobs_per_user"))

    def submit(self, packs: Sequence[Pack], settings: PackSettings) -> list[tuple[Pack, PackJobHandle]]:
        """Each pack with its job: one job array per (partition, mode, N), split at MaxArraySize, in the plan's order.
        A submission of more jobs than the site lets the user queue now is refused whole, before any sbatch."""
        forecast, arrays = self.array_jobs(packs)
        if forecast.over:
            raise SubmissionError(over_limit(forecast, self.key("max_jobs_per_user")))
        out: list[tuple[Pack, PackJobHandle]] = []
        for array in arrays:
            key, group, in_turn = array.key, array.lanes, array.in_turn
            partition, _mode, factor, devices = key
            part, req = self.cluster.partitions[partition], self.request(factor)
            gpus = job_gpus(self.cluster, key)
            lane_gpus = packs_at_once(self.cluster, key)  # GPUs a lane's packs take one each (a spread: all k)
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
        """How a pack's job ended; where SLURM says it ran out of memory, its killed trainings are recorded oom (so
        their N is infeasible), and any it cannot record are named in the error."""
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
        return commands.queue_states(job_ids)

    def pack_states(self, job_ids: Sequence[str]) -> dict[str, str] | None:
        states = self.queue_states(job_ids)
        return None if states is None else {j: commands.pack_state(s) for j, s in states.items()}


