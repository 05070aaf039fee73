#!/usr/bin/env bash
# A one-minute packed sweep on this machine, then collect its records again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RUN=runs/examples/tiny_$(date +%Y%m%d_%H%M%S)
"$PY" -m gpupack +sweep=mnist_pack packing.factors=[1,2] packing.repeats=1 \
  sweep.grid.lr=[0.1] sweep.grid.batch_size=[128] sweep.fixed.train_samples=5000 sweep.fixed.epochs=1 \
  run_dir="$RUN"
"$PY" -m gpupack collect "$RUN"
