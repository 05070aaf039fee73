"""Fast start: trainings forked from one preloaded server per pack keep the isolation of fresh processes (own
process and session, environment, cores, limits, logs, exit status), and the server steps aside when it cannot
start. CPU affinity shares the job's cores out."""
from __future__ import annotations

import os

import pytest

from gpupack.cli import main
from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.body import run_pack
from gpupack.job.pack.process import ProcessOptions, cpus_for, start_choice
from gpupack.job.workloads import load_workload


@pytest.mark.parametrize("cores, n, expected", [
    ([0, 1], 1, [[0, 1]]),
    ([0, 1], 2, [[0], [1]]),
    ([0, 1], 3, [[0], [1], [0]]),  # more trainings than cores: one core each, round-robin
    ([0, 1, 2, 3, 4], 2, [[0, 1, 2], [3, 4]]),  # the first gets the odd core
    ([4, 5, 6, 7], 4, [[4], [5], [6], [7]]),  # the job's own cores, not 0..n
    ([2, 9, 5], 1, [[2, 5, 9]]),
])
def test_cpus_for_shares_the_jobs_cores(cores, n, expected):
    shares = [cpus_for(cores, n, i) for i in range(n)]
    assert shares == expected
    if n <= len(cores):  # disjoint, and every core used
        assert sorted(c for s in shares for c in s) == sorted(cores)


def test_start_method_forks_only_what_can_be_forked():
    torch_like, tf, command = load_workload("mnist_torch"), load_workload("mnist_tf"), load_workload("command")
    assert start_choice("auto", [torch_like])[0] == "fork"
    assert start_choice("fresh", [torch_like])[0] == "fresh"
    assert start_choice("auto", [tf])[0] == "fresh" and start_choice("auto", [command])[0] == "fresh"


def _pack(tmp_path, n=2, **params):
    plan = make_plan(sweep="fs", workload="tests.fake_workloads", grid={"tag": [f"t{i}" for i in range(n)]},
                     fixed={"steps": 5, "sleep_s": 0.01, "report_env": "OMP_NUM_THREADS,CUDA_VISIBLE_DEVICES,MARK",
                            **params}, factors=[n], modes=["process"], partitions=["local"], repeats=1)
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.plan, plan.to_json())
    return run, plan.packs[0]


def _records(run, pack):
    return {t.params["tag"]: read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings}


def test_forked_trainings_are_processes_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("MARK", "from-the-job")
    run, pack = _pack(tmp_path, n=2)
    options = ProcessOptions(start="auto", cpu_affinity=True)
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu", mode_options={"process": options}))
    recs = _records(run, pack)
    assert rec["n_completed"] == 2
    pids = {r["metrics"]["pid"] for r in recs.values()}
    assert len(pids) == 2 and os.getpid() not in pids
    for r in recs.values():
        m = r["metrics"]
        assert r["start"] == "fork" and m["own_session"] is True
        assert m["env"] == {"OMP_NUM_THREADS": str(r["threads"]), "CUDA_VISIBLE_DEVICES": "3",
                            "MARK": "from-the-job"}  # the job's environment, threads capped
        assert m["cpus"] == r["cpus"] and len(m["cpus"]) >= 1
        t = r["timings"]
        assert t["spawned_at"] <= t["process_start"] <= t["loop_start"]  # start-up is fork → first step
        out = run.log(pack.pack_id, r["training_id"], "out")
        assert out.exists()
    if len(os.sched_getaffinity(0)) >= 2:
        assert recs["t0"]["metrics"]["cpus"] != recs["t1"]["metrics"]["cpus"]  # each its own share
    assert (run.pack_dir(pack.pack_id) / "logs" / "forkserver.err").exists()


