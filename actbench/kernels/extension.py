"""The only module that builds and loads actbench's compiled extension (csrc/).

It builds once with ninja through ``torch.utils.cpp_extension`` into a per-user cache keyed by the
sources' contents, the compiler flags, torch and CUDA, and loads the cached binary later. Loading
runs the binary's code in this process, so the cache is guarded: private folders and a recorded
SHA-256 per library, checked before loading. Failures raise :class:`ExtensionError` with the cause and the fix. The rules:
docs/design.md §9 ("The extension's cache is guarded").
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from actbench.core.processes import dies_with_this_process
from actbench.schema import one_line

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parents[2] / "csrc"
DEFAULT_CUDA_ARCHS = "7.5;8.0;8.6;9.0+PTX"  # T4, A100, A10, H100/H200
CPU_SOURCES = ("registration.cpp", "cpu/ops_cpu.cpp")
CUDA_SOURCES = ("cuda/ops_cuda.cpp", "cuda/kernels.cu")
# Every float multiply and add rounds on its own, on both compilers, so CPU and CUDA codes match.
# -fopenmp: torch's at::parallel_for is OpenMP pragmas inlined into the caller, so without it every
# CPU kernel runs on one thread. The link resolves to the libgomp.so.1 torch has already loaded.
CXX_FLAGS = ("-O3", "-ffp-contract=off", "-fopenmp")
LD_FLAGS = ("-fopenmp",)
NVCC_FLAGS = ("-O3", "--fmad=false")
# Part of the cache key: bumped when the build record changes meaning (2: records the library's
# SHA-256), so builds whose record cannot be verified are never looked up again.
RECORD_FORMAT = 2


#: What TORCH_CUDA_ARCH_LIST may hold: compute capabilities (``8.0``, ``9.0a``, ``9.0+PTX``) separated
#: by ``;``, ``,`` or spaces.
ARCH_ENTRY = re.compile(r"\d{1,2}\.\d[a-z]?(\+PTX)?")
#: Variables the compile reads; a failed build names the one whose value its first error line shows.
BUILD_VARS = ("CXX", "CC", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME", "CFLAGS", "CXXFLAGS", "LDFLAGS", "MAX_JOBS",
              "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")


class ExtensionError(RuntimeError):
    """The extension could not be built or loaded; the message names the cause and the fix."""


class UnsafeCacheError(ExtensionError):
    """A cache folder or cached library that someone other than the current user could have written."""


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


def with_cuda_setting() -> bool | None:
    """``ACTBENCH_WITH_CUDA``: True (1), False (0) or None (unset: decide by nvcc); ExtensionError otherwise."""
    env = os.environ.get("ACTBENCH_WITH_CUDA")
    if env not in (None, "", "0", "1"):
        raise ExtensionError(f"ACTBENCH_WITH_CUDA must be 0 or 1 (or unset to decide by nvcc), got {env!r}")
    return None if env in (None, "") else env == "1"


def cuda_arch_setting() -> str | None:
    """``TORCH_CUDA_ARCH_LIST`` when set, checked (ExtensionError naming it and the form allowed)."""
    text = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    if not text.strip():
        return None
    entries = [e for e in re.split(r"[;, ]+", text.strip()) if e]
    if len(text) > 200 or not all(ARCH_ENTRY.fullmatch(e) for e in entries):
        raise ExtensionError("TORCH_CUDA_ARCH_LIST must be compute capabilities separated by ';' like "
                             f"'8.0;9.0+PTX', got {text[:60]!r}")
    return text


def cache_root_setting() -> Path | None:
    """``ACTBENCH_CACHE_DIR`` as an absolute path (a relative one would mean another folder in every
    child, whose working directory is private), or None when unset; ExtensionError for control
    characters or a path that exists and is not a folder."""
    text = os.environ.get("ACTBENCH_CACHE_DIR", "")
    if not text:
        return None
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ExtensionError(f"ACTBENCH_CACHE_DIR must be a folder path without control characters, got {text[:60]!r}")
    root = Path(text).expanduser().absolute()
    if root.exists() and not root.is_dir():
        raise ExtensionError(f"ACTBENCH_CACHE_DIR must be a folder (or a path to create one), got {text[:60]!r}, "
                             "which is not a folder")
    return root


def check_environment() -> dict[str, str]:
    """Check every variable the extension reads (ExtensionError naming a bad one), before anything
    runs; returns the values to set instead (``ACTBENCH_CACHE_DIR`` made absolute)."""
    with_cuda_setting()
    cuda_arch_setting()
    root = cache_root_setting()
    return {} if root is None or str(root) == os.environ["ACTBENCH_CACHE_DIR"] else {"ACTBENCH_CACHE_DIR": str(root)}


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


@dataclass(frozen=True)
class TorchFacts:
    """What the cache key needs to know about the installed torch.

    Read from torch's own ``version.py`` without importing torch, so a command that
    only checks whether the extension is built stays fast; torch is imported only when it already
    was, or when the file cannot be read, or when a GPU may be present and its capability decides
    the architectures.
    """

    version: str
    cuda: str | None

    @staticmethod
    def installed() -> "TorchFacts":
        loaded = sys.modules.get("torch")
        if loaded is not None and hasattr(loaded, "version"):
            return TorchFacts(loaded.__version__, loaded.version.cuda)
        facts = _read_torch_version_file()
        if facts is not None:
            return facts
        import torch

        return TorchFacts(torch.__version__, torch.version.cuda)


_VERSION_LINE = re.compile(r"^(__version__|cuda)\s*(?::[^=]*)?=\s*(.+?)\s*$", re.M)


def _read_torch_version_file() -> TorchFacts | None:
    """``__version__`` and ``cuda`` from torch/version.py, or None if it is not as expected."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return None
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except (OSError, ImportError, ValueError):
        return None
    found = {name: value for name, value in _VERSION_LINE.findall(text)}
    try:
        version = ast.literal_eval(found["__version__"])
        cuda = ast.literal_eval(found["cuda"])
    except (KeyError, ValueError, SyntaxError):
        return None
    if not isinstance(version, str) or not (cuda is None or isinstance(cuda, str)):
        return None
    return TorchFacts(version, cuda)


