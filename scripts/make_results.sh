#!/usr/bin/env bash
# Regenerates the results committed under results/ (never edit them by hand):
#   results/meta/   predictions on the meta device for the paper's grid (16 GiB budget):
#                   memory per level and the maximum batch per strategy of the four networks
#                   (experiments/memory_per_level.toml on meta, experiments/planned_max_batch.toml),
#                   and today's baselines beside ActNN (experiments/modern_baselines.toml), and the
#                   paper's maximum batch planned for the T4 profile with 64 GiB of host memory
#                   (experiments/paper_t4.toml; meta only, so not in the --quick cpu loop below), and
#                   ResNet-152's largest depth, width and resolution at batch 64 per strategy
#                   (experiments/max_scale_resnet152_meta.toml: about 20 minutes with 2 jobs on 2 cores),
#                   and segmentation, detection, video and flow at their reference sizes
#                   (experiments/dense_tasks.toml)
#   results/zoo/    ActNN on one model per torchvision family (experiments/model_zoo.toml, meta)
#   results/cpu/    the full accuracy-vs-bits run (experiments/accuracy_vs_bits.toml: ResNet-8 and a
#                   small ViT from three seeds, about 11 CPU-minutes), and meta against cpu for one
#                   model per task (trust_tasks/meta_vs_cpu.csv)
#   results/quick/  the --quick CPU version of every experiment in experiments/
# Each command resumes, so an interrupted run can be restarted.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# two worker processes where there are two cores (run refuses more jobs than cores)
JOBS=$(( $(nproc) < 2 ? 1 : 2 ))
"$PY" -m actbench run experiments/memory_per_level.toml --device meta --out results/meta
"$PY" -m actbench run experiments/planned_max_batch.toml --out results/meta
"$PY" -m actbench run experiments/modern_baselines.toml --out results/meta
"$PY" -m actbench run experiments/paper_t4.toml --out results/meta
"$PY" -m actbench run experiments/max_scale_resnet152_meta.toml --jobs "$JOBS" --out results/meta
"$PY" -m actbench run experiments/dense_tasks.toml --jobs "$JOBS" --out results/meta
"$PY" -m actbench report results/meta --out results/meta/report.md
# ActNN on one model per torchvision family, with its own figures and report under results/zoo/model_zoo/
# (apart from results/meta, whose report covers the paper's grid; about 50 minutes on 2 loaded cores; resumes)
"$PY" -m actbench run experiments/model_zoo.toml --out results/zoo
"$PY" -m actbench run experiments/accuracy_vs_bits.toml --device cpu --out results/cpu
# meta against cpu for one model per task beyond classification, at 160x192, batch 2 (about 4 minutes)
"$PY" -m actbench trust --models lraspp_mobilenet_v3_large,fasterrcnn_mobilenet_v3_large_fpn,r3d_18,raft_small \
  --strategies fp32,L3 --image-size 160x192 --out results/cpu/trust_tasks
for exp in max_batch memory_per_level accuracy_vs_bits resnet50_throughput_vs_batch max_scale_resnet152 planned_max_batch modern_baselines; do
  "$PY" -m actbench run "experiments/$exp.toml" --quick --device cpu --out results/quick
done
