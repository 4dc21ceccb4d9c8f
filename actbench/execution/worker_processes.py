"""Worker children (docs/design.md §7, "Executors and isolation"): a fresh child per request
(:func:`run_child`) or a persistent worker that measures point after point (:class:`WorkerProcess`).
Each starts with ``-P`` in a private folder and a process group of its own, is killed with its whole
group on timeout or interruption, and dies with this process even on ``kill -9``; how a child died
becomes its point's measurement (:func:`outcome_to_measurement`).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from actbench.core.child_env import python_child_env
from actbench.schema import Measurement, one_line
from actbench.worker import SPARE_ENV

if TYPE_CHECKING:
    from actbench.planning.point import Point

#: The worker reads this to die with its parent (see actbench.worker).
PARENT_PID_ENV = "ACTBENCH_PARENT_PID"


@dataclass(frozen=True)
class ChildOutcome:
    result: dict[str, Any] | None
    returncode: int | None
    timed_out: bool
    stderr_tail: str


def _child_env(alloc_conf: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = python_child_env()
    env[PARENT_PID_ENV] = str(os.getpid())
    if alloc_conf:
        # Must be set before the child touches CUDA; the child process starts with it.
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    env.update(extra or {})
    return env


class _Spawner:
    """Starts every long-lived worker from one thread that lives as long as this process.

    Linux's parent-death signal (the worker's ``PR_SET_PDEATHSIG``) fires when the *thread* that
    started a child ends, not the process: a worker started by a short-lived search thread would be
    killed under the next point that uses it. The main thread (which outlives everything) starts
    children itself; other threads hand the start to this one.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, args: list[str], **kwargs: Any) -> subprocess.Popen:
        if threading.current_thread() is threading.main_thread():
            blocked = _block_signals()
            try:
                return subprocess.Popen(args, **kwargs)
            finally:
                _unblock_signals(blocked)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="actbench-spawner", daemon=True)
                self._thread.start()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((future, args, kwargs))
        return future.result()

    def _serve(self) -> None:
        while True:
            future, args, kwargs = self._queue.get()
            try:
                future.set_result(subprocess.Popen(args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)


_SPAWNER = _Spawner()

#: How every child starts: in a process group of its own, so a timeout kills the child and all it
#: started (``killpg``), and the terminal's Ctrl-C (sent to the foreground group) reaches only this
#: process, which ends its children. Not in a session of its own: Linux divides the CPU between
#: sessions first (autogroups) and only then by nice value, so a child in its own session got an
#: equal share beside the measured point whatever its threads' priority. In this process's session a
#: spare's lowest-priority imports give way to the point (docs/design.md §7, "Spare workers").
CHILD_GROUP: dict[str, Any] = {"process_group": 0}


def run_child(request: dict[str, Any], timeout_s: float, alloc_conf: str | None = None,
              log_path: Path | None = None, extra_env: dict[str, str] | None = None,
              track: Callable[[subprocess.Popen | None], None] | None = None) -> ChildOutcome:
    """Run one worker request in a fresh child; kill its whole process group on timeout or any exception.

    The child starts with ``-P`` (the working directory is not on its import path, so a stray
    ``json.py`` there cannot run) in a private temporary directory, and dies with this process
    even when this process is killed outright (the worker watches its parent). ``extra_env``: what
    the slot adds (a pinned GPU, a thread cap). ``track(proc)`` is told of the child when it starts
    and ``track(None)`` when it is gone, so an aborting executor can kill it.
    """
    with tempfile.TemporaryDirectory(prefix="actbench-") as tmp:
        req_path, res_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req_path.write_text(json.dumps(request))
        err_path = Path(tmp) / "stderr.txt"
        with err_path.open("wb") as err:
            # Hold Ctrl-C while the child starts: an interrupt inside Popen() would leave a child in
            # its own process group that nobody kills. A pending SIGINT fires on unblock, inside the try.
            blocked = _block_signals()
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-P", "-m", "actbench.worker", str(req_path), str(res_path)],
                    stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=_child_env(alloc_conf, extra_env),
                    cwd=tmp, **CHILD_GROUP,
                )
            except BaseException:
                _unblock_signals(blocked)
                raise
            timed_out = False
            try:
                if track is not None:
                    track(proc)
                _unblock_signals(blocked)
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            except BaseException:
                _kill_group(proc)
                raise
            finally:
                if track is not None:
                    track(None)
        stderr_text = err_path.read_text(errors="replace")
        _write_log(log_path, stderr_text)
        result = None
        if not timed_out and res_path.exists():
            try:
                result = json.loads(res_path.read_text())
            except json.JSONDecodeError:
                result = None
        return ChildOutcome(result, proc.returncode, timed_out, stderr_text[-2000:])


def _write_log(log_path: Path | None, text: str) -> None:
    if log_path is not None and text.strip():
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(text)


_HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _block_signals() -> bool:
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return False
    signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    return True


