"""The environment block written once per run as ``env.json``: what measured the rows."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from actbench.core.devices import EXACT_STEPS_ENV, DeviceProfile, exact_steps


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: set by whoever runs a copy of the tree without its .git (scripts/gpu_check.sh on a lent GPU)
GIT_COMMIT_VAR = "ACTBENCH_GIT_COMMIT"


def _git_commit(repo_dir: Path) -> str | None:
    """HEAD of the checkout actbench runs from; else ``$ACTBENCH_GIT_COMMIT``; else None (unknown)."""
    try:
        out = subprocess.run(["git", "-C", str(repo_dir), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        out = None
    if out is not None and out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    return os.environ.get(GIT_COMMIT_VAR) or None


def capture_environment(device: DeviceProfile, alloc_conf: str | None = None) -> dict[str, Any]:
    """Versions, hardware and allocator settings. On ``cuda`` this initialises CUDA: call it in a child."""
    import torch

    import actbench

    env: dict[str, Any] = {
        "device": device.name,
        "actbench_version": actbench.__version__,
        "git_commit": _git_commit(Path(actbench.__file__).resolve().parent.parent),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda_build": torch.version.cuda,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_num_threads": torch.get_num_threads(),
        "pytorch_cuda_alloc_conf": alloc_conf if alloc_conf is not None else os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "gpu_name": None,
        "gpu_total_memory_bytes": None,
        "cuda_runtime": None,
        "cudnn": None,
    }
    env.update(device.hardware())
    if exact_steps():  # only when set, so the environments of runs timed as usual keep their ids
        env["timing"] = f"exactly the timed steps asked for ({EXACT_STEPS_ENV}=1)"
    return env


def environment_id(env: dict[str, Any]) -> str:
    """Short hash of the environment block; rows reference it as ``env_id``."""
    blob = json.dumps(env, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
