"""The `gpu` tier: the GPU path against a real CUDA device (`pytest -m gpu`; scripts/gpu_check.sh runs it on the
device machine). Where there is none every test is skipped with the reason. Nothing here decides on speed: each test
asserts what ran where and what was recorded.

Covered: the device and its RGU model name from the real NVML; N=4 process packing on cuda, forked from a server
that never touched CUDA, with each training's GPU memory (torch's peak; NVML's per-process figure where the driver
gives one); the memory cap from NVML's total; fused equivalence on CUDA; DDP over NCCL at k=1; MPS where
nvidia-cuda-mps-control exists; the sampler's utilization and memory on a busy GPU; each training's share of the GPU
enforced (torch's per-process fraction, and MPS's client limit where MPS can start), and MPS clients whose limits
come from a measured N=1 holding their whole process (written 2026-11-30 after the H200's 11 of 21; not yet run on a
GPU).
"""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gpupack.core.cost.rgu import model_from_device_name
from gpupack.core.memory.figures import Measured, check_memory, estimate
from gpupack.core.monitor import detect_device, first_visible
from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import Capacity, PackSettings
from gpupack.errors import ConfigError
from gpupack.job.body import run_pack
from gpupack.job.pack.process import ProcessOptions
from gpupack.job.runtime.sampler import Sampler

REPO = Path(__file__).resolve().parent.parent


def _why_no_gpu() -> str | None:
    """None where NVML sees a GPU and torch can use it (asked in a child: this process never touches CUDA)."""
    info = detect_device(os.environ)
    if info.kind != "gpu":
        return f"no GPU here: {info.note}"
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=120)
    if probe.stdout.strip() != "True":
        return f"NVML sees {info.name}, but torch cannot use it: {(probe.stderr or probe.stdout).strip()[-300:]}"
    return None


WHY = _why_no_gpu()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY is not None, reason=WHY or "")]
SMALL = {"train_samples": 2048, "val_samples": 512, "batch_size": 128, "epochs": 1}


def _run(tmp_path: Path, factor: int, settings: PackSettings, mode: str = "process", **grid: list) -> tuple:
    plan = make_plan(sweep="gpu", workload="mnist_torch", grid=grid or {"seed": list(range(factor))}, fixed=SMALL,
                     factors=[factor], modes=[mode], partitions=["local"], repeats=1)
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.plan, plan.to_json())
    pack = plan.packs[0]
    rec = run_pack(str(run.root), pack.pack_id, settings)
    trainings = [read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings]
    return rec, trainings


def test_nvml_names_the_device_and_its_rgu_model():
    info = detect_device(os.environ)
    assert info.kind == "gpu" and info.memory_total_mb and info.memory_total_mb > 1000
    model = model_from_device_name(info.name)
    table = OmegaConf.load(REPO / "conf" / "rgu" / "alliance.yaml")
    families = {str(name).split("-")[0] for name in table.models}  # P100, V100, A100, H100, T4
    if any(re.search(rf"\b{family}\b", info.name, re.I) for family in families):
        assert model in table.models, (info.name, model)  # e.g. NVIDIA H100 80GB HBM3 → H100-80gb
    else:  # e.g. NVIDIA H200 (the device machine, 2026-11-28): no Alliance weight; never another model's
        assert model is None, (info.name, model)


def test_four_forked_trainings_share_the_gpu_and_record_their_memory(tmp_path):
    settings = PackSettings(device="cuda", sample_interval_s=0.2,
                            mode_options={"process": ProcessOptions(start="fork")})
    rec, trainings = _run(tmp_path, 4, settings)
    assert rec["n_completed"] == 4, [t["error"] for t in trainings]
    assert rec["gpu_type"] != "cpu" and rec["device"] == "cuda"
    for t in trainings:
        assert t["start"] == "fork" and not t.get("fork_fallback")  # the server never touched CUDA; the child did
        assert t["memory"]["peak_gpu_mem_mb"] > 0  # torch's own peak in the training
    sampled = rec["sampler"]
    assert sampled["source"] == "nvml" and sampled["gpu_mem_used_peak_mb"] > 0
    per = [p for p in sampled["per_training"].values() if p["gpu_mem_known"]]
    assert all(p["peak_gpu_mem_mb"] > 0 for p in per)  # NVML's per-process figure, where the driver gives it