def test_a_forked_training_that_raises_fails_alone_with_its_traceback(tmp_path):
    plan = make_plan(sweep="fs", workload="tests.fake_workloads", grid={"fail": [True, False]}, fixed={"steps": 3},
                     factors=[2], modes=["process"], partitions=["local"], repeats=1)
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.plan, plan.to_json())
    pack = plan.packs[0]
    rec = run_pack(str(run.root), pack.pack_id,
                   PackSettings(device="cpu", mode_options={"process": ProcessOptions(start="fork")}))
    recs = {t.params["fail"]: read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings}
    assert rec["n_completed"] == 1 and recs[False]["status"] == "completed"
    assert recs[True]["status"] == "failed" and recs[True]["exit_code"] == 1
    assert "probe failure on purpose" in recs[True]["error"] and recs[True]["start"] == "fork"


def test_a_server_that_cannot_preload_steps_aside_for_fresh_interpreters(tmp_path):
    run, pack = _pack(tmp_path, n=2, preload_fail=True)
    rec = run_pack(str(run.root), pack.pack_id,
                   PackSettings(device="cpu", mode_options={"process": ProcessOptions(start="auto")}))
    assert rec["n_completed"] == 2
    assert {r["start"] for r in _records(run, pack).values()} == {"fresh"}
    log = (run.pack_dir(pack.pack_id) / "logs" / "forkserver.err").read_text()
    assert "preload failure on purpose" in log and "fresh interpreter instead" in log


