"""MirroredStrategy: one Keras training over k devices (k logical CPUs standing in on this machine), run as a pack
through the real job body, beside the refusals that keep it from starting where it cannot work."""
from __future__ import annotations

import sys
from typing import Any
from unittest import mock

import pytest

from gpupack.core.placement import Placement
from gpupack.core.plan import Plan, spread_packs
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import Capacity, PackSettings
from gpupack.errors import ConfigError
from gpupack.job.body import run_pack
from gpupack.job.runtime.joins import join
from gpupack.job.runtime.joins.mirrored import first_gpus, make_devices
from gpupack.job.spread import check_spread, load_strategy
from gpupack.job.workloads._tf_common import check_even_split

# Small, so each k costs one TF process start (~5-10 s here) and a second of training: 8 steps of a 64 global batch.
FIXED = {"model": "mlp", "hidden": 32, "train_samples": 512, "val_samples": 200, "epochs": 1, "batch_size": 64,
         "lr": 0.05}


@pytest.fixture(scope="module")
def mirrored_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """One mnist_tf training as a mirrored pack at k=1 and at k=2 (logical CPUs), each run by the job body as a
    submitted job would run it; the training record of each, by k."""
    run = RunDir(tmp_path_factory.mktemp("mirrored") / "run")
    packs = spread_packs("mnist_tf", [{}], FIXED, ["local"], [("mirrored", "mirrored")], [1, 2], repeats=1)
    write_json_atomic(run.plan, Plan(sweep="t", workload="mnist_tf", grid_size=1, packs=tuple(packs)).to_json())
    records: dict[int, dict[str, Any]] = {}
    for pack in packs:
        run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu", warmup_steps=2))
        records[pack.devices] = read_json(run.training_record(pack.pack_id, pack.trainings[0].training_id))
    return records


@pytest.mark.slow
def test_mirrored_pack_trains_over_two_logical_cpus(mirrored_runs: dict[int, dict[str, Any]]) -> None:
    rec = mirrored_runs[2]
    assert rec["status"] == "completed", rec["error"]
    assert rec["mode"] == "mirrored" and rec["strategy"] == "mirrored" and rec["devices"] == 2
    spread = rec["spread"]
    assert spread["replicas"] == 2 and spread["replica_devices"] == ["/job:localhost/replica:0/task:0/device:CPU:0",
                                                             "/job:localhost/replica:0/task:0/device:CPU:1"]
    assert spread["cross_device_ops"] and spread["device"] == "cpu" and spread["world"] == 1
    assert rec["metrics"]["replicas"] == 2  # what Keras trained over: the model was made under the strategy's scope
    # The reporter counts the global batch per step: 512 samples in 8 steps, at any k.
    assert rec["throughput"]["steps"] == 8 and rec["throughput"]["samples"] == 512
    assert mirrored_runs[1]["spread"]["replicas"] == mirrored_runs[1]["metrics"]["replicas"] == 1


