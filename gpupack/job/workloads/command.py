"""Pack any program without touching it: ``sweep.workload=command``.

    sweep.fixed.argv=[python, train.py, --lr, "{lr}", --seed, "{seed}"]   sweep.grid.lr=[0.1,0.01]

Each ``{name}`` in an argv item (a list, never a shell), ``sweep.fixed.cwd`` and ``sweep.fixed.env`` is replaced by
that training's hyperparameter (``{lr:.0e}``: a format spec; ``{{``: a brace; an unknown name is refused before
anything runs). Every other key of the grid or of ``sweep.fixed`` is a hyperparameter.

The program's exit status and wall time are the training's. A program that writes JSON at ``$GPUPACK_RESULT``
(:mod:`gpupack.result`) reports metrics, samples and, marking its first step, start-up apart from the loop.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.machinery
import importlib.util
import math
import os
import shutil
import string
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence, TypedDict, cast

from gpupack.core.preload import check_importable, import_libraries, static_imports
from gpupack.core.result import ENV as RESULT_ENV
from gpupack.core.result import ResultReport
from gpupack.core.stdout_metrics import metrics_from_output, stdout_patterns
from gpupack.core.workload import Launch, LoopSummary, PythonMain, TrainingContext, Workload
from gpupack.errors import ConfigError, DataError, nearest

PROGRAM_KEYS = ("argv", "cwd", "env", "metrics", "start", "preload")  # every other key is a hyperparameter
STARTS = ("fresh", "fork")
# Placeholders that are no hyperparameter: {python} is the interpreter running gpupack (its venv, activated or not).
RESERVED = {"python": sys.executable}
CONVERSIONS: dict[str, Callable[[object], str]] = {"r": repr, "s": str, "a": ascii}
ARGV_HINT = "e.g. sweep.fixed.argv=[python,train.py,--lr,'{lr}']"


class CommandParams(TypedDict, total=False):
    """The keys that describe the program, as :meth:`Command.typed` checked them; any other is a hyperparameter."""

    argv: list[str]
    cwd: str | None
    env: dict[str, str]
    metrics: dict[str, str]
    start: str
    preload: list[str]


def program_keys(params: Mapping[str, object]) -> CommandParams:
    """A training's plain values as what they are (:meth:`Command.typed` checked them before anything ran)."""
    return cast(CommandParams, params)


def render(template: str, values: Mapping[str, object], key: str) -> str:
    """``template`` with each ``{name}`` (optionally ``{name:spec}`` or ``{name!r}``) replaced by values[name]."""
    out = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ConfigError(key, template, f"is not a valid template ({err})",
                          "write {{ and }} for literal braces, {name} for a hyperparameter") from None
    for literal, name, spec, conversion in parsed:
        out.append(literal)
        if name is None:
            continue
        if not name or not name.isidentifier() and not name.replace("-", "_").isidentifier():
            raise ConfigError(key, template, f"{{{name}}} is not a hyperparameter placeholder",
                              "name a hyperparameter, e.g. {lr}; write {{ and }} for literal braces")
        if name not in values:
            raise ConfigError(key, template, f"{{{name}}} names no hyperparameter of this sweep",
                              f"{nearest(name, values)} "
                              f"(add it with sweep.grid.{name}=[...] or sweep.fixed.{name}=...)")
        if conversion and conversion not in CONVERSIONS:
            raise ConfigError(key, template, f"!{conversion} is not a conversion",
                              "use {name}, {name!r}, {name!s} or {name!a}")
        value = CONVERSIONS[conversion](values[name]) if conversion else values[name]
        try:
            out.append(format(value, spec or ""))
        except (ValueError, TypeError) as err:
            raise ConfigError(key, template, f"format spec {spec!r} does not fit {name}={value!r} ({err})",
                              "drop the spec, or give one that fits the value, e.g. {lr:.0e}") from None
    return "".join(out)


def _names(template: str) -> set[str]:
    """The placeholder names in a template ("" where it does not parse: render refuses it later)."""
    try:
        return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}
    except ValueError:
        return set()


