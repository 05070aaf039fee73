"""fused mode: N models trained as one batched model (torch.func) end exactly where each would alone; a model that
diverges fails alone; shapes split packs into groups planned up front; what cannot be fused is refused."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from gpupack.cli import main  # noqa: E402
from gpupack.core.plan import make_plan  # noqa: E402
from gpupack.core.store.records import read_json, write_json_atomic  # noqa: E402
from gpupack.core.store.rundir import RunDir  # noqa: E402
from gpupack.core.types import PackSettings  # noqa: E402
from gpupack.job.body import run_pack  # noqa: E402
from gpupack.job.workloads import _mnist_data, _torch_common, _torch_fused, load_workload  # noqa: E402
from gpupack.job.workloads.mnist_torch import WORKLOAD as MNIST  # noqa: E402
from gpupack.workload import Reporter, TrainingContext  # noqa: E402
from tests.doc_commands import pasted  # noqa: E402

WORKLOAD = load_workload("mnist_torch")


def _params(**kw):
    return WORKLOAD.params({**WORKLOAD.defaults(), "train_samples": 640, "val_samples": 200, "batch_size": 64,
                            "epochs": 2, "hidden": 32, **kw})


def _ctx(threads=1):
    return TrainingContext(device="cpu", threads=threads, reporter=Reporter())


@pytest.mark.slow
def test_fused_models_end_where_each_would_alone():
    """Different learning rates, momenta and seeds (init and data order), two epochs: same weights as alone."""
    group = [_params(lr=0.05, seed=0), _params(lr=0.2, seed=1, momentum=0.5), _params(lr=0.01, seed=7)]
    data = _mnist_data.load(None)
    torch.set_num_threads(1)
    alone = []
    for p in group:
        built = []
        _torch_common.run(p, _ctx(), data, lambda nn, p=p: built.append(MNIST.build(p, nn)) or built[-1])
        alone.append({k: v.detach() for k, v in built[0].state_dict().items()})
    kept: list[dict] = []
    results = _torch_fused.train_fused(group, [_ctx() for _ in group], data, lambda nn, p: MNIST.build(p, nn),
                                       keep=kept)
    assert all(isinstance(r, dict) for r in results)
    for i, (a, f) in enumerate(zip(alone, kept)):
        assert a.keys() == f.keys()
        for name in a:
            assert torch.allclose(a[name], f[name], rtol=1e-4, atol=1e-5), (i, name, (a[name] - f[name]).abs().max())
    # and the models really differ from each other (different lr/seed), so the check above is not trivial
    assert not torch.allclose(kept[0]["1.weight"], kept[1]["1.weight"], atol=1e-3)


def test_fused_metrics_match_alone():
    p = _params(lr=0.1, seed=3)
    data = _mnist_data.load(None)
    alone = _torch_common.run(p, _ctx(), data, lambda nn: MNIST.build(p, nn))
    fused = _torch_fused.train_fused([p, _params(lr=0.3, seed=4)], [_ctx(), _ctx()], data,
                                     lambda nn, q: MNIST.build(q, nn))
    assert fused[0]["val_accuracy"] == pytest.approx(alone["val_accuracy"], abs=1e-9)
    assert fused[0]["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-4)


def _fused_pack(tmp_path, grid, fixed=None):
    plan = make_plan(sweep="fz", workload="mnist_torch", grid=grid,
                     fixed={**WORKLOAD.defaults(), "train_samples": 640, "val_samples": 200, "epochs": 1,
                            **(fixed or {})},
                     factors=[len(next(iter(grid.values())))], modes=["fused"], partitions=["local"], repeats=1)
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.plan, plan.to_json())
    return run, plan.packs[0]


@pytest.mark.slow
def test_a_diverging_model_fails_alone_and_the_others_finish(tmp_path):
    run, pack = _fused_pack(tmp_path, {"lr": [0.05, 1e9, 0.1]})
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu"))
    recs = {t.params["lr"]: read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings}
    assert rec["n_completed"] == 2 and rec["n_failed"] == 1 and rec["mode"] == "fused"
    assert recs[1e9]["status"] == "failed" and "loss became" in recs[1e9]["error"]
    for lr in (0.05, 0.1):
        r = recs[lr]
        assert r["status"] == "completed" and math.isfinite(r["metrics"]["train_loss"])
        assert r["metrics"]["val_accuracy"] > 0.3 and r["throughput"]["samples"] == 640
        assert r["timings"]["loop_s"] > 0 and r["metrics"]["fused_group"] == 3
        assert r["memory"]["shared_by"] == 3  # its resident peak is the shared process's, the pack's
    # ... so it sizes no training's request: one training's figure of this setting is not known from this pack
    from gpupack.core.memory.figures import find_measured, setting_key

    settings = {setting_key(t.params) for t in pack.trainings}
    measured = find_measured([run.root], "mnist_torch", settings, devices=["cpu"])
    assert measured.host_mb is None, measured


def test_shapes_split_packs_into_groups_planned_up_front():
    keys = {"fused": lambda params: (params["hidden"],)}
    plan = make_plan(sweep="s", workload="w", grid={"hidden": [32, 64], "lr": [0.1, 0.2, 0.3]}, fixed={},
                     factors=[2], modes=["process", "fused"], partitions=["local"], repeats=1, group_keys=keys)
    fused = [p for p in plan.packs if p.mode == "fused" and p.reference_of is None]  # the drift check left out
    process = [p for p in plan.packs if p.mode == "process" and p.reference_of is None]
    assert all(len({t.params["hidden"] for t in p.trainings}) == 1 for p in fused)  # one shape per pack
    assert any(len({t.params["hidden"] for t in p.trainings}) == 2 for p in process)  # process mixes them
    assert sorted(t.params["hidden"] for p in fused for t in p.trainings) == [32] * 4 + [64] * 4  # 3 points → 2 packs
    assert len({p.pack_id for p in plan.packs}) == len(plan.packs)
    assert any("fused N=2" in note and "2 shapes" in note for note in plan.notes)


@pytest.mark.parametrize("overrides, needle", [
    (["packing.modes=[fused]", "sweep.grid.amp=[true,false]"], "sweep.grid.amp=True: cannot be fused"),
    (["+sweep=mnist_tf_pack", "packing.modes=[fused]"], "packing.modes='fused': mnist_tf cannot be fused"),
    (["sweep.workload=command", "sweep.fixed.argv=[python,-c,pass]", "packing.modes=[fused]", "~sweep.grid.batch_size",
      "~sweep.grid.seed"], "packing.modes='fused': command cannot be fused"),
])
def test_what_cannot_be_fused_is_refused_before_anything(tmp_path, capsys, overrides, needle):
    base = [] if overrides[0].startswith("+sweep") else ["+sweep=mnist_pack"]
    assert main(base + overrides + [f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "HINT" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.quiet
def test_process_and_fused_in_one_table_with_the_best_mode_and_n(tmp_path, subprocess_env):
    """Both modes in one table, and the best (mode, N) of the two named. A mode whose gain passes its bound names
    nothing (summary.no_answer), and at N=2 on 2 cores both modes' bound is 2x and both sit near it: at 1,000
    samples a forked training took 0.1 s and jitter passed it in both modes at once (once in about 20 CI runs; one
    mode in 2 of 3 runs here); at 4,000 the process mode's gain stayed at 1.5x-1.8x in 3 runs, and the line asserted
    needs one mode's answer."""
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "gpupack",
                           *pasted("python -m gpupack +sweep=mnist_pack packing.modes=[process,fused]"),
                           "packing.factors=[1,2]", "packing.repeats=1", "sweep.grid.batch_size=[128]",
                           "sweep.fixed.train_samples=4000", "sweep.fixed.val_samples=500", "sweep.fixed.epochs=1",
                           f"run_dir={run_dir}"], capture_output=True, text=True, env=subprocess_env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {(g["mode"], g["factor"]) for g in summary["groups"]} == {("process", 1), ("process", 2), ("fused", 1),
                                                                      ("fused", 2)}
    assert all(g["failed"] == 0 for g in summary["groups"])
    assert "Best (mode, N) for mnist_torch on local (cpu):" in proc.stdout


