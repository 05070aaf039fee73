"""TF logical-GPU splits, MPS, TF and CIFAR-10 workloads."""
from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from gpupack.cli import main
from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import Capacity, PackSettings
from gpupack.errors import ConfigError
from gpupack.job.body import run_pack
from gpupack.job.pack import PackContext
from gpupack.job.pack.process import PACKER as PROCESS
from gpupack.job.pack.process import ProcessOptions
from gpupack.job.pack.tf_logical import PACKER as TF_LOGICAL
from gpupack.job.pack.tf_logical import logical_devices, split_memory_mb
from gpupack.job.runtime.mps import mps_daemon
from gpupack.job.workloads import _cifar10_data
from tests.doc_commands import pasted

REPO = Path(__file__).resolve().parent.parent


# ---------------- the memory-limit arithmetic ----------------

@pytest.mark.parametrize("total, n, reserve, budget, minimum, expected", [
    (16384, 1, 1024, None, 512, 15360),  # V100-16gb, whole GPU less the reserve
    (16384, 4, 1024, None, 512, 3840),
    (16384, 5, 1024, None, 512, 3072),
    (81920, 34, 1024, None, 512, 2379),  # H100-80gb at the study's largest N
    (40960, 8, 1024, 20000, 512, 2500),  # an explicit budget
    (12288, 21, 1024, None, 512, 536),
])
def test_split_memory(total, n, reserve, budget, minimum, expected):
    assert split_memory_mb(total, n, reserve, budget, minimum) == expected


@pytest.mark.parametrize("total, n, reserve, budget, minimum, needle", [
    (12288, 34, 1024, None, 512, "below the workload's minimum of 512 MB"),  # P100-12gb, N=34
    (10240, 21, 1024, None, 512, "use N <= 18"),  # an H100 1g.10gb MIG slice
    (16384, 2, 1024, 20000, 512, "more than the GPU's 16384 MB"),
])
def test_split_memory_refused(total, n, reserve, budget, minimum, needle):
    with pytest.raises(ConfigError, match=needle):
        split_memory_mb(total, n, reserve, budget, minimum)


def test_logical_device_names():
    assert logical_devices("gpu", 3) == ["/device:GPU:0", "/device:GPU:1", "/device:GPU:2"]
    assert logical_devices("cpu", 2) == ["/device:CPU:0", "/device:CPU:1"]


# ---------------- MPS lifecycle, with a stand-in nvidia-cuda-mps-control ----------------

STAND_IN = """#!{python}
import json, os, sys
with open({log!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "stdin": "" if sys.stdin.isatty() else sys.stdin.read(),
                        "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                        "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}) + "\\n")
"""


@pytest.fixture
def mps_stand_in(tmp_path, monkeypatch):
    bin_dir, log = tmp_path / "bin", tmp_path / "mps-calls.jsonl"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(STAND_IN.format(python=sys.executable, log=str(log)))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    (tmp_path / "job-tmp").mkdir()
    return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _pack(tmp_path, grid, workload="tests.fake_workloads", factor=None, mode="process"):
    run = RunDir(tmp_path / "run")
    n = 1
    for v in grid.values():
        n *= len(v)
    plan = make_plan(sweep="t", workload=workload, grid=grid, fixed={}, factors=[factor or n], modes=[mode],
                     partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    return run, plan.packs[0]


def test_mps_starts_passes_its_dirs_to_trainings_and_quits(tmp_path, mps_stand_in):
    run, pack = _pack(tmp_path, {"lr": [0.1, 0.2],
                                 "report_env": ["CUDA_MPS_PIPE_DIRECTORY,CUDA_MPS_LOG_DIRECTORY"]})
    ctx = PackContext(run=run, pack=pack, device="cpu", threads=1, env=dict(os.environ),
                      settings=PackSettings(mode_options={"process": ProcessOptions(mps=True)}),
                      gpu_memory_total_mb=16384, tmp_dir=str(tmp_path / "job-tmp"))
    outcomes = PROCESS.run(pack.trainings, ctx)
    calls = mps_stand_in()
    assert [c["argv"] for c in calls] == [["-d"], []] and calls[1]["stdin"] == "quit\n"
    pipe = calls[0]["pipe"]
    assert pipe.startswith(str(tmp_path / "job-tmp" / "gpupack-mps-"))  # inside the job's own temp space
    for o in outcomes:
        assert o.result["metrics"]["env"] == {"CUDA_MPS_PIPE_DIRECTORY": pipe,
                                              "CUDA_MPS_LOG_DIRECTORY": calls[0]["log"]}
    assert not Path(pipe).exists()  # cleaned up


def test_mps_quits_when_the_pack_fails(tmp_path, mps_stand_in, monkeypatch):
    run, pack = _pack(tmp_path, {"lr": [0.1]})
    ctx = PackContext(run=run, pack=pack, device="cpu", threads=1, env=dict(os.environ),
                      settings=PackSettings(mode_options={"process": ProcessOptions(mps=True)}),
                      gpu_memory_total_mb=16384, tmp_dir=str(tmp_path / "job-tmp"))

    def broken(trainings, ctx, opts):
        raise RuntimeError("the packer broke")

    monkeypatch.setattr("gpupack.job.pack.process.run_processes", broken)
    with pytest.raises(RuntimeError, match="the packer broke"):
        PROCESS.run(pack.trainings, ctx)
    assert [c["argv"] for c in mps_stand_in()] == [["-d"], []]


def test_mps_missing_binary_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="nvidia-cuda-mps-control is not on this node's PATH"):
        with mps_daemon({"PATH": str(tmp_path)}, str(tmp_path), lambda name, kind: tmp_path / f"{name}.{kind}"):
            pass


