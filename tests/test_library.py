"""gpupack as a library (gpupack.sweep: prepare → run → status → collect, printing nothing) and the CLI's Hydra
habits (--cfg, --resolve, -p, --info, --help, and -m refused)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gpupack import sweep
from gpupack.cli import main
from gpupack.core.plan import make_plan
from gpupack.core.rundir import RunDir
from gpupack.core.types import DONE, FAILED, PENDING, RUNNING
from gpupack.errors import ConfigError, RunDirError

REPO = Path(__file__).resolve().parent.parent
PROBE = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack", "sweep.grid.lr=[0.1]"]


def test_prepare_writes_nothing_and_run_returns_typed_results(tmp_path, capsys):
    run_dir = tmp_path / "run"
    prepared = sweep.prepare(PROBE + ["packing.factors=[1,2]", "packing.repeats=1", f"run_dir={run_dir}"])
    assert not run_dir.exists() and not prepared.resumes()
    assert sorted(p.factor for p in prepared.plan.packs) == [1, 2]
    seen: list[sweep.Opened] = []
    states: list[tuple[str, str]] = []
    outcome = sweep.run(prepared, on_open=seen.append, progress=lambda p, s: states.append((p.pack_id, s)),
                        plots=False)
    assert capsys.readouterr().out == ""  # the library prints nothing; the CLI does
    assert outcome.ok and [r.ok for r in outcome.results] == [True, True]
    assert seen[0].resumed is False and len(seen[0].todo) == 2
    assert {s for _, s in states} == {"pending", "running", "done"}
    assert set(outcome.collected.summary["factor"]) == {1, 2}
    assert (run_dir / "summary.json") in outcome.written

    st = sweep.status(run_dir)
    assert [p.state for p in st.packs] == [DONE, DONE] and st.counts()["local"][DONE] == 2

    again = sweep.run(sweep.prepare(PROBE + ["packing.factors=[1,2]", "packing.repeats=1", f"run_dir={run_dir}"]),
                      collect_outputs=False)
    assert again.opened.resumed and again.opened.complete == 2 and again.opened.todo == []


def test_a_sweep_through_a_backend_that_runs_packs_in_this_process(tmp_path, monkeypatch):
    """The whole flow over tests/fakes.py's FakeSubmitter: asked its capacities once, each pack run through the real
    job body (run_pack) in this process, collected; then status and resume through the same backend."""
    from gpupack.core.records import read_json
    from tests.fakes import FakeConfig, use_fake_submitter

    made = use_fake_submitter(monkeypatch, config=FakeConfig(default_partitions=["cpu"]))
    run_dir = tmp_path / "run"
    overrides = PROBE + ["sweep.grid.lr=[0.1,0.2]", "packing.factors=[1,2]", "packing.device=cpu",
                         f"run_dir={run_dir}"]
    prepared = sweep.prepare(overrides)
    states: list[tuple[str, str]] = []
    outcome = sweep.run(prepared, progress=lambda p, s: states.append((p.pack_id, s)), plots=False)
    backend = made[0]
    assert backend.asked == [("cpu",)] and [p for p, _ in backend.ran] == [p.pack_id for p in prepared.plan.packs]
    assert outcome.ok and [r.ok for r in outcome.results] == [True] * 3
    assert states == [(p.pack_id, s) for p in prepared.plan.packs for s in ("pending", "running", "done")]
    for i, pack in enumerate(prepared.plan.packs, start=1):
        record = read_json(run_dir / "packs" / pack.pack_id / "pack.json")
        assert record["job_id"] == f"fake-{i}" and record["partition"] == "cpu"
        assert record["n_completed"] == pack.factor
    assert sorted(outcome.collected.summary["factor"]) == [1, 2]
    assert [p.state for p in sweep.status(run_dir).packs] == [DONE] * 3
    again = sweep.run(sweep.prepare(overrides), collect_outputs=False)
    assert again.opened.resumed and again.opened.todo == [] and made[-1].ran == []


def test_prepare_refuses_bad_input_before_anything(tmp_path):
    with pytest.raises(ConfigError, match=r"packing.factors\[0\]=0"):
        sweep.prepare(PROBE + ["packing.factors=[0]", f"run_dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()


def test_a_run_dir_holding_another_plan_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    sweep.run(sweep.prepare(PROBE + ["packing.factors=[1]", "packing.repeats=1", f"run_dir={run_dir}"]),
              collect_outputs=False)
    other = sweep.prepare(PROBE + ["packing.factors=[2]", "packing.repeats=1", f"run_dir={run_dir}"])
    with pytest.raises(RunDirError, match="another sweep's plan"):
        sweep.run(other)


PLAN = make_plan(sweep="s", workload="w", grid={"lr": [0.1, 0.2]}, fixed={}, factors=[2], modes=["process"],
                 partitions=["p"], repeats=1)
PACK = PLAN.packs[0]


@pytest.mark.parametrize("done, has_record, job, states, expected", [
    (2, True, None, {}, DONE),  # records first: complete whatever the queue says
    (0, False, None, {}, "not submitted"),
    ((1, True), False, None, {}, "stopped"),  # began here (local), stopped mid-run before its pack record
    ((0, True), False, None, {}, "stopped"),
    ((1, True, True), False, None, {}, RUNNING),  # began here and a live packer holds its lock (local)
    ((0, False, False, True), False, None, {}, PENDING),  # not begun, while a live sweep holds the run (local)
    (0, True, None, {}, FAILED),  # ran here (local backend) and left trainings unfinished
    (0, False, "7", {"7": PENDING}, PENDING),
    (1, False, "7", {"7": RUNNING}, RUNNING),
    (1, True, "7", {"7": DONE}, FAILED),  # the job ended, a training did not complete
    (0, False, "7", {"7": FAILED}, FAILED),
    (0, False, "7", {}, "submitted"),  # sacct does not know it yet
    (0, False, "7", None, "unknown"),  # the queue did not answer: say so, guess nothing
])
def test_pack_status_table(done, has_record, job, states, expected):
    done, started, held, sweep_held = (*done, False, False, False)[:4] if isinstance(done, tuple) else (
        done, False, False, False)
    assert sweep.pack_status(PACK, done, has_record, job, states, started=started, held=held,
                             sweep_held=sweep_held) == expected


def test_a_lock_is_held_here_by_a_live_holder_of_this_host(tmp_path):
    import socket
    import subprocess

    from gpupack.core.rundir import held_here, holder_line

    lock = tmp_path / ".lock"
    assert not held_here(lock)  # no lock file: nothing runs
    lock.write_text(holder_line())
    assert held_here(lock)  # this process
    lock.write_text(f"{os.getpid()} another-host\n")
    assert not held_here(lock)  # a pid of another host says nothing here
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock.write_text(f"{dead.pid} {socket.gethostname()}\n")
    assert not held_here(lock)  # a holder that died (killed mid-run)
    lock.write_text(f"{os.getpid()}\n")
    assert not held_here(lock)  # an older lock's line, with no host


def test_slurm_queue_states_map_to_gpupack_states():
    from gpupack.submit._slurm_queue import pack_state

    table = {"PENDING": PENDING, "REQUEUED": PENDING, "RUNNING": RUNNING, "COMPLETING": RUNNING, "COMPLETED": DONE,
             "FAILED": FAILED, "CANCELLED by 0": FAILED, "TIMEOUT": FAILED, "OUT_OF_MEMORY": FAILED,
             "NODE_FAIL": FAILED}
    assert {k: pack_state(k) for k in table} == table


def test_resume_fails_closed_when_the_queue_does_not_answer(tmp_path):
    from gpupack.core.rundir import RunDir
    from gpupack.errors import SubmissionError
    from gpupack.submit.slurm import SlurmConfig, SlurmSubmitter

    class Silent(SlurmSubmitter):
        def queue_states(self, job_ids):
            return None  # sacct did not answer

    run = RunDir(tmp_path)
    backend = Silent(SlurmConfig(), run)
    backend.remember({"p-process-n01-000": ("42", "p")})
    with pytest.raises(SubmissionError, match="nothing was submitted again"):
        backend.active_packs()


def test_find_runs_under_a_folder(tmp_path):
    for name in ("a/.gpupack/launch_000000", "a/.gpupack/launch_000002", "b"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "plan.json").write_text("{}")
    assert sweep.find_runs([tmp_path / "a"]) == [tmp_path / "a/.gpupack/launch_000000",
                                                  tmp_path / "a/.gpupack/launch_000002"]
    assert sweep.find_runs([tmp_path / "b"]) == [tmp_path / "b"]


# ---------------- the CLI's Hydra habits ----------------

def test_cfg_job_prints_the_composed_config_and_runs_nothing(tmp_path, capsys):
    assert main(["+sweep=mnist_pack", "packing.factors=[1,8]", "--cfg", "job", f"run_dir={tmp_path / 'r'}"]) == 0
    cfg = OmegaConf.create(capsys.readouterr().out)
    assert list(cfg.packing.factors) == [1, 8] and cfg.sweep.workload == "mnist_torch" and "hydra" not in cfg
    assert not (tmp_path / "r").exists()


def test_cfg_package_and_resolve(capsys):
    assert main(["+sweep=mnist_pack", "--cfg", "job", "-p", "sweep.grid", "--resolve"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# @package sweep.grid") and OmegaConf.create(out).lr == [0.05, 0.1]
    assert main(["+sweep=mnist_pack", "--cfg", "hydra"]) == 0
    assert "hydra" in OmegaConf.create(capsys.readouterr().out)
    assert main(["+sweep=mnist_pack", "--cfg", "jobs"]) == 2
    assert "--cfg='jobs'" in capsys.readouterr().err


def test_help_lists_config_groups_and_their_options(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "sweep: " in out and "mnist_pack" in out and "command" in out
    assert "cluster: " in out and "narval" in out and "local_schema" not in out


def test_help_sees_a_users_own_config_folder(capsys):
    own = REPO / "examples" / "own_workload" / "conf"
    assert main([f"hydra.searchpath=[file://{own}]", "-h"]) == 0
    assert "quadratic_pack" in capsys.readouterr().out


def test_info_says_versions_search_path_and_what_is_installed(capsys):
    assert main(["--info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpupack ") and "Config search path:" in out and "command" in out
    assert "packing modes: fused, process, tf_logical" in out and "backends: local, slurm" in out


def test_multirun_is_refused_with_what_to_do_instead(capsys):
    assert main(["+sweep=mnist_pack", "-m", "sweep.grid.lr=0.1,0.2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "gpupack is itself the sweeper" in err
    assert "sweep.grid.lr=0.1,0.01" in err and "hydra/launcher=gpupack_local" in err


def test_composing_gpupack_leaves_the_callers_hydra_version_base_alone():
    """A notebook or Hydra app calling gpupack keeps its own version_base (job.chdir and more depend on it)."""
    from hydra.version import VersionBase

    from gpupack.setup.compose import compose_config, group_options

    before = VersionBase.instance().getbase()
    compose_config(["+sweep=mnist_pack"])
    group_options()
    assert VersionBase.instance().getbase() is before


@pytest.mark.parametrize("ok, record, expected", [
    (True, {"n_failed": 0}, DONE),
    (True, {"n_failed": 2}, FAILED),  # the job ended, but trainings failed: not "done" in the progress lines
    (False, None, FAILED),
])
def test_a_pack_with_failed_trainings_shows_failed_in_progress(ok, record, expected):
    from gpupack.core.types import PackResult
    from gpupack.submit import progress_state

    assert progress_state(PackResult("p", "local", "1", ok=ok, record=record)) == expected


def test_packs_whose_every_training_failed_are_not_timed():
    import pandas as pd

    from gpupack.analysis.summary import summarize

    trainings = pd.DataFrame([{"training_id": f"t{i}", "pack_id": p, "workload": "w", "partition": "local",
                               "gpu_type": "cpu", "mode": "process", "factor": n, "status": s, "samples": 0}
                              for i, (p, n, s) in enumerate([("a", 1, "failed"), ("b", 2, "completed"),
                                                             ("b", 2, "completed")])])
    packs = pd.DataFrame([{"pack_id": "a", "factor": 1, "complete": True, "wall_s": 0.1, "n_completed": 0,
                           "partition": "local", "gpu_type": "cpu", "mode": "process"},
                          {"pack_id": "b", "factor": 2, "complete": True, "wall_s": 4.0, "n_completed": 2,
                           "partition": "local", "gpu_type": "cpu", "mode": "process"}])
    out = summarize(trainings, packs).set_index("factor")
    assert pd.isna(out.loc[1, "time_per_training_s"]) and out.loc[1, "failed"] == 1
    assert out.loc[2, "time_per_training_s"] == 2.0 and pd.isna(out.loc[2, "pack_samples_per_s"])


def test_each_mode_owns_its_options():
    """packing.<mode>.* is the mode's own dataclass, reaching the pack as PackSettings.mode_options."""
    from gpupack.pack.process import ProcessOptions
    from gpupack.pack.tf_logical import TfLogicalOptions

    p = sweep.prepare(["+sweep=mnist_pack", "packing.process.start=fresh", "packing.process.cpu_affinity=true",
                       "packing.tf_logical.gpu_memory_reserve_mb=512"])
    opts = p.settings.mode_options
    assert opts["process"] == ProcessOptions(start="fresh", cpu_affinity=True)
    assert opts["tf_logical"] == TfLogicalOptions(gpu_memory_reserve_mb=512)
    assert "fused" not in opts  # a mode with no options has no section