def _gpu_capability() -> tuple[int, int] | None:
    """The first GPU's compute capability, or None without one.

    Without NVIDIA device files (Linux) no GPU can be visible, so torch is not imported to ask.
    """
    if sys.platform.startswith("linux") and not any(Path("/dev").glob("nvidia[0-9]*")):
        return None
    import torch

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def plan(cache_dir: Path | None = None, with_cuda: bool | None = None) -> BuildPlan:
    """Decide what to build: CUDA when torch has CUDA and nvcc is found (or as ``with_cuda`` says)."""
    facts = TorchFacts.installed()
    cuda_home = find_cuda_home() if facts.cuda else None
    if with_cuda is None:
        with_cuda = cuda_home is not None
    elif with_cuda and cuda_home is None:
        raise ExtensionError(
            "actbench extension: CUDA build requested but no CUDA toolkit with nvcc and libcudart was found "
            f"(torch CUDA: {facts.cuda}); set CUDA_HOME to the toolkit folder"
        )
    archs = None
    if with_cuda:
        archs = cuda_arch_setting()
        capability = None if archs else _gpu_capability()
        if capability is not None:
            archs = f"{capability[0]}.{capability[1]}"
        archs = archs or DEFAULT_CUDA_ARCHS
    source_hash = _source_hash()
    key = hashlib.sha256(
        json.dumps([source_hash, facts.version, with_cuda, archs, sys.version_info[:2], RECORD_FORMAT,
                    CXX_FLAGS, LD_FLAGS, NVCC_FLAGS]).encode()
    ).hexdigest()[:16]
    root = cache_dir or cache_root_setting() or Path.home() / ".cache" / "actbench"
    flavour = f"cu{facts.cuda.replace('.', '')}" if with_cuda and facts.cuda else "cpu"
    directory = root / "extension" / f"torch{facts.version.split('+')[0]}-{flavour}-{key}"
    return BuildPlan(with_cuda, cuda_home if with_cuda else None, archs, facts.version, source_hash, directory)


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


def _others_can_write(mode: int) -> bool:
    return bool(mode & (stat.S_IWGRP | stat.S_IWOTH))


def _check_private(path: Path, what: str) -> None:
    """Raise UnsafeCacheError unless ``path`` belongs to this user and only this user can write it."""
    try:
        st = path.stat()
    except OSError as err:
        raise UnsafeCacheError(f"actbench {what} {path} cannot be inspected: {err.strerror or err}") from err
    if what == "library":
        fix = f"delete {path} and run `actbench build --force`"
    else:
        fix = "delete it, or set ACTBENCH_CACHE_DIR to a private folder (actbench creates it 0700)"
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeCacheError(
            f"actbench {what} {path} belongs to another user (uid {st.st_uid}, you are uid {uid}), "
            f"so actbench will not build or load code there; {fix}"
        )
    if _others_can_write(st.st_mode):
        if what != "library":
            fix = f"`chmod go-w {path}` if only you have ever written there, else " + fix
        raise UnsafeCacheError(
            f"actbench {what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}), "
            f"so anyone could plant code that actbench would load: refusing it; {fix}"
        )


