"""On a GPU: time per training of the default sweep along N, MPS on and off, fused beside process, and ResNet-50.

    python benchmarks/gpu.py                 # on the GPU machine (scripts/gpu_check.sh runs it): about 9 min on
                                             # an H200 (2026-11-30: mnist 4.6 min, resnet50 1 min, MPS the rest)
    python benchmarks/gpu.py --quick         # tiny sizes; on a machine without a GPU it runs on the CPU, MPS left out
    python benchmarks/gpu.py --ladder 1,3,8 --runs mnist,resnet50   # a short lease: fewer N, fewer runs
    python benchmarks/gpu.py --report OUT    # re-print (also what a run cut short wrote: results.json is
                                             # rewritten after each run)

Runs, each a gpupack sweep into its own run directory under OUT (default runs/benchmarks/gpu/<date>_<time>):

    python -m gpupack +sweep=mnist_pack packing.factors=[1,2,3,5,8,13,21,34] packing.modes=[process,fused]
        packing.repeats=1 run_dir=OUT/mnist                                   # process and fused, MPS off
    python -m gpupack +sweep=mnist_pack packing.factors=[...] packing.process.mps=true run_dir=OUT/mnist_mps
    python -m gpupack +sweep=resnet50_gpu packing.factors=[1,2,4] run_dir=OUT/resnet50   # 224x224, batch 128, AMP

N beyond the memory cap (packing.memory_fraction of NVML's total) is refused by gpupack before anything runs: the
ladder is cut to what validation accepts (a dry run per N). The table gives time per training (pack wall / N,
median over packs) for each N and run, each as a multiple of N=1 process (MPS off), and ResNet-50's images/s per
training and per pack; with the device, the driver, torch's version and the date.
"""
from __future__ import annotations

import datetime as _dt
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PYTHON, REPO, fmt, out_dir, parser, ratio, read_json, run_sweep, say, table, write_json  # noqa: E402

LADDER = [1, 2, 3, 5, 8, 13, 21, 34]
QUICK_MNIST = ["sweep.grid.lr=[0.1]", "sweep.grid.batch_size=[128]", "sweep.fixed.train_samples=2000",
               "sweep.fixed.epochs=1", "sweep.fixed.val_samples=500"]
QUICK_RESNET = ["sweep.fixed.image_size=32", "sweep.fixed.batch_size=16", "sweep.fixed.train_samples=64",
                "sweep.fixed.val_samples=16", "sweep.fixed.num_workers=0", "sweep.grid.seed=[0,1]"]


def device() -> dict[str, Any]:
    """The GPU NVML sees (or why none), its driver, and torch's version and CUDA."""
    code = ("import json, torch\nfrom gpupack.core.monitor import detect_device\n"
            "info = detect_device()\ndriver = None\n"
            "try:\n    import pynvml\n    pynvml.nvmlInit()\n    driver = pynvml.nvmlSystemGetDriverVersion()\n"
            "except Exception:\n    pass\n"
            "print(json.dumps({'kind': info.kind, 'name': info.name, 'memory_mb': info.memory_total_mb,"
            " 'note': info.note, 'driver': str(driver) if driver else None, 'torch': torch.__version__,"
            " 'cuda': torch.version.cuda}))")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    import json

    return json.loads(out.stdout) if out.returncode == 0 else {"kind": "unknown", "note": out.stderr[-500:]}


def fitting(ladder: list[int], base: list[str]) -> list[int]:
    """The N gpupack accepts for this sweep here (a dry run each: the memory cap refuses the rest)."""
    ok = []
    for n in ladder:
        rc = subprocess.run([PYTHON, "-m", "gpupack", *base, f"packing.factors=[{n}]", "dry_run=true"],
                            capture_output=True, cwd=REPO, timeout=300).returncode
        if rc != 0:
            break
        ok.append(n)
    return ok


RUNS = ("mnist", "mnist_mps", "resnet50")


