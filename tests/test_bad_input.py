"""Bad input stops before anything starts: one line naming the key, the value and the fix; non-zero exit."""
from __future__ import annotations

import subprocess
import sys

import pytest

from gpupack.cli import main
from gpupack.errors import ConfigError
from tests.fakes import FakeConfig, use_fake_submitter

BASE = ["+sweep=mnist_pack"]

# (overrides, text the one-line error must contain: the key, the value)
CASES = [
    (["packing.factors=[0]"], ["packing.factors[0]=0", "HINT"]),
    (["packing.factors=[1,-2]"], ["packing.factors[1]=-2", "HINT"]),
    (["packing.factors=[1.5]"], ["packing.factors", "1.5", "HINT"]),
    (["packing.factors=[two]"], ["packing.factors", "two", "HINT"]),
    (["packing.factors=[]"], ["packing.factors=[]", "HINT"]),
    (["packing.factors=[2,2]"], ["packing.factors=[2, 2]", "twice"]),
    (["sweep.workload=mnist_trch"], ["sweep.workload='mnist_trch'", "mnist_torch"]),
    (["packing.modes=[proces]"], ["packing.modes[0]='proces'", "process"]),
    (["packing.modes=[]"], ["packing.modes=[]", "HINT"]),
    (["~sweep.grid.lr", "~sweep.grid.batch_size", "~sweep.grid.seed"], ["sweep.grid={}", "empty"]),
    (["sweep.grid.lr=[]"], ["sweep.grid.lr=[]", "HINT"]),
    (["sweep.grid.lr=[fast]"], ["sweep.grid.lr='fast'", "HINT"]),
    (["+sweep.grid.lrr=[0.1]"], ["sweep.grid.lrr", "'lr'"]),
    (["sweep.fixed.epoch=2"], ["sweep.fixed.epoch=2", "'epochs'"]),
    (["sweep.fixed.data_dir=/nonexistent/mnist"], ["sweep.fixed.data_dir='/nonexistent/mnist'", "does not exist"]),
    (["sweep.fixed.model=resnet"], ["sweep.fixed.model='resnet'", "mlp"]),
    (["packing.factr=[1]"], ["packing.factr", "factors"]),
    (["packing.repeats=0"], ["packing.repeats=0", "HINT"]),
    # packing.auto.* and packing.then, checked with explicit factors too (issue 29: they were accepted unused)
    (["packing.auto.min_gain=-1"], ["packing.auto.min_gain=-1.0", "HINT"]),
    (["packing.auto.repeats=0"], ["packing.auto.repeats=0", "HINT"]),
    (["packing.auto.ladder=[0]"], ["packing.auto.ladder[0]=0", "HINT"]),
    (["packing.auto.objective=speed"], ["packing.auto.objective='speed'", "time"]),
    (["packing.then=go"], ["packing.then='go'", "run"]),
    # search=optuna: its space and its one N (or auto), before anything runs; a search key without the group
    (["search.n_trials=8"], ["search.n_trials=8: sets a key of search, which no config chose",
                              "HINT: choose it first: search=optuna search.n_trials=8"]),
    (["search=optuna", "packing.factors=[2]", "+search.space.lr=interval(0.01,0.1)", "packing.stream=off"],
     ["packing.stream='off': a search streams its trials", "HINT: leave packing.stream=auto"]),
    (["hydra/sweeper=optuna"], ["hydra/sweeper='optuna': gpupack's own command plans and runs its sweep itself",
                                "HINT: search=optuna"]),
    (["hydra/launcher=gpupack_local"], ["hydra/launcher='gpupack_local': gpupack's own command", "my_app.py"]),
    (["search=optuna", "packing.factors=[2]", "+search.space.lr=interval(1,0.1)"], ["search.space.lr=", "HINT"]),
    (["search=optuna", "packing.factors=[2]", "+search.space.lr=interval(0.01,0.1)", "search.pruner=HyperbandPruner",
      "+search.pruner_kwargs.min_resource=0"],  # passes the constructor, fails at the first decision: said before
     ["search.pruner_kwargs={'min_resource': 0}: Optuna refuses them (ZeroDivisionError", "HINT"]),
    (["search=optuna", "packing.factors=[2]", "+search.space.lr=interval(0.01,0.1)", "+sweep.fixed.lr=0.5"],
     ["sweep.fixed.lr=0.5: is also searched (search.space.lr)", "HINT: drop one: ~sweep.fixed.lr"]),
    (["search=optuna", "packing.factors=[2]", "+search.space.lr=interval(0.01,0.1)",
      "search.intermediate='val: ([0-9.]+)'"],  # mnist_torch reports its curve itself: the pattern would read nothing
     ["search.intermediate='val: ([0-9.]+)': mnist_torch reports its intermediate values itself", "HINT"]),
    # the sweep's own space (a preset's default for search=optuna): checked whether a search runs or not
    (["sweep.space.lr=interval(1,0.1)"], ["sweep.space.lr=", "HINT"]),
    (["+sweep.space.lrr=interval(0.1,1)"], ["sweep.space.lrr=", "no hyperparameter 'lrr'", "HINT"]),
    (["packing.device=tpu"], ["packing.device='tpu'", "HINT"]),
    (["cluster=nowhere"], ["cluster", "nowhere", "local"]),
    (["cluster.partition=../x"], ["cluster.partition='../x'", "HINT"]),
    (["packing.factors=1,2"], ["packing.factors", "sweep.grid"]),
    (["sweep.grid.lr=[0.1"], ["sweep.grid.lr", "cannot parse"]),
    (["sweep.fixed.data_dir=/etc/passwd"], ["sweep.fixed.data_dir='/etc/passwd'", "HINT"]),
    (["run_dir=/proc/gpupack-run"], ["run_dir='/proc/gpupack-run'", "not writable"]),
    (["packing.threads_per_training=0"], ["packing.threads_per_training=0", "HINT"]),
    (["packing.training_timeout_s=-1"], ["packing.training_timeout_s=-1", "HINT"]),
    (["packing.memory_limit_gb_per_training=0"], ["packing.memory_limit_gb_per_training=0", "HINT"]),
    (["cluster.timeout_min=0"], ["cluster.timeout_min=0", "HINT"]),
    (["sweep.training_estimate_s=600", "cluster.timeout_min=5"], ["cluster.timeout_min=5", "estimate"]),
    (["sweep.training_estimate_s=60", "packing.training_timeout_s=30"], ["packing.training_timeout_s=30.0",
                                                                         "estimate"]),
    (["sweep.fixed.batch_size=0"], ["sweep.fixed.batch_size=0", "HINT"]),
    (["sweep.grid.seed=[a]"], ["sweep.grid.seed='a'", "HINT"]),
    (["grid.lr=[0.1]"], ["grid.lr='[0.1]'", "did you mean sweep.grid.lr=[0.1]"]),
    (["packing.factors=[100000]"], ["packing.factors[0]=100000", "budget", "lower N to at most"]),
    (["packing.factors=abc"], ["packing.factors='abc'", "auto"]),
    (["packing.factors=auto", "packing.modes=[process,fused]"], ["packing.modes=", "one mode"]),
    (["packing.factors=auto", "packing.then=go"], ["packing.then='go'", "run"]),
    (["packing.factors=auto", "wait=false"], ["wait=False", "runs jobs in this process"]),  # the local backend
    (["packing.factors=auto", "packing.auto.ladder=[3,1]"], ["packing.auto.ladder=[3, 1]", "rising"]),
    (["packing.factors=auto", "packing.auto.min_gain=1.5"], ["packing.auto.min_gain=1.5", "HINT"]),
    (["packing.factors=auto", "packing.auto.repeats=1"],
     ["packing.auto.repeats=1", "two packs", "packing.auto.repeats=3"]),
    (["packing.memory_fraction=0"], ["packing.memory_fraction=0", "80 %"]),
    (["sweep.training_memory_mb=-5"], ["sweep.training_memory_mb=-5", "HINT"]),
    (["packing.order=random"], ["packing.order='random'", "interleaved"]),
    (["sweep.workload=command", "sweep.fixed.argv=[python,t.py,--lr,{lr]"],
     ["sweep.fixed.argv=", "cannot parse", '"{lr}"', '"{python}"']),
    # spread: one training over k devices (issue 13)
    (["spread.devices=[1,512]"], ["spread.devices[1]=512", "a local node has", "k <="]),
    (["spread.devices=[1,2]", "spread.strategy=mirrored"], ["spread.strategy='mirrored'", "torch workload",
                                                            "spread.strategy=ddp"]),
    (["spread.devices=[1,2]", "spread.strategy=ddp", "sweep.workload=mnist_tf"],
     ["spread.strategy='ddp'", "tensorflow workload", "spread.strategy=mirrored"]),
    (["spread.devices=[1,2]", "spread.ddp_backend=nccl"], ["spread.ddp_backend='nccl'", "gloo"]),
    (["spread.devices=[2]", "spread.ddp_backend=mpi"], ["spread.ddp_backend='mpi'", "HINT"]),
    (["spread.devices=[0]"], ["spread.devices[0]=0", "HINT"]),
    (["spread.devices=[2,2]"], ["spread.devices=[2, 2]", "twice"]),
    (["spread.devices=[2]", "spread.strategy=horovod"], ["spread.strategy='horovod'", "ddp"]),
    (["spread.devices=[2]", "spread.repeats=0"], ["spread.repeats=0", "HINT"]),
    (["spread.devices=[2]", "packing.factors=auto"], ["spread.devices=[2]", "auto"]),
    (["spread.devices=[1,2]", "spread.strategy=mirrored", "sweep.workload=mnist_tf", "sweep.grid.batch_size=[63]"],
     ["sweep.grid.batch_size=63", "spread.devices has 2", "divisible by 2"]),
    (["spread.devices=[1,2]", "sweep.grid.batch_size=[1]"], ["sweep.grid.batch_size=1", "batch_size >= 2"]),
    (["spread.devices=[1,2]", "spread.strategy=mirrored", "sweep.workload=mnist_tf", "spread.ddp_backend=nccl"],
     ["spread.ddp_backend='nccl'", "option of spread.strategy=ddp"]),
]


