#!/usr/bin/env bash
# The tests that need another Optuna than gpupack's environment has (pip's newest within the `search` extra, 5.x):
#
#   optuna-4.0     the search tests on the `search` extra's floor, optuna 4.0.0
#   hydra-optuna   gpupack_local under Hydra's Optuna sweeper: hydra-optuna-sweeper 1.2 pins optuna<3, so it is kept
#                  out of gpupack's environment (README, "A Hydra app"; tests marked needs_hydra_optuna_sweeper)
#
# Each side environment is a folder of packages under .ci/env/ (pip --no-deps --target: only what differs), put first
# on PYTHONPATH over the main .venv; its trainings, lanes and Hydra jobs inherit it. The README's test command runs
# this after the main suite; run it alone the same way:   scripts/side_envs.sh [optuna-4.0|hydra-optuna]
# `scripts/side_envs.sh --path NAME` makes the folder and prints it, running nothing (benchmarks/search_vs_hydra_optuna.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ONLY=${1:-}
PATH_ONLY=""
if [ "$ONLY" = --path ]; then PATH_ONLY=1; ONLY=${2:?"side_envs: --path needs a name: optuna-4.0 or hydra-optuna"}; fi
case "$ONLY" in ""|optuna-4.0|hydra-optuna) ;; *) echo "side_envs: no side environment '$ONLY'. HINT: optuna-4.0 or hydra-optuna" >&2; exit 2 ;; esac

side() {  # side NAME WANT_OPTUNA PACKAGE... : make .ci/env/NAME once, check the Optuna it gives
  local dir=".ci/env/$1" want=$2
  shift 2
  [ "$(cat "$dir/.complete" 2>/dev/null)" = "$*" ] ||  # made once for this list of packages
    { rm -rf "$dir"; "$PY" -m pip install -q --no-deps --target "$dir" "$@" && echo "$*" > "$dir/.complete"; }
  local got
  got=$(PYTHONPATH="$PWD/$dir" "$PY" -c "import optuna; print(optuna.__version__)")
  [ "$got" = "$want" ] || { echo "side_envs: $dir gives optuna $got, not $want" >&2; exit 1; }
  if [ -n "$PATH_ONLY" ]; then echo "$PWD/$dir"; exit 0; fi
  echo "side_envs: $dir: optuna $got"
}

if [ -z "$ONLY" ] || [ "$ONLY" = optuna-4.0 ]; then
  side optuna-4.0 4.0.0 optuna==4.0.0
  # two workers, a file to each (as the real tier); the quiet tests judge a pack's timing, not Optuna's API: the main
  # suite runs them alone
  PYTHONPATH="$PWD/.ci/env/optuna-4.0" "$PY" -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
    -m "not slurm and not quiet" \
    tests/test_search.py tests/test_search_study.py tests/test_search_prune.py tests/test_search_progress.py \
    tests/test_search_report.py tests/test_search_workloads.py tests/test_search_dashboard.py \
    tests/test_search_curve.py
fi
if [ -z "$ONLY" ] || [ "$ONLY" = hydra-optuna ]; then
  side hydra-optuna 2.10.1 hydra-optuna-sweeper==1.2.0 optuna==2.10.1 cmaes==0.13.1 scipy==1.17.1  # 2.10 needs scipy
  PYTHONPATH="$PWD/.ci/env/hydra-optuna" "$PY" -m pytest -q -p no:cacheprovider -rs \
    -m hydra_optuna tests/test_hydra_launcher.py tests/test_doc_commands.py
fi
