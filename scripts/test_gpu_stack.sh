#!/usr/bin/env bash
# Rehearsal for a GPU loan, on a machine without a GPU: the lent H200 runs Python 3.12 with
# torch 2.11.0+cu130 (see README, "GPU checks"), not this project's pinned Python 3.11 / torch 2.14.1. This
# makes that stack in a venv (once; about 5 minutes, pip's local index), runs the whole test suite
# with it, then scripts/gpu_check.sh: with no GPU its CUDA steps fail, but the build and the script's
# own logic are exercised. Device minutes are scarce; spend them only on what this cannot check.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GPU_STACK_VENV:-/tmp/actbench-gpu-stack}
PYVER=${GPU_STACK_PYTHON:-3.12}
if [ ! -x "$VENV/bin/python" ]; then
  PY=python$PYVER
  if ! "$PY" -c "" 2>/dev/null && command -v pyenv >/dev/null; then  # a pyenv shim may exist yet not run
    PY=$(PYENV_VERSION=$(pyenv versions --bare | grep "^$PYVER" | tail -1) pyenv which python)
  fi
  "$PY" -c "" 2>/dev/null || { echo "test_gpu_stack: no Python $PYVER found (set GPU_STACK_PYTHON)" >&2; exit 2; }
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q torch==2.11.0 torchvision==0.26.0 typer rich pandas matplotlib pytest ninja pybind11
fi
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/python" -c "import sys, torch; print('stack:', sys.version.split()[0], torch.__version__)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider
OUT=$(mktemp -d) PYTHON="$VENV/bin/python" GPU_CHECK_SECONDS=${GPU_CHECK_SECONDS:-240} \
  bash scripts/gpu_check.sh || echo "(gpu_check.sh fails its CUDA steps without a GPU; read summary.txt above)"