def test_mps_on_a_job_without_gpu_is_refused(tmp_path):
    run, pack = _pack(tmp_path, {"lr": [0.1]})
    ctx = PackContext(run=run, pack=pack, device="cpu", threads=1, env=dict(os.environ),
                      settings=PackSettings(mode_options={"process": ProcessOptions(mps=True)}),
                      gpu_memory_total_mb=None)
    with pytest.raises(ConfigError, match="needs a GPU"):
        PROCESS.run(pack.trainings, ctx)


# ---------------- tf_logical packs, for real on the CPU ----------------

@pytest.mark.slow
def test_tf_logical_pack_one_training_raises_the_others_finish(tmp_path):
    run, pack = _pack(tmp_path, {"tag": ["a", "b", "boom"], "fail": [False]}, workload="tests.fake_tf_workload",
                      mode="tf_logical")
    plan = read_json(run.plan)
    for t in plan["packs"][0]["trainings"]:  # only 'boom' fails
        t["params"]["fail"] = t["params"]["tag"] == "boom"
    write_json_atomic(run.plan, plan)
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    assert rec["n_completed"] == 2 and rec["n_failed"] == 1
    recs = {t.params["tag"]: read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings}
    assert recs["boom"]["status"] == "failed" and "tf probe failure on purpose" in recs["boom"]["error"]
    placed = {recs[k]["metrics"]["placed_on"] for k in ("a", "b")}
    assert len(placed) == 2 and all("CPU" in p for p in placed)  # each on its own logical device
    assert {recs[k]["logical_device"] for k in ("a", "b", "boom")} == {"/device:CPU:0", "/device:CPU:1",
                                                                       "/device:CPU:2"}
    assert all(recs[k]["memory"]["shared_by"] == 3 for k in ("a", "b"))  # the shared process's peak: the pack's


@pytest.mark.slow
def test_a_shared_process_that_dies_fails_what_it_had_not_finished_and_keeps_what_landed(tmp_path):
    """Nothing lost when the one process of a pack dies: a training that landed before keeps its outcome, the rest
    are failed with how the process ended."""
    run, pack = _pack(tmp_path, {"tag": ["a", "b", "die"], "exit_after_s": [0.0]},
                      workload="tests.fake_tf_workload", mode="tf_logical")
    plan = read_json(run.plan)
    for t in plan["packs"][0]["trainings"]:
        t["params"]["exit_after_s"] = 8.0 if t["params"]["tag"] == "die" else 0.0  # a and b land long before
    write_json_atomic(run.plan, plan)
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    recs = {t.params["tag"]: read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings}
    assert {k: r["status"] for k, r in recs.items()} == {"a": "completed", "b": "completed", "die": "failed"}
    assert recs["die"]["exit_code"] == 3  # how the process ended, with what it wrote last (its stderr)
    assert rec["n_completed"] == 2 and rec["n_failed"] == 1


# ---------------- bad input, before anything starts ----------------