def test_resnets_with_batchnorm_fuse_with_their_own_statistics():
    """cifar10_torch (conv + BatchNorm): weights and each model's running statistics as alone, one epoch
    (BatchNorm amplifies float rounding over further steps at this learning rate: 1e-7 after one epoch here)."""
    from types import SimpleNamespace

    import numpy as np

    from gpupack.job.workloads.cifar10_torch import small_resnet

    cifar = load_workload("cifar10_torch")
    rng = np.random.default_rng(0)
    data = SimpleNamespace(x_train=rng.integers(0, 255, (300, 32, 32, 3), dtype=np.uint8),
                           y_train=rng.integers(0, 10, 300).astype(np.uint8),
                           x_test=rng.integers(0, 255, (50, 32, 32, 3), dtype=np.uint8),
                           y_test=rng.integers(0, 10, 50).astype(np.uint8), source="synthetic")
    group = [cifar.params({**cifar.defaults(), "lr": lr, "seed": seed, "train_samples": 128, "val_samples": 50,
                           "batch_size": 32, "epochs": 1, "width": 4, "blocks": 1})
             for lr, seed in ((0.05, 0), (0.1, 1))]
    torch.set_num_threads(1)
    alone, accuracy = [], []
    for p in group:
        built = []
        out = _torch_common.run(p, _ctx(), data, lambda nn, p=p: built.append(small_resnet(nn, p.width, p.blocks))
                                or built[-1], weight_decay=5e-4, eval_batch=1000)
        alone.append({k: v.detach() for k, v in built[0].state_dict().items()})
        accuracy.append(out["val_accuracy"])
    kept: list[dict] = []
    results = _torch_fused.train_fused(group, [_ctx(), _ctx()], data, lambda nn, p: small_resnet(nn, p.width, p.blocks),
                                       weight_decay=5e-4, eval_batch=1000, keep=kept)
    for i, (a, f) in enumerate(zip(alone, kept)):
        assert a.keys() == f.keys()  # running_mean/var and num_batches_tracked too
        for name in a:
            assert torch.allclose(a[name].double(), f[name].double(), rtol=1e-5, atol=1e-5), (i, name)
        assert results[i]["val_accuracy"] == accuracy[i]  # evaluated with running statistics, as alone
