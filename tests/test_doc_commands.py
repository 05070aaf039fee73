"""Every gpupack command of README.md, examples/README.md and ``python -m gpupack --help`` runs as pasted (issue 28).

Each command is read from its file (tests/doc_commands.py) and given to bash as it is written, quotes included, from
a folder that holds the repository's ``examples/`` (the docs say: paste them from the repository's root), with the
venv's ``python`` first on PATH (the docs say: ``source .venv/bin/activate``). How each one runs here:

- **Real**, with tiny sizes appended (``TINY``: fewer samples, one repeat, no pack measured again), where it runs on
  this machine and is the first command of its path (sweep config, packing modes, stream, auto, start method,
  launcher): every config file and mechanism a command names runs once for real.
- **Dry** (``dry_run=true`` appended): a local command whose path a real one has run already (its own overrides are
  composed, validated and planned, which is where a pasted override fails), and cluster examples (Alliance presets:
  with no cluster reachable, the preset alone, as on a laptop).
- **Real in its own test** (``RUN_BY`` in tests/doc_commands.py): dry here, and run for real as pasted by the test
  that checks what it measured (that test takes its words from ``pasted()``), so it runs for real once a suite.
- ``cluster=slurm`` and the ``gpupack_slurm`` launcher run against the local test SLURM (marked ``slurm``).

Paths the docs write for the user's own (``RUN_DIR``, ``/project/def-me/...``, ``multirun/<date>/<time>``) stand in
for what the runs here made (``PLACEHOLDERS``). A new command in the docs is picked up with no change here.
"""
from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpupack.cli import help_text
from tests.conftest import HYDRA_OPTUNA
from tests.doc_commands import REPO, RUN_BY, DocCommand, from_docs, from_help, pasted, pasted_env


def _once(commands: list[DocCommand]) -> list[DocCommand]:
    first: dict[str, DocCommand] = {}
    for command in commands:
        first.setdefault(command.text, command)
    return list(first.values())


ALL = _once(from_docs() + from_help(help_text([])))  # each text once, where it first appears

# Appended to a real run of each sweep config: tiny sizes, one N, one repeat (a key the command sets is left to it).
_MNIST = ["sweep.fixed.train_samples=256", "sweep.fixed.val_samples=128", "sweep.fixed.epochs=1", "packing.repeats=1",
          "packing.factors=[2]", "sweep.grid.batch_size=[128]"]
TINY: dict[str, list[str]] = {
    "mnist_pack": _MNIST, "mnist_tf_pack": _MNIST, "mnist_spread": _MNIST + ["spread.repeats=1"],
    "mnist_tf_spread": _MNIST + ["spread.repeats=1"],
    "cifar10_pack": ["sweep.fixed.train_samples=64", "sweep.fixed.val_samples=16", "packing.repeats=1",
                     "packing.factors=[2]"],
    "resnet50_pack": ["sweep.fixed.train_samples=32", "sweep.fixed.val_samples=16", "packing.repeats=1",
                      "packing.factors=[2]"],
    "resnet50_gpu": ["sweep.fixed.train_samples=16", "sweep.fixed.val_samples=8", "sweep.fixed.image_size=32",
                     "sweep.fixed.batch_size=8", "packing.repeats=1", "packing.factors=[2]"],
    "quadratic_pack": [],
    # examples/train.py: 6000 samples, about a second, and torch's import in each; N=1 at one set-up (not also at 2
    # threads, a second reference: 4 more trainings, about 20 s)
    "command": ["packing.repeats=1", "packing.factors=[2]", "packing.threads_per_training=1"],
    "auto": ["packing.auto.ladder=[1,2]", "packing.auto.repeats=2"],  # packing.factors=auto climbs no further
    "hydra": ["train_samples=256"],  # examples/conf/hydra_app.yaml
}
# The keys that choose a path through gpupack (what a real run covers); other overrides are values on that path.
PATH_KEYS = ("+sweep", "packing.modes", "packing.stream", "packing.factors=auto", "sweep.fixed.start",
             "sweep.workload", "hydra/launcher", "hydra/sweeper", "hydra.searchpath")


