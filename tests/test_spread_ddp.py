"""DDP spread (gpupack/job/spread/ddp.py) on real processes: gloo on the CPU, k=2 ranks as k fresh workers.

What it guarantees: each step all-reduces exactly the model's gradients (4 bytes a parameter, whatever the batch);
k=2 with the global batch held equal trains the same loss curve as one process alone; one rank failing fails the
training with that rank's error and the others are stopped, not left hanging in an all-reduce.

This module is also a workload (``WORKLOAD``, named ``tests.test_spread_ddp``) whose ranks fail or hang on request.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpupack.core.placement import Placement
from gpupack.core.plan import Plan, make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import Capacity, PackSettings
from gpupack.errors import ConfigError
from gpupack.job.body import run_pack
from gpupack.job.runtime.joins import ddp
from gpupack.job.runtime.joins import join as join_placement
from gpupack.job.runtime.joins.ddp import _merged
from gpupack.job.spread import check_spread, load_strategy, strategy_options
from gpupack.job.spread.ddp import RANKS_FAIL_TOGETHER, STRATEGY, DdpOptions
from gpupack.job.workloads import load_workload
from gpupack.workload import Reporter, TrainingContext, Workload

SMALL = {"model": "mlp", "hidden": 32, "train_samples": 500, "val_samples": 500, "epochs": 1, "lr": 0.05}
NO_GPU = Capacity(has_gpu=False, node_cpus=2)


# ---------------- labels, placement, check: pure ----------------


@pytest.mark.parametrize("given, labels", [
    ("gloo", ["ddp-gloo"]), (["gloo"], ["ddp-gloo"]), (["gloo", "nccl"], ["ddp-gloo", "ddp-nccl"]),
    ("nccl", ["ddp-nccl"])])
def test_labels_one_per_backend(given, labels):
    assert STRATEGY.labels(DdpOptions(backend=given)) == labels


def test_labels_take_an_omegaconf_list():
    from omegaconf import OmegaConf

    spread = OmegaConf.create({"devices": [2], "ddp_backend": ["nccl", "gloo"]})  # the spread section, as composed
    assert STRATEGY.labels(strategy_options(STRATEGY, spread)) == ["ddp-nccl", "ddp-gloo"]


@pytest.mark.parametrize("given, value, why", [
    ("glo", "glo", "unknown DDP backend"), (["gloo", "mpi"], "mpi", "unknown DDP backend"),
    ([], [], "no DDP backend"), (["gloo", "gloo"], ["gloo", "gloo"], "listed twice")])
def test_bad_backends_are_refused_naming_the_key(given, value, why):
    with pytest.raises(ConfigError) as err:
        STRATEGY.labels(DdpOptions(backend=given))
    assert err.value.key == "spread.ddp_backend" and err.value.value == value and why in err.value.why
    if given == "glo":
        assert "gloo" in err.value.hint  # the nearest name


def test_placement_reads_the_backend_from_the_label():
    where = STRATEGY.placement("ddp-nccl", 4, "cuda")
    assert (where.strategy, where.label, where.devices, where.world, where.rank, where.backend, where.device) == \
        ("ddp", "ddp-nccl", 4, 4, 0, "nccl", "cuda")
    assert Placement.from_json(json.loads(json.dumps(where.to_json()))) == where
    with pytest.raises(ConfigError, match="spread.ddp_backend"):
        STRATEGY.placement("ddp-mpi", 2, "cpu")


def test_nccl_without_a_gpu_is_refused_and_gloo_is_not():
    workload = load_workload("mnist_torch")
    for capacity in (NO_GPU, Capacity(has_gpu=None, node_cpus=2)):  # unknown is not a GPU either
        with pytest.raises(ConfigError) as err:
            STRATEGY.check(workload, 2, "ddp-nccl", capacity, None)
        assert err.value.key == "spread.ddp_backend" and err.value.value == "nccl"
        assert "gloo" in err.value.hint
    STRATEGY.check(workload, 2, "ddp-gloo", NO_GPU, None)
    STRATEGY.check(workload, 2, "ddp-nccl", Capacity(has_gpu=True, node_gpus=4), None)


def test_check_spread_accepts_the_torch_workloads_and_refuses_nccl_on_a_cpu_partition():
    options = DdpOptions(backend=["gloo", "nccl"])
    strategy = load_strategy("ddp")
    assert strategy is STRATEGY
    for name in ("mnist_torch", "cifar10_torch"):
        check_spread(strategy, load_workload(name), [1, 2], ["ddp-gloo"], {"cpu": NO_GPU}, options)
    with pytest.raises(ConfigError, match="spread.ddp_backend='nccl'"):
        check_spread(strategy, load_workload("mnist_torch"), [1, 2], strategy.labels(options), {"cpu": NO_GPU},
                     options)


def test_of_ranks_failing_at_once_the_cause_is_the_one_that_did_not_lose_a_peer(tmp_path):
    def rank(r: int, text: str) -> Any:
        (tmp_path / f"{r}.err").write_text(f"Traceback (most recent call last):\n{text}\n")
        return SimpleNamespace(rank=r, err_path=tmp_path / f"{r}.err", proc=SimpleNamespace(returncode=1))

    lost = rank(0, "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:33170")
    cause = rank(1, "ValueError: a bad batch")
    assert RANKS_FAIL_TOGETHER.culprit([lost, cause]) is cause
    assert RANKS_FAIL_TOGETHER.culprit([lost]) is lost  # only a lost peer: that is all there is to say


def test_union_of_in_flight_intervals():
    assert _merged([(3.0, 4.0), (0.0, 1.0), (0.5, 2.0), (2.0, 2.5)]) == [(0.0, 2.5), (3.0, 4.0)]


def test_all_reduce_time_is_the_union_of_in_flight_intervals_also_once_folded(monkeypatch):
    monkeypatch.setattr(ddp, "FOLD_AT", 2)  # fold as often as possible
    now = [0.0]
    count = ddp._CommCount(clock=lambda: now[0])

    def at(t: float, what: Any) -> Any:
        now[0] = t
        return what()

    a = at(0, lambda: count.started(100, False))
    b = at(1, lambda: count.started(50, True))
    at(2, lambda: count.finished(a))
    at(3, lambda: count.finished(b))  # folds [0, 3]
    c = at(10, lambda: count.started(100, False))
    d = at(11, lambda: count.started(50, True))
    at(12, lambda: count.finished(d))
    e = at(13, lambda: count.started(100, False))
    at(14, lambda: count.finished(e))  # folds nothing past c, still in flight since 10
    at(15, lambda: count.finished(c))
    assert count.busy_s() == pytest.approx(3 + 5)  # [0, 3] and [10, 15]: overlaps counted once
    assert (count.buckets, count.bytes, count.steps) == (5, 400, 2)


# ---------------- on real processes: the pack's side and the workload's ----------------


def _spread_plan(tmp_path: Path, workload: str, grid: dict[str, list[Any]], fixed: dict[str, Any],
                 k: int = 2) -> tuple[RunDir, Plan]:
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="t", workload=workload, grid=grid, fixed=fixed, factors=[], modes=[],
                     partitions=["local"], repeats=1, spread_layouts=[("ddp", "ddp-gloo")], spread_devices=[k])
    write_json_atomic(run.plan, plan.to_json())
    return run, plan


@pytest.mark.slow
def test_each_step_all_reduces_the_gradients_whatever_the_batch(tmp_path):
    import torch

    from gpupack.job.workloads.mnist_torch import WORKLOAD, MnistTorchParams

    run, plan = _spread_plan(tmp_path, "mnist_torch", {"batch_size": [32, 128]}, SMALL)
    n_params = sum(p.numel() for p in WORKLOAD.build(MnistTorchParams(**SMALL), torch.nn).parameters())
    per_sample = {}
    for pack in plan.packs:
        assert pack.spread == "ddp" and pack.devices == 2
        run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
        t = pack.trainings[0]
        rec = read_json(run.training_record(pack.pack_id, t.training_id))
        assert rec["status"] == "completed", rec["error"]
        batch = t.params["batch_size"]
        spread = rec["spread"]
        assert spread["allreduce_bytes_per_step"] == n_params * 4  # float32 gradients, each once
        steps = -(-SMALL["train_samples"] // batch)  # every batch, the last partial one too (split unevenly)
        assert spread["comm_steps"] == rec["throughput"]["steps"] == steps
        assert rec["throughput"]["samples"] == SMALL["train_samples"]  # the global batches, counted once over ranks
        assert spread["allreduce_buckets_per_step"] >= 1 and spread["allreduce_s_per_step"] > 0
        assert (spread["world"], spread["rank"], spread["backend"], rec["devices"], rec["ranks"]) == \
            (2, 0, "gloo", 2, 2)
        assert rec["metrics"]["val_accuracy"] > 0.2  # it learned, on rank 0's copy of the shared weights
        assert run.log(pack.pack_id, f"{t.training_id}.rank1", "err").exists()  # rank 1 ran, with its own log
        per_sample[batch] = spread["allreduce_bytes_per_step"] / batch
    assert per_sample[128] < per_sample[32]  # the same bytes a step over more samples: spreading pays at big batches


def test_bytes_and_steps_are_counted_per_backward_pass_over_several_buckets(tmp_path):
    import torch

    # World 1 in this process: DDP still all-reduces (with itself) through the hook, bucket by bucket.
    spread = join_placement(dataclasses.replace(STRATEGY.placement("ddp-gloo", 1, "cpu"),
                                               init_method=f"file://{tmp_path / 'store'}"))
    try:
        assert spread.stats() == {}  # nothing measured before the model is wrapped
        torch.manual_seed(0)
        # Two 1.4 MB layers: DDP's first bucket closes at 1 MB, so a backward pass all-reduces two buckets.
        model = torch.nn.Sequential(torch.nn.Linear(600, 600), torch.nn.ReLU(), torch.nn.Linear(600, 600))
        wrapped = spread.wrap(model)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.01)
        for _ in range(3):
            opt.zero_grad()
            wrapped(torch.randn(8, 600)).square().mean().backward()
            opt.step()
        stats = spread.stats()
    finally:
        wrapped = opt = None  # the DDP model (its reducer) before its process group: freed after, it can hang
        spread.close()
    # DDP rebuilds its buckets after the first pass (in the order gradients became ready): more than one a step.
    assert stats["allreduce_buckets_per_step"] > 1 and stats["comm_steps"] == 3
    assert stats["allreduce_bytes_per_step"] == sum(p.numel() for p in model.parameters()) * 4
    assert stats["allreduce_s_per_step"] > 0 and stats["backend"] == "gloo"


def _rank_losses(rank: int, world: int, init: str, params: dict[str, Any], out: str) -> None:
    """One rank of a DDP training of mnist_torch through the workload's real loop, in a spawned process."""
    from gpupack.job.runtime.worker import join_spread

    spread = join_spread(dataclasses.replace(STRATEGY.placement("ddp-gloo", world, "cpu"), rank=rank,
                                             init_method=init).to_json())
    workload = load_workload("mnist_torch")
    reporter = Reporter(warmup_steps=1, info={"losses": []})
    try:
        metrics = workload.train(workload.params(params), TrainingContext(spread.device, 1, reporter, spread))
        Path(out, f"rank{rank}.json").write_text(json.dumps({"losses": reporter.info["losses"], **metrics,
                                                             **spread.stats()}))
    finally:
        spread.close()
    os._exit(0)  # as gpupack's worker ends a rank: before finalization, where gloo's threads may abort it