def _private_dir(path: Path, what: str) -> None:
    """Create ``path`` owner-only (0700) if missing; then require it to be private (see module doc)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise UnsafeCacheError(
            f"actbench {what} {path} cannot be created: {err.strerror or err}; set ACTBENCH_CACHE_DIR to a folder "
            "you can write"
        ) from err
    else:
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask; this makes it exactly 0700
    if not path.is_dir():
        raise UnsafeCacheError(f"actbench {what} {path} is not a folder; set ACTBENCH_CACHE_DIR to a private folder")
    _check_private(path, what)


def prepare_cache(p: BuildPlan) -> None:
    """Create the cache root, ``extension/`` and the build folder 0700, or refuse unsafe ones."""
    _private_dir(p.directory.parent.parent, "cache folder")
    _private_dir(p.directory.parent, "cache folder")
    _private_dir(p.directory, "build folder")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_cached(p: BuildPlan) -> None:
    """Raise ExtensionError unless ``p.library`` is the library its build record hashed."""
    fix = f"refusing to load it; run `actbench build --force` to rebuild it (or delete {p.directory})"
    try:
        record = json.loads(p.marker.read_text())
        expected = record.get("library_sha256") if isinstance(record, dict) else None
    except (OSError, ValueError) as err:
        raise ExtensionError(f"actbench build record {p.marker} is unreadable ({err}): {fix}") from err
    if not isinstance(expected, str) or not expected:
        raise ExtensionError(f"actbench build record {p.marker} has no SHA-256 of {p.library}: {fix}")
    _check_private(p.library, "library")
    actual = file_sha256(p.library)
    if actual != expected:
        raise ExtensionError(
            f"actbench extension at {p.library} does not match the SHA-256 in {p.marker} (recorded "
            f"{expected[:16]}..., found {actual[:16]}...): it changed after it was built; {fix}"
        )


def _write_record(p: BuildPlan) -> None:
    """Write build.json with the library's SHA-256, atomically (concurrent loaders never read half of it)."""
    os.chmod(p.library, stat.S_IMODE(p.library.stat().st_mode) & ~0o022)
    record = {k: str(v) for k, v in asdict(p).items()}
    record["library"] = p.library.name
    record["library_sha256"] = file_sha256(p.library)
    record["record_format"] = RECORD_FORMAT
    tmp = p.marker.with_name(f".{p.marker.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, p.marker)


def _load_library(p: BuildPlan) -> None:
    import torch

    try:
        torch.ops.load_library(str(p.library))
    except OSError as err:
        raise ExtensionError(
            f"actbench extension at {p.library} failed to load: {err}. It was built for another torch or CUDA "
            f"than the installed torch {torch.__version__}: run `actbench build --force` (or delete {p.directory})"
        ) from err


def _is_loaded() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and hasattr(torch.ops, "actbench") and hasattr(torch.ops.actbench, "quantize")


def build(p: BuildPlan, force: bool = False, verbose: bool = False) -> None:
    """Compile the extension into ``p.directory`` and load it (ninja rebuilds only what changed).

    The compile runs in an isolated child (``-P``, no user ``PYTHONPATH``) in a process group of its
    own, so the compilers it starts die with this command (:func:`_dies_with_this_process`).
    """
    _private_dir(p.directory.parent.parent, "cache folder")
    _private_dir(p.directory.parent, "cache folder")
    if force and p.directory.exists():
        shutil.rmtree(p.directory)
    _private_dir(p.directory, "build folder")
    log.warning(
        "building actbench's extension (%s) in %s; a first build takes up to a minute or two on 2 cores",
        "CPU + CUDA " + (p.cuda_archs or "") if p.with_cuda else "CPU only",
        p.directory,
    )
    build_log = p.directory / "build.log"
    build_log.unlink(missing_ok=True)
    code = _run_compile_child(p, verbose, build_log)
    if code != 0:
        text = build_log.read_text(errors="replace") if build_log.exists() else f"the compile exited with code {code}"
        raise ExtensionError(_build_failure(p, text))
    _write_record(p)
    _load_library(p)


def _run_compile_child(p: BuildPlan, verbose: bool, build_log: Path) -> int:
    """``compile_here`` in a child; its exit code."""
    from actbench.core.child_env import python_child_env

    fields = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(p).items()}
    extra = {"CUDA_HOME": p.cuda_home or ""} if p.with_cuda else {}
    quiet = None if verbose else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-P", "-c", _COMPILE, json.dumps(fields), str(build_log),
                             "1" if verbose else "0", str(CSRC)], stdin=subprocess.DEVNULL, stdout=quiet, stderr=quiet,
                            cwd=p.directory, env=python_child_env(extra), process_group=0)
    with dies_with_this_process(proc):
        return proc.wait()


