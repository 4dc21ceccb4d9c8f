"""What a long command shows while it works (on stderr, so stdout keeps only tables and paths).

In a terminal: a rich progress bar whose line says which point runs now. Anywhere else (a log, CI,
a pipe): one plain line per point, flushed as it goes, e.g.::

    [3/12] measuring resnet18 L2 b4 64px cpu ... ok (12.3 s)
    [4/12] resnet18 L3 b4 64px cpu: ok (resumed)

The count is exact for grids (throughput, memory) and an upper bound for searches ("[3/≤12]"): a
search stops when it has its answer, and the bar then ends at the number of points it took, the
same number the closing summary gives. Nothing here is parsed as rich markup: a row's message
("[enforce fail at alloc_cpu.cpp:117] ...") is printed as written.

Before the first point that needs actbench's extension, :func:`ensure_extension` builds it here,
announced, instead of letting a point's child (whose output nobody sees) spend a silent minute on it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterable

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from actbench.schema import one_line

#: What the user reads before the first-use build of the extension.
EXTENSION_NOTICE = "building actbench's extension (first use, about a minute) ..."


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def row_result(row: Any) -> str:
    """``ok``, ``oom: CUDA out of memory ...``: a row's status and, when there is one, its message."""
    return row.status + (f": {one_line(row.message, 100)}" if row.message else "")


def stderr_is_terminal() -> bool:
    return Console(stderr=True).is_terminal


