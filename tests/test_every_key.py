"""Every key of the composed config, one row each: a bad value is refused by the real CLI before anything runs (one
line, exit 2, no run directory, nothing asked of the cluster), naming the key; then the HINT's own value is applied
and accepted (issue 42, item 4). The keys are those of ``python -m gpupack +sweep=mnist_pack --cfg job`` with
cluster=local and cluster=slurm, each mode's and strategy's options included whether or not the run uses them."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gpupack.cli import main
from gpupack.core.store.rundir import RunDir
from gpupack.errors import ConfigError
from gpupack.job.workloads import load_workload
from gpupack.submit.slurm import SlurmSubmitter, commands
from gpupack.sweep.setup.compose import compose_config
from gpupack.sweep.setup.validate import requested_partitions
from gpupack.workload import Range

BASE = ["+sweep=mnist_pack", "packing.factors=[1,2]"]
SLURM = ["cluster=slurm"]

# (overrides, what the one line must also hold). The key the line names is the override's, or the one given first.
LOCAL = [
    # packing.*
    (["packing.factors=4"], ["packing.factors=4", "must be a list", "HINT: packing.factors=[4]"]),
    (["packing.factors=[2,2]"], ["packing.factors=[2, 2]", "listed twice", "packing.factors=[2]"]),
    (["packing.factors=[0]"], ["packing.factors[0]=0", "whole number >= 1"]),
    (["packing.then=go"], ["packing.then='go'"]),
    (["packing.auto.ladder=[3,1]"], ["packing.auto.ladder=[3, 1]", "rising"]),
    (["packing.auto.min_gain=1.5"], ["packing.auto.min_gain=1.5", "[0, 1)"]),
    (["packing.auto.repeats=1"], ["packing.auto.repeats=1", ">= 2"]),
    (["packing.auto.objective=speed"], ["packing.auto.objective='speed'"]),
    (["packing.memory_fraction=0"], ["packing.memory_fraction=0", "(0, 1]"]),
    (["packing.memory_fraction=1.5"], ["packing.memory_fraction=1.5", "(0, 1]"]),
    (["packing.memory_share=maybe"], ["packing.memory_share='maybe'"]),
    (["packing.memory_margin=-1"], ["packing.memory_margin=-1", ">= 0"]),
    (["packing.admission=maybe"], ["packing.admission='maybe'"]),
    (["packing.host_memory_mb=-1"], ["packing.host_memory_mb=-1", "> 0 or null"]),
    (["packing.host_memory_mb=80000000"], ["packing.host_memory_mb=8", "looks like bytes"]),
    (["packing.modes=[process,process]"], ["packing.modes=['process', 'process']", "listed twice",
                                           "packing.modes=[process]"]),
    (["packing.modes=[proces]"], ["packing.modes[0]='proces'", "'process'"]),
    (["packing.repeats=0"], ["packing.repeats=0", ">= 1"]),
    (["packing.remeasure=-1"], ["packing.remeasure=-1", "whole number >= 0"]),
    (["packing.order=random"], ["packing.order='random'"]),
    (["packing.order_seed=x"], ["packing.order_seed"]),
    (["packing.stream=maybe"], ["packing.stream='maybe'"]),
    (["packing.jobs=0"], ["packing.jobs=0", "> 0 or null"]),
    (["packing.threads_per_training=0"], ["packing.threads_per_training=0", "> 0 or null"]),
    (["packing.device=tpu"], ["packing.device='tpu'"]),
    (["packing.sample_interval_s=0"], ["packing.sample_interval_s=0", "> 0"]),
    (["packing.training_timeout_s=-1"], ["packing.training_timeout_s=-1", "> 0 or null"]),
    (["packing.memory_limit_gb_per_training=0"], ["packing.memory_limit_gb_per_training=0", "> 0 or null"]),
    (["packing.memory_limit_gb_per_training=16384"], ["packing.memory_limit_gb_per_training=16384", "looks like MB",
                                                      "=16 "]),
    (["packing.process.start=bogus"], ["packing.process.start='bogus'"]),  # process's options: its mode in use
    (["packing.modes=[fused]", "packing.process.start=bogus"], ["packing.process.start='bogus'"]),  # and not
    (["packing.tf_logical.gpu_memory_budget_mb=0"], ["packing.tf_logical.gpu_memory_budget_mb=0", "> 0 or null"]),
    (["packing.tf_logical.gpu_memory_budget_mb=8000000000"], ["packing.tf_logical.gpu_memory_budget_mb=8000000000",
                                                             "looks like bytes"]),
    (["packing.tf_logical.gpu_memory_reserve_mb=-5"], ["packing.tf_logical.gpu_memory_reserve_mb=-5", ">= 0"]),
    # sweep.*
    (["sweep.name=../x"], ["sweep.name='../x'"]),
    (["sweep.workload=mnist_trch"], ["sweep.workload='mnist_trch'", "'mnist_torch'"]),
    (["sweep.grid.lr=[0.1,0.1]"], ["sweep.grid.lr=[0.1, 0.1]", "listed twice", "sweep.grid.lr=[0.1]"]),
    (["sweep.grid.batch_size=[64,64]"], ["sweep.grid.batch_size=[64, 64]", "listed twice"]),
    (["sweep.grid.lr=[0.1,-1]"], ["sweep.grid.lr=-1.0", "must be > 0"]),
    (["sweep.grid.batch_size=[0]"], ["sweep.grid.batch_size=0", ">= 1"]),
    (["sweep.grid.seed=[-1]"], ["sweep.grid.seed=-1", ">= 0"]),
    (["sweep.fixed.momentum=-0.9"], ["sweep.fixed.momentum=-0.9", "in [0, 1)", "sweep.fixed.momentum=0.9"]),
    (["sweep.fixed.momentum=1"], ["sweep.fixed.momentum=1.0", "in [0, 1)"]),
    (["sweep.fixed.epochs=0"], ["sweep.fixed.epochs=0", ">= 1"]),
    (["sweep.fixed.train_samples=0"], ["sweep.fixed.train_samples=0", ">= 1"]),
    (["sweep.fixed.val_samples=0"], ["sweep.fixed.val_samples=0", ">= 1"]),
    (["+sweep.fixed.num_workers=-1"], ["sweep.fixed.num_workers=-1", ">= 0"]),
    (["+sweep.fixed.hidden=0"], ["sweep.fixed.hidden=0", ">= 1"]),
    (["sweep.fixed.model=resnet"], ["sweep.fixed.model='resnet'"]),
    (["sweep.training_estimate_s=-1"], ["sweep.training_estimate_s=-1", "> 0 or null"]),
    (["sweep.training_memory_mb=-5"], ["sweep.training_memory_mb=-5", "> 0 or null"]),
    (["sweep.training_memory_mb=524288000"], ["sweep.training_memory_mb=524288000", "looks like bytes",
                                              "HINT: sweep.training_memory_mb=500 "]),
    (["sweep.training_memory_mb=9000000"], ["sweep.training_memory_mb=9000000", "looks like bytes",
                                            "HINT: sweep.training_memory_mb=9 "]),
    # spread.*: checked whether or not spread.devices is empty
    (["spread.devices=[2,2]"], ["spread.devices=[2, 2]", "listed twice", "spread.devices=[2]"]),
    (["spread.devices=[0]"], ["spread.devices[0]=0", ">= 1"]),
    (["spread.repeats=0"], ["spread.repeats=0", "> 0 or null"]),
    (["spread.strategy=horovd"], ["spread.strategy='horovd'"]),
    (["spread.ddp_backend=mpi"], ["spread.ddp_backend='mpi'"]),
    (["spread.ddp_backend=[gloo,gloo]"], ["spread.ddp_backend=['gloo', 'gloo']", "twice"]),
    # collect.*, rgu.*
    (["collect.goal=up"], ["collect.goal='up'"]),
    (["collect.plots=maybe"], ["collect.plots='maybe'", "true or false"]),
    (["collect.metric=val_acc"], ["collect.metric='val_acc'", "collect.metric=val_accuracy"]),
    (["rgu.models.V100-16gb=0"], ["rgu.models.V100-16gb=0", "> 0"]),
    # cluster=local's own keys, and the top level
    (["cluster.timeout_min=0"], ["cluster.timeout_min=0", ">= 1"]),
    (["cluster.max_parallel_packs=0"], ["cluster.max_parallel_packs=0", ">= 1 or null"]),
    (["cluster.partition=../x"], ["cluster.partition='../x'"]),
    (["partitions=[local,local]"], ["partitions=['local', 'local']", "partitions=[local]"]),
    (["dry_run_packs=every"], ["dry_run_packs='every'", "unknown pack listing", "valid: all, few"]),
]

# search=optuna's keys (gpupack.search.options.OptunaSearchConfig, checked by read_search where they are declared):
# (overrides, what the one line must also hold, the fix its HINT gives: applied, a dry run accepts it; None: the HINT
# names another key to write, not a value)
SEARCH_BASE = ["search=optuna", "packing.factors=[2]", "+search.space.lr=interval(0.01, 0.1)"]
SEARCH_ROWS: list[tuple[list[str], list[str], list[str] | None]] = [
    (["search.sampler=TPE"], ["search.sampler='TPE'", "no such class"], ["search.sampler=TPESampler"]),
    (["+search.sampler_kwargs.n_startup=3"], ["search.sampler_kwargs.n_startup=3", "'n_startup_trials'"], None),
    (["search.seed=-1"], ["search.seed=-1", ">= 0"], ["search.seed=0"]),
    (["search.seed=x"], ["search.seed='x'", "Integer"], None),
    (["~search.space.lr", "~sweep.space.lr", "~sweep.space.batch_size"],  # no space given, nor the preset's
     ["search.space={}", "empty"], ["+search.space.lr='tag(log, interval(1e-4, 1e-1))'"]),
    (["search.space.lr=interval(1,0.1)"], ["search.space.lr='interval(1,0.1)'", "low end"],
     ["search.space.lr='tag(log, interval(1e-4, 1e-1))'"]),
    (["search.space.lr=0.1"], ["search.space.lr='0.1'", "not a range"],
     ["search.space.lr='tag(log, interval(1e-4, 1e-1))'"]),
    (["+search.space.lrr=interval(0.1,1)"], ["search.space.lrr", "'lr'"], None),
    (["search.n_trials=0"], ["search.n_trials=0", "at least one"], ["search.n_trials=32"]),
    (["search.device_hours=0"], ["search.device_hours=0.0", "> 0 or null"], ["search.device_hours=1.0"]),
    (["search.pruner=Median"], ["search.pruner='Median'", "no such class"], ["search.pruner=MedianPruner"]),
    (["+search.pruner_kwargs.warmup=2"], ["search.pruner_kwargs.warmup=2", "'n_warmup_steps'"], None),
    (["+search.pruner_kwargs.n_warmup_steps=-1"], ["search.pruner_kwargs={'n_warmup_steps': -1}", "Optuna refuses"],
     ["search.pruner_kwargs={}"]),
    (["search.metric=val_acc"], ["search.metric='val_acc'", "no such metric"], ["search.metric=val_accuracy"]),
    (["search.metric=train_loss"], ["collect.goal=None", "which way train_loss is better"], ["collect.goal=min"]),
    (["search.intermediate='(x'"], ["search.intermediate='(x'", "mnist_torch reports its intermediate values"],
     ["search.intermediate=null"]),  # a command workload's pattern: test_a_bad_intermediate_pattern_is_named
    (["packing.factors=[]"], ["packing.factors=[]", "HINT"], None),  # several N are measured first: none is none
]

# cluster=slurm (conf/cluster/slurm.yaml): refused before sinfo or sacct is asked anything.
SLURM_ROWS = [
    (["cluster.timeout_min=0"], ["cluster.timeout_min=0", ">= 1"]),
    (["cluster.signal_delay_s=-30"], ["cluster.signal_delay_s=-30", "whole number > 0"]),
    (["cluster.signal_delay_s=3600"], ["cluster.signal_delay_s=3600", "before the time limit",
                                       "cluster.timeout_min=60: 3600 s"]),
    (["cluster.timeout_min=1"], ["cluster.signal_delay_s=90", "cluster.timeout_min=1: 60 s",
                                 "HINT: cluster.signal_delay_s=30"]),
    (["cluster.poll_s=-1"], ["cluster.poll_s=-1", "> 0"]),
    (["cluster.max_num_timeout=-1"], ["cluster.max_num_timeout=-1", ">= 0"]),
    (["cluster.array_parallelism=0"], ["cluster.array_parallelism=0", "> 0"]),
    (["cluster.cpus_per_training=0"], ["cluster.cpus_per_training=0", "> 0"]),
    (["cluster.mem_gb_per_training=0"], ["cluster.mem_gb_per_training=0", "> 0 or null"]),
    (["cluster.mem_gb_per_training=16384"], ["cluster.mem_gb_per_training=16384", "looks like MB", "=16 "]),
    (["cluster.max_jobs_per_user=0"], ["cluster.max_jobs_per_user=0", "> 0 or null"]),
    (["cluster.default_partitions=[p10]"], ["cluster.default_partitions[0]='p10'", "=[p100]"]),
    (["cluster.default_partitions=[p100,p100]"], ["cluster.default_partitions=['p100', 'p100']", "listed twice"]),
    (["partitions=[v100]", "cluster.default_partitions=[p10]"], ["cluster.default_partitions[0]='p10'"]),  # unused
    (["partitions=[v100,v100]"], ["partitions=['v100', 'v100']", "listed twice", "partitions=[v100]"]),
    (["partitions=[v10]"], ["partitions[0]='v10'", "'v100'"]),
    (["cluster.partitions.a100.max_mem_gb=4000000000"], ["cluster.partitions.a100.max_mem_gb=4000000000",
                                                         "looks like bytes"]),  # a100: a partition not chosen
    (["cluster.partitions.a100.max_mem_gb=0"], ["cluster.partitions.a100.max_mem_gb=0", "> 0 or null"]),
    (["cluster.partitions.a100.bundle_mem_gb=-1"], ["cluster.partitions.a100.bundle_mem_gb=-1", "> 0 or null"]),
    (["cluster.partitions.a100.max_cpus=0"], ["cluster.partitions.a100.max_cpus=0", "> 0 or null"]),
    (["cluster.partitions.a100.bundle_cores=0"], ["cluster.partitions.a100.bundle_cores=0", "> 0 or null"]),
    (["cluster.partitions.a100.gpus_per_job=0"], ["cluster.partitions.a100.gpus_per_job=0", "> 0"]),
    (["cluster.partitions.a100.whole_node_gpus=0"], ["cluster.partitions.a100.whole_node_gpus=0", "> 0 or null"]),
    (["cluster.partitions.a100.request=gress"], ["cluster.partitions.a100.request='gress'", "'gres'"]),
    # the site's rules (cluster.rules.*, issue 43): each rule's own keys, then each rule against a partition's keys
    (["cluster.rules.one_mig_per_job.quote=q", "cluster.rules.one_mig_per_job.source=s",
      "cluster.rules.one_mig_per_job.since=2026-4-6"], ["cluster.rules.one_mig_per_job.since='2026-4-6'", "YYYY-MM-DD",
                                                        "since=2026-04-06"]),
    (["cluster.rules.gpu_model.source=s"], ["cluster.rules.gpu_model.quote=''", "words"]),
    (["cluster.rules.whole_node.quote=q"], ["cluster.rules.whole_node.source=''", "page"]),
    (["cluster.rules.one_mig_per_job.quote=q", "cluster.rules.one_mig_per_job.source=s",
      "cluster.partitions.a100.mig=true", "cluster.partitions.a100.gpus_per_job=2"],
     ["cluster.partitions.a100.gpus_per_job=2", "one MIG instance per job", '("q", s)', "gpus_per_job=1"]),
    (["cluster.rules.gpu_model.quote=q", "cluster.rules.gpu_model.source=s", "cluster.partitions.a100.gpu=null"],
     ["cluster.partitions.a100.gpu=None", "names no model", '("q", s)', "gpu=a100"]),
    (["cluster.rules.whole_node.quote=q", "cluster.rules.whole_node.source=s",
      "cluster.partitions.a100.whole_node_gpus=4", "cluster.partitions.a100.gpus_per_job=2"],
     ["cluster.partitions.a100.gpus_per_job=2", "whole node of 4", '("q", s)']),
]

# Keys whose type alone is checked (the schema's): a bad value is refused in one line naming the key.
TYPED_ROWS = [
    (["cluster.partitions.a100.mig=maybe"], "cluster.partitions.a100.mig='maybe'"),
    (["cluster.rules.one_mig_per_job.in_force=maybe"], "cluster.rules.one_mig_per_job.in_force='maybe'"),
]

# The keys whose fixed value is accepted but the run then stops at another key's check (what the fix leaves).
ELSEWHERE: set[str] = set()

# The rows whose HINT names no single value to apply: (the key's own fix is a choice the user makes).
NO_VALUE = {"packing.order_seed", "sweep.name", "cluster.partition", "sweep.fixed.model"}


def refused(argv: list[str], capsys: Any, run_dir: Path) -> str:
    code = main(argv + [f"run_dir={run_dir}"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err  # the documented exit code of bad input
    assert len(err.splitlines()) == 1 and err.startswith("gpupack: error: "), err
    assert "Traceback" not in err and "HINT: " in err, err
    assert not run_dir.exists()  # nothing written, so nothing submitted
    return err


def named_key(err: str) -> str:
    """The key an error line names: ``gpupack: error: KEY=VALUE: ...``."""
    return err.removeprefix("gpupack: error: ").split("=", 1)[0]


def hinted(err: str, key: str) -> tuple[str, str] | None:
    """The (key, value) a HINT gives to apply: ``KEY=VALUE`` for the named key (a list index dropped), else the
    first of the choices it lists; None where it names no value."""
    hint = err.split("HINT: ", 1)[1]
    base = re.sub(r"\[\d+\]$", "", key)
    for k, v in re.findall(r"([\w.\-]+)=(\[[^\]]*\]|[^\s,;)]+)", hint):
        if k == base:
            return k, v
    choice = re.match(r"(?:did you mean '([^']+)'|valid: ([^,\s]+))", hint)
    if choice:  # one of a list's items: the list of it
        value = choice.group(1) or choice.group(2)
        return base, f"[{value}]" if base != key else value
    return None


def with_fix(overrides: list[str], key: str, value: str) -> list[str]:
    return [o for o in overrides if o.lstrip("+~").split("=", 1)[0] != key] + [f"{key}={value}"]


@pytest.mark.parametrize("overrides, needles", LOCAL, ids=[" ".join(c[0]) for c in LOCAL])
def test_a_bad_value_of_any_key_is_one_line_and_its_hint_is_accepted(tmp_path: Path, capsys: Any,
                                                                      overrides: list[str], needles: list[str]) -> None:
    err = refused(BASE + overrides, capsys, tmp_path / "run")
    for needle in needles:
        assert needle in err, err
    key = named_key(err)
    fix = hinted(err, key)
    if fix is None:
        assert re.sub(r"\[\d+\]$", "", key) in NO_VALUE, f"the HINT names no value: {err}"
        return
    code = main(BASE + with_fix(overrides, *fix) + ["dry_run=true", f"run_dir={tmp_path / 'run'}"])
    out, again = capsys.readouterr()
    if code:  # the fix is accepted; what then stops the run is another key's, and said so
        other = named_key(again.strip())
        assert re.sub(r"\[\d+\]$", "", other) != fix[0] and key in ELSEWHERE, f"{fix}: {again}"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, needles, fix", SEARCH_ROWS, ids=[" ".join(c[0]) for c in SEARCH_ROWS])
def test_a_bad_search_value_is_one_line_and_its_hint_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 overrides: list[str], needles: list[str],
                                                                 fix: list[str] | None) -> None:
    err = refused(["+sweep=mnist_pack", *SEARCH_BASE, *overrides], capsys, tmp_path / "run")
    for needle in needles:
        assert needle in err, err
    if fix is None:
        return
    assert f"HINT: {fix[0]}" in err, err
    keys = tuple(f.lstrip("+~").split("=", 1)[0] for f in fix)  # the fixed keys, and what the bad value put under them
    under = tuple(f"{k}." for k in keys)
    kept = [o for o in SEARCH_BASE + overrides if (k := o.lstrip("+~").split("=", 1)[0]) not in keys
            and not k.startswith(under)]
    code = main(["+sweep=mnist_pack", *kept, *fix, "dry_run=true", f"run_dir={tmp_path / 'run'}"])
    assert code == 0, capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.fixture
def no_cluster(monkeypatch: Any) -> None:
    """sinfo/sacct must not be asked: the value is refused before."""
    def asked(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the cluster was asked {args}")

    monkeypatch.setattr(commands, "slurm_command", asked)


@pytest.mark.parametrize("overrides, needles", SLURM_ROWS, ids=[" ".join(c[0]) for c in SLURM_ROWS])
def test_a_bad_slurm_value_is_refused_before_the_cluster_is_asked(tmp_path: Path, capsys: Any, no_cluster: None,
                                                                  overrides: list[str], needles: list[str]) -> None:
    err = refused(BASE + SLURM + overrides, capsys, tmp_path / "run")
    for needle in needles:
        assert needle in err, err
    key = named_key(err)
    fix = hinted(err, key)
    assert fix is not None, f"the HINT names no value: {err}"
    fixed = with_fix(overrides, *fix)
    cfg = compose_config(BASE + SLURM + fixed)
    submitter = SlurmSubmitter(cfg.cluster, RunDir(tmp_path / "run"))
    try:  # the submitter's own checks, as prepare asks them (sinfo is not asked)
        submitter.check(submitter.resolve_partitions(requested_partitions(cfg.partitions)))
    except ConfigError as other:
        assert other.key != key, f"{fix}: {other}"


@pytest.mark.parametrize("overrides, needle", TYPED_ROWS, ids=[" ".join(c[0]) for c in TYPED_ROWS])
def test_a_bad_typed_slurm_value_is_refused_before_the_cluster_is_asked(tmp_path: Path, capsys: Any, no_cluster: None,
                                                                        overrides: list[str], needle: str) -> None:
    err = refused(BASE + SLURM + overrides, capsys, tmp_path / "run")
    assert needle in err and "bool" in err, err


# The declared ranges, pure: (range, inside, outside).
RANGES = [
    (Range(0, 1, high_open=True), [0, 0.5, 0.999], [-0.1, 1, 1.5]),
    (Range(low=0, low_open=True), [1e-9, 3], [0, -1]),
    (Range(low=1), [1, 10**6], [0, -3]),
    (Range(high=5, high_open=True), [-10, 4.9], [5, 6]),
]


@pytest.mark.parametrize("declared, inside, outside", RANGES, ids=[r[0].text() for r in RANGES])
def test_a_range_holds_what_it_says_and_suggests_a_value_inside(declared: Range, inside: list[float],
                                                                 outside: list[float]) -> None:
    assert all(declared.holds(v) for v in inside) and not any(declared.holds(v) for v in outside)
    for default in (*inside, *outside, None):
        assert default is None or declared.holds(declared.example(default))


@pytest.mark.parametrize("name", ["mnist_torch", "mnist_tf", "cifar10_torch", "cifar10_tf", "resnet50"])
def test_every_builtin_workloads_defaults_are_inside_its_declared_ranges(name: str) -> None:
    workload = load_workload(name)
    ranges = workload.Params.ranges
    assert {"lr", "momentum", "batch_size", "epochs", "train_samples"} <= set(ranges)
    workload.check_ranges(workload.params(workload.defaults()))


@pytest.mark.parametrize("pattern, needle", [("(x", "not a regular expression"), ("loss", "has 0 groups")])
def test_a_bad_intermediate_pattern_is_named(pattern: str, needle: str) -> None:
    """search.intermediate over a command workload's output: a pattern that is no regular expression, or holds no
    group for the number, is one ConfigError naming the key, with a pattern that works as the HINT."""
    from gpupack.errors import ConfigError
    from gpupack.search.options import read_search

    with pytest.raises(ConfigError) as refused_:
        read_search({"space": {"lr": "interval(0.01, 0.1)"}, "intermediate": pattern}, "loss", "min", None,
                    "command", curve_in_output=True)
    said = str(refused_.value)
    assert said.startswith(f"search.intermediate={pattern!r}") and needle in said and "HINT" in said, said
