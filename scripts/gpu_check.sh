#!/usr/bin/env bash
# GPU check for a lent machine (see README, "GPU checks"). Builds actbench's extension there
# (its torch may differ from ours: the cache key includes the torch version), runs the CUDA
# tests and the kernel benchmark, and leaves a log and flat CSVs under $OUT (or a local folder).
# Budget: under 8 minutes on an H200. Each step runs even if an earlier one failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/_scratch/gpu_check_$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
SCRATCH=$(mktemp -d)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export ACTBENCH_CACHE_DIR=${ACTBENCH_CACHE_DIR:-/tmp/actbench-cache}
PY=${PYTHON:-python3}
LOG="$OUT/gpu_check.log"
: >"$LOG"

step() {  # step NAME TIMEOUT_S CMD...: run, log, record the exit code in summary.txt
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a "$LOG"
  local start=$SECONDS
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - start))" | tee -a "$OUT/summary.txt" "$LOG"
}

step nvidia_smi 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step doctor 300 "$PY" -m actbench doctor
step cuda_tests 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_ops_cuda.py tests/test_actnn_cuda.py tests/test_ops_opcheck.py
step bench_kernels 180 "$PY" -m actbench bench-kernels --device cuda --sizes-mib 1,16,256,1024 --bits 2,4 \
  --repeats 20 --reference-max-mib 16 --out "$SCRATCH"
step sweep 300 "$PY" -m actbench sweep-batch resnet50 --strategies fp32 --levels L3 --batch 64:192:64 \
  --image-size 224 --device cuda --budget 16GiB --warmup-steps 2 --timed-steps 5 --out "$SCRATCH"
# meta predictions vs cuda measurements of the same small points: the gap the caching allocator adds.
step meta_vs_cuda 180 "$PY" -m actbench.measure.trust --device cuda --out "$OUT"

# Flat copies of what was measured ($OUT comes back at most two folders deep, 8 files).
for f in "$SCRATCH"/bench-kernels_cuda_*/kernels.csv; do [ -f "$f" ] && cp "$f" "$OUT/kernels_cuda.csv"; done
for f in "$SCRATCH"/bench-kernels_cuda_*/env.json; do [ -f "$f" ] && cp "$f" "$OUT/env_cuda.json"; done
for f in "$SCRATCH"/sweep-batch_resnet50_cuda_*/rows.jsonl; do [ -f "$f" ] && cp "$f" "$OUT/sweep_rows.jsonl"; done
for f in "$SCRATCH"/sweep-batch_resnet50_cuda_*/table.csv; do [ -f "$f" ] && cp "$f" "$OUT/sweep_table.csv"; done
cat "$OUT/summary.txt"
! grep -qv " rc=0 " "$OUT/summary.txt"