@dataclass
class Ran:
    proc: subprocess.CompletedProcess[str]
    made: list[Path]  # the run or multirun folders it made


class Workspace:
    """Where the commands run, what they made, and the stand-ins for the docs' placeholder paths."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "examples").symlink_to(REPO / "examples")
        from gpupack.job.workloads import _cifar10_data
        self.cifar = _cifar10_data.write_batches(root / "staged" / "cifar-10-batches-py", 40)
        self.ran: dict[str, Ran] = {}
        self.covered: set[tuple[str, ...]] = set()

    def placeholders(self) -> dict[str, str]:
        return {
            "/project/def-me/mnist": str(REPO / "gpupack" / "job" / "workloads" / "data" / "mnist"),
            "/project/def-me/cifar-10-batches-py": str(self.cifar),
            "multirun/<date>/<time>": str(self.made_by(_first(lambda c: "gpupack_local" in c.text
                                                               and "sweeper" not in c.text))),
            "MULTIRUN_DIR": str(self.made_by(_first(lambda c: "gpupack_local" in c.text and "sweeper" not in c.text))),
            # the first command example: a run of examples/train.py, which prints "Average loss: ..." and reports
            # val_loss, val_accuracy and train_loss, so every collect/status example of the docs has its figures
            "RUN_DIR": str(self.made_by(_first(lambda c: "+sweep=command" in c.text))),
        }

    def made_by(self, command: DocCommand) -> Path:
        ran = self.run(command, env=_user_env())
        assert ran.proc.returncode == 0 and ran.made, _said(command, ran.proc)
        return ran.made[-1]

    def run(self, command: DocCommand, env: dict[str, str], extra: list[str] | None = None) -> Ran:
        if command.text in self.ran:
            return self.ran[command.text]
        text = command.text
        if "RUN_DIR" in text or "<date>" in text or "/project/def-me/" in text:
            for placeholder, path in self.placeholders().items():
                text = text.replace(placeholder, shlex.quote(path))
        extra = extra if extra is not None else self.extra(command)
        before = set(self._made())
        proc = subprocess.run(["bash", "-c", " ".join([text, *map(shlex.quote, extra)])], cwd=self.root, env=env,
                              capture_output=True, text=True, timeout=900)
        self.ran[command.text] = Ran(proc, sorted(set(self._made()) - before, key=lambda p: p.stat().st_mtime))
        return self.ran[command.text]

    def extra(self, command: DocCommand) -> list[str]:
        """What is appended: tiny sizes for the first run of a path, ``dry_run=true`` for the rest (gpupack sweeps)."""
        words = command.words
        if "examples/hydra_app.py" in command.text:
            return TINY["hydra"]
        sweep_name = next((w.split("=", 1)[1] for w in words if w.startswith("+sweep=")), None)
        if sweep_name is None or "--cfg" in words or "dry_run=true" in words:
            return []
        if command.text in RUN_BY:  # its test runs it for real (tests/doc_commands.py): its path is covered
            self.covered.add(_path(words))
            return ["dry_run=true"]
        if _is_cluster(words) or _path(words) in self.covered:
            return ["dry_run=true"]
        self.covered.add(_path(words))
        # a pack that another test's load disturbed is not measured again (packing.remeasure=0): that doubles a run
        # beside the other worker, and a docs command is checked for running as pasted, not for what it measured
        tiny = TINY[sweep_name] + (TINY["auto"] if "packing.factors=auto" in words else []) + ["packing.remeasure=0"]
        given = {w.split("=", 1)[0] for w in words}
        return [o for o in tiny if o.split("=", 1)[0] not in given] + [f"run_dir=runs/doc/{len(self.covered)}"]

    def _made(self) -> list[Path]:
        return [p.parent for p in self.root.glob("runs/*/*/plan.json")] + list(self.root.glob("multirun/*/*"))


def _first(match) -> DocCommand:  # type: ignore[no-untyped-def]
    return next(c for c in ALL if match(c))


def _path(words: list[str]) -> tuple[str, ...]:
    return tuple(sorted(w for w in words if w.startswith(PATH_KEYS)))


def _is_cluster(words: list[str]) -> bool:
    return any(w.startswith("cluster=") and w != "cluster=local" for w in words)


def _needs_slurm(command: DocCommand) -> bool:
    return "cluster=slurm" in command.words or "hydra/launcher=gpupack_slurm" in command.words


def _user_env(slurm: dict[str, str] | None = None) -> dict[str, str]:
    """A user's shell after ``source .venv/bin/activate``: the venv's python first, no test PYTHONPATH (the repo's),
    no cluster unless the command is for the local test SLURM. A side environment's folder on PYTHONPATH
    (scripts/side_envs.sh) stays: it stands for what that user installed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SLURM_CONF")}
    side = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    if side:
        env["PYTHONPATH"] = os.pathsep.join(side)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)
    if slurm is not None:
        env["SLURM_CONF"] = slurm["SLURM_CONF"]
    return env


