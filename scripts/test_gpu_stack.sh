#!/usr/bin/env bash
# Rehearsal for a GPU loan, on a machine without a GPU: the lent H200 runs Python 3.12 with
# torch 2.11.0+cu130 (see README, "GPU checks"), not this project's pinned Python 3.11 / torch 2.14.1. This
# makes that stack in a venv (once; about 5 minutes, pip's local index), runs the whole test suite
# with it, then scripts/gpu_check.sh: with no GPU its CUDA steps fail, but the build and the script's
# own logic are exercised. Device minutes are scarce; spend them only on what this cannot check.
#
# The venv (default ~/.cache/actbench-gpu-stack, not a shared /tmp path) is used only if this script
# made it: it writes a stamp file into the venv it creates, and refuses to run the python of a folder
# without that stamp, or one owned by another user or writable by group or others. A venv it stamped
# for another stack (or left half-built) is deleted and made again.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GPU_STACK_VENV:-${HOME:?set HOME or GPU_STACK_VENV}/.cache/actbench-gpu-stack}
PYVER=${GPU_STACK_PYTHON:-3.12}
PACKAGES="torch==2.11.0 torchvision==0.26.0 typer rich pandas matplotlib pytest ninja pybind11 submitit"
STAMP="$VENV/.actbench-gpu-stack"
WANT="actbench gpu stack venv 1: python$PYVER $PACKAGES"

private() {  # private PATH: exists, belongs to this user, and nobody else can write it
  local mode
  [ -e "$1" ] || return 1
  [ "$(stat -L -c %u -- "$1")" = "$(id -u)" ] || return 1
  mode=$(stat -L -c %a -- "$1")
  (((8#$mode & 8#022) == 0))
}

if [ -e "$VENV" ] || [ -L "$VENV" ]; then
  if ! { [ -f "$STAMP" ] && [ ! -L "$STAMP" ] && private "$STAMP" && private "$VENV" && private "$VENV/bin"; }; then
    echo "test_gpu_stack: $VENV exists but is not a venv this script made for you (no stamp $STAMP of yours," \
      "or the folder belongs to another user or others can write it): not running its python." \
      "Delete it, or set GPU_STACK_VENV to a new path" >&2
    exit 2
  fi
  HAVE=$(cat -- "$STAMP")
  if [ "$HAVE" != "$WANT" ]; then
    case $HAVE in
      unfinished | "actbench gpu stack venv "*) ;;
      *) echo "test_gpu_stack: $STAMP is not a stamp this script writes; not touching $VENV" >&2; exit 2 ;;
    esac
    echo "test_gpu_stack: $VENV was made for another stack or not finished; making it again" >&2
    rm -rf -- "$VENV"
  fi
fi
if [ ! -e "$VENV" ]; then
  PY=python$PYVER
  if ! "$PY" -c "" 2>/dev/null && command -v pyenv >/dev/null; then  # a pyenv shim may exist yet not run
    PYENV_PICK=$(pyenv versions --bare | grep "^$PYVER" | tail -1 || true)
    [ -z "$PYENV_PICK" ] || PY=$(PYENV_VERSION=$PYENV_PICK pyenv which python)
  fi
  # exactly the Python asked for (an empty PYENV_VERSION would have given pyenv's default instead)
  "$PY" -c "import sys; sys.exit('%d.%d' % sys.version_info[:2] != '$PYVER')" 2>/dev/null ||
    { echo "test_gpu_stack: no Python $PYVER found (set GPU_STACK_PYTHON)" >&2; exit 2; }
  mkdir -p -- "$(dirname -- "$VENV")"
  mkdir -m 700 -- "$VENV"  # fails if someone made it since the check above
  (
    umask 077
    echo "unfinished" >"$STAMP"  # ours from the start, so an interrupted install is redone, not refused
    "$PY" -m venv "$VENV"
    # shellcheck disable=SC2086
    "$VENV/bin/pip" install -q $PACKAGES
    echo "$WANT" >"$STAMP"
  )
fi
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/python" -c "import sys, torch; print('stack:', sys.version.split()[0], torch.__version__)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider
OUT=$(mktemp -d) PYTHON="$VENV/bin/python" GPU_CHECK_SECONDS=${GPU_CHECK_SECONDS:-240} \
  bash scripts/gpu_check.sh || echo "(gpu_check.sh fails its CUDA steps without a GPU; read summary.txt above)"
