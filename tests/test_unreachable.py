"""No SLURM answers here (issue 43, item 3): a SLURM_CONF naming no file, or a controller nobody listens for. The CLI
and the gpupack_slurm Hydra launcher say so in one line — the client's own words once, the SLURM_CONF used and the
fix — exit non-zero without a traceback, and write and submit nothing. Where sbatch itself finds no controller (SLURM
answered a moment before), its words come back the same way."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from submitit.core.utils import FailedJobError

from gpupack.errors import UnreachableError
from gpupack.submit.slurm import commands

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "tests" / "hydra_app" / "app.py"
SMALL = ["+sweep=mnist_pack", "packing.factors=[1]", "sweep.grid.seed=[0]", "sweep.grid.lr=[0.1]",
         "sweep.grid.batch_size=[64]", "cluster=slurm"]
# SLURM's clients, when installed here, say this of a controller nobody listens for
NO_CONTROLLER = "Unable to contact slurm controller"


def closed_port() -> int:
    with socket.socket() as s:  # a port just free: nobody listens on it
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dead_controller(tmp_path: Path) -> Path:
    """A slurm.conf whose controller is a port nobody listens on (MessageTimeout=1: each client gives up in a
    moment, not SLURM's default 9 s; what it says is the same)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=gone\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={closed_port()}\n"
                    "GresTypes=gpu\nMessageTimeout=1\n")
    return conf


def env_with(conf: Path, subprocess_env: dict[str, str]) -> dict[str, str]:
    return {**subprocess_env, "SLURM_CONF": str(conf)}


def said_once(err: str, conf: Path) -> None:
    """What every refusal here holds: the SLURM_CONF used, the fix, the client's words once, no traceback."""
    assert "Traceback" not in err, err
    assert f"SLURM_CONF={conf}" in err and "login node" in err and "HINT:" in err, err
    if shutil.which("sinfo") and conf.exists():  # a client that ran: its own words, once
        assert err.count(NO_CONTROLLER) == 1, err


CONFS = {"no such file": lambda tmp: tmp / "nowhere" / "slurm.conf", "dead controller": dead_controller}


@pytest.mark.parametrize("conf", CONFS, ids=list(CONFS))
@pytest.mark.slow
def test_the_cli_says_no_slurm_answers_in_one_line(tmp_path, subprocess_env, conf):
    conf_path = CONFS[conf](tmp_path)
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "gpupack", *SMALL, f"run_dir={run_dir}"], capture_output=True,
                          text=True, env=env_with(conf_path, subprocess_env), cwd=REPO, timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc.stdout + err
    assert len(err.splitlines()) == 1 and err.startswith("gpupack: error: SLURM does not answer here: "), err
    said_once(err, conf_path)
    assert "cluster=local to run here" in err, err
    assert not run_dir.exists()  # said before anything was written


@pytest.mark.parametrize("conf", CONFS, ids=list(CONFS))
@pytest.mark.slow
def test_the_slurm_launcher_says_no_slurm_answers_in_a_few_lines(tmp_path, subprocess_env, conf):
    conf_path = CONFS[conf](tmp_path)
    sweep_dir = tmp_path / "mr"
    proc = subprocess.run([sys.executable, str(APP), "-m", "hydra/launcher=gpupack_slurm",
                           "hydra.launcher.partition=p100", "hydra.launcher.gres=gpu:p100:1", "lr=0.1,0.2",
                           f"hydra.sweep.dir={sweep_dir}"], capture_output=True, text=True,
                          env=env_with(conf_path, subprocess_env), cwd=tmp_path, timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode != 0, proc.stdout + err
    assert len(err.splitlines()) <= 3 and err.startswith("SLURM does not answer here: "), err
    said_once(err, conf_path)
    assert "hydra/launcher=gpupack_local to run here" in err, err
    assert not (sweep_dir / ".gpupack").exists() and not (sweep_dir / "0").exists()


@pytest.mark.slow
def test_sbatch_finding_no_controller_is_one_line_with_its_words_once(tmp_path, subprocess_env):
    """SLURM answered the checks a moment ago (require_reachable passed), then sbatch finds no controller: the
    error quotes sbatch once (submitit's own print of it is not passed on) with the same fix."""
    conf = dead_controller(tmp_path)
    script = ("import sys\nfrom gpupack.submit.slurm import SlurmSubmitter\n"
              "SlurmSubmitter.require_reachable = lambda self: None\n"
              "from gpupack.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", script, *SMALL, f"run_dir={tmp_path / 'run'}", "wait=false"],
                          capture_output=True, text=True, env=env_with(conf, subprocess_env), cwd=REPO, timeout=300)
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc.stdout + err
    assert len(err.splitlines()) == 1 and err.startswith("gpupack: error: SLURM does not answer here: sbatch: "), err
    said_once(err, conf)


