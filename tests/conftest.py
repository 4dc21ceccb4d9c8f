"""Suite-wide hooks. After a test that left the process large, memory it freed goes back to the system.

Without this the pytest process keeps every heap page a large model ever used (glibc holds freed
blocks for reuse), so its resident size grows test by test towards the sum of the largest ones, above
the 4 GB the default run promises a laptop (README, "Tests"); with it, the peak is about the largest
test's own. A test pays for the collection only when the process grew by ``_TRIM_AFTER_GROWTH`` since
the last one (a collection after every test would add minutes to the run), and so does the last test of
a file that left the process ``_TRIM_AT_FILE_END`` larger: a file's fixtures are gone by then, and the
next file's largest test then starts from what is really alive, not from what the files before it
freed (in the default run, the zoo's AlexNet peaked 1.6 GB above what the files before it had left).

CI runs the heavy tests on two workers (``-n 2 --dist loadgroup``, .ci/run). Those that take 6 GB or
more carry ``xdist_group("large_memory")``: one worker runs them all, one after another, so two of them
never add up on one machine; the other worker meanwhile runs tests of a few GB at most.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys

import pytest

# Points in tests time exactly the steps they ask for (actbench/core/devices.py, EXACT_STEPS_ENV): the
# suite checks what is measured, not how steady the numbers are; a test of the timing rules removes it.
os.environ.setdefault("ACTBENCH_EXACT_STEPS", "1")

_TRIM_AFTER_GROWTH = 512 << 20  # bytes resident above what the last trim left
_TRIM_AT_FILE_END = 128 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_LIBC = None
if sys.platform.startswith("linux"):
    try:
        _LIBC = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to trim
        _LIBC = None


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


_floor = [0]  # resident bytes right after the last trim


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem) -> None:
    """Runs after the test's own teardown, so what its fixtures held can be given back too."""
    if _LIBC is None:
        return
    file_ends = nextitem is None or nextitem.path != item.path
    if _resident_bytes() > _floor[0] + (_TRIM_AT_FILE_END if file_ends else _TRIM_AFTER_GROWTH):
        gc.collect()
        _LIBC.malloc_trim(0)
        _floor[0] = _resident_bytes()
