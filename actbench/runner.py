"""Runs each point in its own child process with a timeout and turns every outcome into a row.

Child = ``python -m actbench.worker`` with JSON request/result files. The parent never imports CUDA
state a child would share: on a ``cuda`` run even the environment block is captured in a child.
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
from typing import Any, Callable

import actbench
from actbench.measure.environment import capture_environment, environment_id
from actbench.measure.point import Measurement, PointConfig
from actbench.results import ResultRow, RunStore
from actbench.strategies import cuda_alloc_conf

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1800.0
_PACKAGE_ROOT = str(Path(actbench.__file__).resolve().parent.parent)


@dataclass(frozen=True)
class ChildOutcome:
    result: dict[str, Any] | None
    returncode: int | None
    timed_out: bool
    stderr_tail: str


def _child_env(alloc_conf: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    if alloc_conf:
        # Must be set before the child touches CUDA; the child process starts with it.
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    return env


def run_child(request: dict[str, Any], timeout_s: float, alloc_conf: str | None = None,
              log_path: Path | None = None) -> ChildOutcome:
    """Run one worker request; kill the child's whole process group on timeout or Ctrl-C."""
    with tempfile.TemporaryDirectory(prefix="actbench-") as tmp:
        req_path, res_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req_path.write_text(json.dumps(request))
        err_path = Path(tmp) / "stderr.txt"
        with err_path.open("wb") as err:
            # Hold Ctrl-C while the child starts: an interrupt inside Popen() would leave a child in
            # its own session that nobody kills. A pending SIGINT fires on unblock, inside the try.
            blocked = _block_sigint()
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "actbench.worker", str(req_path), str(res_path)],
                    stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=_child_env(alloc_conf),
                    start_new_session=True,
                )
            except BaseException:
                _unblock_sigint(blocked)
                raise
            timed_out = False
            try:
                _unblock_sigint(blocked)
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
            result = json.loads(res_path.read_text())
        return ChildOutcome(result, proc.returncode, timed_out, stderr_text[-2000:])


def _block_sigint() -> bool:
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return False
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    return True


def _unblock_sigint(blocked: bool) -> None:
    if blocked:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


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


class EnvironmentCaptureError(RuntimeError):
    """The environment block could not be captured (e.g. no usable GPU for a cuda run)."""


class PointRunner:
    """Measures points for one run directory, skipping points whose key is already recorded."""

    def __init__(self, store: RunStore, device: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_event: Callable[[str, PointConfig, ResultRow | None], None] | None = None) -> None:
        self.store = store
        self.device = device
        self.timeout_s = timeout_s
        self.on_event = on_event or (lambda *_: None)
        self._env_id: str | None = None
        self._meta: Any = None  # MetaSessions, made on the first meta point

    def environment_id(self) -> str:
        """Capture the environment once per run (in a child on cuda) and record it in the run dir."""
        if self._env_id is None:
            if self.device == "cuda":
                outcome = run_child({"task": "environment", "device": self.device}, timeout_s=300)
                if outcome.result is None:
                    raise EnvironmentCaptureError(
                        f"environment capture failed on {self.device}: {_last_line(outcome.stderr_tail)}")
                env = outcome.result["environment"]
            else:
                env = capture_environment(self.device)
            self._env_id = environment_id(env)
            self.store.record_environment(env, self._env_id)
        return self._env_id

    def _measure_meta(self, point: PointConfig) -> Measurement:
        """Meta points run in this process: fake tensors use no memory and a child's start-up (torch,
        the extension) would cost more than the step. No timeout applies; test faults other than
        ``error``/``oom`` (a crash or hang would take this process with them) are child-only."""
        import time

        from actbench.measure.meta import MetaSessions
        from actbench.measure.point import measure_point
        from actbench.worker import FAULT_ENV, error_measurement, fault_action

        if self._meta is None:
            self._meta = MetaSessions()
        started = time.perf_counter()
        try:
            spec = os.environ.get(FAULT_ENV)  # read at this edge, as the worker does in a child
            if spec and spec.partition("@")[0] in ("crash", "hang"):
                spec = None
            measurement = measure_point(point, fault=fault_action(spec, point), meta_sessions=self._meta)
        except Exception as exc:  # an op without a fake kernel, a model that cannot run on fake tensors
            measurement = error_measurement(exc)
            measurement.elapsed_s = round(time.perf_counter() - started, 3)
        return measurement

    def run(self, point: PointConfig) -> ResultRow:
        key = point.key()
        existing = self.store.get(key)
        if existing is not None:
            self.on_event("cached", point, existing)
            return existing
        env_id = self.environment_id()
        self.on_event("start", point, None)
        try:
            alloc_conf = cuda_alloc_conf(point.strategy)
        except Exception as exc:  # e.g. the ActNN package missing: a row, not a dead sweep
            measurement = Measurement(status="error", message=f"{type(exc).__name__}: {exc}"[:300])
        else:
            measurement = self._measure_meta(point) if point.device == "meta" else None
        if measurement is None:
            outcome = run_child({"task": "measure", "point": point.to_dict()}, self.timeout_s, alloc_conf,
                                log_path=self.store.run_dir / "logs" / f"{key}.log")
            measurement = outcome_to_measurement(outcome, self.timeout_s)
        row = ResultRow.build(point, measurement, self.store.run_id, env_id)
        self.store.append(row)
        self.store.write_table()
        log.info("%s -> %s %s", point.describe(), row.status, row.message)
        self.on_event("done", point, row)
        return row