@pytest.mark.slow
def test_two_ranks_train_the_loss_curve_of_one(tmp_path):
    import torch
    import torch.multiprocessing as mp

    # An odd global batch: rank 0 takes 8 samples, rank 1 takes 7, and the step is still the batch's mean (weighting
    # the slices' losses equally would be off by ~1e-3 here).
    params = {**SMALL, "batch_size": 15, "train_samples": 15 * 8}
    # The ranks meet through a file of this test's own, as the pack's ranks do (no TCP port to race for).
    mp.spawn(_rank_losses, args=(2, f"file://{tmp_path / 'store'}", params, str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    together = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"])]

    threads = torch.get_num_threads()
    workload = load_workload("mnist_torch")
    reporter = Reporter(warmup_steps=1, info={"losses": []})
    try:  # the same training alone, in this process, with no spread at all
        alone = workload.train(workload.params(params), TrainingContext("cpu", 1, reporter))
    finally:
        torch.set_num_threads(threads)
    assert len(together) == len(reporter.info["losses"]) == 8
    assert together == pytest.approx(reporter.info["losses"], rel=1e-4, abs=1e-5)
    assert ranks[0]["train_loss"] == ranks[1]["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-4)
    assert ranks[0]["val_accuracy"] == ranks[1]["val_accuracy"] == pytest.approx(alone["val_accuracy"], abs=0.005)


# ---------------- faults: this module as a workload whose ranks fail or hang ----------------


@dataclass
class FaultParams:
    seed: int = 0
    fail_rank: int = -1  # this rank raises as soon as it has joined
    then: str = "hang"  # what the other ranks do: hang | allreduce (wait in one for the failed rank, then hang)
    # The failing rank first leaves the process group (its peers fail of a lost connection), then lingers this long
    # before it raises: the race where the peers' errors land first.
    linger_s: float = 0.0
    # A hang ends in an error after this long, so a pack that failed to stop it still ends; the rank then leaves a
    # file in `hung_dir`, which a test of the stop finds (an outcome, not a clock: a stopped rank never writes it).
    hang_s: float = 120.0
    hung_dir: str = ""
    ignore_term: bool = False  # the other ranks ignore SIGTERM: only the SIGKILL after the grace period ends them


class RankFault(Workload):
    name = "rank_fault"
    framework = "torch"
    spreads = ("ddp",)
    Params = FaultParams

    def params(self, values: Any) -> FaultParams:
        params = FaultParams(**dict(values))
        if params.ignore_term:  # as early as the worker lets a workload act: before it imports torch and joins
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return params

    def train(self, params: FaultParams, ctx: TrainingContext) -> dict[str, Any]:
        if ctx.spread.rank == params.fail_rank:
            if params.linger_s:
                ctx.spread.close()
                time.sleep(params.linger_s)
            raise RuntimeError(f"rank fault on purpose in rank {ctx.spread.rank}")
        if params.then == "allreduce":
            ctx.spread.mean(1.0)
        deadline = time.time() + params.hang_s
        while time.time() < deadline:
            time.sleep(0.1)
        if params.hung_dir:
            (Path(params.hung_dir) / f"rank{ctx.spread.rank}").write_text("hung to the end of hang_s: never stopped")
        raise RuntimeError(f"rank {ctx.spread.rank} was left hanging for {params.hang_s} s")


WORKLOAD = RankFault()


@pytest.mark.parametrize("then, linger_s", [("hang", 0.0), ("allreduce", 1.5)])
@pytest.mark.slow
def test_a_failing_rank_fails_the_training_with_its_error_and_the_others_are_stopped(tmp_path, then, linger_s):
    run, plan = _spread_plan(tmp_path, __name__, {"fail_rank": [1]},
                             {"then": then, "linger_s": linger_s, "hung_dir": str(tmp_path)})
    pack = plan.packs[0]
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    assert not (tmp_path / "rank0").exists()  # rank 0 was stopped, not left to hang to its end
    tr = read_json(run.training_record(pack.pack_id, pack.trainings[0].training_id))
    assert rec["n_failed"] == 1 and tr["status"] == "failed" and tr["exit_code"] == 1 and tr["signal"] is None
    assert tr["error"].startswith("rank 1 of 2: ") and "rank fault on purpose in rank 1" in tr["error"]
    assert tr["timed_out"] is False and tr["ranks"] == 2


@pytest.mark.slow
def test_a_training_past_its_time_limit_is_stopped_on_every_rank(tmp_path):
    run, plan = _spread_plan(tmp_path, __name__, {"fail_rank": [-1]},
                             {"then": "hang", "ignore_term": True, "hung_dir": str(tmp_path)})
    pack = plan.packs[0]
    run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu", training_timeout_s=3))
    # SIGTERM at 3 s (ignored), SIGKILL KILL_GRACE_S later: neither rank hung on to the end of its hang_s
    assert not any((tmp_path / f"rank{r}").exists() for r in range(2))
    tr = read_json(run.training_record(pack.pack_id, pack.trainings[0].training_id))
    assert tr["status"] == "timeout" and tr["timed_out"] is True and tr["signal"] == signal.SIGKILL
    assert tr["error"].startswith("stopped after packing.training_timeout_s")


@pytest.mark.parametrize("visible, world, refused", [(2, 2, False), (4, 2, False), (1, 2, True), (0, 4, True)])
def test_a_rank_refuses_a_job_with_fewer_gpus_than_ranks(visible, world, refused):
    from gpupack.errors import ConfigError
    from gpupack.job.runtime.joins.ddp import check_visible

    if refused:
        with pytest.raises(ConfigError, match=f"needs {world} GPUs in its job, but it sees {visible}"):
            check_visible(visible, world, "0")
    else:
        check_visible(visible, world, "0,1")
