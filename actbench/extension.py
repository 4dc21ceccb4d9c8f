"""The only module that builds and loads actbench's compiled extension (csrc/).

Built once with ninja through ``torch.utils.cpp_extension`` into a cache directory keyed by the
sources' hash, the torch version and whether CUDA is compiled in; later processes load the cached
binary directly. CUDA sources are compiled whenever ``nvcc`` is found (so CI compiles them without
a GPU) and run when a GPU is present. Failures raise :class:`ExtensionError` with the cause and
the fix, not a traceback from deep inside the toolchain.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent.parent / "csrc"
DEFAULT_CUDA_ARCHS = "7.5;8.0;8.6;9.0+PTX"  # T4, A100, A10, H100/H200
CPU_SOURCES = ("registration.cpp", "cpu/ops_cpu.cpp")
CUDA_SOURCES = ("cuda/ops_cuda.cpp", "cuda/kernels.cu")
# Every float multiply and add rounds on its own, on both compilers, so CPU and CUDA codes match.
CXX_FLAGS = ("-O3", "-ffp-contract=off")
NVCC_FLAGS = ("-O3", "--fmad=false")


class ExtensionError(RuntimeError):
    """The extension could not be built or loaded; the message names the cause and the fix."""


@dataclass(frozen=True)
class BuildPlan:
    """What would be built, and where: everything that goes into the cache key."""

    with_cuda: bool
    cuda_home: str | None
    cuda_archs: str | None
    torch_version: str
    source_hash: str
    directory: Path

    @property
    def name(self) -> str:
        return f"actbench_ops_{self.source_hash[:12]}"

    @property
    def library(self) -> Path:
        return self.directory / f"{self.name}.so"

    @property
    def marker(self) -> Path:
        return self.directory / "build.json"


def _source_hash() -> str:
    if not (CSRC / CPU_SOURCES[0]).is_file():
        raise ExtensionError(
            f"actbench extension sources not found at {CSRC}: install actbench from its source tree "
            "(pip install -e .) so csrc/ sits beside the package"
        )
    digest = hashlib.sha256()
    for path in sorted(p for p in CSRC.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(CSRC)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def find_cuda_home() -> str | None:
    """The CUDA toolkit to compile with, or None when there is no usable nvcc.

    Prefers $CUDA_HOME, then /usr/local/cuda, then the folder above ``nvcc`` on PATH. A folder
    counts only if it has bin/nvcc and the CUDA runtime library to link against (on some machines
    /usr/local/bin/nvcc is a wrapper whose parent has no lib64/libcudart: torch guesses that one).
    """
    candidates = [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    for c in candidates:
        if not c or not (Path(c) / "bin" / "nvcc").exists():
            continue
        if any(next((Path(c) / d).glob("libcudart.so*"), None) for d in ("lib64", "lib")):
            return c
    return None


def plan(cache_dir: Path | None = None, with_cuda: bool | None = None) -> BuildPlan:
    """Decide what to build: CUDA when torch has CUDA and nvcc is found (or as ``with_cuda`` says)."""
    cuda_home = find_cuda_home() if torch.version.cuda else None
    if with_cuda is None:
        with_cuda = cuda_home is not None
    elif with_cuda and cuda_home is None:
        raise ExtensionError(
            "actbench extension: CUDA build requested but no CUDA toolkit with nvcc and libcudart was found "
            f"(torch CUDA: {torch.version.cuda}); set CUDA_HOME to the toolkit folder"
        )
    archs = None
    if with_cuda:
        archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
        if not archs and torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            archs = f"{major}.{minor}"
        archs = archs or DEFAULT_CUDA_ARCHS
    source_hash = _source_hash()
    key = hashlib.sha256(
        json.dumps([source_hash, torch.__version__, with_cuda, archs, sys.version_info[:2]]).encode()
    ).hexdigest()[:16]
    root = cache_dir or Path(os.environ.get("ACTBENCH_CACHE_DIR", Path.home() / ".cache" / "actbench"))
    flavour = f"cu{torch.version.cuda.replace('.', '')}" if with_cuda else "cpu"
    directory = root / "extension" / f"torch{torch.__version__.split('+')[0]}-{flavour}-{key}"
    return BuildPlan(with_cuda, cuda_home if with_cuda else None, archs, torch.__version__, source_hash, directory)


def _gencode_flags(archs: str) -> list[str]:
    flags = []
    for arch in archs.replace(",", ";").split(";"):
        arch = arch.strip()
        if not arch:
            continue
        ptx = arch.endswith("+PTX")
        num = arch.removesuffix("+PTX").replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def _load_library(p: BuildPlan) -> None:
    try:
        torch.ops.load_library(str(p.library))
    except OSError as err:
        raise ExtensionError(
            f"actbench extension at {p.library} failed to load: {err}. It was built for another torch or CUDA "
            f"than the installed torch {torch.__version__}: run `actbench build --force` (or delete {p.directory})"
        ) from err


def _is_loaded() -> bool:
    return hasattr(torch.ops, "actbench") and hasattr(torch.ops.actbench, "quantize")


def build(p: BuildPlan, force: bool = False, verbose: bool = False) -> None:
    """Compile the extension into ``p.directory`` and load it (ninja rebuilds only what changed)."""
    if force and p.directory.exists():
        shutil.rmtree(p.directory)
    p.directory.mkdir(parents=True, exist_ok=True)
    if p.with_cuda:
        # torch reads CUDA_HOME when cpp_extension is imported: set it first (see find_cuda_home).
        os.environ["CUDA_HOME"] = p.cuda_home or ""
    from torch.utils import cpp_extension

    if p.with_cuda:
        cpp_extension.CUDA_HOME = p.cuda_home
    sources = [str(CSRC / s) for s in CPU_SOURCES + (CUDA_SOURCES if p.with_cuda else ())]
    log.warning(
        "building actbench's extension (%s) in %s; the first build takes a few minutes",
        "CPU + CUDA " + (p.cuda_archs or "") if p.with_cuda else "CPU only",
        p.directory,
    )
    try:
        cpp_extension.load(
            name=p.name,
            sources=sources,
            extra_cflags=list(CXX_FLAGS) + (["-DACTBENCH_WITH_CUDA"] if p.with_cuda else []),
            extra_cuda_cflags=list(NVCC_FLAGS) + _gencode_flags(p.cuda_archs or DEFAULT_CUDA_ARCHS),
            extra_include_paths=[str(CSRC / "include")],
            build_directory=str(p.directory),
            with_cuda=p.with_cuda,
            is_python_module=False,
            verbose=verbose,
        )
    except (RuntimeError, OSError, IndexError, subprocess.CalledProcessError) as err:
        text = str(err)
        (p.directory / "build.log").write_text(text)
        errors = [line.strip() for line in text.splitlines() if "error:" in line.lower()][:3]
        raise ExtensionError(
            f"actbench extension failed to build in {p.directory}: {' | '.join(errors) or text.strip()[:300]}. "
            f"Full log: {p.directory / 'build.log'}. Check that g++, ninja"
            + (f" and the CUDA toolkit at {p.cuda_home}" if p.with_cuda else "")
            + " are installed, or set ACTBENCH_WITH_CUDA=0 to build the CPU kernels only"
        ) from err
    p.marker.write_text(json.dumps({k: str(v) for k, v in asdict(p).items()}, indent=2))


def load(force_rebuild: bool = False, verbose: bool = False) -> BuildPlan:
    """Load the extension into this process, building it first when no cached build matches."""
    env = os.environ.get("ACTBENCH_WITH_CUDA")
    if env not in (None, "", "0", "1"):
        raise ExtensionError(f"ACTBENCH_WITH_CUDA must be 0 or 1 (or unset to decide by nvcc), got {env!r}")
    p = plan(with_cuda=None if env in (None, "") else env == "1")
    if _is_loaded() and not force_rebuild:
        return p
    if p.marker.exists() and p.library.exists() and not force_rebuild:
        _load_library(p)
    else:
        build(p, force=force_rebuild, verbose=verbose)
    return p


def cuda_kernels_registered() -> dict[str, bool]:
    """For each op, whether a CUDA kernel is registered in this process (after :func:`load`)."""
    from actbench.ops import OPS

    return {op: torch._C._dispatch_has_kernel_for_dispatch_key(f"actbench::{op}", "CUDA") for op in OPS}
