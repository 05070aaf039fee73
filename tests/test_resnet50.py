"""The resnet50 workload: torchvision's architecture (its parameter count and module names) defined here where
torchvision does not import, synthetic images of any size, amp ignored on a CPU with its reason, bad input refused,
and one real training through process packing."""
from __future__ import annotations

import pytest

from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.errors import ConfigError
from gpupack.job.body import run_pack
from gpupack.job.workloads import load_workload
from gpupack.job.workloads.resnet50 import AMP_ON_CPU, LAYERS, ResNet50Params, on_device, own_resnet50, synthetic

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("classes, params", [(1000, 25_557_032), (10, 23_528_522)])  # torchvision's resnet50
def test_the_architecture_is_torchvisions(classes, params):
    model = own_resnet50(torch.nn, classes)
    assert sum(p.numel() for p in model.parameters()) == params
    keys = list(model.state_dict())
    assert len(keys) == 320  # 53 convolutions, 53 batch norms (5 entries each), fc weight and bias
    for name in ("conv1.weight", "bn1.running_var", "layer1.0.downsample.0.weight", "layer1.0.downsample.1.bias",
                 "layer3.5.conv3.weight", "layer4.2.bn3.num_batches_tracked", "fc.weight", "fc.bias"):
        assert name in keys
    assert [len(getattr(model, f"layer{i}")) for i in range(1, 5)] == list(LAYERS) == [3, 4, 6, 3]
    assert model.layer2[0].conv2.stride == (2, 2) and model.layer2[0].conv1.stride == (1, 1)  # v1.5: 3x3 strides


@pytest.mark.parametrize("size", [32, 64])
def test_any_resolution_gives_one_logit_per_class(size):
    model = own_resnet50(torch.nn, 10).eval()
    with torch.no_grad():
        assert tuple(model(torch.zeros(2, 3, size, size)).shape) == (2, 10)


def test_synthetic_images_are_the_same_for_every_training():
    a, b = synthetic(8, 4, 32, 10), synthetic(8, 4, 32, 10)
    assert a.x_train.shape == (8, 32, 32, 3) and a.x_train.dtype.name == "uint8" and a.y_train.max() < 10
    assert (a.x_train == b.x_train).all() and "synthetic" in a.source


@pytest.mark.parametrize("amp, device, runs_amp, noted", [
    (True, "cpu", False, True),  # ignored, with its reason
    (True, "cuda", True, False),
    (False, "cpu", False, False),
])
def test_amp_is_ignored_on_a_cpu_with_its_reason(amp, device, runs_amp, noted):
    params, note = on_device(ResNet50Params(amp=amp), device)
    assert params.amp is runs_amp and (note == AMP_ON_CPU) is noted


@pytest.mark.parametrize("overrides, key", [
    ({"data": "imagenet"}, "data"),
    ({"image_size": 16}, "image_size"),
    ({"data": "cifar10", "image_size": 64}, "image_size"),
    ({"num_workers": -1}, "num_workers"),
    ({"batch_size": 0}, "batch_size"),
])
def test_bad_resnet50_input_is_refused(overrides, key):
    workload = load_workload("resnet50")
    params = ResNet50Params(**overrides)
    with pytest.raises(ConfigError) as err:  # what validate runs on each training: the declared ranges, then check()
        workload.check_ranges(params)
        workload.check(params)
    assert err.value.key == key and "HINT" in str(err.value)


def test_a_bigger_image_costs_more():
    workload = load_workload("resnet50")
    small = workload.cost({"epochs": 1, "train_samples": 100, "image_size": 32})
    assert workload.cost({"epochs": 1, "train_samples": 100, "image_size": 224}) == small * 49


@pytest.mark.slow
def test_a_resnet50_training_reports_images_per_second_and_why_amp_was_ignored(tmp_path):
    plan = make_plan(sweep="r", workload="resnet50", grid={"lr": [0.1]},
                     fixed={"train_samples": 16, "val_samples": 8, "batch_size": 8, "amp": True, "channels_last": True},
                     factors=[1], modes=["process"], partitions=["local"], repeats=1)
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.plan, plan.to_json())
    (pack,) = plan.packs
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    assert rec["n_completed"] == 1, rec
    training = read_json(run.training_record(pack.pack_id, pack.trainings[0].training_id))
    assert training["throughput"]["samples"] == 16 and training["throughput"]["samples_per_s"] > 0
    assert training["metrics"]["amp_note"] == AMP_ON_CPU and "synthetic" in training["data"]


@pytest.mark.slow
def test_fused_mode_hosts_n_resnet50s(tmp_path):
    assert type(own_resnet50(torch.nn, 10)) is type(own_resnet50(torch.nn, 10))  # stacking needs one class
    plan = make_plan(sweep="r", workload="resnet50", grid={"lr": [0.1, 0.05]},
                     fixed={"train_samples": 16, "val_samples": 8, "batch_size": 8},
                     factors=[2], modes=["fused"], partitions=["local"], repeats=1)
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.plan, plan.to_json())
    (pack,) = plan.packs
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    assert rec["n_completed"] == 2 and rec["mode"] == "fused", rec


@pytest.mark.parametrize("amp, noted", [(True, True), (False, False)])
def test_amp_on_a_partition_without_a_gpu_is_said_before_anything_runs(tmp_path, amp, noted):
    from gpupack import sweep

    prepared = sweep.prepare(["+sweep=resnet50_pack", f"sweep.fixed.amp={str(amp).lower()}",
                              f"run_dir={tmp_path / 'run'}", "packing.device=cpu"])
    assert any(AMP_ON_CPU in w for w in prepared.warnings) is noted
    assert not (tmp_path / "run").exists()
