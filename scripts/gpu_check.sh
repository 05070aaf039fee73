#!/usr/bin/env bash
# The GPU check, in one command, from the repository root of the GPU machine (or any machine: without a GPU it runs
# the CPU-side checks, says "no GPU here" and exits 0).
#
#   scripts/gpu_check.sh            # CPU-side checks; on a GPU the `gpu` test tier and benchmarks/gpu.py
#   scripts/gpu_check.sh --quick    # the same with benchmarks/gpu.py --quick (tiny sizes: a check of the path in
#                                   # minutes, for a short lease; its figures are no measurement)
#   OUT=/some/folder scripts/gpu_check.sh   # logs and tables written there ($OUT on the device machine)
#
# The device machine has python3 3.12 with torch (CUDA), nvidia-ml-py, numpy, pandas, pyarrow, matplotlib, rich,
# psutil, cloudpickle and pytest, but not hydra-core, omegaconf, antlr4-python3-runtime or submitit: carry them as
# wheels in .whl/ (kept out of git: echo /.whl/ >> .git/info/exclude). Fetch them here, once:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 --platform any -d .whl hydra-core==1.3.8 omegaconf==2.3.1 submitit==1.5.4
#   python3 -m pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3     # an sdist only: built here
#
# (456 KB; PyYAML, typing-extensions and cloudpickle are there already) and name .whl in the device tool's carry.
# With a .venv of its own (this machine), that one is used instead.
set -uo pipefail
cd "$(dirname "$0")/.."
BENCH_ARGS=()
case "${1:-}" in
  --quick) BENCH_ARGS=(--quick) ;;
  "") ;;
  *) echo "gpu_check: unknown argument '$1'. HINT: scripts/gpu_check.sh [--quick]" >&2; exit 2 ;;
esac
OUT="${OUT:-runs/gpu_check}"
mkdir -p "$OUT"
say() { echo "gpu_check: $*" | tee -a "$OUT/gpu_check.log"; }

if [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  PY=python3
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpupack-site \
      .whl/*.whl || { say "could not install the carried wheels in .whl/"; exit 1; }
    export PYTHONPATH="/tmp/gpupack-site:${PYTHONPATH:-}"
  fi
  export PYTHONPATH="$PWD:${PYTHONPATH:-}"  # gpupack and its Hydra plugin from this checkout, not installed
fi
export PYTHONUNBUFFERED=1

# ---- CPU-side checks: gpupack imports, plans, and its GPU tests collect ----
missing=$("$PY" -c "
import importlib.util as u
print(' '.join(m for m in ('hydra', 'omegaconf', 'submitit', 'torch', 'pynvml', 'pandas', 'rich') if u.find_spec(m) is None))")
if [ -n "$missing" ]; then
  say "missing Python packages: $missing (see this script's header: carry them as wheels in .whl/)"
  exit 1
fi
"$PY" -m gpupack +sweep=mnist_pack dry_run=true > "$OUT/dry_run.log" 2>&1 || { say "the default sweep does not plan: $OUT/dry_run.log"; exit 1; }
"$PY" -m gpupack +sweep=resnet50_gpu dry_run=true >> "$OUT/dry_run.log" 2>&1 || { say "resnet50_gpu does not plan: $OUT/dry_run.log"; exit 1; }
"$PY" -m pytest -q -p no:cacheprovider tests/test_resnet50.py -k "architecture or amp or bad" > "$OUT/cpu_tests.log" 2>&1 \
  || { say "the CPU-side tests failed: $OUT/cpu_tests.log"; exit 1; }
say "CPU-side checks passed (plans, ResNet-50's architecture)"

# ---- the GPU, if there is one ----
device=$("$PY" -c "
from gpupack.core.monitor import detect_device
info = detect_device()
print(info.name if info.kind == 'gpu' else 'none: ' + (info.note or 'no GPU'))")
case "$device" in
  none:*)
    "$PY" -m pytest -q -p no:cacheprovider -m gpu -rs tests/test_gpu.py > "$OUT/gpu_tests.log" 2>&1
    say "no GPU here (${device#none: }); the gpu tier was skipped with that reason ($OUT/gpu_tests.log)"
    exit 0 ;;
esac
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
say "GPU: $device"
"$PY" -m pytest -p no:cacheprovider -m gpu -rs -v tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log"
tier=${PIPESTATUS[0]}
say "gpu tier: exit $tier ($OUT/gpu_tests.log)"
"$PY" benchmarks/gpu.py "${BENCH_ARGS[@]}" --out "$OUT/bench" 2>&1 | tee "$OUT/benchmark.txt"
bench=${PIPESTATUS[0]}
say "benchmark: exit $bench ($OUT/benchmark.txt)"
exit $(( tier != 0 || bench != 0 ))