@pytest.mark.parametrize("overrides, needles", [
    (["+sweep=mnist_pack", "packing.modes=[tf_logical]"], ["packing.modes='tf_logical'", "torch workload"]),
    # a 1g.10gb slice: its own 10 GB bounds N; its bundle's 1 core is shared out (0.025 each)
    (["+sweep=mnist_tf_pack", "cluster=fir", "cluster.account=def-pi", "partitions=[h100_1g_10gb]",
      "packing.factors=[1,34]", "cluster.cpus_per_training=0.025"], ["packing.factors=34", "use N <= 18"]),
    (["+sweep=mnist_pack", "packing.process.mps=true"],
     ["packing.process.mps=True", "needs a GPU and this node has none"]),
    (["+sweep=cifar10_pack"], ["sweep.fixed.data_dir=None", "data_batch_1", "test_batch"]),
    (["+sweep=mnist_tf_pack", "cluster=fir", "cluster.account=def-pi", "packing.modes=[tf_logical]",
      "packing.memory_limit_gb_per_training=4"], ["packing.memory_limit_gb_per_training=4", "RLIMIT_AS", "--mem"]),
])
def test_tf_bad_input(tmp_path, capsys, monkeypatch, overrides, needles):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo: the preset alone
    code = main(overrides + [f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    assert not (tmp_path / "run").exists()


# ---------------- tf_logical: one process runs N trainings, so its memory limit is the pack's ----------------

def test_tf_logicals_shared_process_gets_n_times_the_per_training_limit(tmp_path, monkeypatch):
    """RLIMIT_AS is per process and tf_logical's one shared process holds all N trainings: N x the per-training limit
    (not one training's, which N trainings together would hit at once). gpupack/job/pack/_shared.py sets it, so the
    fused mode's shared process gets the same."""
    seen = []

    class Stop(Exception):
        pass

    def fake_child_setup(limit, cpus=None):  # what the shared process would be started under; it is not started
        seen.append(limit)
        raise Stop

    monkeypatch.setattr("gpupack.job.runtime.supervisor.child_setup", fake_child_setup)
    run, pack = _pack(tmp_path, {"tag": ["a", "b", "c"]}, workload="tests.fake_tf_workload", mode="tf_logical")
    per = 3 * 2**30
    ctx = PackContext(run=run, pack=pack, device="cpu", threads=1, env=dict(os.environ),
                      settings=PackSettings(device="cpu", memory_limit_gb_per_training=3), memory_limit_bytes=per)
    with pytest.raises(Stop):
        TF_LOGICAL.run(pack.trainings, ctx)
    with pytest.raises(Stop):
        TF_LOGICAL.run(pack.trainings, PackContext(run=run, pack=pack, device="cpu", threads=1, env=dict(os.environ)))
    assert seen == [3 * per, None]  # no limit stays no limit


def _tf_workload():
    from gpupack.job.workloads import load_workload

    return load_workload("tests.fake_tf_workload")


@pytest.mark.parametrize("capacity, device", [(Capacity(has_gpu=True, gpu_memory_mb=16384), "auto"),
                                              (Capacity(has_gpu=True), "cuda")])
def test_tf_logical_refuses_rlimit_as_on_a_gpu_job(capacity, device):
    settings = PackSettings(device=device, memory_limit_gb_per_training=4)
    with pytest.raises(ConfigError, match=r"packing.memory_limit_gb_per_training=4: .*RLIMIT_AS.*HINT: .*--mem"):
        TF_LOGICAL.check(_tf_workload(), 2, capacity, settings)


@pytest.mark.parametrize("capacity, settings", [
    (Capacity(has_gpu=False), PackSettings(memory_limit_gb_per_training=4)),  # a CPU job: the limit is the pack's
    (Capacity(has_gpu=True, gpu_memory_mb=16384), PackSettings(device="cpu", memory_limit_gb_per_training=4)),
    (Capacity(has_gpu=True, gpu_memory_mb=16384), PackSettings()),  # no limit asked
])
def test_tf_logical_allows_what_cuda_never_sees(capacity, settings):
    TF_LOGICAL.check(_tf_workload(), 2, capacity, settings)


def test_tf_logical_refuses_rlimit_as_when_the_job_finds_a_gpu(tmp_path, monkeypatch):
    """The partition's check could not know (the local backend, device=auto): the pack refuses at its start, before
    its shared process starts under a limit CUDA cannot work in."""
    monkeypatch.setattr("gpupack.job.pack.tf_logical.run_shared",
                        lambda *a, **k: pytest.fail("the shared process started"))
    run, pack = _pack(tmp_path, {"tag": ["a", "b"]}, workload="tests.fake_tf_workload", mode="tf_logical")
    ctx = PackContext(run=run, pack=pack, device="cuda", threads=1, env=dict(os.environ), gpu_memory_total_mb=16384,
                      settings=PackSettings(memory_limit_gb_per_training=4), memory_limit_bytes=4 * 2**30)
    with pytest.raises(ConfigError, match="RLIMIT_AS"):
        TF_LOGICAL.run(pack.trainings, ctx)


# ---------------- CIFAR-10 ----------------

def test_cifar10_reader_round_trip_and_missing_files(tmp_path):
    folder = _cifar10_data.write_batches(tmp_path / "cifar-10-batches-py", 20)
    data = _cifar10_data.load(str(tmp_path))  # finds the cifar-10-batches-py folder inside
    assert data.x_train.shape == (100, 32, 32, 3) and data.x_test.shape == (20, 32, 32, 3)
    assert data.y_train.dtype.name == "uint8" and "100 train, 20 test" in data.source
    (folder / "data_batch_3").unlink()
    with pytest.raises(ConfigError, match="data_batch_3"):
        _cifar10_data.load(str(folder))


@pytest.mark.slow
@pytest.mark.parametrize("text", [  # the docs' two (docs/packing-modes.md), each run for real here alone
    "python -m gpupack +sweep=cifar10_pack sweep.fixed.data_dir=/project/def-me/cifar-10-batches-py",
    "python -m gpupack +sweep=cifar10_pack sweep.workload=cifar10_torch packing.modes=[process] "
    "sweep.fixed.data_dir=/project/def-me/cifar-10-batches-py"], ids=["cifar10_tf", "cifar10_torch"])
def test_cifar10_sweeps_run_on_staged_batches(tmp_path, subprocess_env, text):
    import subprocess

    data = _cifar10_data.write_batches(tmp_path / "cifar-10-batches-py", 40)
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "gpupack",
                           *pasted(text, {"/project/def-me/cifar-10-batches-py": str(data)}), "packing.factors=[2]",
                           "sweep.grid.lr=[0.05]", "sweep.fixed.train_samples=200", "sweep.fixed.val_samples=20",
                           f"run_dir={run_dir}"],
                          capture_output=True, text=True, env=subprocess_env, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = [json.loads(p.read_text()) for p in run_dir.glob("packs/*/trainings/*.json")]
    assert recs and all(r["status"] == "completed" for r in recs)
    assert all("CIFAR-10 (data path" in r["data"] for r in recs)


@pytest.mark.slow
@pytest.mark.quiet
def test_tf_mnist_sweep_compares_split_and_no_split(tmp_path, subprocess_env):
    import subprocess

    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "gpupack", *pasted("python -m gpupack +sweep=mnist_tf_pack"),
                           "packing.factors=[1,2]",
                           "packing.repeats=1", "sweep.fixed.train_samples=1000", "sweep.fixed.val_samples=200",
                           f"run_dir={run_dir}"], capture_output=True, text=True, env=subprocess_env, timeout=600,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {(g["mode"], g["factor"]) for g in summary["groups"]} == {("process", 1), ("process", 2),
                                                                     ("tf_logical", 1), ("tf_logical", 2)}
    assert "Best (mode, N) for mnist_tf on local (cpu):" in proc.stdout
    assert (run_dir / "plots" / "split_vs_no_split.png").exists()


def test_an_mps_daemon_that_does_not_start_fails_the_pack_with_its_words(tmp_path, mps_stand_in):
    """The control program runs under the supervisor: its failure is its stderr, and its temp space goes."""
    exe = Path(shutil.which("nvidia-cuda-mps-control"))
    exe.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write('MPS: no GPU in exclusive mode\\n')\n"
                   "sys.exit(1)\n")
    logs = tmp_path / "logs"
    with pytest.raises(RuntimeError, match="did not start the MPS daemon: MPS: no GPU in exclusive mode"):
        with mps_daemon(dict(os.environ), str(tmp_path / "job-tmp"), lambda name, kind: logs / f"{name}.{kind}"):
            pass
    assert list((tmp_path / "job-tmp").iterdir()) == []  # its pipe and log dirs removed
    assert "exclusive mode" in (logs / "mps-start.err").read_text()