def _said(command: DocCommand, proc: subprocess.CompletedProcess[str]) -> str:
    return f"{command.where}: {command.text}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("docs"))


def test_the_docs_commands_are_all_found():
    """The reader finds what a user pastes, so the test below cannot pass by finding nothing."""
    texts = [c.text for c in ALL]
    assert len(ALL) >= 35, texts
    assert any(c.where.startswith("--help") for c in ALL) and any(c.where.startswith("examples/") for c in ALL)
    # the fork fast start (a fenced block inside a list item), a continued line, an inline collect
    assert ("python -m gpupack +sweep=command 'sweep.fixed.argv=[{python},examples/train.py,--lr,{lr}]' "
            "sweep.grid.lr=[0.1,0.03] sweep.fixed.start=fork") in texts
    assert any(t.startswith("python examples/hydra_app.py -m hydra/launcher=gpupack_slurm hydra.launcher.pack=2 "
                            "hydra.launcher.partition=v100") for t in texts)
    assert "python -m gpupack collect RUN_DIR --metric loss --goal min --pattern 'Average loss: ([0-9.]+)'" in texts
    assert not any("#" in t and "# " in t.split("'")[-1] for t in texts), "a trailing comment was kept"


@pytest.mark.parametrize("text, test_file", sorted(RUN_BY.items()))
def test_a_docs_command_run_dry_here_is_run_for_real_as_pasted_by_the_test_named(text, test_file):
    """A command of RUN_BY is run dry below; the file named runs it for real through ``pasted`` (its text there)."""
    assert text in [c.text for c in ALL]
    assert any(word.startswith("+sweep=") for word in pasted(text))
    assert text in _pasted_in(REPO / test_file), f"{test_file} runs no {text!r} through pasted()"


def _pasted_in(path: Path) -> set[str]:
    """The strings of a test file that calls ``pasted`` (adjacent literals joined), else none."""
    nodes = list(ast.walk(ast.parse(path.read_text())))
    if not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "pasted" for n in nodes):
        return set()
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_pasted_splits_what_a_command_sets_before_python_from_gpupack_s_words():
    text = next(t for t in RUN_BY if t.startswith("PYTHONPATH="))
    assert pasted_env(text) == {"PYTHONPATH": "examples"}
    assert pasted(text) == ["hydra.searchpath=[file://examples/own_workload/conf]", "+sweep=quadratic_pack"]
    assert pasted_env("python -m gpupack +sweep=mnist_spread") == {}


def test_pasted_refuses_a_command_no_docs_page_shows():
    with pytest.raises(LookupError, match="the docs changed"):
        pasted("python -m gpupack +sweep=mnist_pack packing.modes=[fused]")


@pytest.mark.parametrize("command", [
    pytest.param(c, id=c.where, marks=([pytest.mark.slurm] if _needs_slurm(c) else [])
                 + (HYDRA_OPTUNA if "hydra/sweeper=optuna" in c.words else [])) for c in ALL])
@pytest.mark.slow
def test_a_docs_command_runs_as_pasted(command: DocCommand, workspace: Workspace, request: pytest.FixtureRequest):
    slurm = request.getfixturevalue("slurm_env") if _needs_slurm(command) else None
    ran = workspace.run(command, env=_user_env(slurm))
    assert ran.proc.returncode == 0, _said(command, ran.proc)
    assert "Traceback" not in ran.proc.stderr, _said(command, ran.proc)
