"""The SLURM backend's reading of sinfo and sacct, with canned answers at its one seam (gpupack.submit.slurm.commands.
slurm_command), without a slurmctld: what tests/test_slurm.py checks against the local cluster, in the fast tier."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from gpupack.cli import main
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import DONE, FAILED, PENDING, RUNNING, Capacity
from gpupack.errors import ConfigError, SubmissionError
from gpupack.submit.slurm import PartitionConfig, SlurmConfig, SlurmSubmitter
from gpupack.submit.slurm import commands as slurm  # the backend's seam to the cluster: sinfo, sacct
from gpupack.submit.slurm.commands import gpus_in
from tests.fakes import SINFO, canned_slurm
from tests.test_slurm import PROBE, SLURM_CASES

# What `sinfo -h -o %P|%c|%m|%G` answers on scripts/local_slurm.sh's cluster (one node of 2 GPUs per type, 8 CPUs and
# 16000 MB each; p100 the default partition).
LOCAL_SINFO = "p100*|8|16000|gpu:p100:2\nv100|8|16000|gpu:v100:2\na100|8|16000|gpu:a100:2\n"


def submitter(tmp_path: Path, **partitions: PartitionConfig) -> SlurmSubmitter:
    return SlurmSubmitter(SlurmConfig(name="site", backend="slurm", partitions=dict(partitions)), RunDir(tmp_path))


@pytest.fixture
def asked(monkeypatch):
    """SINFO and SACCT (tests/fakes.py) as the cluster's answers; the command lines gpupack ran."""
    lines: list[list[str]] = []
    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(asked=lines))
    return lines


# ---------------- sinfo ----------------

@pytest.mark.parametrize("gres, gpu, n", [
    ("gpu:v100:4(S:0-1)", "v100", 4), ("gpu:t4:2,gpu:v100:1", "v100", 1), ("gpu:t4:2,gpu:v100:1", "t4", 2),
    ("gpu:t4:2,gpu:v100:1", None, 3), ("gpu:4", None, 4), ("gpu:4", "v100", 0), ("(null)", None, 0),
    ("gpu:a100:4(S:0-3)", "a10", 0)])
def test_gpus_in_one_sinfo_gres_field(gres, gpu, n):
    assert gpus_in(gres, gpu) == n


def test_capacities_from_sinfo_and_the_preset(tmp_path, asked):
    sub = submitter(tmp_path, v100=PartitionConfig(gpu="v100", model="V100-16gb"),
                    a100=PartitionConfig(gpu="a100", slurm_partition="gpubase", model="A100-40gb", max_cpus=12),
                    cpu=PartitionConfig(request="none", slurm_partition="cpu"))
    caps = sub.capacities(["v100", "a100", "cpu"])
    assert asked == [["sinfo", "-h", "-o", "%P|%c|%m|%G"]]  # asked once for all partitions
    # no slurm_partition: any node of the cluster; its nodes with the most V100s (4) bound a whole node
    assert caps["v100"] == Capacity(has_gpu=True, gpu_memory_mb=16 * 1024, max_cpus=64, max_mem_mb=510000,
                                    node_gpus=4, node_cpus=32, node_mem_mb=191000, device="V100-16gb")
    # the preset's per-GPU guidance wins over the node's size; "64+" and "510000+" read as at least
    assert caps["a100"] == Capacity(has_gpu=True, gpu_memory_mb=40 * 1024, max_cpus=12, max_mem_mb=510000,
                                    node_gpus=4, node_cpus=64, node_mem_mb=510000, device="A100-40gb")
    assert caps["cpu"] == Capacity(has_gpu=False, gpu_memory_mb=None, max_cpus=48, max_mem_mb=187000, device="cpu")


def test_sinfo_names_each_partition_once_though_a_node_is_in_two(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(sinfo=SINFO + "debug|4|8000|gpu:t4:1\n"))
    sub = submitter(tmp_path, t4=PartitionConfig(gpu="t4", slurm_partition="gpu"),
                    dbg=PartitionConfig(gpu="t4", slurm_partition="debug"))
    caps = sub.capacities(["t4", "dbg"])
    assert (caps["t4"].max_cpus, caps["t4"].node_gpus, caps["t4"].node_cpus) == (32, 2, 16)  # "gpu*": the default
    assert (caps["dbg"].max_cpus, caps["dbg"].max_mem_mb, caps["dbg"].node_gpus) == (4, 8000, 1)