_COMPILE = "import sys\nfrom actbench.kernels.extension import compile_here\nsys.exit(compile_here(*sys.argv[1:]))\n"


def compile_here(fields: str, build_log: str, verbose: str, csrc: str) -> int:
    """Inside the compile child: build the library from ``csrc`` with ninja; 0, or 1 with the error
    in ``build_log``."""
    data = json.loads(fields)
    p = BuildPlan(**{**data, "directory": Path(data["directory"])})
    from torch.utils import cpp_extension  # reads CUDA_HOME, which the parent set

    if p.with_cuda:
        cpp_extension.CUDA_HOME = p.cuda_home
    sources = [str(Path(csrc) / s) for s in CPU_SOURCES + (CUDA_SOURCES if p.with_cuda else ())]
    try:
        cpp_extension.load(
            name=p.name,
            sources=sources,
            extra_cflags=list(CXX_FLAGS) + (["-DACTBENCH_WITH_CUDA"] if p.with_cuda else []),
            extra_cuda_cflags=list(NVCC_FLAGS) + _gencode_flags(p.cuda_archs or DEFAULT_CUDA_ARCHS),
            extra_ldflags=list(LD_FLAGS),
            extra_include_paths=[str(Path(csrc) / "include")],
            build_directory=str(p.directory),
            with_cuda=p.with_cuda,
            is_python_module=False,
            verbose=verbose == "1",
        )
    except (RuntimeError, OSError, IndexError, subprocess.CalledProcessError) as err:
        Path(build_log).write_text(str(err))
        return 1
    return 0


def _build_failure(p: BuildPlan, text: str) -> str:
    """One line for a failed build: the compiler's first error line, the variable whose value it shows."""
    first = _first_error_line(text)
    culprits = [f"{name}={os.environ[name]!r}" for name in BUILD_VARS
                if len(os.environ.get(name, "").strip()) >= 2 and os.environ[name].strip() in first]
    cause = first + (f" (from {', '.join(culprits)})" if culprits else "")
    return (f"actbench extension failed to build in {p.directory}: {cause}. Full log: {p.directory / 'build.log'}. "
            "Check that g++, ninja" + (f" and the CUDA toolkit at {p.cuda_home}" if p.with_cuda else "")
            + " are installed, or set ACTBENCH_WITH_CUDA=0 to build the CPU kernels only")


_ERROR_LINE = re.compile(r"\berror\b|fatal|not found|no such file|permission denied|cannot|unsupported", re.I)
_NOT_A_CAUSE = ("Error building extension", "ninja: build stopped", "FAILED:")


def _first_error_line(text: str) -> str:
    """The compiler's first error line in a build's output (else its first line), as a stored message."""
    lines = [one_line(line) for line in text.splitlines() if line.strip()]
    for line in lines:
        if _ERROR_LINE.search(line) and not line.startswith(_NOT_A_CAUSE):
            return line
    return lines[0] if lines else "no output"


def load(force_rebuild: bool = False, verbose: bool = False) -> BuildPlan:
    """Load the extension into this process, building it first when no cached build matches.

    A cached library is loaded only from private folders and only when its SHA-256 matches its
    build record (docs/design.md §9); otherwise this raises :class:`ExtensionError`.
    """
    p = plan(with_cuda=with_cuda_setting())
    if _is_loaded() and not force_rebuild:
        return p
    if force_rebuild:
        build(p, force=True, verbose=verbose)
        return p
    prepare_cache(p)
    if p.marker.exists() and p.library.exists():
        verify_cached(p)
        _load_library(p)
    else:
        build(p, verbose=verbose)
    return p

