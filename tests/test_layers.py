"""The layers of gpupack/ (pyproject.toml's [tool.importlinter], docs/ARCHITECTURE.md): imports only downward, no
cycle between the modules or folders of any package — module-level imports and those inside functions alike."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def lint_imports(cwd: Path, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env_path = [str(extra_path)] if extra_path else []
    code = ("import sys; sys.path[:0] = " + repr(env_path) + "; from importlinter.cli import lint_imports_command; "
            "lint_imports_command()")
    return subprocess.run([sys.executable, "-c", code, "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_gpupack_keeps_its_layers_and_has_no_cycle():
    proc = lint_imports(ROOT, ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "BROKEN" not in proc.stdout and proc.stdout.count("KEPT") == 8, proc.stdout[-4000:]


HOUSE, CORE, FACE = "the house", "core's own order", "the job wing's face"


@pytest.mark.parametrize("importer, imported, contract", [
    ("gpupack/core/plan.py", "gpupack.sweep", HOUSE),                # an upward import at module level
    ("gpupack/job/runtime/sampler.py", "gpupack.job.pack.process", "the job wing's own order"),  # ... in a function
    ("gpupack/core/workload.py", "gpupack.search.study", HOUSE),      # the ground knows no study (a trial's lane does)
    ("gpupack/job/pack/process.py", "gpupack.search.study", HOUSE),   # nor does the job wing
    ("gpupack/results/analysis/load.py", "gpupack.sweep.flow.run", HOUSE),  # results stand below the command wing
    ("gpupack/results/report/text.py", "gpupack.submit", HOUSE),      # ... beside the backends, which they never import
    ("gpupack/job/body.py", "gpupack.workload", HOUSE),               # gpupack imports the contract from the ground
    ("gpupack/job/runtime/worker.py", "gpupack.job.body", "the job wing's own order"),
    ("gpupack/sweep/setup/config.py", "gpupack.sweep.flow.run", "the command wing's own order"),
    ("gpupack/results/analysis/load.py", "gpupack.results.report.text", "the results wing's own order"),
    ("gpupack/sweep/flow/collect.py", "gpupack.sweep.flow.run", "the flow's own order"),
    ("gpupack/sweep/setup/validate.py", "gpupack.job.pack.process", FACE),  # a mode's package is the face, not its
    ("gpupack/submit/local.py", "gpupack.job.runtime.supervisor", FACE),    # inside; the wing's processes are its own
    ("gpupack/core/store/journal.py", "gpupack.core.memory.figures", CORE),  # inside core: storage over memory policy
    ("gpupack/core/plan.py", "gpupack.core.store.rundir", CORE),      # ... and a base module over the storage
    ("gpupack/job/records.py", "gpupack.job.body", "no import cycle"),  # the job itself: siblings, but no cycle
])
def test_an_upward_import_breaks_the_contract(tmp_path, importer, imported, contract):
    """Each contract bites: a copy of the package with one upward import added fails it, naming the contract and
    the importing module."""
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "gpupack", copy / "gpupack", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    target = copy / importer
    inside = "sampler" in importer
    target.write_text(target.read_text() + textwrap.dedent(f"""

        def _upward() -> None:
            import {imported}  # noqa
        """ if inside else f"\nimport {imported}  # noqa\n"))
    proc = lint_imports(tmp_path, copy)
    assert proc.returncode != 0
    module = importer.replace("/", ".").removesuffix(".py")
    broken = " ".join(proc.stdout.split("Broken contracts", 1)[-1].split())  # lint-imports wraps at 80 columns
    named = module in proc.stdout or f".{module.rsplit('.', 1)[1]} ->" in proc.stdout  # a cycle names it relatively
    assert "BROKEN" in proc.stdout and named and contract in broken, proc.stdout[-3000:]


def floors() -> tuple[int, list[str]]:
    """How deep the house is: the longest chain of imports between gpupack's folders and top-level modules."""
    import grimp

    graph = grimp.build_graph("gpupack", cache_dir=None)
    room = {m: m.split(".")[1] for m in graph.modules if m != "gpupack"}
    below: dict[str, set[str]] = {r: set() for r in room.values()}
    for module, r in room.items():
        below[r] |= {room[i] for i in graph.find_modules_directly_imported_by(module) if i in room} - {r}

    def chain(r: str, seen: frozenset[str] = frozenset()) -> list[str]:
        assert r not in seen, f"a cycle through {r}"
        return [r, *max((chain(b, seen | {r}) for b in below[r]), key=len, default=[])]

    longest = max((chain(r) for r in below), key=len)
    return len(longest), longest