@pytest.mark.slow
def test_mirrored_loss_at_two_devices_matches_one(mirrored_runs: dict[int, dict[str, Any]]) -> None:
    """The same global batch at k=1 and k=2: Keras scales each replica's loss by 1/k and sums the gradients, so
    k=2 takes the same steps; only the order of float sums differs."""
    one, two = (mirrored_runs[k]["metrics"] for k in (1, 2))
    assert two["train_loss"] == pytest.approx(one["train_loss"], rel=1e-3)
    assert two["val_accuracy"] == pytest.approx(one["val_accuracy"], abs=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("fixed, settings, status, needle", [
    ({"batch_size": 63}, PackSettings(device="cpu"), "failed", "batch_size=63: one training spread over 2 replicas"),
    ({}, PackSettings(device="cpu", training_timeout_s=0.5), "timeout", "stopped after packing.training_timeout_s"),
], ids=["uneven-first-batch", "timeout"])
def test_mirrored_training_fails_or_times_out_as_in_process_mode(tmp_path: Any, fixed: dict[str, Any],
                                                                 settings: PackSettings, status: str,
                                                                 needle: str) -> None:
    """A mirrored training that raises (a first global batch Keras cannot split evenly over 2 replicas: refused with
    its own message, not TF's AddN shape error) or outlives packing.training_timeout_s is recorded as process mode
    records it, and the pack record still comes."""
    run = RunDir(tmp_path / "run")
    (pack,) = spread_packs("mnist_tf", [{}], {**FIXED, **fixed}, ["local"], [("mirrored", "mirrored")], [2], 1)
    write_json_atomic(run.plan, Plan(sweep="t", workload="mnist_tf", grid_size=1, packs=(pack,)).to_json())
    rec = run_pack(str(run.root), pack.pack_id, settings)
    assert rec["n_failed"] == 1 and rec["devices"] == 2
    training = read_json(run.training_record(pack.pack_id, pack.trainings[0].training_id))
    assert training["status"] == status and needle in training["error"], training["error"]


# ---------------- refusals, without starting TensorFlow ----------------

def test_join_refuses_more_gpus_than_the_job_has() -> None:
    with pytest.raises(ConfigError, match=r"spread.devices=2: MirroredStrategy over 2 GPUs needs 2 GPUs in the "
                                          r"training's job, but TensorFlow sees 1 \(CUDA_VISIBLE_DEVICES='3'\)"):
        first_gpus(["GPU:0"], 2, "3")
    assert first_gpus(["GPU:0", "GPU:1", "GPU:2"], 2) == ["GPU:0", "GPU:1"]  # the job's first k


class _FakeConfig:
    """tf.config as a job with one GPU shows it: what join asks of it, and what it sets."""

    def __init__(self) -> None:
        self.growth: list[str] = []
        self.experimental = self

    def list_physical_devices(self, kind: str) -> list[str]:
        return ["GPU:0"] if kind == "GPU" else ["CPU:0"]

    def set_memory_growth(self, device: str, on: bool) -> None:
        self.growth.append(device)

    def set_visible_devices(self, devices: Any, kind: str) -> None:
        raise AssertionError("nothing may be set on a job that cannot host the training")


def test_join_refuses_on_a_job_with_fewer_gpus_before_setting_anything() -> None:
    tf = type("tf", (), {"config": _FakeConfig()})()
    with pytest.raises(ConfigError, match="needs 2 GPUs"):
        make_devices(tf, "cuda", 2)
    assert tf.config.growth == []
    with pytest.raises(ConfigError, match="needs 2 GPUs"):  # the strategy's own join, TensorFlow faked out
        with mock.patch.dict(sys.modules, {"tensorflow": tf}):
            join(Placement(strategy="mirrored", label="mirrored", devices=2, device="cuda"))


def test_global_batch_must_split_evenly_over_the_replicas() -> None:
    check_even_split(64, 2)
    check_even_split(5, 1)
    with pytest.raises(ConfigError, match=r"batch_size=6: .*over 4 replicas.*divisible by 4"):
        check_even_split(6, 4)


def test_tf_workloads_say_they_spread_with_mirrored() -> None:
    from gpupack.job.workloads import load_workload

    assert all(load_workload(w).spreads == ("mirrored",) for w in ("mnist_tf", "cifar10_tf"))
    strategy = load_strategy("mirrored")
    assert (strategy.name, strategy.framework) == ("mirrored", "tensorflow")
    # k=1,2 on a 2-CPU node pass the generic check; k=3 asks for more stand-ins than the node has.
    cpus = {"local": Capacity(has_gpu=False, node_cpus=2)}
    check_spread(strategy, load_workload("mnist_tf"), [1, 2], ["mirrored"], cpus, None)
    with pytest.raises(ConfigError, match="needs 3 CPUs standing in"):
        check_spread(strategy, load_workload("mnist_tf"), [3], ["mirrored"], cpus, None)


@pytest.mark.parametrize("shapes, dtypes, replicas, expected", [
    ([(784, 32), (32,), (32, 10), (10,)], ["float32"] * 4, 2, (784 * 32 + 32 + 32 * 10 + 10) * 4),
    ([(10, 10)], ["float16"], 4, 200),
    ([(784, 32)], ["float32"], 1, 0),  # one replica: nothing to all-reduce
])
def test_mirrored_all_reduce_bytes_are_the_trainable_weights(shapes, dtypes, replicas, expected):
    from types import SimpleNamespace

    from gpupack.job.runtime.joins.mirrored import allreduce_bytes

    weights = [SimpleNamespace(shape=s, dtype=d) for s, d in zip(shapes, dtypes)]
    assert allreduce_bytes(weights, replicas) == expected
