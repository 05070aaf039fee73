"""Helpers shared by the benchmark scripts in this folder (not a benchmark itself).

Each script runs gpupack (or another tool) as a user would, as a subprocess of the venv's Python from the
repository root, keeps every command's output in a log file under its output folder, then reads the records the
tools wrote and prints one plain-text table.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence, cast

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
DEFAULT_SLURM_CONF = "/tmp/gpupack-slurm/etc/slurm.conf"


def write_bytecode() -> None:
    """The tree's bytecode, as a user's first run leaves it: where PYTHONDONTWRITEBYTECODE is set (this machine's
    shell sets it) every process a benchmark starts would compile gpupack's modules again (0.3 s of a core each),
    a cost no user pays twice."""
    import compileall

    for folder in ("gpupack", "hydra_plugins", "benchmarks", "examples"):
        compileall.compile_dir(REPO / folder, quiet=1)


write_bytecode()  # every benchmark imports this module before it runs anything


def parser(name: str, doc: str, quick_help: str) -> argparse.ArgumentParser:
    """The options every benchmark takes: --quick, --out, --report (each script adds its own)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", help=f"output folder (default runs/benchmarks/{name}/<date>_<time>)")
    ap.add_argument("--report", metavar="OUT", help="re-print the table of an earlier run's folder; runs nothing")
    return ap


def checkouts(before: str | None) -> dict[str, Path]:
    """This gpupack, and (``--before DIR``) another checkout of it to run beside, by name."""
    return {"this": REPO, **({"before": Path(before).resolve()} if before else {})}


def out_dir(name: str, given: str | None) -> Path:
    """Where a benchmark's run directories, logs and results.json go (runs/ is git-ignored)."""
    path = Path(given) if given else REPO / "runs" / "benchmarks" / name / _dt.datetime.now().strftime("%Y%m%d_%H%M%S")
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def run_logged(argv: Sequence[str], log: Path, env: dict[str, str] | None = None,
               timeout: float | None = None) -> tuple[int, float]:
    """Run argv from the repository root, stdout+stderr into ``log``; return (exit status, wall seconds)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    full_env.update(env or {})
    with open(log, "w") as f:
        f.write("$ " + " ".join(shlex.quote(a) for a in argv) + "\n")
        f.flush()
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(list(argv), cwd=REPO, env=full_env, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = 124
        wall = time.perf_counter() - t0
    return rc, wall


def run_sweep(argv: Sequence[str], out: Path, key: str, label: str | None = None) -> dict[str, Any]:
    """Run one gpupack sweep whose run directory is ``out/key``, its output in ``out/key.log``; say how it ended (its
    log's tail when it failed). Returns its entry for results.json."""
    log = out / f"{key}.log"
    say(f"running: {label or ' '.join(argv[1:])}")
    rc, wall = run_logged(argv, log)
    say(f"  exit {rc} after {wall:.1f} s (output: {log})")
    if rc != 0:
        say(tail(log))
    return {"argv": list(argv[1:]), "rc": rc, "wall_s": wall, "run_dir": str(out / key)}


def bench_main(name: str, doc: str, quick_help: str, run: Any, report: Any) -> None:
    """The main of a benchmark that takes only the common options: --report re-prints, else run, then report."""
    args = parser(name, doc, quick_help).parse_args()
    if args.report:
        report(Path(args.report))
        return
    out = out_dir(name, args.out)
    run(out, args.quick)
    report(out)


def say(msg: str) -> None:
    print(msg, flush=True)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else None


def fmt(value: Any, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or (isinstance(a, float) and math.isnan(a)) or (
            isinstance(b, float) and math.isnan(b)):
        return None
    return a / b


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> str:
    """A plain-text table: the first column left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    out = [title] if title else []
    out += [line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]]
    return "\n".join(out)


def load_run(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pack records, training records) of one gpupack run directory (attempts/ left out): its packs' folders, and the
    latest record of each pack and training its lanes' journals folded (a streaming lane's, a launcher's)."""
    from gpupack.core.store.journal import read_folded
    from gpupack.core.store.rundir import RunDir

    pack_files = sorted(run_dir.glob("packs/*/pack.json"))
    packs = [read_json(p) for p in pack_files]
    trainings = [read_json(p) for p in sorted(run_dir.glob("packs/*/trainings/*.json"))]
    folded = read_folded(RunDir(run_dir), {p.parent.name for p in pack_files})
    packs += [cast(dict[str, Any], recs[-1]) for recs in folded.packs.values()]
    trainings += [cast(dict[str, Any], recs[-1]) for recs in folded.trainings.values()]
    return packs, trainings