# What sbatch said (submitit's FailedJobError holds its stderr), and whether it is SLURM not answering.
SBATCH = [
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)", True),
    ("sbatch: error: s_p_parse_file: cannot stat file /x/slurm.conf: No such file or directory, retrying in 1sec "
     "up to 60sec\nsbatch: error: ClusterName needs to be specified\nsbatch: fatal: Unable to process configuration "
     "file", True),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified", False),
    ("sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification", False),
]


@pytest.mark.parametrize("said, unreachable", SBATCH, ids=[s[0][-40:] for s in SBATCH])
def test_sbatch_not_finding_slurm_is_told_from_sbatch_refusing_the_job(monkeypatch, said, unreachable):
    monkeypatch.setenv("SLURM_CONF", "/x/slurm.conf")
    err = commands.sbatch_refusal(FailedJobError(said))
    assert (err is not None) == unreachable
    if err is not None:
        line = str(err)
        assert isinstance(err, UnreachableError) and "\n" not in line and "(SLURM_CONF=/x/slurm.conf)" in line
        first = said.splitlines()[0].removeprefix("sbatch: error: ")
        assert line.count(first) == 1, line  # each thing it said, once


def test_sbatch_not_installed_is_slurm_not_answering(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    err = commands.sbatch_refusal(FileNotFoundError(2, "No such file or directory", "sbatch"))
    assert err is not None and "SLURM_CONF not set" in str(err) and "cluster=local" in str(err)


def test_what_a_client_said_is_one_line_each_thing_once():
    said = "sbatch: error: A\nsbatch: error: B\n\nsbatch: error: A\nsbatch: fatal: C\n"
    assert commands.one_line("sbatch", said) == "sbatch: A; B; C"


@pytest.mark.parametrize("printed, refusal, passed_on", [
    ("", None, ""),
    ("a warning of submitit's own\n", None, "a warning of submitit's own\n"),  # a submission that went through
    ("sbatch: error: Invalid account\n", "sbatch: error: Invalid account", ""),  # said once: in gpupack's error
    ("a warning\nsbatch: error: Invalid account\n", "sbatch: error: Invalid account", "a warning\n"),
])
def test_a_submission_passes_on_what_it_wrote_to_stderr_but_sbatchs_refusal(monkeypatch, capsys, tmp_path, printed,
                                                                          refusal, passed_on):
    """submitit prints what a failing sbatch said before it raises it; gpupack quotes those words in its own error,
    so the print is held back, and nothing else written to stderr meanwhile is."""
    from submitit import SlurmExecutor

    from gpupack.submit.slurm import QuietSlurmExecutor

    def submit(self, delayed):
        sys.stderr.write(printed)
        if refusal is not None:
            raise FailedJobError(refusal)
        return []

    monkeypatch.setattr(SlurmExecutor, "_internal_process_submissions", submit)
    executor = QuietSlurmExecutor.__new__(QuietSlurmExecutor)  # no sbatch to find: the seam alone
    if refusal is None:
        assert executor._internal_process_submissions([]) == []
    else:
        with pytest.raises(FailedJobError):
            executor._internal_process_submissions([])
    assert capsys.readouterr().err == passed_on
