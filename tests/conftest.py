"""Suite-wide hooks. After a test that left the process large, memory it freed goes back to the system.

Without this the pytest process keeps every heap page a large model ever used (glibc holds freed
blocks for reuse), so its resident size grows test by test towards the sum of the largest ones, above
the 4 GB the default run promises a laptop (README, "Tests"); with it, the peak is about the largest
test's own. A test pays for the collection only when the process grew by ``_TRIM_AFTER_GROWTH`` since
the last one (a collection after every test would add minutes to the run), and so does the last test of
a file that left the process ``_TRIM_AT_FILE_END`` larger: a file's fixtures are gone by then, and the
next file's largest test then starts from what is really alive, not from what the files before it
freed (in the default run, the zoo's AlexNet peaked 1.6 GB above what the files before it had left).

On parallel workers (``-n 2``: CI's heavy run) the tests running at once share one memory budget
(``--memory-budget``, default ``memory_ledger.DEFAULT_BUDGET_GB``): each test declares the GB it holds
with ``@pytest.mark.memory_gb(N)`` (unmarked: ``memory_ledger.DEFAULT_GB``), and a worker starts a test
only when the declarations of the tests running then fit the budget (tests/memory_ledger.py); each
worker's torch gets its share of the cores. In any run, a test whose own process grew past its
declaration is named at the end, so the declarations stay true. The default run stays on one process:
between two tests a worker still holds up to ``_TRIM_AFTER_GROWTH`` of freed memory that no declaration
counts: two workers on the default run reached 4.09 GiB (4.4 GB) together, past the 4 GB a laptop has.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
import tempfile
from pathlib import Path

import pytest

from memory_ledger import DEFAULT_BUDGET_GB, DEFAULT_GB, LEDGER_ENV, MemoryLedger

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


# --- parallel workers: one memory budget, a share of the cores each ----------------------------------
def pytest_addoption(parser) -> None:
    parser.addoption("--memory-budget", type=float, default=DEFAULT_BUDGET_GB, metavar="GB",
                     help="on parallel workers (-n): GB the tests running at once may declare together "
                          f"(@pytest.mark.memory_gb; default {DEFAULT_BUDGET_GB:g})")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "memory_gb(n): the GB this test holds at most, its children included "
                                       f"(unmarked: {DEFAULT_GB:g}); parallel workers keep the sum within "
                                       "--memory-budget")
    budget = config.getoption("memory_budget")
    if not budget > 0:
        raise pytest.UsageError(f"--memory-budget must be above 0 GB, got {budget}")
    config.pluginmanager.register(_MemoryBudget(config, budget), "actbench-memory-budget")


class _MemoryBudget:
    """The ledger's file (made by the controller of parallel workers, held by each test on a worker),
    the cores' share of each worker, and the tests that outgrew their declaration."""

    def __init__(self, config, budget_gb: float) -> None:
        self.own_path: Path | None = None
        self.over: list[tuple[str, float, float]] = []
        if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
            fd, path = tempfile.mkstemp(prefix="actbench-test-memory-", suffix=".json")
            os.close(fd)
            self.own_path = Path(path)
            os.environ[LEDGER_ENV] = path  # the workers, started after this, inherit it
        on_worker = "PYTEST_XDIST_WORKER" in os.environ and LEDGER_ENV in os.environ
        self.ledger = MemoryLedger(Path(os.environ[LEDGER_ENV]), budget_gb) if on_worker else None
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
            # the children a test starts inherit it too; torch reads it when first imported
            os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
            if "torch" in sys.modules:
                sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    def pytest_unconfigure(self) -> None:
        if self.own_path is not None:
            self.own_path.unlink(missing_ok=True)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        held = self.ledger.hold(_declared_gb(item)) if self.ledger else contextlib.nullcontext()
        with held:
            _reset_peak()
            yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        """After teardown, the test's own peak goes into its report (on a worker, that is how it reaches
        the controller)."""
        if call.when == "teardown":
            peak, declared = _peak_gb(), _declared_gb(item)
            if peak is not None and peak > declared:
                item.user_properties.append(("memory_gb_over", (round(peak, 2), declared)))
        yield

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "teardown":
            self.over += [(report.nodeid, *value) for name, value in report.user_properties
                          if name == "memory_gb_over"]

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.over:
            terminalreporter.section("tests whose own process grew past their memory_gb")
            for nodeid, peak, declared in self.over:
                terminalreporter.write_line(f"{nodeid}: {peak:.2f} GB, declared {declared:g}")


def _declared_gb(item) -> float:
    mark = item.get_closest_marker("memory_gb")
    return float(mark.args[0]) if mark else DEFAULT_GB


def _reset_peak() -> None:
    """Restarts this process's peak resident size (Linux: /proc/self/clear_refs; elsewhere a no-op)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")


def _peak_gb() -> float | None:
    """This process's peak resident size since the last reset (Linux), else None."""
    with contextlib.suppress(OSError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20
    return None