class Command(Workload[CommandParams]):
    name = "command"
    framework = "command"  # a program of its own: only process mode can host it
    Params = dict
    fresh_reason = "a program starts fresh unless sweep.fixed.start=fork, for a Python script or -m module"
    curve_in_output = True  # a user's program prints its curve: search.intermediate reads it

    # ---- hyperparameters are open: the program's own, whatever the user names ----

    def defaults(self) -> dict[str, object]:
        return {"argv": [], "cwd": None, "env": {}, "metrics": {}, "start": "fresh", "preload": []}

    def typed(self, key: str, value: object, where: str) -> object:
        full = f"{where}.{key}"
        if key not in PROGRAM_KEYS:
            if isinstance(value, dict):
                raise ConfigError(full, value, "a hyperparameter must be a value or a list of values",
                                  "give a number, a string or a list")
            return value
        if where != "sweep.fixed":
            raise ConfigError(full, value, f"{key} describes the program, not a hyperparameter",
                              f"set it once as sweep.fixed.{key}")
        if key == "argv":
            if not isinstance(value, list) or any(isinstance(v, (list, dict)) for v in value):
                raise ConfigError(full, value, "argv must be a list of strings (a list argv, never a shell line)",
                                  ARGV_HINT)
            if any(v is None for v in value):
                raise ConfigError(full, value, "an argv item is null", "quote it, or leave it out: [python,train.py]")
            # Hydra parsed unquoted items: a boolean arrives as the user wrote it (true), not as Python's True.
            return [str(v).lower() if isinstance(v, bool) else str(v) for v in value]
        if key == "metrics":
            return stdout_patterns(value, full)
        if key == "start":
            if value not in STARTS:
                raise ConfigError(full, value, "unknown start", f"{nearest(str(value), STARTS)}: fresh (a new "
                                  "interpreter per training) or fork (from a server that imported sweep.fixed.preload)")
            return value
        if key == "preload":
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise ConfigError(full, value, "must be a list of module names", "e.g. sweep.fixed.preload=[torch]")
            return value
        if key == "cwd":
            if value is not None and not isinstance(value, str):
                raise ConfigError(full, value, "must be a folder path or null", "e.g. sweep.fixed.cwd=/project/me/code")
            return value
        if not isinstance(value, dict) or any(isinstance(v, (list, dict)) for v in value.values()):
            raise ConfigError(full, value, "env must map variable names to values",
                              "e.g. +sweep.fixed.env.WANDB_MODE=offline")
        return {str(k): str(v) for k, v in value.items()}

    def params(self, values: Mapping[str, object]) -> CommandParams:
        return program_keys(dict(values))

    @staticmethod
    def hyperparameters(params: Mapping[str, object]) -> dict[str, object]:
        return {k: v for k, v in params.items() if k not in PROGRAM_KEYS}

    def program(self, plain: Mapping[str, object]) -> Launch:
        """The rendered argv, environment and working directory of one training (refuses bad templates)."""
        params = program_keys(plain)
        # only the hyperparameters its templates name; all of them where one is missing (render's nearest name)
        templates = [*(params.get("argv") or []), *(params.get("env") or {}).values(), params.get("cwd") or ""]
        names = {n for t in templates for n in _names(str(t)) if n not in RESERVED}
        own = all(n not in PROGRAM_KEYS and n in plain for n in names)
        named = {n: plain[n] for n in names} if own else self.hyperparameters(params)
        values = {**RESERVED, **named}
        argv = [render(item, values, f"argv[{i}]") for i, item in enumerate(params.get("argv") or [])]
        env = {name: render(v, values, f"env.{name}") for name, v in (params.get("env") or {}).items()}
        cwd = render(cwd_template, values, "cwd") if (cwd_template := params.get("cwd")) else None
        return Launch(argv, env, cwd)

    def filler_seed(self, fixed: Mapping[str, object]) -> str | None:
        """The seed reaches the program only through a ``{seed}`` in its argv, env or cwd."""
        program = program_keys(fixed)
        templates = [*(program.get("argv") or []), *(program.get("env") or {}).values(), program.get("cwd") or ""]
        return self.seed_key if any(_names(str(t)) & {self.seed_key} for t in templates) else None

    def check(self, params: CommandParams) -> None:
        if not params.get("argv"):
            raise ConfigError("argv", params.get("argv"), "no program given (argv is empty)", ARGV_HINT)
        launch = self.program(params)
        for name in launch.env:
            if not name.replace("_", "a").isalnum() or name[0].isdigit():
                raise ConfigError(f"env.{name}", launch.env[name], "is not an environment variable name",
                                  "use letters, digits and _, not starting with a digit")
        cwd = Path(launch.cwd) if launch.cwd else Path.cwd()
        if not cwd.is_dir():
            raise ConfigError("cwd", launch.cwd, "is not a folder", "give an existing folder, or leave cwd unset")
        # the program's PATH, without copying the whole environment once per training (a grid of thousands)
        check_program(launch.argv, cwd, {"PATH": launch.env.get("PATH", os.environ.get("PATH", ""))})
        if params.get("start") == "fork":
            if python_main(launch.argv, {**os.environ, **launch.env}) is None:
                raise ConfigError("start", "fork", f"argv {launch.argv[:3]} is not a Python program this interpreter "
                                  "runs (python SCRIPT.py ... or python -m MODULE ...)",
                                  "write sweep.fixed.argv=['{python}',train.py,...], or leave start=fresh")
            for i, module in enumerate(params.get("preload") or []):
                check_importable(module, f"preload[{i}]")

    # ---- process mode: the program itself is the training's process ----

    def launch(self, params: Mapping[str, object], spec_path: str, result_path: str) -> Launch:
        program = self.program(params)
        main = python_main(program.argv, {**os.environ, **program.env}) if params.get("start") == "fork" else None
        return Launch(program.argv, {**program.env, RESULT_ENV: result_path}, program.cwd, main)

    # ---- fork start (sweep.fixed.start=fork): a forked child runs the script as python would ----

    def fork_refusal(self, params: Mapping[str, object]) -> str | None:
        return None if params.get("start") == "fork" else self.fresh_reason

    def preload(self, params: Sequence[CommandParams]) -> None:
        if not params:
            return
        for module in params[0].get("preload") or []:
            importlib.import_module(str(module))
        # what the file a forked training runs (its script, or its -m module's) imports: every import of a forked
        # script runs in its child
        launch = self.program(params[0])
        main = python_main(launch.argv, {**os.environ, **launch.env})
        cwd = Path(launch.cwd) if launch.cwd else Path.cwd()
        found = None if main is None else cwd / str(main["script"]) if "script" in main \
            else module_file(str(main["module"]), [str(cwd), *sys.path])
        import_libraries(static_imports([found] if found else [], sys.modules), "imported by the script's files")

    def failure_hint(self, params: Mapping[str, object], error: str) -> str | None:
        """A program that could not import a module may have run under another interpreter: say which."""
        if "ModuleNotFoundError" not in error and "No module named" not in error:
            return None
        argv = self.program(params).argv
        program = argv[0] if argv else ""
        ran = shutil.which(program) or program
        if os.path.abspath(ran) == os.path.abspath(sys.executable):
            return None
        return (f"HINT: argv[0] {program!r} ran {ran}, not the Python running gpupack ({sys.executable}): write "
                f"{{python}} in sweep.fixed.argv to use gpupack's, or install the module for {ran}")

    def result(self, params: Mapping[str, object], raw: Mapping[str, object] | None, spawned_at: float,
               ended_at: float, stdout: Path | None = None) -> dict[str, object]:
        patterns = program_keys(params).get("metrics") or {}
        printed = metrics_from_output(stdout, patterns) if patterns and stdout is not None else {}
        return result_from_report(raw, spawned_at, ended_at, printed)

    def train(self, params: CommandParams, ctx: TrainingContext) -> dict[str, object]:
        """Never called: a program is its own process (``launch``); no mode hosts a ``command`` training in-process."""
        raise NotImplementedError("a command training runs as its own process (process mode), never in-process")


