#!/usr/bin/env bash
# The whole suite as CI runs it (the README's test command ends with this), in four tiers:
#
#   checks   ruff, mypy, the documentation site built strictly (a dead link fails it)
#   fast     -m "not slow and not slurm" on two workers: tables and fakes, nothing real runs (~2 min); alone only
#            with `scripts/tests.sh fast`
#   runs     -m "not slurm and not quiet" on three workers, a test file to a worker (a module's workspace is made
#            once): the fast tests and the real runs together, so that the fast tests fill the cores while the real
#            runs' workers wait on their processes (two workers left the cores a fifth idle); beside them, the SLURM
#            tests one at a time against the local slurmctld (scripts/local_slurm.sh start): those mostly wait on the
#            scheduler (a time limit is whole minutes, a job's start a second), so the runs' CPU fills that wait; some
#            restart slurmctld with other limits, so no two of them run at once
#   quiet    -m quiet, one at a time: the tests that judge what a real run measured on this host (a named N, a quiet
#            pack), which anything beside them would disturb
#   side     scripts/side_envs.sh: the search tests on Optuna's floor, and Hydra's Optuna sweeper
#
# Each tier stops the script where it fails. `scripts/tests.sh fast` runs the checks and the fast tier alone.
# PYTEST_ADDOPTS reaches every pytest (e.g. --durations=40).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
case "${1:-}" in ""|fast) ;; *) echo "tests.sh: no tier '$1'. HINT: scripts/tests.sh [fast]" >&2; exit 2 ;; esac

.venv/bin/ruff check
.venv/bin/mypy
.venv/bin/mkdocs build --strict
# The tree's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (this machine's shell sets it) every one of
# the suite's ~2,000 interpreters would compile gpupack's modules again, 0.3 s of a core each
"$PY" -m compileall -q -j 0 gpupack tests hydra_plugins examples benchmarks > /dev/null
if [ "${1:-}" = fast ]; then exec "$PY" -m pytest -n 2 -m "not slow and not slurm"; fi

slurm_log=$(mktemp -t gpupack-slurm-tier.XXXXXX)
setsid "$PY" -m pytest -m "slurm and not quiet" --basetemp="$slurm_log.d" > "$slurm_log" 2>&1 &
slurm_pid=$!  # its own process group (setsid): a tier that fails leaves no SLURM test, nor its jobs, behind it
trap 'kill -- "-$slurm_pid" 2>/dev/null || true' EXIT
real=0
"$PY" -m pytest -n 3 --dist loadfile -m "not slurm and not quiet" || real=$?
slurm=0
wait "$slurm_pid" || slurm=$?
trap - EXIT
echo "---- the SLURM tests (run beside the real runs; exit $slurm) ----"
cat "$slurm_log"
rm -rf "$slurm_log" "$slurm_log.d"
[ "$real" = 0 ] && [ "$slurm" = 0 ] || exit 1

"$PY" -m pytest -m quiet
scripts/side_envs.sh