@pytest.mark.parametrize("part, key, needles", [
    (PartitionConfig(gpu="v100", slurm_partition="gpus"), "cluster.partitions.x.slurm_partition='gpus'",
     ["has no such partition", "gpu"]),
    (PartitionConfig(gpu="h100", slurm_partition="gpubase"), "cluster.partitions.x.gpu='h100'",
     ["partition gpubase has no GPU of this type", "a100"]),
    (PartitionConfig(gpu="a100"), None, []),  # no slurm_partition: any partition with an A100 will do
    (PartitionConfig(gpu="k80"), "cluster.partitions.x.gpu='k80'", ["this cluster has no GPU of this type"]),
])
def test_a_partition_or_gpu_type_sinfo_does_not_know_is_refused(tmp_path, asked, part, key, needles):
    sub = submitter(tmp_path, x=part)
    if key is None:
        assert sub.capacities(["x"])["x"].node_gpus == 4
        return
    with pytest.raises(ConfigError) as err:
        sub.capacities(["x"])
    assert str(err.value).startswith(key) and "HINT:" in str(err.value)
    for needle in needles:
        assert needle in str(err.value)


def test_away_from_the_cluster_the_preset_is_all_there_is(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(sinfo=None, sacct=None))
    sub = submitter(tmp_path, x=PartitionConfig(gpu="k80", slurm_partition="nowhere", model="K80-12gb", max_cpus=6))
    assert sub.capacities(["x"]) == {"x": Capacity(has_gpu=True, gpu_memory_mb=12 * 1024, max_cpus=6,
                                                   device="K80-12gb")}


