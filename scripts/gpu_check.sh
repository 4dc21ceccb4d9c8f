#!/usr/bin/env bash
# GPU check for a lent machine (see README, "GPU checks"). Builds actbench's extension there
# (its torch may differ from ours: the cache key includes the torch version), runs the CUDA
# tests and the benchmarks, and leaves three files under $OUT (or a local folder): gpu_check.log,
# summary.txt (one rc= line per step) and results.tgz (every CSV, JSON and run file the steps wrote,
# packed again after each step: the device tool brings back at most 8 files from $OUT).
# Budget: at most GPU_CHECK_SECONDS (540) in all. Each step runs even if an earlier one failed.
# The lent machine gets the tree without .git: pass ACTBENCH_GIT_COMMIT=$(git rev-parse HEAD) so
# every env.json there still names the commit that measured it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/_scratch/gpu_check_$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
SCRATCH=$(mktemp -d)
KEPT=$(mktemp -d)  # what comes back, packed into $OUT/results.tgz after every step
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# The extension cache: actbench's own default (~/.cache/actbench, which it creates 0700 and refuses
# if anyone else can write it), never a fixed path under the shared /tmp that another user could
# create first. Without a usable $HOME: a private mktemp -d (0700), built afresh.
if [ -z "${ACTBENCH_CACHE_DIR:-}" ]; then
  if [ -n "${HOME:-}" ] && mkdir -p "$HOME/.cache" 2>/dev/null && [ -w "$HOME/.cache" ]; then
    export ACTBENCH_CACHE_DIR="$HOME/.cache/actbench"
  else
    ACTBENCH_CACHE_DIR=$(mktemp -d) && export ACTBENCH_CACHE_DIR
  fi
fi
PY=${PYTHON:-python3}
LOG="$OUT/gpu_check.log"
: >"$LOG"
echo "commit: ${ACTBENCH_GIT_COMMIT:-unknown (set ACTBENCH_GIT_COMMIT)}" | tee -a "$LOG"
echo "extension cache: $ACTBENCH_CACHE_DIR" | tee -a "$LOG"

# The device tool kills a command after 600 s and returns only what is under $OUT by then, so the
# whole script keeps to DEADLINE: each step's limit shrinks to what is left (a step with under 30 s
# left is recorded as skipped), and each step's files are copied under $OUT as soon as it ends.
DEADLINE=${GPU_CHECK_SECONDS:-540}
RESERVE=15  # seconds kept after the last step for the summary

# GPU_CHECK_STEPS="sac_cuda bf16_cuda ...": run only the named steps (the others are recorded as
# skipped), e.g. when a loan is too short for the whole script.
ONLY=${GPU_CHECK_STEPS:-}

step() {  # step NAME TIMEOUT_S CMD...: run, log, record the exit code in summary.txt
  local name=$1 limit=$2; shift 2
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then
    echo "$name rc=skipped seconds=0 (not in GPU_CHECK_STEPS)" | tee -a "$OUT/summary.txt" "$LOG"
    return
  fi
  local left=$((DEADLINE - SECONDS - RESERVE))
  if ((left < 30)); then
    echo "$name rc=skipped seconds=0 (${DEADLINE}s deadline reached)" | tee -a "$OUT/summary.txt" "$LOG"
    return
  fi
  ((limit > left)) && limit=$left
  echo "=== $name (limit ${limit}s): $*" | tee -a "$LOG"
  local start=$SECONDS
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - start))" | tee -a "$OUT/summary.txt" "$LOG"
  pack
}

pack() { tar czf "$OUT/results.tgz.part" -C "$KEPT" . && mv "$OUT/results.tgz.part" "$OUT/results.tgz"; }

keep() {  # keep GLOB NAME: flat copy of a run file into what comes back
  local f
  for f in $1; do [ -f "$f" ] && cp "$f" "$KEPT/$2"; done
}

