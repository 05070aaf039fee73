"""Fast start for a Hydra app's jobs: the pack's server preloads the app once and forks each job from it. A forked
job is the same job as a fresh one (Hydra's .hydra/ files, return value, output); an app whose import initialised
CUDA is never forked from (its jobs start fresh and the multirun says why in one line)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from gpupack.job.runtime.forkserver import fork_unsafe

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "tests" / "hydra_app" / "app.py"


def multirun(script: Path, args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), "-m", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def records(sweep_dir: Path) -> dict[int, dict]:
    out = {}
    for path in sweep_dir.glob(".gpupack/*/packs/*/trainings/*.json"):
        rec = json.loads(path.read_text())
        out[rec["params"]["job_num"]] = rec
    return out


def _hydra_job(job_dir: Path) -> dict:
    """What Hydra wrote of the job that must not depend on how its process started: its config, overrides, and its
    hydra.job section but the id (the pack job's id, which differs between any two runs)."""
    hydra = OmegaConf.to_container(OmegaConf.load(job_dir / ".hydra" / "hydra.yaml").hydra)
    job = {k: v for k, v in hydra["job"].items() if k != "id"}
    return {"config": OmegaConf.to_container(OmegaConf.load(job_dir / ".hydra" / "config.yaml")),
            "overrides": OmegaConf.to_container(OmegaConf.load(job_dir / ".hydra" / "overrides.yaml")),
            "job": job, "mode": hydra["mode"], "sweeper": hydra["sweeper"], "verbose": hydra["verbose"]}


def _log(job_dir: Path) -> list[str]:
    """The job's log lines without their timestamps."""
    return [re.sub(r"^\[[^\]]*\]", "", line) for line in (job_dir / "app.log").read_text().splitlines()]


@pytest.mark.slow
def test_a_forked_job_is_the_same_job_as_a_fresh_one(tmp_path, subprocess_env):
    jobs = ["lr=0.1,0.2", "sleep_s=0"]
    runs = {}
    for start in ("fork", "fresh"):
        sweep_dir = tmp_path / start
        proc = multirun(APP, ["hydra/launcher=gpupack_local", "hydra.launcher.pack=2", f"hydra.launcher.start={start}",
                              *jobs, f"hydra.sweep.dir={sweep_dir}"], tmp_path, subprocess_env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs[start] = (sweep_dir, records(sweep_dir))
    (fork_dir, forked), (fresh_dir, fresh) = runs["fork"], runs["fresh"]
    assert sorted(forked) == sorted(fresh) == [0, 1]
    for num in (0, 1):
        assert forked[num]["start"] == "fork" and fresh[num]["start"] == "fresh"
        assert forked[num]["timings"]["startup_s"] is not None and forked[num]["timings"]["startup_s"] >= 0
        assert forked[num]["metrics"] == fresh[num]["metrics"] == {"return_value": pytest.approx((num + 1))}
        assert _hydra_job(fork_dir / str(num)) == _hydra_job(fresh_dir / str(num))
        assert _log(fork_dir / str(num)) == _log(fresh_dir / str(num))
        assert (fork_dir / str(num) / "done.txt").exists()
    # each forked job ran in a process of its own, not in the server and not in one another's
    pids = {(fork_dir / str(n) / "started.txt").read_text().split()[1] for n in (0, 1)}
    assert len(pids) == 2


CUDA_APP = '''
import hydra
import torch  # the fake below: its CUDA says it is initialised, as a real app's import-time torch.cuda call would


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg):
    return float(cfg.lr) * 10 if torch.__name__ == "torch" else 0.0


if __name__ == "__main__":
    main()
'''
FAKE_TORCH = '''
class cuda:
    @staticmethod
    def is_initialized():
        return True
'''


@pytest.mark.slow
def test_an_app_whose_import_initialised_cuda_runs_fresh_and_says_why(tmp_path, subprocess_env):
    app_dir = tmp_path / "app"
    (app_dir / "torch").mkdir(parents=True)
    (app_dir / "torch" / "__init__.py").write_text(FAKE_TORCH)
    (app_dir / "cuda_app.py").write_text(CUDA_APP)
    sweep_dir = tmp_path / "mr"
    proc = multirun(app_dir / "cuda_app.py", ["hydra/launcher=gpupack_local", "hydra.launcher.pack=2", "+lr=0.1,0.2",
                                              f"hydra.sweep.dir={sweep_dir}"], tmp_path, subprocess_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = records(sweep_dir)
    assert [recs[n]["status"] for n in (0, 1)] == ["completed", "completed"]
    assert [recs[n]["metrics"]["return_value"] for n in (0, 1)] == [pytest.approx(1.0), pytest.approx(2.0)]
    for n in (0, 1):
        assert recs[n]["start"] == "fresh" and "initialised CUDA" in recs[n]["fork_fallback"]
    lines = (proc.stdout + proc.stderr).splitlines()
    said = [line for line in lines if "started its jobs as fresh interpreters" in line]
    assert len(said) == 1 and "initialised CUDA" in said[0], proc.stdout + proc.stderr


def _torch(initialised: bool | Exception) -> SimpleNamespace:
    def is_initialized() -> bool:
        if isinstance(initialised, Exception):
            raise initialised
        return initialised

    return SimpleNamespace(cuda=SimpleNamespace(is_initialized=is_initialized))


UNSAFE = [  # (what the preload left in sys.modules, the words of the reason or None: safe to fork)
    ({}, None),
    ({"torch": _torch(False)}, None),
    ({"torch": _torch(True)}, "initialised CUDA"),
    ({"torch": _torch(RuntimeError("half imported"))}, None),
    ({"torch": SimpleNamespace()}, None),  # torch without its cuda module yet
    ({"tensorflow": object()}, "TensorFlow"),
    ({"jax._src.xla_bridge": SimpleNamespace(_backends={"cpu": object()})}, "JAX"),
    ({"jax._src.xla_bridge": SimpleNamespace(_backends={})}, None),
]


@pytest.mark.parametrize("modules, words", UNSAFE)
def test_what_makes_a_preloaded_server_unsafe_to_fork(modules, words):
    why = fork_unsafe(modules)
    assert (why is None) if words is None else (why is not None and words in why), why


def test_the_jobs_server_composes_one_jobs_config_and_imports_the_apps_libraries_before_it_forks(monkeypatch,
                                                                                                 tmp_path):
    """Issue 31: what each job's config composition builds cold (the grammars' lexer caches) is built once in the
    pack's server, by composing the first job's config there, with the launch's own singletons in place; and the
    libraries the app's files import, inside its task function too, are imported there once, not in every job."""
    import importlib.util

    from hydra.core.singleton import Singleton

    from gpupack.job.runtime import hydra_job

    (tmp_path / "my_app.py").write_text("def task(cfg):\n    import tabnanny\n    import my_helper\n")
    (tmp_path / "my_helper.py").write_text("import ftplib\n")
    spec = importlib.util.spec_from_file_location("my_app", tmp_path / "my_app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    imported: list[tuple[list[str], str]] = []
    monkeypatch.setattr(hydra_job, "import_libraries", lambda names, why: imported.append((names, why)))
    composed: list[tuple[object, list[str], bool]] = []
    state = Singleton.get_state()
    loader = SimpleNamespace(load_sweep_config=lambda config, overrides: composed.append(
        (config, overrides, Singleton._instances is state["instances"])))  # the launch's singletons, in place
    launcher = SimpleNamespace(params={}, config="the app's config", task_function=module.task,
                               hydra_context=SimpleNamespace(config_loader=loader))
    monkeypatch.setattr(hydra_job, "payload", lambda params: hydra_job.Payload(launcher, state, {}))  # none kept
    jobs = [hydra_job.HydraJobParams(overrides=[f"lr={lr}"], job_num=i) for i, lr in enumerate((0.1, 0.2))]
    hydra_job.WORKLOAD.preload(jobs)
    assert composed == [("the app's config", ["lr=0.1"], True)]  # one job's, once
    assert imported == [(["ftplib", "tabnanny"], "imported by the app's files")]


def test_a_job_config_the_sweeper_composed_to_check_it_is_the_one_its_job_runs_with(monkeypatch, tmp_path):
    """Issue 53, item 4: a sweeper composes each job's config to check the batch before the launcher gets it; the
    launcher keeps those (as they were composed: a change made to one after does not reach its job) and each job runs
    with its own, composing nothing; a job whose config was not kept composes it as Hydra's launchers do."""
    from hydra.core.singleton import Singleton
    from hydra.types import HydraContext

    from gpupack.core.store import pickling
    from gpupack.core.store.rundir import RunDir
    from gpupack.hydra_launch import ComposedOnce, for_jobs, keep_compositions
    from gpupack.job.runtime import hydra_job

    composed: list[list[str]] = []

    def compose(config: object, overrides: list[str]) -> object:
        composed.append(overrides)
        return OmegaConf.create({"lr": float(overrides[0].split("=")[1])})

    master = OmegaConf.create({"app": "config"})
    context = HydraContext(config_loader=SimpleNamespace(load_sweep_config=compose, repository="its repository"),
                           callbacks=None)
    keep_compositions(context)
    keep_compositions(context)  # a second setup wraps nothing twice
    loader = context.config_loader
    assert isinstance(loader, ComposedOnce) and not isinstance(loader.loader, ComposedOnce)
    batch = [["lr=0.1"], ["lr=0.2"]]
    checked = [loader.load_sweep_config(master, o) for o in batch]  # the sweeper's check of the batch
    checked[1].lr = 99.0  # what the sweeper does with its copy after
    kept = loader.take(master, batch, 5)
    assert sorted(kept) == [5, 6] and loader.take(master, batch, 5) == {}  # taken once, then none held
    run = RunDir(tmp_path)
    where = pickling.dump_indexed(kept, run.hydra_configs)

    launcher = SimpleNamespace(config=master, hydra_context=context)
    assert for_jobs(launcher).hydra_context.config_loader is loader.loader  # the jobs get Hydra's own loader
    assert launcher.hydra_context.config_loader is loader  # the sweeper keeps checking through it
    monkeypatch.setattr(hydra_job, "payload", lambda params: hydra_job.Payload(for_jobs(launcher),
                                                                                Singleton.get_state(), where))
    composed.clear()
    job = hydra_job.HydraJobParams(overrides=["lr=0.2"], job_num=6, launch_dir=str(tmp_path))
    assert hydra_job.job_config(job).lr == 0.2 and composed == []  # its own, as composed, composed no more
    unkept = hydra_job.HydraJobParams(overrides=["lr=0.3"], job_num=7, launch_dir=str(tmp_path))
    assert hydra_job.job_config(unkept).lr == 0.3 and composed == [["lr=0.3"]]
    assert loader.repository == "its repository"  # what else code reads off Hydra's loader, through the keeper
    small = ComposedOnce(SimpleNamespace(load_sweep_config=compose), limit=len(kept[5]))  # room for one config
    for o in batch:
        small.load_sweep_config(master, o)
    assert sorted(small.take(master, batch, 0)) == [0]  # past its limit the jobs compose their own
    where = pickling.dump_indexed({6: pickling.dumps(["not", "a", "config"])}, run.hydra_configs)
    with pytest.raises(TypeError, match="holds no job config at .* for job #6: list"):
        hydra_job.job_config(job)