@pytest.mark.parametrize("overrides, needle", [
    (["packing.process.start=forked"], "packing.process.start='forked'"),
    (["+sweep=mnist_tf_pack", "packing.process.start=fork"], "packing.process.start='fork'"),
    (["packing.start=fork"], "packing.start='fork': this option moved under its packing mode"),
])
def test_bad_start_is_refused_before_anything(tmp_path, capsys, overrides, needle):
    base = [] if overrides[0].startswith("+sweep") else ["+sweep=mnist_pack"]
    assert main(base + overrides + [f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "HINT" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_servers_preload_is_set_up_outside_the_packs_wall(tmp_path):
    """Forking saves each training its own import; the one preload is set-up (a lane's packs share it, as they share
    the job's start): the pack's wall counts from its first training's start, and the preload is its ``setup_s``."""
    run, pack = _pack(tmp_path, n=2, preload_sleep_s=1.5)
    rec = run_pack(str(run.root), pack.pack_id,
                   PackSettings(device="cpu", mode_options={"process": ProcessOptions(start="fork")}))
    recs = _records(run, pack).values()
    assert {r["start"] for r in recs} == {"fork"}
    # The server's 1.5 s preload (a sleep: a lower bound, whatever the load) is before every training's spawn, in no
    # training's own start-up, and not in the pack's wall: that starts at its first training.
    assert rec["setup_s"] >= 1.5
    assert rec["started_at"] == min(r["started_at"] for r in recs)
    assert rec["wall_s"] == pytest.approx(max(r["ended_at"] for r in recs) - rec["started_at"])
    for r in recs:
        t = r["timings"]
        assert t["startup_s"] == pytest.approx(t["loop_start"] - t["spawned_at"])


def test_the_server_ends_without_its_interpreters_teardown(tmp_path, monkeypatch):
    """The lane waits for its server to exit; a server's teardown frees every module its preload imported (about a
    second of torch), for nothing: it has told the packer everything, and its trainings ran their own exit handlers."""
    said = tmp_path / "teardown"
    monkeypatch.setenv("GPUPACK_TEST_TEARDOWN", str(said))
    run, pack = _pack(tmp_path, n=2, preload_import="tests.server_teardown")
    rec = run_pack(str(run.root), pack.pack_id,
                   PackSettings(device="cpu", mode_options={"process": ProcessOptions(start="fork")}))
    assert rec["n_completed"] == 2 and {r["start"] for r in _records(run, pack).values()} == {"fork"}
    assert not said.exists(), said.read_text()  # the server's exit handlers never ran: it ended at once


# ---------------- learned preload (issue 31) ----------------

@pytest.mark.parametrize("new, expected, refused", [
    (["colorsys"], ["colorsys"], {}),  # a standard library module
    (["torch", "torch.nn", "torch.nn.functional"], ["torch"], {}),  # the root: importing it imports the rest
    (["logging.config"], ["logging.config"], {}),  # a new submodule of a package the server had
    (["tensorflow", "tensorflow.python"], [], {"tensorflow": "a framework that is not fork-safe"}),
    (["tests.lazy_module"], [], {"tests.lazy_module": "the program's own module (not a library): it may do anything "
                                                      "at import"}),
    (["__main__", "ghost"], [], {}),  # the program itself; a failed import's placeholder
    (["_cython_3_2_4"], [], {}),  # made at run time, no spec: nothing to import it by
])
def test_what_a_child_imported_that_the_server_may_learn(new, expected, refused):
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    from gpupack.core.preload import learnable, library_roots

    site = library_roots()[0]
    where = {"tests.lazy_module": "/home/me/app/tests/lazy_module.py", "colorsys": None}
    modules = {name: ModuleType(name) for name in new if name != "ghost"}
    for name, module in modules.items():
        module.__file__ = where.get(name, f"{site}{name.replace('.', '/')}.py")
        module.__spec__ = None if name in ("__main__", "_cython_3_2_4") else ModuleSpec(name, None)
    modules["ghost"] = None
    assert learnable(new, modules, library_roots()) == (expected, refused)


@pytest.mark.slow
def test_a_stream_learns_what_its_first_training_imported_and_forks_the_next_ones_warm(tmp_path):
    """A program that imports its libraries inside its task: the first training of a one-slot stream imports them
    itself; the server learns the libraries (not the program's own module) when it ends, and every later training is
    forked with them already imported."""
    from gpupack import sweep

    run_dir = tmp_path / "run"
    outcome = sweep.run(sweep.prepare([
        f"hydra.searchpath=[file://{os.path.dirname(__file__)}/conf]", "+sweep=probe_pack", "packing.factors=[1]",
        "packing.stream=on", "sweep.grid.lr=[0.1,0.2,0.3]", "+sweep.fixed.lazy_import='colorsys,tests.lazy_module'",
        f"run_dir={run_dir}"]), plots=False)
    assert outcome.ok
    recs = sorted((read_json(p) for p in run_dir.glob("packs/*/trainings/*.json")), key=lambda r: r["started_at"])
    assert [r["start"] for r in recs] == ["fork"] * 3
    assert [r["metrics"]["warm"] for r in recs] == [{"colorsys": False, "tests.lazy_module": False}] + \
        [{"colorsys": True, "tests.lazy_module": False}] * 2
    log = next(run_dir.glob("packs/*/logs/forkserver.err")).read_text()
    assert "learned from" in log and "colorsys" in log and "tests.lazy_module" not in log.split("learned from")[1]


def test_a_whole_packs_server_learns_nothing_its_trainings_all_start_at_once(tmp_path):
    """An import between a whole pack's training ends would sit inside the pack's measured wall, for no training
    to gain from it: only a stream's server learns."""
    run, pack = _pack(tmp_path, n=2, lazy_import="colorsys")
    rec = run_pack(str(run.root), pack.pack_id,
                   PackSettings(device="cpu", mode_options={"process": ProcessOptions(start="fork")}))
    assert rec["n_completed"] == 2 and {r["start"] for r in _records(run, pack).values()} == {"fork"}
    assert "learned" not in (run.pack_dir(pack.pack_id) / "logs" / "forkserver.err").read_text()


def test_a_forked_trainings_exit_wakes_the_packer(tmp_path, monkeypatch):
    """The fork server's word of an exit wakes the supervisor: with a minute between two looks, a forked pack of two
    ends in far less."""
    import time

    from gpupack.job.runtime import supervisor

    monkeypatch.setattr(supervisor, "POLL_S", 60.0)
    run, pack = _pack(tmp_path, n=2)
    began = time.monotonic()
    rec = run_pack(str(run.root), pack.pack_id, PackSettings(device="cpu", mode_options={
        "process": ProcessOptions(start="fork")}))
    assert rec["n_completed"] == 2 and all(r["start"] == "fork" for r in _records(run, pack).values())
    assert time.monotonic() - began < 45, "the packer slept to its next look"
