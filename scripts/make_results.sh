#!/usr/bin/env bash
# Regenerates the results committed under results/ (never edit them by hand):
#   results/meta/   predictions on the meta device for the paper's grid (16 GiB budget):
#                   memory per level and the maximum batch per strategy of the four networks
#   results/quick/  the --quick CPU version of every experiment in experiments/
# Each command resumes, so an interrupted run can be restarted.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m actbench run experiments/memory_per_level.toml --device meta --out results/meta
for model in resnet50 resnet152 wide_resnet101_2 densenet201; do
  "$PY" -m actbench plan "$model" --budget 16GiB --strategies swap,checkpoint --levels L0..L5 --out results/meta/max_batch
done
"$PY" -m actbench report results/meta --out results/meta/report.md
for exp in max_batch memory_per_level accuracy_vs_bits resnet50_throughput_vs_batch max_scale_resnet152; do
  "$PY" -m actbench run "experiments/$exp.toml" --quick --device cpu --out results/quick
done
