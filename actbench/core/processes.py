"""Child processes that die with the command that started them, whatever process groups they made."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def dies_with_this_process(proc: subprocess.Popen) -> Iterator[None]:
    """While ``proc`` runs: any exception here, and SIGTERM or SIGHUP where nothing else handles
    them, kill it and everything it started first (:func:`kill_process_tree`), so no compiler
    outlives the command."""
    def end(signum: int, frame: object) -> None:
        kill_process_tree(proc.pid)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, end) for s in (signal.SIGTERM, signal.SIGHUP)
                    if signal.getsignal(s) == signal.SIG_DFL}
    try:
        yield
    except BaseException:
        kill_process_tree(proc.pid)
        proc.wait()
        raise
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def kill_process_tree(pid: int) -> None:
    """SIGKILL ``pid`` (a process group's leader) and all its descendants, whatever their group.

    ninja starts each compile command in a process group of its own, so killing the build's group
    would leave ``c++``/``cc1plus`` running: every group in the tree is stopped first (nothing
    stopped starts anything new, so the tree read afterwards is complete), then killed.
    """
    stopped: set[int] = set()
    while True:
        groups = {g for g in {pid} | {g for _, g in _descendants(pid)} if g != os.getpgrp()} - stopped
        if not groups:
            break
        for group in groups:
            _signal_group(group, signal.SIGSTOP)
        stopped |= groups
    for group in stopped:
        _signal_group(group, signal.SIGKILL)
        _signal_group(group, signal.SIGCONT)


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _descendants(root: int) -> list[tuple[int, int]]:
    """(pid, process group) of every live descendant of ``root``, from /proc."""
    parents: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append((int(entry.name), int(fields[2])))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found