def module_file(name: str, path: Sequence[str]) -> Path | None:
    """The file of module ``name`` as ``python -m`` would find it from ``path``, without importing its packages."""
    locations: Sequence[str] | None = list(path)
    spec = None
    for part in name.split("."):
        if locations is None:
            return None
        try:
            spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
        except (ImportError, ValueError, OSError):
            return None
        if spec is None:
            return None
        locations = spec.submodule_search_locations
    return Path(spec.origin) if spec is not None and spec.origin and spec.has_location else None


def python_main(argv: Sequence[str], env: Mapping[str, str]) -> PythonMain | None:
    """``[PY, SCRIPT.py, ARGS...]`` or ``[PY, -m, MODULE, ARGS...]`` run by this very interpreter (paths compared
    unresolved: a venv's python links to the system's) as the fork server's request; None otherwise. Pure."""
    if len(argv) < 2:
        return None
    found = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    if found is None or os.path.abspath(found) != os.path.abspath(sys.executable):
        return None
    if argv[1] == "-m" and len(argv) > 2:
        return {"module": argv[2], "argv": [argv[2], *argv[3:]]}
    if argv[1].startswith("-"):
        return None  # other interpreter options (-c, -u, -X...): only a fresh interpreter honours them
    return {"script": argv[1], "argv": list(argv[1:])}


def check_program(argv: list[str], cwd: Path, env: Mapping[str, str]) -> None:
    """The program must exist where it will run (an executable file, or on PATH), and so must a python's script."""
    program = argv[0]
    if os.sep in program:
        path = Path(program) if os.path.isabs(program) else cwd / program
        if not path.is_file():
            raise ConfigError("argv[0]", program, f"no such program ({path})",
                              "give the path of an executable file, or a program on PATH such as python")
        if not os.access(path, os.X_OK):
            raise ConfigError("argv[0]", program, "is not executable",
                              f"chmod +x {program}, or run it through its interpreter: [python,{program},...]")
    elif shutil.which(program, path=env.get("PATH")) is None:
        raise ConfigError("argv[0]", program, "is not a program on PATH",
                          "install it, load its module, or give its full path")
    script = argv[1] if len(argv) > 1 else ""
    if Path(program).name.startswith("python") and script.endswith(".py") and not script.startswith("-"):
        if not (Path(script) if os.path.isabs(script) else cwd / script).is_file():
            raise ConfigError("argv[1]", script, f"no such script (looked in {cwd})",
                              "give the script's path, or set sweep.fixed.cwd to the folder that holds it")


