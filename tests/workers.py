"""Finding live actbench worker processes from /proc, for the tests that kill their parents.

Read from /proc rather than ``ps``: command lines there have no width limit, and a zombie (state
``Z``, already dead but not yet reaped) is not a live worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    cmdline: str
    cwd: str


def live_workers(keep: Callable[[Process], bool] = lambda p: True, command: str = "actbench.worker") -> list[int]:
    """PIDs of live processes whose command line contains ``command`` and that ``keep`` accepts."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state, ppid = (entry / "stat").read_text().rpartition(")")[2].split()[:2]
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if command in cmdline and state != "Z" and keep(Process(int(entry.name), int(ppid), cmdline, cwd)):
            pids.append(int(entry.name))
    return pids


def is_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process: running or sleeping, not a zombie and not gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"