# In order of what only a GPU can settle: the build and the CUDA tests, the kernels' bandwidth and
# ActNN's cost per step, the device model and the step-time model's error, meta's gap to cuda, the
# caching allocator's history, then a measured sweep and the bf16/sac points.
step nvidia_smi 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
# without a visible GPU the CUDA tests below would all skip and pass: this step fails instead
step cuda_visible 60 "$PY" -c "import sys, torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() else 1)"
step doctor 300 "$PY" -m actbench doctor
# the CLI finds the extension's build without importing torch: with a GPU it must pick the same
# folder (the GPU's own architecture) as a process that imported torch
step build_key 60 "$PY" -c "import sys; from actbench.kernels import extension as e; a = e.plan(); import torch; b = e.plan(); print(a.cuda_archs, b.cuda_archs, a.directory); sys.exit(0 if a == b else 1)"
# (test_actnn_cuda.py includes the attention twin: Q/K and V packed apart on the device)
step cuda_tests 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_ops_cuda.py tests/test_actnn_cuda.py tests/test_ops_opcheck.py
# every op of the extension (quantize, dequantize, mixed, min/max, mask pack/unpack/apply, max-pool
# forward and backward) against a copy of the same bytes and torch's own op where one exists
# (dequantize and apply_mask run a thread per 8-value chunk since the H200 loan measured them at 22 %
# and 33 % of a copy; the cuda tests above hold their values, an unaligned gradient included)
step bench_kernels 150 "$PY" -m actbench bench-kernels --device cuda --sizes-mib 1,16,256 --bits 2,4 \
  --repeats 20 --oracle-max-mib 16 --out "$SCRATCH"
keep "$SCRATCH/bench-kernels_cuda_*/kernels.csv" kernels_cuda.csv
keep "$SCRATCH/bench-kernels_cuda_*/env.json" env_cuda.json
# meta predictions vs cuda measurements of the same small points: the gap the caching allocator adds.
# (ActNN levels now convert the point's model in place: no second fp32 copy of the parameters stays
# alive on cuda, so their peak_ratio should sit beside fp32's; checkpoint's and sac's meta warm-up
# now gives every wrapped parameter its momentum, as the real warm-up on cuda does.)
step meta_vs_cuda 180 "$PY" -m actbench trust --device cuda --batch 16 --image-size 224 --out "$KEPT"
# the step-time model: this GPU calibrated (device-model JSON, with the host seconds of one ActNN layer
# per level, of one checkpointed module and of one host copy of swap's and save_on_cpu's hooks, measured
# rather than fitted; convolutions by GEMM rows in fp32/TF32, bf16 and fp16, and batch and layer norm on
# their own), then predicted ÷ measured step time per strategy on that model (speed_vs_cuda.csv), both
# brought back; the log names each pair of strategies out of the measured order beside its spread
step calibrate_cuda 180 "$PY" -m actbench calibrate --device cuda --out "$KEPT/device_model_cuda.json"
step speed_vs_cuda 300 "$PY" -m actbench trust --device cuda --models resnet50 --strategies fp32,L0,L3,L4,checkpoint,swap \
    --batch 64 --image-size 224 --device-model "$KEPT/device_model_cuda.json" --out "$KEPT"
# the same points predicted on the built-in datasheet model of this GPU (what --gpu NAME uses for a
# GPU one does not have): its error here is the error of every prediction made for such a GPU
step datasheet_model 30 "$PY" -c "import sys, torch; from actbench.planning.device_models import GPU_SPEED_MODELS, save_device_model; found = [m for m in GPU_SPEED_MODELS.values() if m.label == torch.cuda.get_device_name()]; found and save_device_model(found[0], sys.argv[1]); print(found[0].name if found else 'no built-in model for ' + torch.cuda.get_device_name()); sys.exit(0 if found else 1)" "$KEPT/device_model_datasheet.json"
step speed_vs_datasheet 300 "$PY" -m actbench trust --device cuda --models resnet50 --strategies fp32,L0,L3,L4,checkpoint,swap \
    --batch 64 --image-size 224 --device-model "$KEPT/device_model_datasheet.json" --out "$KEPT/datasheet"
# where a step's time goes on this GPU, per op, host and device (fp32, L0, L3 of ResNet-50 at batch 64)
step profile_cuda 120 "$PY" scripts/profile_step.py --device cuda --model resnet50 --batch 64 --image-size 224 \
    --strategies fp32,L0,L3 --top 12