def test_the_memory_cap_comes_from_nvmls_total():
    info = detect_device(os.environ)
    total = float(info.memory_total_mb or 0)
    capacity = Capacity(has_gpu=True, gpu_memory_mb=total)
    memory = estimate(1000.0, Measured())  # 1000 MB a training, as stated
    fits = math.floor(total * 0.8 / 1000)
    check_memory([fits], {"local": capacity}, memory, 0.8, key=lambda i: "packing.factors[0]")
    with pytest.raises(ConfigError) as err:
        check_memory([fits + 1], {"local": capacity}, memory, 0.8, key=lambda i: "packing.factors[0]")
    assert "GPU memory" in err.value.why and f"at most {fits}" in err.value.hint


def test_fused_models_on_cuda_end_where_each_would_alone():
    import torch

    from gpupack.job.workloads import _mnist_data, _torch_common, _torch_fused, load_workload
    from gpupack.job.workloads.mnist_torch import WORKLOAD as MNIST
    from gpupack.workload import Reporter, TrainingContext

    workload = load_workload("mnist_torch")
    group = [workload.params({**workload.defaults(), **SMALL, "hidden": 32, "lr": lr, "seed": s})
             for lr, s in ((0.05, 0), (0.2, 1))]
    data = _mnist_data.load(None)
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False

    def ctx() -> TrainingContext:
        return TrainingContext(device="cuda", threads=1, reporter=Reporter())

    alone = []
    for p in group:
        built: list = []
        _torch_common.run(p, ctx(), data, lambda nn, p=p: built.append(MNIST.build(p, nn)) or built[-1])
        alone.append({k: v.detach().cpu() for k, v in built[0].state_dict().items()})
    kept: list[dict] = []
    _torch_fused.train_fused(group, [ctx() for _ in group], data, lambda nn, p: MNIST.build(p, nn), keep=kept)
    for a, f in zip(alone, kept):
        for name in a:
            assert torch.allclose(a[name], f[name].cpu(), rtol=1e-3, atol=1e-4), name


def test_ddp_over_nccl_at_k1(tmp_path):
    plan = make_plan(sweep="gpu", workload="mnist_torch", grid={"seed": [0]}, fixed=SMALL, factors=[], modes=[],
                     partitions=["local"], repeats=1, spread_layouts=[("ddp", "ddp-nccl")], spread_devices=[1])
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.plan, plan.to_json())
    (pack,) = plan.packs
    run_pack(str(run.root), pack.pack_id, PackSettings(device="cuda"))
    rec = read_json(run.training_record(pack.pack_id, pack.trainings[0].training_id))
    assert rec["status"] == "completed", rec["error"]
    assert rec["spread"]["backend"] == "nccl" and rec["spread"]["world"] == 1


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None,
                    reason="nvidia-cuda-mps-control is not on PATH: MPS cannot start here")
def test_two_trainings_under_mps(tmp_path):
    settings = PackSettings(device="cuda", sample_interval_s=0.2,
                            mode_options={"process": ProcessOptions(mps=True)})
    rec, trainings = _run(tmp_path, 2, settings)
    assert rec["n_completed"] == 2, [t["error"] for t in trainings]
    assert rec["sampler"]["mps"] is True


def test_the_sampler_sees_a_busy_gpu():
    info = detect_device(os.environ)
    sampler = Sampler(interval_s=0.1, gpu=info.uuid or first_visible(os.environ), no_gpu_reason=info.note)
    sampler.start()
    busy = subprocess.Popen([sys.executable, "-c", "import time, torch\n"
                             "x = torch.randn(4096, 4096, device='cuda')\n"
                             "end = time.time() + 3\n"
                             "while time.time() < end:\n    x = (x @ x).tanh()\n"
                             "torch.cuda.synchronize()"])
    try:
        sampler.register("busy", busy.pid)  # the sampler samples once a training is registered, as in a pack
        assert busy.wait(timeout=300) == 0
    finally:
        busy.kill()
        sampled = sampler.stop()
    assert sampled["source"] == "nvml" and sampled["n_samples"] > 0
    assert sampled["gpu_util_max"] > 0 and sampled["gpu_mem_used_peak_mb"] > 0
    figures = sampled["per_training"]["busy"]
    assert figures["gpu_mem_known"] is False or figures["peak_gpu_mem_mb"] > 0  # its own memory, where NVML says it