def test_the_house_is_at_most_eight_floors_and_the_map_says_how_many():
    """Issue 54: the wings stand on the ground in at most 8 floors; docs/ARCHITECTURE.md says the count the code has."""
    from tests.test_architecture_doc import NUMBERS, TEXT

    count, longest = floors()
    assert count <= 8, f"{count} floors: {' -> '.join(longest)}"
    said = re.search(r"is (\w+) floors deep", TEXT)
    assert said is not None and NUMBERS[said.group(1)] == count, (said and said.group(0), count, longest)


def defined_names(path: Path) -> set[str]:
    """The public names a module defines at its top (in an ``if``/``else`` too), not those it imports."""
    import ast

    names: set[str] = set()
    body = list(ast.parse(path.read_text()).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If):
            body += node.body + node.orelse
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {n for n in names if not n.startswith("_")}


@pytest.mark.parametrize("ground, public", [("core/workload.py", "workload"), ("core/result.py", "result")])
def test_the_names_a_user_imports_are_every_public_name_of_the_ground(ground, public):
    """gpupack.workload and gpupack.result re-export the ground's modules by their __all__: it must hold every
    public name they define, or a user's import of one breaks."""
    import importlib

    module = importlib.import_module(f"gpupack.{public}")
    assert set(module.__all__) == defined_names(ROOT / "gpupack" / ground)
    assert all(hasattr(module, name) for name in module.__all__)


# ---------------- imports by name (importlib), which the contract above cannot see ----------------

@pytest.mark.slow
def test_imports_by_name_keep_the_layers():
    from tests.dynamic_imports import by_name, violations

    found = by_name(ROOT / "gpupack")
    assert len(found) >= 7, found  # the backends, modes, strategies' two sides, workloads, user modules
    assert violations(ROOT / "gpupack", ROOT / "pyproject.toml") == []


