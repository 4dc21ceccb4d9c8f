"""The executor seam: where and how points are measured (docs/design.md §7).

An executor takes points and yields their measurements, in order; it also captures the environment
the points run in, and runs other named work (:class:`Task`: an accuracy setting's training, a
gradient verification) the same way. The runner (:mod:`actbench.runner`), the searches
(:mod:`actbench.search`), ``actbench trust``, the accuracy experiment and ``verify-grads`` only see
this interface, so they never know whether work ran in a child process, in this process, or
(later) on another machine.

- :class:`ChildProcessExecutor` — one child process per point (``python -m actbench.worker``) with
  a timeout: an out-of-memory, a crash or a hang costs one row, and the device starts clean for
  every point. Used for devices that compute (cpu, cuda).
- :class:`InProcessExecutor` — in this process: predictions on fake tensors (meta), where a child's
  start-up would cost more than the step and nothing can leak; also what ``actbench trust`` uses.

:func:`executor_for` picks by the device profile (``DeviceProfile.in_process``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

import actbench
from actbench.devices import profile
from actbench.schema import DEFAULT_TIMEOUT_S, Measurement, PointConfig

log = logging.getLogger(__name__)

_PACKAGE_ROOT = str(Path(actbench.__file__).resolve().parent.parent)
#: The worker reads this to die with its parent (see actbench.worker).
PARENT_PID_ENV = "ACTBENCH_PARENT_PID"


class EnvironmentCaptureError(RuntimeError):
    """The environment block could not be captured (e.g. no usable GPU for a cuda run)."""


class TaskError(RuntimeError):
    """A task failed where it ran; the message is that failure's one line."""


#: Work an executor runs by name: "module:function", a function taking and returning JSON-able dicts.
TASKS: dict[str, str] = {
    "accuracy-setting": "actbench.accuracy:train_setting_task",
    "verify-grads": "actbench.actnn.verify:verify_task",
}


@dataclass(frozen=True)
class Task:
    """A named unit of work (a key of :data:`TASKS`) and its JSON-able arguments.

    ``progress(done, total)`` is called as the work advances where the executor can see it (in this
    process); a child reports only its result.
    """

    name: str
    args: dict[str, Any]
    progress: Callable[[int, int], None] | None = None

    def function(self) -> Callable[[dict[str, Any]], dict[str, Any]]:
        import importlib

        if self.name not in TASKS:
            raise ValueError(f"unknown task '{self.name}'; known: {', '.join(TASKS)}")
        module, _, attr = TASKS[self.name].partition(":")
        return getattr(importlib.import_module(module), attr)


class Executor(Protocol):
    """Measures points (one measurement per point, in the order given) and runs tasks."""

    def measure(self, points: Iterable[PointConfig]) -> Iterator[Measurement]: ...

    def environment(self, device: str) -> dict[str, Any]: ...

    def call(self, task: Task) -> dict[str, Any]: ...


# --- one child process per point --------------------------------------------------------------------
@dataclass(frozen=True)
class ChildOutcome:
    result: dict[str, Any] | None
    returncode: int | None
    timed_out: bool
    stderr_tail: str


def _child_env(alloc_conf: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env[PARENT_PID_ENV] = str(os.getpid())
    if alloc_conf:
        # Must be set before the child touches CUDA; the child process starts with it.
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    return env


def run_child(request: dict[str, Any], timeout_s: float, alloc_conf: str | None = None,
              log_path: Path | None = None) -> ChildOutcome:
    """Run one worker request; kill the child's whole process group on timeout or any exception.

    The child starts with ``-P`` (the working directory is not on its import path, so a stray
    ``json.py`` there cannot run) in a private temporary directory, and dies with this process
    even when this process is killed outright (the worker watches its parent).
    """
    with tempfile.TemporaryDirectory(prefix="actbench-") as tmp:
        req_path, res_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req_path.write_text(json.dumps(request))
        err_path = Path(tmp) / "stderr.txt"
        with err_path.open("wb") as err:
            # Hold Ctrl-C while the child starts: an interrupt inside Popen() would leave a child in
            # its own session that nobody kills. A pending SIGINT fires on unblock, inside the try.
            blocked = _block_signals()
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-P", "-m", "actbench.worker", str(req_path), str(res_path)],
                    stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=_child_env(alloc_conf),
                    start_new_session=True, cwd=tmp,
                )
            except BaseException:
                _unblock_signals(blocked)
                raise
            timed_out = False
            try:
                _unblock_signals(blocked)
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            except BaseException:
                _kill_group(proc)
                raise
        stderr_text = err_path.read_text(errors="replace")
        if log_path is not None and stderr_text.strip():
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_text(stderr_text)
        result = None
        if not timed_out and res_path.exists():
            try:
                result = json.loads(res_path.read_text())
            except json.JSONDecodeError:
                result = None
        return ChildOutcome(result, proc.returncode, timed_out, stderr_text[-2000:])


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


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


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
    tail = _last_line(outcome.stderr_tail)
    return Measurement(status="error", message=f"{how}: {tail}" if tail else how)