def test_slurm_command_answers_none_without_slurm(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo here
    assert slurm.slurm_command(["sinfo", "-h"]) is None


# The bad input of tests/test_slurm.py's test_bad_input_checked_against_sinfo, against canned sinfo of the same cluster.
@pytest.mark.parametrize("overrides, key, hint", SLURM_CASES, ids=[" ".join(c[0]) for c in SLURM_CASES])
def test_bad_input_checked_against_canned_sinfo(tmp_path, capsys, monkeypatch, overrides, key, hint):
    lines: list[list[str]] = []
    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(sinfo=LOCAL_SINFO, asked=lines))
    monkeypatch.setattr(SlurmSubmitter, "submit", lambda *a, **k: pytest.fail("submitted"))
    code = main(PROBE + overrides + [f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert key in err and hint in err, err
    assert not (tmp_path / "run").exists()
    assert all(line[0] == "sinfo" for line in lines)  # nothing but sinfo was asked


def test_good_input_against_canned_sinfo_is_planned(tmp_path, monkeypatch):
    from gpupack import sweep

    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(sinfo=LOCAL_SINFO))
    prepared = sweep.prepare(PROBE + ["partitions=[p100,a100]", f"run_dir={tmp_path / 'run'}"])
    assert prepared.capacities["p100"] == Capacity(has_gpu=True, gpu_memory_mb=12 * 1024, max_cpus=8,
                                                   max_mem_mb=16000, node_gpus=2, node_cpus=8, node_mem_mb=16000,
                                                   device="P100-12gb")
    assert prepared.capacities["a100"].gpu_memory_mb == 40 * 1024
    assert {p.partition for p in prepared.plan.packs} == {"p100", "a100"}


# ---------------- sacct ----------------

def test_sacct_states_of_each_job(tmp_path, asked):
    sub = submitter(tmp_path)
    ids = ["101", "102_0", "102_1", "103", "104", "105"]
    assert sub.queue_states(ids) == {"101": "COMPLETED", "102_0": "RUNNING", "102_1": "PENDING",
                                     "103": "CANCELLED by 0", "104": "RUNNING", "105": "OUT_OF_MEMORY"}
    assert asked == [["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(ids)]]
    assert sub.pack_states(ids) == {"101": DONE, "102_0": RUNNING, "102_1": PENDING, "103": FAILED,
                                    "104": RUNNING,  # requeued, then running: its last line
                                    "105": FAILED}


def test_no_job_no_sacct(tmp_path, asked):
    assert submitter(tmp_path).queue_states([]) == {} and asked == []


def test_the_packs_still_queued_or_running_are_not_submitted_again(tmp_path, asked):
    sub = submitter(tmp_path)
    sub.remember({"a": ("101", "v100"), "b": ("102_0", "v100"), "c": ("102_1", "v100"), "d": ("103", "v100"),
                  "e": ("104", "v100")})
    assert sub.active_packs() == {"b": "102_0", "c": "102_1", "e": "104"}


def test_resume_fails_closed_when_sacct_does_not_answer(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(sacct=None))
    sub = submitter(tmp_path)
    sub.remember({"a": ("101", "v100")})
    assert sub.queue_states(["101"]) is None and sub.pack_states(["101"]) is None
    with pytest.raises(SubmissionError, match="nothing was submitted again"):
        sub.active_packs()


# ---------------- the SLURM job environment: its own, read by no one below the backend ----------------

@pytest.mark.parametrize("env, started_at, scheduler", [
    ({"SLURM_JOB_START_TIME": "1795550000", "SLURM_JOB_GPUS": "0,1", "SLURM_JOB_PARTITION": "gpubase",
      "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_TMPDIR": "/localscratch/me.12.0"}, 1795550000.0,
     {"slurm_job_gpus": "0,1", "slurm_partition": "gpubase"}),
    ({}, None, {"slurm_job_gpus": None, "slurm_partition": None}),  # before Slurm 21.08: no start time given
    ({"SLURM_JOB_START_TIME": "soon"}, None, {"slurm_job_gpus": None, "slurm_partition": None}),
])
def test_slurm_job_environment(env, started_at, scheduler):
    from gpupack.submit.slurm import slurm_job_environment

    job = slurm_job_environment("12_3", env)
    assert job.started_at == started_at and job.job_id == "12_3"
    assert job.record_fields() == {"job_id": "12_3", "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
                                   **scheduler}
    # MPS's pipes and DDP's rendezvous go to the node-local disk the job was given, else the process's own tmp
    assert job.temp_dir() == env.get("SLURM_TMPDIR", tempfile.gettempdir())
    if started_at is not None:
        assert job.start() == started_at  # a streaming lane's time limit counts from SLURM's start


def test_the_job_body_reads_no_scheduler_variable():
    """Each backend hands the job body its own job environment (issue 29): no SLURM_ name outside SLURM's backend
    (the job body, the modes, the strategies, the runtime: MPS and DDP take the job's temporary space from it)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "gpupack"
    slurm = root / "submit" / "slurm"
    assert [p for p in root.rglob("*.py") if slurm not in p.parents and "SLURM_" in p.read_text()] == []


@pytest.mark.parametrize("field, value", [("bundle_cores", 0.0), ("bundle_mem_gb", -1.0), ("max_cpus", 0),
                                          ("max_mem_gb", 0.0), ("request", "gpu_per_node")])
def test_a_preset_partition_is_checked_though_this_run_does_not_use_it(tmp_path, field, value):
    """Every value of the config is checked where its field is declared, used or not (issue 29: a preset's bundle
    or core figures were accepted when the run named another partition)."""
    sub = submitter(tmp_path, used=PartitionConfig(gpu="a100"), unused=PartitionConfig(gpu="t4", **{field: value}))
    with pytest.raises(ConfigError) as err:
        sub.check(["used"])
    assert str(err.value).startswith(f"cluster.partitions.unused.{field}=") and "HINT:" in str(err.value)
    sub.cluster.partitions["unused"] = PartitionConfig(gpu="t4")
    sub.check(["used"])  # the same preset with sound figures passes


# ---------------- the site's limits: MaxArraySize, MaxSubmitJobs (issue 30) ----------------

SCONTROL = "Configuration data as of 2026-11-25T00:00:00\nMaxArraySize            = 5\nMaxJobCount    = 10000\n"
LIMITS = {"scontrol show config": SCONTROL,
          "sacctmgr show assoc": "|normal|normal,high\n",  # no association limit; default QOS normal
          "sacctmgr show qos": "normal|7\nhigh|500\n",
          "squeue": "101\n102_0\n102_1\n"}


@pytest.mark.parametrize("answers, qos, expected", [
    (LIMITS, None, (5, 7, "QOS normal's MaxSubmitJobsPerUser=7", 3)),
    (LIMITS, "high", (5, 500, "QOS high's MaxSubmitJobsPerUser=500", 3)),  # the QOS the jobs are submitted under
    ({**LIMITS, "sacctmgr show assoc": "4|normal|normal\n"}, None, (5, 4, "your association's MaxSubmitJobs=4", 3)),
    ({**LIMITS, "sacctmgr show assoc": "||normal,high\n"}, None, (5, 7, "QOS normal's MaxSubmitJobsPerUser=7", 3)),
    ({"scontrol show config": SCONTROL}, None, (5, None, "", None)),  # sacctmgr/squeue silent: unknown, not zero
    ({}, None, (None, None, "", None)),  # away from the cluster
])
def test_site_limits_read_from_scontrol_sacctmgr_and_squeue(monkeypatch, answers, qos, expected):
    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(more=answers))
    got = slurm.site_limits("me", qos)
    assert (got.max_array_size, got.max_submit, got.submit_source, got.queued) == expected
    # each question SLURM left unanswered, with its words (here the fake's)
    assert got.unanswered == {c: f"{c}: canned silence" for c in ("scontrol", "sacctmgr", "squeue")
                              if not any(k.startswith(c) for k in answers)}


def _packs(n: int, factors: tuple[int, ...] = (1,)) -> list:
    from gpupack.core.plan import make_plan

    plan = make_plan(sweep="s", workload="tests.fake_workloads", grid={"lr": [i + 1 for i in range(n)]}, fixed={},
                     factors=factors, modes=["process"], partitions=["v100"], repeats=1)
    return list(plan.packs)


@pytest.mark.parametrize("n, size, expected", [(12, 5, [5, 5, 2]), (5, 5, [5]), (3, None, [3]), (0, 5, [])])
def test_arrays_are_split_at_max_array_size(n, size, expected):
    from gpupack.submit.slurm import array_chunks

    packs = _packs(n) if n else []
    chunks = array_chunks(packs, size)
    assert [len(c) for c in chunks] == expected
    assert [p for c in chunks for p in c] == packs  # every pack once, in the plan's order


def test_a_submission_past_the_users_job_limit_is_refused_whole_before_any_sbatch(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(sinfo=LOCAL_SINFO, more=LIMITS))
    sub = SlurmSubmitter(SlurmConfig(name="site", backend="slurm", partitions={"v100": PartitionConfig(gpu="v100")}),
                         RunDir(tmp_path))
    monkeypatch.setattr(SlurmSubmitter, "_executor", lambda self: pytest.fail("sbatch was called"))
    from gpupack.core.types import PackSettings

    packs = _packs(6, factors=(1, 2, 3, 4, 5))  # five (partition, mode, N) groups: five lanes at the least
    forecast = sub.job_forecast(packs)
    assert (forecast.jobs, forecast.allowed, forecast.over) == (5, 4, True)  # 7 less 3 queued
    with pytest.raises(SubmissionError) as err:
        sub.submit(packs, PackSettings())
    text = str(err.value)
    assert "needs 5 job(s) at the least" in text and "queue 4 more now" in text and "MaxSubmitJobsPerUser=7" in text
    assert "nothing was submitted" in text and "HINT: wait for some of your jobs to end" in text
    assert not sub.run.jobs.exists()  # nothing remembered as submitted


def test_the_sites_stated_limit_counts_where_it_is_lower(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(sinfo=LOCAL_SINFO, more=LIMITS))
    cluster = SlurmConfig(name="narval", backend="slurm", partitions={"v100": PartitionConfig(gpu="v100")},
                          max_jobs_per_user=2)
    forecast = SlurmSubmitter(cluster, RunDir(tmp_path)).job_forecast(_packs(1))
    assert (forecast.allowed, forecast.limit) == (0, "cluster.max_jobs_per_user=2, the site's stated limit")


def test_a_dry_run_says_its_jobs_and_files_against_the_limits(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(sinfo=LOCAL_SINFO, more=LIMITS))
    code = main(PROBE + ["partitions=[v100]", "packing.factors=[1,2]", "+sweep.grid.lr=[0.1,0.2,0.3,0.4,0.5,0.6]",
                         f"run_dir={tmp_path / 'run'}", "dry_run=true"])
    out = " ".join(capsys.readouterr().out.split())  # as one line, whatever the terminal's width
    assert code == 0, out
    # 6 packs of N=1, the drift check, and 3 of N=2 in the 4 jobs this user may still queue: 2 + 1 lanes (in
    # proportion, 1 at least)
    assert ("jobs: 3 (lanes of packs: up to 4 packs each, in turn) in 2 job array(s) of at most 5 tasks "
            "(MaxArraySize); the site lets you queue 4 more now (QOS normal's MaxSubmitJobsPerUser=7, 3 queued)") in out
    assert "refuses" not in out
    assert "files: about " in out and not (tmp_path / "run").exists()


def test_a_dry_run_of_thousands_of_packs_lists_a_few_and_counts_the_rest(tmp_path, monkeypatch, capsys):
    from gpupack.cli import LISTED_PACKS

    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(sinfo=LOCAL_SINFO, more=LIMITS))
    assert main(PROBE + ["partitions=[v100]", "packing.factors=[1]", "sweep.grid.lr=range(1,2001)",
                         f"run_dir={tmp_path / 'run'}", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    listed = [line for line in out.splitlines() if line.startswith("  round ") and ": v100-process-n01-" in line]
    assert len(listed) == LISTED_PACKS and f"... and {2000 - LISTED_PACKS:,} more packs" in out
    # 2,000 packs in the 4 jobs this user may still queue: 4 lanes of 500 packs, one array
    assert "jobs: 4 (lanes of packs: up to 500 packs each, in turn) in 1 job array(s)" in " ".join(out.split())


@pytest.mark.parametrize("sizes, at_once, allowed, expected", [
    ([3, 2], 64, None, [3, 2]),  # a group runs at once: a job per pack, as before
    ([6000, 3000], 64, None, [64, 64]),  # thousands of packs: as many lanes as run at once
    ([6000, 3000], 64, 1000, [64, 64]),
    ([6, 3], 64, 4, [2, 1]),  # past the user's limit: shared in proportion
    ([100, 1, 1], 64, 10, [8, 1, 1]),  # at least one lane a group
    ([5, 5, 5], 64, 2, None),  # not even one lane a group fits: refused
])
def test_lanes_per_group_within_the_limits(sizes, at_once, allowed, expected):
    from gpupack.submit.slurm import lane_counts

    counts = lane_counts(sizes, at_once, allowed)
    assert counts == expected
    if counts is not None:
        assert all(1 <= k <= size for k, size in zip(counts, sizes))
        assert allowed is None or sum(counts) <= allowed


def test_a_groups_packs_are_dealt_to_its_lanes_in_the_plans_order():
    from gpupack.core.plan import deal

    packs = _packs(7)
    lanes = deal(packs, 3)
    assert [[packs.index(p) for p in lane] for lane in lanes] == [[0, 3, 6], [1, 4], [2, 5]]
    assert deal(packs, 7) == [[p] for p in packs]  # one lane a pack: a job per pack, as before


# ---------------- jobs of several GPUs: whole nodes (issue 30, item 4) ----------------

def test_a_job_of_g_gpus_asks_g_gpus_and_g_shares_of_cores_and_memory():
    from types import SimpleNamespace as NS

    from gpupack.submit.slurm import sbatch_parameters

    cluster = NS(cpus_per_training=1.0, mem_gb_per_training=2.0, timeout_min=30, signal_delay_s=60,
                 array_parallelism=8, setup=[], additional_parameters={})
    part = NS(gpu="h100", request="gpus_per_node", slurm_partition=None, constraint=None)
    one, four = (sbatch_parameters(cluster, "h100", part, 3, None, gpus=g) for g in (1, 4))
    assert (one["gpus_per_node"], one["cpus_per_task"], one["mem"], one["job_name"]) == \
        ("h100:1", 3, "6144M", "gpupack-h100-n3")
    assert (four["gpus_per_node"], four["cpus_per_task"], four["mem"], four["job_name"]) == \
        ("h100:4", 12, "24576M", "gpupack-h100-n3-g4")


def test_packs_are_dealt_to_jobs_of_g_gpus_and_billed_as_g_bundles(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(sinfo=LOCAL_SINFO))
    part = PartitionConfig(gpu="v100", gpus_per_job=2, bundle_cores=4, bundle_mem_gb=8)
    sub = SlurmSubmitter(SlurmConfig(name="site", backend="slurm", partitions={"v100": part}, mem_gb_per_training=1),
                         RunDir(tmp_path))
    packs = _packs(6)  # six packs of N=1: three jobs of two GPUs run them at once
    forecast, lanes = sub.lanes(packs)
    assert (forecast.jobs, forecast.gpus) == (3, 6) and [len(lane) for _, group in lanes for lane in group] == [2] * 3
    submitted: list[tuple] = []

    class Executor:
        def update_parameters(self, **params):
            self.params = params

        def batch(self):
            import contextlib

            return contextlib.nullcontext()

        def submit(self, job, run_root, pack_ids, settings):
            submitted.append((self.params, pack_ids, settings))
            from types import SimpleNamespace

            return SimpleNamespace(job_id=f"5_{len(submitted) - 1}")

    monkeypatch.setattr(SlurmSubmitter, "_executor", lambda self: Executor())
    from gpupack.core.types import PackSettings

    sub.submit(packs, PackSettings())
    assert len(submitted) == 3
    for params, pack_ids, settings in submitted:
        assert params["gpus_per_node"] == "v100:2" and isinstance(pack_ids, list) and len(pack_ids) == 2
        assert settings.job_gpus == 2 and settings.billing["gpus"] == 2
        assert settings.fold and params["stderr_to_stdout"] is True  # lanes fold: a few files a job
    from gpupack.core.cost.billing import Bundle, bill

    asked = submitted[0][2].billing  # what the job asked, within its two GPUs' bundles: billed as 2 bundles
    charged = bill(Bundle(1.0, asked["bundle_cores"], asked["bundle_mem_gb"]), asked["cpus"], asked["mem_gb"],
                   asked["gpus"])
    assert charged.bundles == 2 and charged.multiple == 1.0


@pytest.mark.parametrize("fields, value, needle", [
    ({"gpus_per_job": 0}, 0, "whole number > 0"), ({"gpus_per_job": 1.5}, 1.5, "whole number > 0"),
    ({"gpus_per_job": 2, "whole_node_gpus": 4}, 2, "1 GPU or a whole node of 4"),
    ({"gpus_per_job": 2, "request": "none"}, 2, "has no GPUs")])
def test_gpus_per_job_is_checked_in_every_preset_partition(tmp_path, fields, value, needle):
    sub = submitter(tmp_path, used=PartitionConfig(gpu="a100"), node=PartitionConfig(gpu="h100", **fields))
    with pytest.raises(ConfigError) as err:
        sub.check(["used"])
    text = str(err.value)
    assert text.startswith(f"cluster.partitions.node.gpus_per_job={value}") and needle in text and "HINT:" in text


def test_a_job_asking_more_gpus_than_a_node_holds_is_refused_from_sinfo(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "slurm_command", canned_slurm(sinfo=LOCAL_SINFO))
    sub = submitter(tmp_path, v100=PartitionConfig(gpu="v100", gpus_per_job=4))
    with pytest.raises(ConfigError) as err:
        sub.capacities(["v100"])
    assert "cluster.partitions.v100.gpus_per_job=4" in str(err.value) and "hold 2 GPUs" in str(err.value)


def test_trillium_gives_one_gpu_or_whole_nodes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # away from the cluster: the preset alone
    code = main(["+sweep=mnist_pack", "cluster=trillium", "cluster.account=def-pi",
                 "cluster.partitions.h100.gpus_per_job=2", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "cluster.partitions.h100.gpus_per_job=2" in err and "whole node of 4" in err, err
    code = main(["+sweep=mnist_pack", "cluster=trillium", "cluster.account=def-pi",
                 "cluster.partitions.h100.gpus_per_job=4", "packing.factors=[8]", f"run_dir={tmp_path / 'run'}",
                 "dry_run=true"])
    out = " ".join(capsys.readouterr().out.split())
    # 2 packs of 8 on a whole node of 4 GPUs: one job, two of its GPUs idle, said before it is submitted
    assert code == 0 and ("jobs: 1 (lanes of packs: up to 2 packs each, one at a time on each GPU) in 1 job "
                          "array(s), 4 GPUs in all, of which 2 get no pack") in out, out