def _share_pack(tmp_path: Path, settings: PackSettings) -> list[dict]:
    """Two trainings at packing.memory_share=on, memory_fraction 0.8: 0.4 of the GPU each. "big" allocates 0.6 of
    the device at once, past its share; "small" 0.1, within it."""
    plan = make_plan(sweep="share", workload="tests.fake_workloads", grid={"tag": ["big", "small"]},
                     fixed={"steps": 1}, factors=[2], modes=["process"], partitions=["local"], repeats=1)
    data = plan.to_json()
    for t in data["packs"][0]["trainings"]:
        t["params"]["cuda_alloc_fraction"] = 0.6 if t["params"]["tag"] == "big" else 0.1
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.plan, data)
    pack = plan.packs[0]
    run_pack(str(run.root), pack.pack_id, settings)
    return [read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings]


def test_a_training_past_its_share_of_the_gpu_gets_its_own_oom_and_its_neighbour_completes(tmp_path):
    big, small = _share_pack(tmp_path, PackSettings(device="cuda", memory_share=0.8))
    assert big["status"] == "oom" and "its share of the GPU" in big["error"], big["error"]
    assert small["status"] == "completed", small["error"]
    assert big["memory_share"]["fraction"] == pytest.approx(0.4) and big["memory_share"]["mps_limit"] is None


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None,
                    reason="nvidia-cuda-mps-control is not on PATH: MPS cannot start here")
def test_an_mps_client_past_its_limit_gets_its_own_oom_and_its_neighbour_completes(tmp_path):
    big, small = _share_pack(tmp_path, PackSettings(device="cuda", memory_share=0.8,
                                                    mode_options={"process": ProcessOptions(mps=True)}))
    assert big["status"] == "oom", big["error"]
    assert small["status"] == "completed", small["error"]
    assert big["memory_share"]["mps_limit"].startswith("0=")


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None,
                    reason="nvidia-cuda-mps-control is not on PATH: MPS cannot start here")
def test_mps_clients_sized_by_a_measured_n1_hold_their_whole_process(tmp_path):
    """The H200 (2026-11-30): N=21 MPS clients whose limits came from N=1's torch peak plus an assumed context ran out
    of memory, 11 of 21. N=1 first, then N=4 of the same setting, each client limited by what N=1 measured: every
    training completes, and each limit holds the whole process NVML saw at N=1."""
    plan = make_plan(sweep="gpu", workload="mnist_torch", grid={"seed": [0, 1, 2, 3]}, fixed=SMALL, factors=[1, 4],
                     modes=["process"], partitions=["local"], repeats=1)
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.plan, plan.to_json())
    settings = PackSettings(device="cuda", memory_share=0.8, sample_interval_s=0.2,
                            mode_options={"process": ProcessOptions(mps=True)})
    by_n = {n: next(p for p in plan.packs if p.factor == n) for n in (1, 4)}  # the first pack of each N
    for n in (1, 4):
        run_pack(str(run.root), by_n[n].pack_id, settings)
    (alone,) = [read_json(run.training_record(by_n[1].pack_id, t.training_id)) for t in by_n[1].trainings]
    packed = [read_json(run.training_record(by_n[4].pack_id, t.training_id)) for t in by_n[4].trainings]
    assert all(r["status"] == "completed" for r in packed), [r["error"] for r in packed]
    whole = alone["memory"].get("process_gpu_mem_mb")
    assert whole is not None and whole > alone["memory"]["peak_gpu_mem_mb"]  # NVML's figure: its context included
    assert all(r["memory_share"]["mb"] >= whole for r in packed), [r["memory_share"] for r in packed]