# What each key of a program's result file holds (gpupack.result writes them; another language's program may too).
_COUNT = "a whole number >= 0"
_TIME = "a time in seconds since the epoch (time.time())"
REPORT_KEYS = {"metrics": "an object of metric names to values", "samples": _COUNT, "steps": _COUNT,
               "loop_start": _TIME, "loop_end": _TIME}
_REPORT_HINT = ('write what gpupack.result writes: {"metrics": {"val_accuracy": 0.9}, "samples": 60000, "steps": 938, '
                '"loop_start": 1764400000.0, "loop_end": 1764400042.5}, each key optional')


def _number(value: object) -> float | None:
    """A JSON number as a float (a bool is none; an integer too large for a float is not a finite time)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _holds(key: str, value: object) -> bool:
    if key == "metrics":
        return isinstance(value, dict)
    number = _number(value)
    if number is None or not math.isfinite(number):
        return False
    return number >= 0 and number.is_integer() if REPORT_KEYS[key] == _COUNT else True


class _Shown(str):
    """A value quoted in an error as at most 60 characters of its repr (a record keeps the line, not the file)."""

    def __repr__(self) -> str:
        return str(self)


def _shown(value: object) -> object:
    text = repr(value)
    return value if len(text) <= 60 else _Shown(text[:57] + "...")


def checked_report(raw: object) -> ResultReport:
    """What a program reported at ``$GPUPACK_RESULT``, else a DataError naming the first key that does not hold what
    :mod:`gpupack.result` writes. A key of its own is left alone unless it reads as a misspelt one (``metric``)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DataError(RESULT_ENV, _shown(raw), "is no JSON object", _REPORT_HINT)
    for key, value in raw.items():
        if key not in REPORT_KEYS:
            if difflib.get_close_matches(str(key), REPORT_KEYS, n=1, cutoff=0.8):
                raise DataError(f"{RESULT_ENV}.{key}", _shown(value), "is no key of a result",
                                nearest(str(key), REPORT_KEYS))
        elif value is not None and not _holds(key, value):
            raise DataError(f"{RESULT_ENV}.{key}", _shown(value), f"is not {REPORT_KEYS[key]}", _REPORT_HINT)
    metrics, samples, steps = raw.get("metrics"), _number(raw.get("samples")), _number(raw.get("steps"))
    start, end = _number(raw.get("loop_start")), _number(raw.get("loop_end"))
    if start is not None and end is not None and end < start:
        raise DataError(f"{RESULT_ENV}.loop_end", end, f"is before loop_start={start!r}",
                        "write loop_start when the loop begins and loop_end when it ends (time.time())")
    report: ResultReport = {"loop_start": start, "loop_end": end}
    if isinstance(metrics, dict):
        report["metrics"] = {str(k): v for k, v in metrics.items()}
    if samples is not None:
        report["samples"] = int(samples)
    if steps is not None:
        report["steps"] = int(steps)
    return report


def result_from_report(raw: Mapping[str, object] | None, spawned_at: float, ended_at: float,
                       printed: Mapping[str, object] | None = None) -> dict[str, object]:
    """A command training's result in the worker's schema, from what the program reported (which wins over the
    metrics it ``printed``). Start-up and loop are split only where it marked its first step (``timings.split``)."""
    report = checked_report(raw)  # the program's JSON: written by gpupack.result, or by the program itself
    loop_start, loop_end = report.get("loop_start"), report.get("loop_end")
    loop_s = loop_end - loop_start if loop_start is not None and loop_end is not None else None
    samples = report.get("samples") or 0
    rate_over = loop_s if loop_s else ended_at - spawned_at
    throughput: LoopSummary = {
        "loop_s": loop_s, "steps": report.get("steps") or 0, "samples": samples,
        "samples_per_s": samples / rate_over if samples and rate_over > 0 else None, "warmup_excluded": False,
        "curve": []}
    return {
        "metrics": {**(printed or {}), **(report.get("metrics") or {})},
        "memory": {"peak_rss_mb": None, "peak_gpu_mem_mb": None},  # the sampler follows the process's RSS
        "knobs": {}, "loader_setting": None, "data": None, "throughput": throughput,
        "timings": {"spawned_at": spawned_at, "process_start": None, "loop_start": loop_start, "loop_end": loop_end,
                    "finished": ended_at, "startup_s": loop_start - spawned_at if loop_start is not None else None,
                    "loop_s": loop_s, "teardown_s": ended_at - loop_end if loop_end is not None else None,
                    "split": loop_start is not None},
    }


WORKLOAD = Command()
