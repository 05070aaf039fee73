"""Memory measured on one device sizes requests only on the same device (issue 51, part 4): a CPU-only run's RSS (no
CUDA) is half a CUDA process's host memory, so it never sizes an A100 job's --mem; the dry run names each --mem's
source."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpupack import sweep
from gpupack.cli import main
from gpupack.core.memory.figures import same_device
from gpupack.core.store.records import read_json, training_record, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.submit.slurm import commands
from tests.fakes import canned_slurm

REPO = Path(__file__).resolve().parent.parent
SWEEP = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack", "packing.factors=[1]",
         "sweep.grid.lr=[0.1]", "sweep.fixed.steps=2"]
NARVAL = ["cluster=narval", "cluster.account=def-x", "dry_run=true"]


@pytest.mark.parametrize("measured_on, target, same", [
    ("NVIDIA A100-SXM4-40GB", "A100-40gb", True),  # NVML's name against the preset's model
    ("NVIDIA A100-SXM4-80GB", "A100-40gb", True),  # the family: a process holds the same memory on either
    ("NVIDIA A100-SXM4-40GB", "A100-1g.5gb", False),  # a whole GPU is not a MIG slice
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "A100-1g.5gb", True),
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "A100-2g.10gb", False),  # another profile
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "a100_1g.5gb", True),  # the SLURM specifier
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "nvidia_h100_80gb_hbm3_1g.10gb", True),
    ("Tesla V100-SXM2-16GB", "V100-16gb", True),
    ("Tesla V100-SXM2-16GB", "A100-40gb", False),
    ("Tesla P100-PCIE-12GB", "P100-12gb", True),
    ("NVIDIA H100 80GB HBM3", "H100-80gb", True),
    ("NVIDIA H200", "H100-80gb", False),
    ("NVIDIA GH200 480GB", "H200", False),
    ("NVIDIA L40S", "l40s", True),
    ("Tesla T4", "T4-16gb", True),
    ("cpu", "cpu", True),
    ("cpu", "A100-40gb", False),  # a CPU-only run sizes no GPU job
    ("NVIDIA A100-SXM4-40GB", "cpu", False),
    ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090", True),  # no known family: the same name
    ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090", False),
    (None, "A100-40gb", False),  # a record that names no device: not shown to be the same
    ("NVIDIA A100-SXM4-40GB", None, False),  # a partition of no known model
])
def test_same_device(measured_on, target, same):
    assert same_device(measured_on, target) is same
    assert same_device(target, measured_on) is same


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/probe_pack/ holding one real local CPU-only run of the sweep (its records as the job writes them)."""
    root = tmp_path_factory.mktemp("runs") / "probe_pack"
    assert main([*SWEEP, f"run_dir={root / 'cpu'}"]) == 0
    recs = [read_json(p) for p in RunDir(root / "cpu").training_records()]
    assert recs and {r["gpu_type"] for r in recs} == {"cpu"}
    return root


def dry_run(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setattr(commands, "slurm_command", canned_slurm(sinfo=None, sacct=None))  # away from the site
    code = main(args)
    out = capsys.readouterr().out
    assert code == 0, out
    return " ".join(out.split())  # as one line, whatever the terminal's width


@pytest.mark.slow
def test_cpu_records_do_not_size_an_a100_request(cpu_runs, monkeypatch, capsys):
    """The issue's case: beside a CPU-only run, an A100 job asks the default (2 GB a training), not the CPU run's
    RSS x 1.5, and says why; the same folder still sizes a local CPU run (the figure is not lost, only kept to its
    device)."""
    said = dry_run([*SWEEP, *NARVAL, f"run_dir={cpu_runs / 'narval'}"], monkeypatch, capsys)
    assert "#SBATCH --mem=2048M" in said, said
    assert re.search(r"--mem: 2048 MB per training, default: nothing measured on a100; \d+ cpu record\(s\) not used: "
                     r"another device", said), said
    local = sweep.prepare([*SWEEP, f"run_dir={cpu_runs / 'local'}"]).spec.memory.host
    assert local.measured and " on cpu in " in local.source, local


def test_a100_records_size_an_a100_request_and_say_so(cpu_runs, monkeypatch, capsys, tmp_path):
    """Records of an A100 (NVML's name) beside the CPU run: the request is their peak x 1.5 (3000 MB: 4500 MB a
    training), saying where it comes from and that the CPU records were left aside."""
    root = tmp_path / "probe_pack"
    for run in ("cpu",):  # the CPU run beside them
        src = RunDir(cpu_runs / run)
        dst = RunDir(root / run)
        write_json_atomic(dst.plan, read_json(src.plan))
        for path in src.training_records():
            rec = read_json(path)
            write_json_atomic(dst.training_record(str(rec["pack_id"]), str(rec["training_id"])), rec)
    training = sweep.prepare([*SWEEP, f"run_dir={root / 'x'}"]).plan.packs[0].trainings[0]
    a100 = RunDir(root / "a100")
    write_json_atomic(a100.plan, read_json(RunDir(cpu_runs / "cpu").plan))
    write_json_atomic(a100.training_record("a100-process-n01-000", training.training_id), training_record(
        pack_id="a100-process-n01-000", training_id=training.training_id, workload=training.workload_label,
        params=dict(training.params), status="completed", partition="a100", gpu_type="NVIDIA A100-SXM4-40GB",
        device="cuda", device_name="NVIDIA A100-SXM4-40GB", gpu_model="A100-40gb", framework="torch 2.11.0+cu130",
        memory={"peak_rss_mb": 3000.0, "peak_gpu_mem_mb": 500.0}))
    said = dry_run([*SWEEP, *NARVAL, f"run_dir={root / 'narval'}"], monkeypatch, capsys)
    assert "#SBATCH --mem=4500M" in said, said
    assert f"--mem: 4500 MB per training, measured peak 3000 MB x 1.5: the peak of 1 earlier training(s) of this " \
           f"setting on a100 with torch 2.11.0+cu130 in {a100.root}" in said, said  # where, and with what
    assert re.search(r"\(\d+ cpu record\(s\) not used: another device\)", said), said
    # partitions of two device models (a whole A100 and a MIG slice): one figure would size both, so none is used
    said = dry_run([*SWEEP, *NARVAL, "partitions=[a100,a100_2g_10gb]", f"run_dir={root / 'both'}"], monkeypatch,
                   capsys)
    assert "#SBATCH --mem=2048M" in said and "#SBATCH --mem=4500M" not in said, said
    assert "default: nothing measured used: the partitions run on different devices (a100, a100 2g.10gb)" in said
