"""submitit's private internals, in one place: what gpupack's backends use of submitit beyond its public API, listed
by :func:`internals`. pyproject bounds submitit above the newest release tested, and :func:`missing_internals`
(tests/test_submitit.py) names any of these that moved."""
from __future__ import annotations

import contextlib
import functools
import inspect
import io
import shlex
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Callable, TypeVar

import submitit
import submitit.core.utils
import submitit.local._local
import submitit.local.local as submitit_local
import submitit.slurm.slurm
from submitit.core.utils import DelayedSubmission, FailedJobError
from submitit.slurm.slurm import _make_sbatch_string

__all__ = ["CONTROLLER", "QuietSlurmExecutor", "SessionLocalExecutor", "make_sbatch_string", "missing_internals",
           "submitit_main", "unsaid"]

CONTROLLER = "submitit.local._local"  # the module of submitit's local controller, in its command line

_submit_lock = threading.Lock()
R = TypeVar("R")  # what the job returns, as submitit's executor types it


class SessionLocalExecutor(submitit.LocalExecutor):
    """submitit's local executor, each job's controller in a session of its own: the terminal's signals reach gpupack
    alone, which cancels its jobs itself (a controller would die on a hang-up, leaving its job running, parentless).
    ``inherit``: descriptors each controller keeps open (the run directory's lock, held while its job runs)."""

    inherit: tuple[int, ...] = ()

    @property
    def _submitit_command_str(self) -> str:
        # submitit's own job entry, through gpupack.submit._local_job: the same job, and a quick exit once it is done
        return " ".join([self.python, "-u -m gpupack.submit._local_job", shlex.quote(str(self.folder))])

    def _submit_command(self, command: str) -> submitit_local.LocalJob[R]:
        # submitit's module sees a Popen that starts a new session during this call (under a lock: module-wide)
        popen = functools.partial(subprocess.Popen, start_new_session=True, pass_fds=self.inherit)
        with _submit_lock:
            real = submitit_local.subprocess
            submitit_local.subprocess = types.SimpleNamespace(Popen=popen)  # type: ignore[assignment]
            try:
                return super()._submit_command(command)
            finally:
                submitit_local.subprocess = real


class QuietSlurmExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor without its own print of what a failing sbatch said: the error gpupack raises from it
    quotes sbatch's words once. Anything else written to stderr meanwhile (a warning) is passed on."""

    def _internal_process_submissions(self, delayed_submissions: list[DelayedSubmission]) -> list[submitit.Job[object]]:
        said = io.StringIO()
        refused = ""
        try:
            with contextlib.redirect_stderr(said):
                return super()._internal_process_submissions(delayed_submissions)
        except FailedJobError as err:
            refused = str(err).strip()
            raise
        finally:
            sys.stderr.write(unsaid(said.getvalue(), refused))


def unsaid(written: str, refused: str) -> str:
    """What was written to stderr during a submission, less submitit's print of sbatch's ``refused``. Pure."""
    return written.replace(refused + "\n", "", 1) if refused else written


def make_sbatch_string(folder: Path, **parameters: object) -> str:
    """The submission.sh submitit's SlurmExecutor writes for ``parameters`` (its update_parameters' names) into
    ``folder``, with no command: an executor itself needs srun, which a dry run away from the cluster lacks."""
    make: Callable[..., str] = _make_sbatch_string  # its hint says gpus_per_node is an int; sbatch takes "v100:1"
    return make(command="", folder=folder, **parameters)


def submitit_main() -> None:
    """submitit's job entry, imported here in the job: its module imports numpy, 0.15 s the command need not pay."""
    from submitit.core.submission import submitit_main as main

    main()


def internals() -> dict[types.ModuleType, dict[str, tuple[str, ...]]]:
    """What gpupack reaches for in submitit, by module and name; a parameter list: names its signature must have."""
    import submitit.core.submission  # here and in the job only (numpy first, see submitit_main)

    return {
        submitit_local: {"subprocess": (), "LocalJob": (), "LocalExecutor._submitit_command_str": (),
                         "LocalExecutor._submit_command": ("command",)},
        submitit.local._local: {"Controller": ()},
        submitit.slurm.slurm: {"_make_sbatch_string": ("command", "folder", "map_count", "stderr_to_stdout",
                                                       "gpus_per_node", "additional_parameters", "setup"),
                               "SlurmExecutor._internal_process_submissions": ("delayed_submissions",)},
        submitit.core.submission: {"submitit_main": ()},
        submitit.core.utils: {"DelayedSubmission": (), "FailedJobError": ()},
    }


def missing_internals() -> list[str]:
    """Each internal of :func:`internals` this submitit lacks, or whose signature lost a name gpupack passes."""
    missing = []
    for module, names in internals().items():
        for dotted, params in names.items():
            found: object = module
            for part in dotted.split("."):  # a class's own member: the one gpupack overrides or calls
                found = vars(found).get(part) if isinstance(found, type) else getattr(found, part, None)
            if found is None:
                missing.append(f"{module.__name__}.{dotted}")
            elif params and not set(params) <= set(inspect.signature(found).parameters):  # type: ignore[arg-type]
                missing.append(f"{module.__name__}.{dotted}({', '.join(params)})")
    return missing