def run(out: Path, quick: bool, ladder_asked: list[int] | None = None, only: tuple[str, ...] = RUNS) -> dict[str, Any]:
    dev = device()
    gpu = dev.get("kind") == "gpu"
    results: dict[str, Any] = {"quick": quick, "device": dev, "date": _dt.date.today().isoformat(), "runs": {}}
    mnist = ["+sweep=mnist_pack", "packing.repeats=1", *(QUICK_MNIST if quick else [])]
    ladder = fitting(ladder_asked or ([1, 2, 4] if quick else LADDER), mnist)
    factors = f"packing.factors=[{','.join(map(str, ladder))}]"
    results["ladder"] = ladder
    runs = {"mnist": [*mnist, factors, "packing.modes=[process,fused]"]}
    if gpu:
        runs["mnist_mps"] = [*mnist, factors, "packing.process.mps=true"]
    resnet = ["+sweep=resnet50_gpu", "packing.factors=[1,2,4]" if not quick else "packing.factors=[1,2]",
              "packing.repeats=1", *(QUICK_RESNET if quick else [])]
    runs["resnet50"] = resnet
    for key, args in runs.items():
        if key in only:
            results["runs"][key] = run_sweep([PYTHON, "-m", "gpupack", *args, f"run_dir={out / key}"], out, key)
            write_json(out / "results.json", results)  # after each run: a lease that ends mid-way keeps the rest
    return results


def groups(run_dir: str) -> dict[tuple[str, int], dict[str, Any]]:
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return {}
    return {(g["mode"], int(g["factor"])): g for g in read_json(path)["groups"]}


def report(out: Path) -> None:
    results = read_json(out / "results.json")
    dev = results["device"]
    say(f"device: {dev.get('name')} ({dev.get('kind')}; {fmt(dev.get('memory_mb'), 0)} MB), driver "
        f"{dev.get('driver') or '-'}, torch {dev.get('torch')} (CUDA {dev.get('cuda') or '-'}), {results['date']}"
        + (" (--quick check, not a measurement)" if results.get("quick") else ""))
    runs = results["runs"]
    plain = groups(runs["mnist"]["run_dir"]) if "mnist" in runs else {}
    mps = groups(runs["mnist_mps"]["run_dir"]) if "mnist_mps" in runs else {}
    base = (plain.get(("process", 1)) or {}).get("time_per_training_s")
    rows = []
    for n in results.get("ladder", []):
        cells = [plain.get(("process", n)), mps.get(("process", n)), plain.get(("fused", n))]
        times = [(c or {}).get("time_per_training_s") for c in cells]
        rows.append([n, *(fmt(t, 3) for t in times), *(fmt(ratio(base, t)) for t in times),
                     fmt((cells[0] or {}).get("gpu_util_mean"), 0)])
    say("")
    say(table(["N", "process s", "process+MPS s", "fused s", "process x", "MPS x", "fused x", "GPU util %"], rows,
              title="MNIST (the default sweep): time per training by N  [x = N=1 process s / this]"))
    resnet = groups(runs["resnet50"]["run_dir"]) if "resnet50" in runs else {}
    rrows = [[n, fmt(g.get("time_per_training_s"), 2), fmt(g.get("samples_per_s"), 0),
              fmt(g.get("pack_samples_per_s"), 0), fmt(g.get("gpu_util_mean"), 0), fmt(g.get("gpu_mem_peak_mb"), 0)]
             for (mode, n), g in sorted(resnet.items()) if mode == "process"]
    say("")
    say(table(["N", "s/training", "images/s per training", "images/s per pack", "GPU util %", "GPU MB peak"], rrows,
              title="ResNet-50 (resnet50_gpu: 224x224, batch 128, AMP, channels-last)"))
    say(f"\nrecords and logs: {out}")


def main() -> None:
    ap = parser("gpu", __doc__ or "", "tiny sizes (on a CPU where there is no GPU), to check the script works")
    ap.add_argument("--ladder", help="the N to try, comma-separated (default 1,2,3,5,8,13,21,34; --quick 1,2,4)")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"which runs, comma-separated (default {','.join(RUNS)})")
    args = ap.parse_args()
    if args.report:
        report(Path(args.report))
        return
    only = tuple(args.runs.split(","))
    if not set(only) <= set(RUNS):
        ap.error(f"--runs {args.runs!r}: each must be one of {', '.join(RUNS)}")
    ladder = [int(n) for n in args.ladder.split(",")] if args.ladder else None
    out = out_dir("gpu", args.out)
    run(out, args.quick, ladder, only)
    report(out)


if __name__ == "__main__":
    main()
