"""Building and loading: cache key, clear errors for broken or mismatched binaries."""

import hashlib
import json
import shutil
import stat
from pathlib import Path

import pytest
import torch

from actbench.kernels import extension


def test_plan_key_depends_on_torch_version_and_cuda(tmp_path):
    a = extension.plan(cache_dir=tmp_path, with_cuda=False)
    assert a.directory.parent == tmp_path / "extension"
    assert "cpu" in a.directory.name and torch.__version__.split("+")[0] in a.directory.name
    if extension.find_cuda_home() and torch.version.cuda:
        b = extension.plan(cache_dir=tmp_path, with_cuda=True)
        assert b.directory != a.directory and b.cuda_archs


def test_plan_key_depends_on_source_contents_and_compiler_flags(tmp_path, monkeypatch):
    """An edited kernel or other flags (say, a build without -fopenmp) never load an old library."""
    csrc = tmp_path / "csrc"
    shutil.copytree(extension.CSRC, csrc)
    monkeypatch.setattr(extension, "CSRC", csrc)
    base = extension.plan(cache_dir=tmp_path, with_cuda=False).directory
    header = csrc / "include" / "actbench" / "quant_math.h"
    header.write_text(header.read_text() + "\n")
    edited = extension.plan(cache_dir=tmp_path, with_cuda=False).directory
    monkeypatch.setattr(extension, "CXX_FLAGS", tuple(f for f in extension.CXX_FLAGS if f != "-fopenmp"))
    flags = extension.plan(cache_dir=tmp_path, with_cuda=False).directory
    assert len({base, edited, flags}) == 3


def test_plan_without_importing_torch_is_the_same_plan(tmp_path):
    """The CLI checks whether the extension is built before any point: torch's version is read from
    its version.py there (no 2 s import), and must give the very folder a process with torch gets."""
    import subprocess
    import sys

    code = (
        "import sys; from pathlib import Path; from actbench.kernels import extension\n"
        f"p = extension.plan(cache_dir=Path({str(tmp_path)!r}))\n"
        "print(p.directory); print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(extension.plan(cache_dir=tmp_path).directory), "False"]
    facts = extension._read_torch_version_file()
    assert facts == extension.TorchFacts(torch.__version__, torch.version.cuda)


def test_unreadable_torch_version_file_falls_back_to_importing_torch():
    import subprocess
    import sys

    code = (
        "from actbench.kernels import extension\n"
        "extension._read_torch_version_file = lambda: None\n"
        "f = extension.TorchFacts.installed(); print(f.version, f.cuda)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [torch.__version__, str(torch.version.cuda)]


def test_gencode_flags():
    assert extension._gencode_flags("8.0;9.0+PTX") == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    ]


def test_mismatched_cached_binary_gives_clear_error(tmp_path):
    """Upstream users hit bare `undefined symbol` errors here; we name the cause and the fix."""
    p = extension.plan(cache_dir=tmp_path, with_cuda=False)
    p.directory.mkdir(parents=True)
    p.library.write_bytes(b"not a shared library")
    p.marker.write_text(json.dumps({"torch_version": "0.0.0"}))
    with pytest.raises(extension.ExtensionError, match="failed to load.*actbench build --force"):
        extension._load_library(p)


def test_failed_build_gives_clear_error(tmp_path, monkeypatch):
    """A compile error surfaces as one ExtensionError naming the compiler's error line and the log."""
    csrc = tmp_path / "csrc"
    shutil.copytree(extension.CSRC, csrc)
    # Both sources broken before any header: the compiler stops at once (torch's headers take seconds).
    for source in extension.CPU_SOURCES:
        (csrc / source).write_text("this is not C++;\n")
    monkeypatch.setattr(extension, "CSRC", csrc)
    p = extension.plan(cache_dir=tmp_path / "cache", with_cuda=False)
    with pytest.raises(extension.ExtensionError, match=r"failed to build.*error:.*Full log: .*build\.log"):
        extension.build(p)
    assert (p.directory / "build.log").read_text()
    assert not p.marker.exists()  # a failed build records nothing that a later load could trust
    for folder in (tmp_path / "cache", tmp_path / "cache" / "extension", p.directory):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_bad_with_cuda_setting(monkeypatch):
    monkeypatch.setenv("ACTBENCH_WITH_CUDA", "yes")
    with pytest.raises(extension.ExtensionError, match="ACTBENCH_WITH_CUDA must be 0 or 1.*got 'yes'"):
        extension.load()


def test_cuda_home_needs_runtime_library(tmp_path, monkeypatch):
    """A folder with bin/nvcc but no libcudart (the /usr/local wrapper case) is not a toolkit."""
    fake = tmp_path / "fakecuda"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "nvcc").write_text("#!/bin/sh\n")
    monkeypatch.setenv("CUDA_HOME", str(fake))
    found = extension.find_cuda_home()
    assert found != str(fake)
    (fake / "lib64").mkdir()
    (fake / "lib64" / "libcudart.so").write_text("")
    assert extension.find_cuda_home() == str(fake)


def test_loaded_extension_is_the_cached_build():
    """The build record holds the SHA-256 of the library it built, and the cache passes its own checks."""
    p = extension.load()
    assert p.marker.exists() and Path(p.library).exists()
    assert hasattr(torch.ops.actbench, "quantize")
    record = json.loads(p.marker.read_text())
    assert record["library_sha256"] == hashlib.sha256(p.library.read_bytes()).hexdigest()
    assert record["library"] == p.library.name
    extension.verify_cached(p)  # what a later process checks before loading it
    extension.prepare_cache(p)
    assert not stat.S_IMODE(p.library.stat().st_mode) & 0o022