@pytest.mark.parametrize("holds, plan, expected", [
    ({}, None, False),  # new: an auto root is made
    ({"config.yaml": "packing:\n  factors: auto\n"}, None, True),  # an auto root resumed
    ({"config.yaml": "packing:\n  factors: [1, 2]\n"}, None, "holds another sweep"),
    ({"plan.json": "{}"}, None, "holds a sweep with fixed packing factors"),
    ({"notes.txt": "mine"}, None, "is not a gpupack run"),
    ({"notes.txt": "mine"}, PLAN, "is not a gpupack run"),
    ({}, PLAN, False),
])
def test_one_opener_of_a_run_directory_plain_or_auto(tmp_path, holds, plan, expected):
    """flow.run.open_run_dir opens a plain run's directory and a packing.factors=auto root alike (issue 29: two
    pieces of code did it)."""
    from gpupack.flow.run import open_run_dir

    run = RunDir(tmp_path / "run")
    for name, text in holds.items():
        (run.root / name).parent.mkdir(parents=True, exist_ok=True)
        (run.root / name).write_text(text)
    if isinstance(expected, str):
        with pytest.raises(RunDirError, match=expected):
            open_run_dir(run, plan)
    else:
        assert open_run_dir(run, plan) is expected and run.root.is_dir()