@pytest.mark.parametrize("overrides, needles", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_clear_line_and_starts_nothing(tmp_path, capsys, overrides, needles):
    run_dir = tmp_path / "run"
    has_run_dir = any(o.startswith("run_dir=") for o in overrides)
    code = main(BASE + overrides + ([] if has_run_dir else [f"run_dir={run_dir}"]))
    err = capsys.readouterr().err.strip()
    assert code == 2, err  # the documented exit code of bad input
    assert len(err.splitlines()) == 1, err
    assert err.startswith("gpupack: error: ")
    for needle in needles:
        assert needle in err, err
    assert "HINT:" in err
    assert not run_dir.exists()  # nothing was written, so nothing was submitted


# The same checks against what a backend says its partitions hold (tests/fakes.py's table: v100 16 GB, 8 CPUs and
# 40 GB per GPU job, nodes of 4 GPUs; cpu: no GPU, 16 CPUs, 64 GB), whatever this machine has: no NVML, no sinfo.
FAKE_CASES = [
    (["partitions=[v100]", "packing.factors=[1,9]"], {},
     ["packing.factors[1]=9", "9 CPUs", "at most 8", "cluster.cpus_per_training=0.89"]),
    (["partitions=[k80]"], {}, ["partitions[0]='k80'", "no such partition", "v100"]),
    (["partitions=[v100]", "packing.factors=[21]"], {"cpus_per_training": 0.25},
     ["packing.factors[0]=21", "42.0 GB", "a v100 node has 40.0 GB", "cluster.mem_gb_per_training"]),
    (["partitions=[v100]", "packing.factors=[1,200]"], {"cpus_per_training": None, "mem_gb_per_training": None},
     ["packing.factors[1]=200", "GPU memory", "v100's budget is 12.8 GB", "at most 12"]),
    (["partitions=[v100,cpu]", "packing.factors=[1,200]"], {"cpus_per_training": None, "mem_gb_per_training": None},
     ["packing.factors[1]=200", "at most 12"]),
    (["partitions=[cpu]", "packing.factors=[1,200]"], {"cpus_per_training": None, "mem_gb_per_training": None},
     ["packing.factors[1]=200", "host memory", "cpu's budget is 51.2 GB", "at most 51"]),
]


@pytest.mark.parametrize("overrides, config, needles", FAKE_CASES, ids=[" ".join(c[0]) for c in FAKE_CASES])
def test_bad_input_against_a_backends_capacities(tmp_path, capsys, monkeypatch, overrides, config, needles):
    made = use_fake_submitter(monkeypatch, config=FakeConfig(**config))
    run_dir = tmp_path / "run"
    code = main(BASE + overrides + [f"run_dir={run_dir}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("gpupack: error: "), err
    for needle in needles:
        assert needle in err, err
    assert "HINT:" in err
    assert not run_dir.exists()
    [backend] = made
    partitions = next(o for o in overrides if o.startswith("partitions="))[len("partitions=["):-1].split(",")
    known = all(p in backend.table for p in partitions)
    assert backend.asked == ([tuple(partitions)] if known else [])  # asked once, before anything else; never ran
    assert backend.ran == []


def test_input_that_fits_the_backends_capacities_plans_and_runs_nothing_on_dry_run(tmp_path, capsys, monkeypatch):
    made = use_fake_submitter(monkeypatch)
    code = main(BASE + ["partitions=[v100,h100]", "packing.factors=[1,8]", "dry_run=true", f"run_dir={tmp_path}/r"])
    out = capsys.readouterr().out
    assert code == 0 and "dry run: nothing was written" in out and "v100-process-n08-000" in out, out
    assert [b.asked for b in made] == [[("v100", "h100")]] and made[0].ran == []
    assert not (tmp_path / "r").exists()


def test_no_sweep_chosen(capsys):
    assert main([]) != 0
    assert "+sweep=" in capsys.readouterr().err


def test_unknown_sweep_lists_the_known_ones(capsys):
    assert main(["+sweep=mnist_pak"]) != 0
    err = capsys.readouterr().err
    assert "mnist_pak" in err and "mnist_pack" in err


@pytest.mark.slow
def test_bad_input_exit_code_from_the_command_line(tmp_path, subprocess_env):
    proc = subprocess.run([sys.executable, "-m", "gpupack", "+sweep=mnist_pack", "packing.factors=[0]",
                           f"run_dir={tmp_path / 'run'}"], capture_output=True, text=True, env=subprocess_env,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "packing.factors[0]=0" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_run_dir_of_another_sweep_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    assert main(BASE + [f"run_dir={run_dir}"]) != 0
    assert "not a gpupack run" in capsys.readouterr().err
    assert (run_dir / "notes.txt").read_text() == "mine"


def test_dry_run_also_refuses_a_run_dir_of_another_sweep(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "plan.json").write_text('{"schema": 1, "sweep": "other", "packs": []}')
    assert main(BASE + ["dry_run=true", f"run_dir={run_dir}"]) == 2
    assert "holds another sweep's plan" in capsys.readouterr().err
    assert sorted(p.name for p in run_dir.iterdir()) == ["plan.json"]


@pytest.mark.parametrize("key, values", [
    ("batch_size", [64, "128", 256]), ("lr", [1, "0.5", 0.25]), ("data_dir", [None, "/data"]), ("amp", [True, "false"]),
])
def test_a_grid_axis_is_typed_at_once_as_each_value_would_be(key, values):
    """typed_values validates a whole axis in one merge (a grid of thousands), with typed()'s result for each."""
    from gpupack.job.workloads import load_workload

    workload = load_workload("mnist_torch")
    assert workload.typed_values(key, values, "sweep.grid") == [workload.typed(key, v, "sweep.grid") for v in values]


@pytest.mark.parametrize("values, bad", [([64, "many", "x"], "many"), ([1.5], 1.5), ([2, None], None)])
def test_a_grid_axis_with_a_bad_value_names_the_first_in_typeds_words(values, bad):
    from gpupack.job.workloads import load_workload

    workload = load_workload("mnist_torch")
    with pytest.raises(ConfigError) as err:
        workload.typed_values("batch_size", values, "sweep.grid")
    with pytest.raises(ConfigError) as alone:
        workload.typed("batch_size", bad, "sweep.grid")
    assert str(err.value) == str(alone.value)


def test_a_search_key_without_its_group_is_one_line_for_a_sweep_found_on_a_searchpath(tmp_path, capsys):
    """search.n_trials=8 without search=optuna, for a sweep of tests/conf: the group is looked up with the
    hydra.searchpath the sweep is found through, and the refusal is the same one line."""
    run_dir = tmp_path / "run"
    code = main(["hydra.searchpath=[file://tests/conf]", "+sweep=probe_pack", "search.n_trials=8",
                 f"run_dir={run_dir}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "search.n_trials=8: sets a key of search, which no config chose" in err and not run_dir.exists()