@pytest.mark.parametrize("importer, call, says", [
    # what job/runtime/worker.py did before a strategy's training side moved below it (issue 29)
    ("gpupack/job/runtime/worker.py", 'importlib.import_module(f"gpupack.job.spread.{name}")', "upward"),
    ("gpupack/core/workload.py", 'importlib.import_module(f"gpupack.job.workloads.{name}")', "upward"),
    ("gpupack/core/plan.py", "importlib.import_module(name)", "named by data"),
    ("gpupack/core/workload.py", 'importlib.import_module("gpupack.core.result")', "a sibling"),
    ("gpupack/results/report/text.py", 'importlib.import_module("gpupack.submit")', "a sibling"),
])
@pytest.mark.slow
def test_an_upward_import_by_name_breaks_it(tmp_path, importer, call, says):
    from tests.dynamic_imports import violations

    copy = tmp_path / "gpupack"
    shutil.copytree(ROOT / "gpupack", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy.parent / importer
    target.write_text(target.read_text() + f"\n\ndef _by_name(name: str) -> object:\n    import importlib\n\n"
                      f"    return {call}\n")
    found = violations(copy, ROOT / "pyproject.toml")
    module = importer.replace("/", ".").removesuffix(".py")
    assert len(found) == 1 and found[0].startswith(module) and says in found[0], found


# ---------------- processes: one place starts them ----------------

# Where a process may start, and why there: the supervisor's spawn (every process inside a job: trainings, ranks,
# shared processes, the fork server, MPS's control), the fork server's fork of a training (on the supervisor's
# request, in the server's own process), and the submitting side's cluster seam (sbatch, squeue, sacct, scancel;
# submitit's local controller), which runs outside any job.
PROCESS_STARTERS = {"gpupack/job/runtime/supervisor.py": {"subprocess.Popen"},
                    "gpupack/job/runtime/forkserver.py": {"os.fork"},
                    "gpupack/submit/slurm/commands.py": {"subprocess.run"},
                    "gpupack/submit/_submitit.py": {"subprocess.Popen"}}
STARTS = {f"subprocess.{n}" for n in ("Popen", "run", "call", "check_call", "check_output", "getoutput",
                                      "getstatusoutput")} | {f"os.{n}" for n in (
    "fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnv", "spawnve", "spawnl", "spawnle",
    "spawnvp", "spawnlp", "execv", "execve", "execvp", "execvpe", "execl", "execlp")} | {
    "multiprocessing.Process", "multiprocessing.Pool", "pty.spawn"}


def process_starts(root: Path) -> dict[str, set[str]]:
    """Every ``module.function`` of STARTS that a file under ``root`` names (called or passed, not a type hint), by
    file."""
    import ast

    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        hints = {id(n) for node in ast.walk(tree) for hint in (
            [getattr(node, "returns", None)] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else
            [node.annotation] if isinstance(node, (ast.arg, ast.AnnAssign)) else []) if hint is not None
            for n in ast.walk(hint)}
        for node in ast.walk(tree):
            if id(node) in hints:
                continue
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                name = f"{node.value.id}.{node.attr}"
                if name in STARTS:
                    found.setdefault(path.relative_to(root.parent).as_posix(), set()).add(name)
            elif isinstance(node, ast.ImportFrom) and node.module in ("subprocess", "os", "multiprocessing", "pty"):
                for alias in node.names:  # `from subprocess import Popen` would hide it from the check above
                    if f"{node.module}.{alias.name}" in STARTS:
                        found.setdefault(path.relative_to(root.parent).as_posix(), set()).add(
                            f"{node.module}.{alias.name}")
    return found


@pytest.mark.slow
def test_only_the_supervisor_starts_a_process_inside_a_job():
    assert process_starts(ROOT / "gpupack") == PROCESS_STARTERS


@pytest.mark.slow
def test_a_process_started_elsewhere_is_caught(tmp_path):
    copy = tmp_path / "gpupack"
    shutil.copytree(ROOT / "gpupack", copy, ignore=shutil.ignore_patterns("__pycache__"))
    mps = copy / "job" / "runtime" / "mps.py"
    mps.write_text(mps.read_text() + "\n\ndef _quit(control: str) -> None:\n"
                   "    import subprocess\n    subprocess.run([control], input=b'quit\\n')\n")
    assert process_starts(copy)["gpupack/job/runtime/mps.py"] == {"subprocess.run"}


# ---------------- names of modules as data, which no import statement shows ----------------

# A program to start, not a module to import: a training's default argv (``python -m gpupack.job.runtime.worker``), the
# process boundary being the seam between the ground's Workload and the wing that runs it
PROGRAMS = {"gpupack/core/workload.py": ["gpupack.job.runtime.worker"]}


def protected_names(root: Path) -> dict[str, list[str]]:
    """Each string outside the job wing that is the dotted name of a module the wing's face protects (pyproject's
    protected contract): a plan's workload, say, loaded by name inside a job. core/moves.py is the ground's table of
    where old modules are now, names and nothing else."""
    import ast

    from tests.dynamic_imports import contracts

    contract = next(c for c in contracts(ROOT / "pyproject.toml") if c["type"] == "protected")
    patterns = [re.compile(re.escape(m).replace(r"\*", r"\w+") + r"(\.\w+)*$") for m in contract["protected_modules"]]
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent).as_posix()
        if where.startswith("gpupack/job/") or where == "gpupack/core/moves.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and any(
                    p.match(node.value) for p in patterns):
                found.setdefault(where, []).append(node.value)
    return found


def test_no_wing_names_a_module_inside_the_job_wing_as_data():
    assert protected_names(ROOT / "gpupack") == PROGRAMS


def test_a_name_inside_the_job_wing_spelt_elsewhere_is_caught(tmp_path):
    (tmp_path / "gpupack" / "job").mkdir(parents=True)
    (tmp_path / "gpupack" / "hydra_launch.py").write_text('WORKLOAD = "gpupack.job.runtime.hydra_job"\n'
                                                         '"""a docstring naming gpupack.job.runtime is prose"""\n')
    (tmp_path / "gpupack" / "job" / "__init__.py").write_text('HYDRA_JOB = "gpupack.job.runtime.hydra_job"\n')
    assert protected_names(tmp_path / "gpupack") == {"gpupack/hydra_launch.py": ["gpupack.job.runtime.hydra_job"]}