class PointProgress:
    """Progress of one command's points; :meth:`on_event` is the runner's ``on_event``.

    ``total``: points the command may take; ``exact``: whether it takes exactly that many (a grid)
    or at most that many (a search). ``predicts``: the device predicts (meta), so points are
    "predicted", not "measured". ``plain``: one line per point (default: when stderr is not a
    terminal).
    """

    def __init__(self, total: int, exact: bool = True, predicts: bool = False, plain: bool | None = None) -> None:
        self.total = max(0, total)
        self.exact = exact
        self.verb, self.done_verb = ("predicting", "predicted") if predicts else ("measuring", "measured")
        self.plain = (not stderr_is_terminal()) if plain is None else plain
        self.measured = 0
        self.resumed = 0
        self._open_line = False
        self._open_what: str | None = None  # the point whose "measuring ... " line is open
        self._started: dict[str, float] = {}  # per point: several run at once with --jobs/--gpus
        self._progress: Progress | None = None
        self._task: Any = None

    # --- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> "PointProgress":
        if not self.plain:
            columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                       MofNCompleteColumn(), TimeElapsedColumn()]
            if self.exact:
                columns.append(TimeRemainingColumn())
            self._progress = Progress(*columns, console=Console(stderr=True, highlight=False), transient=False)
            self._progress.start()
            self._task = self._progress.add_task("starting", total=self.total or None)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the bar (at the number of points taken, so it agrees with the summary) or the open line."""
        self._end_line()
        if self._progress is not None:
            n = self.count
            self._progress.update(self._task, total=n, completed=n, description="done")
            self._progress.stop()
            self._progress = None

    # --- events ---------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        """Points finished so far: measured (or predicted) now, or resumed from the run directory."""
        return self.measured + self.resumed

    def _position(self, n: int) -> str:
        if self.total and n <= self.total:
            return f"[{n}/{self.total}]" if self.exact else f"[{n}/≤{self.total}]"
        return f"[{n}]"

    def _write(self, text: str) -> None:
        stream = sys.stderr  # looked up now: tests and callers may replace it
        stream.write(text)
        stream.flush()

    def _end_line(self) -> None:
        if self._open_line:
            self._write("\n")
            self._open_line = False
            self._open_what = None

    def say(self, text: str) -> None:
        """A line of its own (above the bar in a terminal), e.g. what a long step is doing."""
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self._end_line()
            self._write(text + "\n")

    def on_event(self, kind: str, point: Any, row: Any) -> None:
        """``start`` (a point begins), ``done`` (it was measured) or ``cached`` (resumed from disk)."""
        what = point.describe()
        if kind == "start":
            self._started[what] = time.monotonic()
            text = f"{self.verb} {what}"
            if self._progress is not None:
                self._progress.update(self._task, description=text)
            else:
                self._end_line()
                self._write(f"{self._position(self.count + 1)} {text} ... ")
                self._open_line = True
                self._open_what = what
            return
        if kind == "cached":
            self.resumed += 1
            result = f"{row_result(row)} (resumed)"
        else:
            self.measured += 1
            started = self._started.pop(what, None)  # none for a row another process measured (Slurm)
            seconds = time.monotonic() - started if started is not None else getattr(row, "elapsed_s", None)
            result = row_result(row) + (f" ({seconds:.1f} s)" if seconds is not None else "")
        if self._progress is not None:
            self._progress.update(self._task, completed=self.count, description=f"{what}: {result}")
            if self.total and self.count > self.total:
                self._progress.update(self._task, total=self.count)
        elif self._open_line and kind == "done" and self._open_what == what:
            self._write(result + "\n")
            self._open_line = False
            self._open_what = None
        else:
            self._end_line()
            self._write(f"{self._position(self.count)} {what}: {result}\n")

    def summary(self, rows_path: object) -> str:
        """``3 points measured, 1 resumed from OUT/<run>/rows.jsonl`` (the bar ended at 4 of 4)."""
        return f"{plural(self.measured, 'point')} {self.done_verb}, {self.resumed} resumed from {rows_path}"


# --- the extension, built where the user can see it ----------------------------------------------
#: Run in a child for devices whose parent must not initialise them (cuda): prints "building"
#: before a first-use build, so the parent can announce it.
_CHILD_BUILD = (
    "import sys\n"
    "from actbench.kernels import extension\n"
    "try:\n"
    "    p = extension.plan()\n"
    "    if not (p.marker.exists() and p.library.exists()):\n"
    "        print('building', flush=True)\n"
    "    extension.load()\n"
    "except extension.ExtensionError as exc:\n"
    "    print('error: ' + ' '.join(str(exc).split()), flush=True)\n"
    "    sys.exit(1)\n"
)


def needs_extension(strategies: Iterable[str]) -> bool:
    from actbench.strategies import is_actnn_level

    return any(is_actnn_level(s) for s in strategies)


def ensure_extension(strategies: Iterable[str], device: str, say: Callable[[str], None]) -> str | None:
    """Build actbench's extension now, announced, when ``strategies`` need it and it is not built.

    Returns None when it is ready, or one line saying why it could not be built. Devices whose
    parent must not initialise them (``DeviceProfile.environment_in_child``: cuda) check and build
    in a child process; the others here (the build itself initialises no device).
    """
    from actbench.core.devices import profile

    if not needs_extension(strategies):
        return None
    started = time.monotonic()
    if profile(device).environment_in_child:
        return _ensure_in_child(say, started)
    from actbench.kernels import extension

    try:
        p = extension.plan()
        if p.marker.exists() and p.library.exists():
            return None  # built: the first point loads it (and verifies its hash)
        say(EXTENSION_NOTICE)
        extension.load()
    except extension.ExtensionError as exc:
        return str(exc)
    say(f"extension built in {time.monotonic() - started:.0f} s ({p.directory})")
    return None


def _ensure_in_child(say: Callable[[str], None], started: float) -> str | None:
    """The extension checked (and built) in an isolated child in a process group of its own, so the
    compilers it starts die with it; None when ready, else the one line that says why not."""
    from actbench.core.child_env import python_child_env

    with tempfile.TemporaryDirectory(prefix="actbench-build-cwd-") as cwd:
        proc = subprocess.Popen([sys.executable, "-P", "-c", _CHILD_BUILD], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=python_child_env(),
                                cwd=cwd, process_group=0)
        return _follow_build_child(proc, say, started)


def _follow_build_child(proc: subprocess.Popen, say: Callable[[str], None], started: float) -> str | None:
    built = False
    error = None
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "building":
                built = True
                say(EXTENSION_NOTICE)
            elif line.startswith("error: "):
                error = line[len("error: "):].strip()
            elif line.strip():
                tail = (tail + [line.strip()])[-5:]
        code = proc.wait()
    finally:
        _end_group(proc)
    if code != 0:
        return error or (tail[-1] if tail else f"the extension check exited with code {code}")
    if built:
        say(f"extension built in {time.monotonic() - started:.0f} s")
    return None


def _end_group(proc: subprocess.Popen) -> None:
    """Kill whatever is left of the child and all it started (the compilers of a build), then reap it."""
    from actbench.core.processes import kill_process_tree

    if proc.poll() is None:
        kill_process_tree(proc.pid)
    proc.wait()