def _unblock_signals(blocked: bool) -> None:
    if blocked:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD_SIGNALS)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def last_line(text: str) -> str:
    """The last non-blank line of a child's stderr, as one short line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return one_line(lines[-1], 200) if lines else ""


def outcome_to_measurement(outcome: ChildOutcome, timeout_s: float) -> Measurement:
    """A measurement from any child outcome: its own report, or one made from how it died."""
    if outcome.timed_out:
        return Measurement(status="timeout", message=f"no result within {timeout_s:g} s; child killed")
    if outcome.result is not None and "measurement" in outcome.result:
        return Measurement.from_dict(outcome.result["measurement"])
    rc = outcome.returncode
    if rc is not None and rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = str(-rc)
        hint = " (SIGKILL: maybe the host OOM killer)" if -rc == signal.SIGKILL else ""
        how = f"child killed by {name}{hint}"
    else:
        how = f"child exited with code {rc} without a result"
    tail = last_line(outcome.stderr_tail)
    return Measurement(status="error", message=f"{how}: {tail}" if tail else how)


# --- a persistent worker ----------------------------------------------------------------------------
class WorkerProcess:
    """A worker child that measures one point after another (``python -P -m actbench.worker --serve``).

    Requests and replies are JSON lines on the child's stdin and on a copy of its original stdout
    (the child points its own stdout at its log, so a stray print cannot corrupt a reply). Each
    request names a fresh log file; the child sends its stderr there for that point, so every point
    keeps its own log, as with a child per point. ``key`` says which points it may take (one
    strategy, device, budget and allocator setting): anything else gets a new worker.
    """

    def __init__(self, key: tuple | None, alloc_conf: str | None, extra_env: dict[str, str] | None = None,
                 spare: bool = False) -> None:
        self.key = key
        self.alloc_conf = alloc_conf
        self.points = 0
        self._dir = Path(tempfile.mkdtemp(prefix="actbench-worker-"))
        self._startup_log = self._dir / "startup.txt"
        with self._startup_log.open("wb") as err:
            self.proc = _SPAWNER.popen(
                [sys.executable, "-P", "-m", "actbench.worker", "--serve"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                env={**_child_env(alloc_conf, extra_env), **({SPARE_ENV: "1"} if spare else {})},
                cwd=self._dir, **CHILD_GROUP,
            )
        self._buffer = b""
        self._finalizer = weakref.finalize(self, _reap, self.proc, self._dir)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def measure(self, point: "Point", timeout_s: float, log_path: Path | None) -> tuple[Measurement, bool]:
        """(measurement, whether this worker may take the next point). A crash or a timeout kills it."""
        self.points += 1
        point_log = self._dir / f"point-{self.points}.txt"
        request = {"task": "measure", "point": point.config.to_dict(), "log": str(point_log)}
        reply: dict[str, Any] | None = None
        timed_out = False
        try:
            reply = self._exchange(request, timeout_s)
        except TimeoutError:
            timed_out = True
        except BaseException:
            self.close()
            raise
        text = point_log.read_text(errors="replace") if point_log.exists() else ""
        if reply is None and not text.strip() and self._startup_log.exists():
            text = self._startup_log.read_text(errors="replace")  # died before its first point
        if reply is None or timed_out:
            self.close()  # removes its folder: the logs were read above
        _write_log(log_path, text)
        outcome = ChildOutcome(reply, self.proc.returncode, timed_out, text[-2000:])
        measurement = outcome_to_measurement(outcome, timeout_s)
        keep = reply is not None and measurement.status in KEEP_WORKER_AFTER and bool(reply.get("clean", True))
        return measurement, keep

    def _exchange(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """Send one request and wait for its reply line; None when the child died; TimeoutError."""
        import time

        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            self.proc.wait()
            return None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # EOF: the child is gone
                self.proc.wait()
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return None

    def close(self) -> None:
        """Kill the worker's process group (it may be mid-point: nothing it does matters any more)."""
        self._finalizer()


def _reap(proc: subprocess.Popen, folder: Path) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    shutil.rmtree(folder, ignore_errors=True)


def worker_key(point: "Point", alloc_conf: str | None) -> tuple:
    """What consecutive points of one worker share: strategy, device, budget (a cuda memory cap stays
    set in the process), allocator configuration (read once, when CUDA starts) and precision.

    A device whose points may run in the parent process (meta: fake tensors, nothing to leak) needs
    only the device: one worker may take any of its points, as the in-process executor does.
    """
    if point.device.in_process:
        return (point.device.name,)
    return (point.strategy.name, point.device.name, point.budget_bytes, alloc_conf, point.precision)


#: Statuses after which a worker takes the next point: results of a process that is fine (an
#: over-budget point ran to the end; its peak, and its host bytes, were only compared with the budgets afterwards).
KEEP_WORKER_AFTER = ("ok", "over_budget", "host_over_budget")