# ActNN's cost per step: fp32, L0, L1, L3 and checkpoint of ResNet-18 b16 and ResNet-50 b8 at 112 px,
# each strategy's img/s as a ratio to fp32 (small points: the host-side share shows most there); every
# strategy's step built in one process and timed in turn, 10 steps each (a fresh process per point
# costs a CUDA start each; in turn, drift reaches every strategy alike)
step bench_actnn 150 "$PY" -m actbench bench-actnn --device cuda --in-turn --out "$SCRATCH"
keep "$SCRATCH/bench-actnn_cuda_*/actnn.csv" actnn_cuda.csv
# L0's gap to fp32 and its ReLU twins' share (docs/design.md §2): L0 beside L0 with its ReLU twins running
# torch's forward, timed in turn (L0's convs and BatchNorms are torch's own already); on a GPU the twins'
# host cost is what shows (one JSON line each)
step l0_twin_costs 60 "$PY" scripts/l0_twin_costs.py resnet50 112 8 10 --device cuda
# ActNN in a user's own loop on cuda: a classifier at L3, and a detector at L3 whose roi_align boxes must
# stay exact on the device too (its census line says "positions: kept exact")
step own_loop_classifier 60 "$PY" scripts/own_loop_classifier.py --device cuda --size 112 --batch 8 --steps 3
step own_loop_detector 90 "$PY" scripts/own_loop_detector.py --device cuda --size 256 --batch 2 --steps 3
# one point's caching-allocator history and segments (memory_snapshot.pickle, no stack traces)
# and the CUDA context, beside meta's caching-allocator model of the same point (memory_snapshot.json)
step memory_snapshot 120 "$PY" scripts/memory_snapshot.py "$KEPT" fp32 64

# its rows carry steps_run and steps_s, so elapsed_s - steps_s is the harness's cost per cuda point
# (two strategies: L3's first point is taken by a spare worker started while fp32 was measured)
step sweep 200 "$PY" -m actbench sweep-batch resnet50 --strategies fp32 --levels L3 --batch 64:256:64 \
  --image-size 224 --device cuda --budget 16GiB --warmup-steps 2 --timed-steps 5 --out "$SCRATCH"
keep "$SCRATCH/sweep-batch_resnet50_cuda_*/rows.jsonl" sweep_rows.jsonl
keep "$SCRATCH/sweep-batch_resnet50_cuda_*/table.csv" sweep_table.csv
# bf16 points (autocast: fp32 and L3, whose conv and linear twins cast as torch's layers are
# cast, docs/design.md §1) and one sac point of ResNet-50 at batch 64 on cuda, then meta's predictions
# of the same points (meta runs CPU autocast's op list; the gap is what cuda's adds).
BASE=(resnet50 --batch 64 --image-size 224 --budget 16GiB --out "$SCRATCH/baselines")
step bf16_cuda 120 "$PY" -m actbench memory "${BASE[@]}" --strategies fp32 --levels L3 --precision bf16 --device cuda
step sac_cuda 90 "$PY" -m actbench memory "${BASE[@]}" --strategies sac --device cuda
step bf16_meta 60 "$PY" -m actbench memory "${BASE[@]}" --strategies fp32 --levels L3 --precision bf16 --device meta
step sac_meta 60 "$PY" -m actbench memory "${BASE[@]}" --strategies sac --device meta
# a segmentation model through the task seam on cuda and its meta prediction (fp32 and L3, 256 px;
# L3 runs the loss scope: the map cross-entropy's 2-bit direction, actnn/loss_functions.py)
SEG=(fcn_resnet50 --batch 4 --image-size 256 --strategies fp32 --levels L3 --out "$SCRATCH/segmentation")
step segmentation_cuda 90 "$PY" -m actbench memory "${SEG[@]}" --device cuda
step segmentation_meta 60 "$PY" -m actbench memory "${SEG[@]}" --device meta
cat "$SCRATCH"/segmentation/*/rows.jsonl >"$KEPT/segmentation_rows.jsonl" 2>/dev/null
# one short point per other task, on cuda and predicted on meta (fp32 and L3): a video clip at the
# reference's 16x112, a RAFT frame pair at 368x496 (its default; L3's lookup keeps centres and
# rebuilds grids in backward, actnn/correlation.py), a detector at 512x640 (its FPN frees the
# top-down temporaries, actnn/pyramid.py)
for task in "video r3d_18 --batch 4" "flow raft_small --batch 2" "detection fasterrcnn_mobilenet_v3_large_fpn --batch 2 --image-size 512x640"; do
    set -- $task
    name=$1; shift
    step "${name}_cuda" 120 "$PY" -m actbench memory "$@" --strategies fp32 --levels L3 --device cuda --out "$SCRATCH/$name"
    step "${name}_meta" 90 "$PY" -m actbench memory "$@" --strategies fp32 --levels L3 --device meta --out "$SCRATCH/$name"
    cat "$SCRATCH/$name"/*/rows.jsonl >"$KEPT/${name}_rows.jsonl" 2>/dev/null
done
cat "$SCRATCH"/baselines/*/rows.jsonl >"$KEPT/baselines_rows.jsonl" 2>/dev/null
pack

echo "total seconds=$SECONDS (deadline ${DEADLINE})" | tee -a "$LOG"
cat "$OUT/summary.txt"
! grep -qv " rc=0 " "$OUT/summary.txt"