class ChildProcessExecutor:
    """One child process per point, killed after ``timeout_s``; its stderr goes to ``log_dir/<key>.log``."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, log_dir: Path | None = None) -> None:
        self.timeout_s = timeout_s
        self.log_dir = log_dir

    def measure(self, points: Iterable[PointConfig]) -> Iterator[Measurement]:
        from actbench import strategies

        for point in points:
            try:
                alloc_conf = strategies.cuda_alloc_conf(point.strategy)
            except ValueError as exc:  # an unknown strategy: a row, not a dead sweep
                yield Measurement.failure("error", f"{type(exc).__name__}: {exc}")
                continue
            log_path = None if self.log_dir is None else self.log_dir / f"{point.key()}.log"
            outcome = run_child({"task": "measure", "point": point.to_dict()}, self.timeout_s, alloc_conf, log_path)
            yield outcome_to_measurement(outcome, self.timeout_s)

    def call(self, task: Task) -> dict[str, Any]:
        """Run ``task`` in a child; its failure (or death, or timeout) raises :class:`TaskError`."""
        task.function()  # an unknown task fails here, in one line, not in the child
        log_path = None if self.log_dir is None else self.log_dir / f"{task.name}.log"
        outcome = run_child({"task": "call", "name": task.name, "args": task.args}, self.timeout_s,
                            log_path=log_path)
        if outcome.result is not None and "result" in outcome.result:
            return outcome.result["result"]
        if outcome.result is not None and "error" in outcome.result:
            raise TaskError(outcome.result["error"])
        raise TaskError(outcome_to_measurement(outcome, self.timeout_s).message)

    def environment(self, device: str) -> dict[str, Any]:
        if not profile(device).environment_in_child:
            from actbench.measure.environment import capture_environment

            return capture_environment(device)
        outcome = run_child({"task": "environment", "device": device}, timeout_s=300)
        if outcome.result is None:
            raise EnvironmentCaptureError(f"environment capture failed on {device}: {_last_line(outcome.stderr_tail)}")
        return outcome.result["environment"]


# --- in this process --------------------------------------------------------------------------------
class InProcessExecutor:
    """Points measured in this process: predictions reuse one :class:`MetaSessions` across points.

    No timeout applies. Test faults that would take this process with them (``crash``, ``hang``)
    are child-only; ``error`` and ``oom`` fire here as in a child.
    """

    def __init__(self) -> None:
        self._sessions: Any = None

    def measure(self, points: Iterable[PointConfig]) -> Iterator[Measurement]:
        for point in points:
            yield self._measure_one(point)

    def _measure_one(self, point: PointConfig) -> Measurement:
        import time

        from actbench.worker import FAULT_ENV, error_measurement, fault_action

        started = time.perf_counter()
        spec = os.environ.get(FAULT_ENV)  # read at this edge, as the worker does in a child
        if spec and spec.partition("@")[0] in ("crash", "hang"):
            spec = None
        try:
            fault = fault_action(spec, point)
            if profile(point.device).predicts:
                if self._sessions is None:
                    from actbench.measure.meta import MetaSessions

                    self._sessions = MetaSessions()
                return self._sessions.measure_point(point, fault)
            from actbench.measure.point import measure_point

            return measure_point(point, fault=fault)
        except Exception as exc:  # an op without a fake kernel, a model that cannot run on fake tensors
            measurement = error_measurement(exc)
            measurement.elapsed_s = round(time.perf_counter() - started, 3)
            return measurement

    def environment(self, device: str) -> dict[str, Any]:
        from actbench.measure.environment import capture_environment

        return capture_environment(device)

    def call(self, task: Task) -> dict[str, Any]:
        """Run ``task`` here; its exception propagates as it is."""
        if task.progress is not None:
            return task.function()(task.args, progress=task.progress)
        return task.function()(task.args)


def executor_for(device: str, timeout_s: float = DEFAULT_TIMEOUT_S, log_dir: Path | None = None) -> Executor:
    """The executor a device's profile asks for: in this process (meta), or a child per point."""
    if profile(device).in_process:
        return InProcessExecutor()
    return ChildProcessExecutor(timeout_s, log_dir)

