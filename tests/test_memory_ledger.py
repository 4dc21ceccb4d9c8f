"""The memory ledger of parallel test workers (tests/memory_ledger.py): the declarations of the tests
running at once stay within the budget, waiting tests go in order, and a dead worker's entries go."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from memory_ledger import MemoryLedger
from workers import is_alive


def _ledger(tmp_path: Path, budget_gb: float = 4.0) -> MemoryLedger:
    path = tmp_path / "ledger.json"
    path.touch()
    return MemoryLedger(path, budget_gb)


@pytest.fixture
def workers() -> Iterator[list[str]]:
    """Pids of processes alive while the test runs (the ledger drops entries of dead pids)."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    yield [str(p.pid) for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def test_tests_start_only_while_their_declarations_fit_the_budget(tmp_path: Path, workers: list[str]) -> None:
    ledger = _ledger(tmp_path)
    a, b, c = workers
    assert ledger.try_start(a, 2.0) and ledger.try_start(b, 2.0)  # 4 GB: fits exactly
    assert not ledger.try_start(c, 1.0)  # 5 GB would not
    ledger.finish(a)
    assert ledger.try_start(c, 1.0)


def test_a_waiting_large_test_is_not_passed_over_by_small_ones(tmp_path: Path, workers: list[str]) -> None:
    ledger = _ledger(tmp_path)
    small, large, _ = workers
    assert ledger.try_start(small, 2.0)
    assert not ledger.try_start(large, 9.0)  # over the whole budget: waits until nothing runs
    ledger.finish(small)
    assert not ledger.try_start(small, 2.0)  # the large one is first in line
    assert ledger.try_start(large, 9.0)
    assert not ledger.try_start(small, 2.0)  # ... and runs alone
    ledger.finish(large)
    assert ledger.try_start(small, 2.0)


@pytest.mark.parametrize("reaped", [True, False], ids=["gone", "zombie"])
def test_a_dead_workers_entries_are_dropped(tmp_path: Path, reaped: bool) -> None:
    ledger = _ledger(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    if reaped:
        dead.wait()
    else:  # exited, not yet waited for: its pid still answers a signal of 0
        deadline = time.monotonic() + 30
        while is_alive(dead.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert Path(f"/proc/{dead.pid}").exists()
    try:
        assert ledger.try_start(str(dead.pid), 4.0)  # it crashed without finishing
        me = str(os.getpid())
        assert ledger.try_start(me, 3.0)  # 7 GB with the dead entry: it fits only if that entry went
        ledger.finish(me)
        with ledger.hold(3.0):
            assert str(os.getpid()) in (tmp_path / "ledger.json").read_text()
        assert str(os.getpid()) not in (tmp_path / "ledger.json").read_text()
    finally:
        dead.wait()
