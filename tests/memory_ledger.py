"""What the tests running at once on parallel workers (``-n 2``) may hold together: a shared ledger.

Each test declares the memory it holds at most, its own process and the children it starts together
(``@pytest.mark.memory_gb(N)``; unmarked tests hold ``DEFAULT_GB``). A worker writes the declaration of
the test it is about to run into one file all workers share and starts it only when the declarations
of the tests running then, its own included, add up to at most the budget (``--memory-budget``). A
test that declares more than the whole budget runs when nothing else does. Waiting tests go first
come, first served, so a large test is not passed over for ever by a stream of small ones.

The file is a JSON object ``{"running": {pid: gb}, "queue": [pid, ...]}`` read and written under an
exclusive ``flock``; the entries of a worker that died (gone, or a zombie not yet reaped) are dropped
by whoever reads them next. Liveness is read from /proc (tests/workers.py): Linux, as the suite's other
process checks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Iterator

from workers import is_alive

#: what a worker with torch, torchvision and a small model's step holds: every unmarked test of the
#: default run measured at most this, children included (one process, sampled every 0.3 s)
DEFAULT_GB = 1.8
#: a laptop's 4 GB (README, "Tests") less the controller of the workers (0.04 GB measured)
DEFAULT_BUDGET_GB = 3.9
#: environment variable through which the workers find the ledger the controller made
LEDGER_ENV = "ACTBENCH_TEST_MEMORY_LEDGER"
_POLL_S = 0.05


class MemoryLedger:
    """The shared ledger at ``path``; ``hold(gb)`` waits until it fits the budget, then holds it while the test runs."""

    def __init__(self, path: Path, budget_gb: float) -> None:
        self.path = path
        self.budget_gb = budget_gb

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict]:
        with open(self.path, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            text = f.read()
            state = json.loads(text) if text.strip() else {"running": {}, "queue": []}
            state["running"] = {pid: gb for pid, gb in state["running"].items() if is_alive(int(pid))}
            state["queue"] = [pid for pid in state["queue"] if is_alive(int(pid))]
            yield state
            f.seek(0)
            f.truncate()
            f.write(json.dumps(state))

    def try_start(self, me: str, gb: float) -> bool:
        """Starts ``me`` (a worker's pid) if it is first in line and fits, else puts it in line."""
        with self._locked() as state:
            if me not in state["queue"]:
                state["queue"].append(me)
            running = state["running"]
            first = state["queue"][0] == me
            fits = not running or sum(running.values()) + gb <= self.budget_gb
            if first and fits:
                state["queue"].remove(me)
                running[me] = gb
                return True
            return False

    def finish(self, me: str) -> None:
        with self._locked() as state:
            state["running"].pop(me, None)
            if me in state["queue"]:
                state["queue"].remove(me)

    @contextlib.contextmanager
    def hold(self, gb: float) -> Iterator[None]:
        me = str(os.getpid())
        try:
            while not self.try_start(me, gb):
                time.sleep(_POLL_S)
            yield
        finally:
            self.finish(me)
