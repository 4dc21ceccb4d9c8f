"""The extension cache is not a way to run someone else's code.

A cached library is loaded only when its SHA-256 matches the one its build recorded, and only from
folders that belong to this user and that nobody else can write; new folders are created 0700.
These tests use small fake files and a tiny planted library: none of them builds the extension.
"""

import json
import os
import shutil
import stat
import subprocess

import pytest
import torch
from typer.testing import CliRunner

from actbench.kernels import extension
from actbench.cli import app

PLANTED_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *path = getenv("ACTBENCH_TEST_PLANTED_RAN");
    if (path) { FILE *f = fopen(path, "w"); if (f) { fputs("ran", f); fclose(f); } }
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache root for load(), as if the extension were not loaded in this process yet."""
    root = tmp_path / "cache"
    monkeypatch.setenv("ACTBENCH_CACHE_DIR", str(root))
    monkeypatch.setenv("ACTBENCH_WITH_CUDA", "0")
    monkeypatch.setattr(extension, "_is_loaded", lambda: False)
    return root


@pytest.fixture
def no_build(monkeypatch):
    """Fail the test if load() falls through to a build (these tests must stay fast)."""

    def build(*args, **kwargs):
        raise AssertionError("load() tried to build")

    monkeypatch.setattr(extension, "build", build)


def _spy_load_library(monkeypatch) -> list:
    calls = []
    monkeypatch.setattr(torch.ops, "load_library", lambda path: calls.append(path))
    return calls


def _plant(p: extension.BuildPlan, library: bytes, sha256: str | None) -> None:
    extension.prepare_cache(p)
    p.library.write_bytes(library)
    record = {"torch_version": torch.__version__}
    if sha256 is not None:
        record["library_sha256"] = sha256
    p.marker.write_text(json.dumps(record))


def _compile_planted(tmp_path) -> bytes:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the planted library")
    src = tmp_path / "planted.c"
    src.write_text(PLANTED_C)
    out = tmp_path / "planted.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True, capture_output=True)
    return out.read_bytes()


def test_planted_library_with_wrong_hash_is_not_loaded(cache, no_build, tmp_path, monkeypatch):
    """A real shared library with a constructor, beside a build record whose hash is not its own:
    refused with the file and the fix named, and its constructor never runs. With the right hash
    the same library loads (and its constructor runs), so the test can tell the two apart."""
    library = _compile_planted(tmp_path)
    ran = tmp_path / "constructor_ran"
    monkeypatch.setenv("ACTBENCH_TEST_PLANTED_RAN", str(ran))
    p = extension.plan(with_cuda=False)
    _plant(p, library, sha256="0" * 64)
    with pytest.raises(extension.ExtensionError) as info:
        extension.load()
    message = str(info.value)
    assert str(p.library) in message and "does not match the SHA-256" in message
    assert "actbench build --force" in message and "\n" not in message
    assert not ran.exists(), "the planted library's constructor ran"

    p.marker.write_text(json.dumps({"library_sha256": extension.file_sha256(p.library)}))
    assert extension.load() == p
    assert ran.read_text() == "ran"


@pytest.mark.parametrize(
    "record",
    [{"torch_version": "2.14.1"}, {"library_sha256": ""}, "not json {", ["library_sha256"]],
    ids=["no-hash", "empty-hash", "not-json", "not-an-object"],
)
def test_record_that_cannot_vouch_for_the_library_is_refused(cache, no_build, monkeypatch, record):
    calls = _spy_load_library(monkeypatch)
    p = extension.plan(with_cuda=False)
    _plant(p, b"\x7fELF planted", sha256=None)
    p.marker.write_text(record if isinstance(record, str) else json.dumps(record))
    with pytest.raises(extension.ExtensionError, match=r"build record .*build\.json.*actbench build --force"):
        extension.load()
    assert calls == []


def test_library_with_matching_hash_is_loaded(cache, no_build, monkeypatch):
    calls = _spy_load_library(monkeypatch)
    p = extension.plan(with_cuda=False)
    _plant(p, b"\x7fELF pretend library", sha256=None)
    p.marker.write_text(json.dumps({"library_sha256": extension.file_sha256(p.library)}))
    extension.load()
    assert calls == [str(p.library)]


def test_library_writable_by_others_is_refused_even_with_matching_hash(cache, no_build, monkeypatch):
    calls = _spy_load_library(monkeypatch)
    p = extension.plan(with_cuda=False)
    _plant(p, b"\x7fELF pretend library", sha256=None)
    p.marker.write_text(json.dumps({"library_sha256": extension.file_sha256(p.library)}))
    os.chmod(p.library, 0o666)
    with pytest.raises(extension.UnsafeCacheError, match=r"library .* writable by group or others"):
        extension.load()
    assert calls == []


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o720])
@pytest.mark.parametrize("level", ["root", "extension"])
def test_cache_folder_others_can_write_is_refused(cache, no_build, monkeypatch, mode, level):
    calls = _spy_load_library(monkeypatch)
    p = extension.plan(with_cuda=False)
    _plant(p, b"\x7fELF planted", sha256="0" * 64)
    folder = cache if level == "root" else cache / "extension"
    os.chmod(folder, mode)
    with pytest.raises(extension.UnsafeCacheError) as info:
        extension.load()
    message = str(info.value)
    assert f"{folder} is writable by group or others (mode {mode:04o})" in message and "\n" not in message
    assert calls == []
    assert stat.S_IMODE(folder.stat().st_mode) == mode  # reported, not silently "fixed"


def test_cache_folder_of_another_user_is_refused(cache, no_build, monkeypatch):
    cache.mkdir(mode=0o700)
    other = cache.stat().st_uid + 4242
    monkeypatch.setattr(extension.os, "geteuid", lambda: other)
    with pytest.raises(extension.UnsafeCacheError, match=rf"{cache} belongs to another user"):
        extension.load()
    assert list(cache.iterdir()) == []  # nothing created inside it


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o200])
def test_new_cache_folders_are_created_owner_only(cache, monkeypatch, umask):
    """Whatever the umask: the root, extension/ and the build folder are exactly 0700."""
    built = []
    monkeypatch.setattr(extension, "build", lambda p, **kw: built.append(p))
    old = os.umask(umask)
    try:
        p = extension.load()
    finally:
        os.umask(old)
    assert built == [p]  # no record yet: load() goes to the build
    for folder in (cache, cache / "extension", p.directory):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert p.directory.parent.parent == cache


def test_private_existing_cache_is_accepted(cache, monkeypatch):
    """A folder of one's own that only the owner can write (0755 from an older actbench) is fine."""
    cache.mkdir(mode=0o755)
    os.chmod(cache, 0o755)
    monkeypatch.setattr(extension, "build", lambda p, **kw: None)
    extension.load()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o755


def test_empty_cache_setting_means_the_default(monkeypatch):
    monkeypatch.setenv("ACTBENCH_CACHE_DIR", "")
    p = extension.plan(with_cuda=False)
    assert p.directory.parent.parent == extension.Path.home() / ".cache" / "actbench"


def test_cli_build_and_doctor_report_an_unsafe_cache_in_one_line(cache, no_build):
    cache.mkdir()
    os.chmod(cache, 0o777)
    result = CliRunner().invoke(app, ["build"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if "writable by group or others" in line]
    assert len(lines) == 1 and lines[0].startswith("actbench: error: actbench cache folder"), result.output
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 1 and "FAIL" in result.output
