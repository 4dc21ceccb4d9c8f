"""Child-process entry: ``python -m actbench.worker REQUEST.json RESULT.json``.

The parent writes a JSON request; the child writes a JSON result file (never parsed from stdout) and
exits 0. Out-of-memory and over-budget are results; any other exception becomes an ``error`` result
with a one-line message. If the child dies before writing (a crash) or is killed (a timeout), the
parent makes the row from the exit status.

Test hook: ``ACTBENCH_TEST_FAULT`` = ``crash`` | ``hang`` | ``oom`` | ``error``, optionally
restricted to some points with ``@batch=N``, ``@batch>N``, ``@image>N``, ``@blocks>N`` or
``@strategy=NAME`` (e.g. ``crash@batch=4``). Read once here; it fires after the model is built.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from actbench.schema import Measurement, PointConfig

FAULT_ENV = "ACTBENCH_TEST_FAULT"


def fault_applies(cond: str, batch_size: int, image_size: int, extra_blocks: int, strategy: str) -> bool:
    """``batch=N``, ``batch>N``, ``image>N``, ``blocks>N`` or ``strategy=NAME``; empty = always."""
    if not cond:
        return True
    op = ">" if ">" in cond else "="
    field, _, value = cond.partition(op)
    if field == "strategy":
        return strategy == value
    actual = {"batch": batch_size, "image": image_size, "blocks": extra_blocks}.get(field)
    if actual is None:
        raise ValueError(f"{FAULT_ENV}: unknown condition '{cond}'")
    return actual > int(value) if op == ">" else actual == int(value)


def fault_action(spec: str | None, point: "PointConfig") -> Callable[[], None] | None:
    """The injected failure for this point, or None. Only tests set the variable."""
    if not spec:
        return None
    kind, _, cond = spec.partition("@")
    if not fault_applies(cond, point.batch_size, point.image_size, point.model.extra_blocks, point.strategy):
        return None

    def act() -> None:
        import torch

        if kind == "crash":
            sys.stderr.write("actbench worker: injected crash\n")
            sys.stderr.flush()
            os.abort()
        if kind == "hang":
            time.sleep(10**6)
        if kind == "oom":
            raise torch.OutOfMemoryError("injected out-of-memory (test hook)")
        if kind == "error":
            raise RuntimeError("injected error (test hook)")
        raise ValueError(f"{FAULT_ENV}: unknown fault '{kind}', expected crash, hang, oom or error")

    return act


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def error_measurement(exc: BaseException, alloc_conf: str | None = None) -> "Measurement":
    """An ``error`` row's measurement: the exception's type and message on one line."""
    from actbench.schema import Measurement

    logging.getLogger(__name__).debug("point failed", exc_info=exc)
    message = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return Measurement(status="error", message=message, alloc_conf=alloc_conf)


def run_request(request: dict[str, Any], fault_spec: str | None) -> dict[str, Any]:
    """Execute one request dict and return the result dict (no process-level effects)."""
    task = request["task"]
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if task == "environment":
        from actbench.measure.environment import capture_environment

        return {"environment": capture_environment(request["device"], alloc_conf)}
    if task == "measure":
        from actbench.measure.point import measure_point
        from actbench.schema import PointConfig

        point = PointConfig.from_dict(request["point"])
        try:
            fault = fault_action(fault_spec, point)
            measurement = measure_point(point, alloc_conf=alloc_conf, fault=fault)
        except Exception as exc:  # any other failure is a row, not a dead sweep
            traceback.print_exc(file=sys.stderr)
            measurement = error_measurement(exc, alloc_conf)
        from dataclasses import asdict

        return {"measurement": asdict(measurement)}
    if task == "call":  # a named task of actbench.executors.TASKS
        from actbench.executors import Task

        try:
            return {"result": Task(request["name"], request["args"]).function()(request["args"])}
        except Exception as exc:  # the parent raises TaskError with this line
            traceback.print_exc(file=sys.stderr)
            return {"error": " ".join(f"{type(exc).__name__}: {exc}".split())[:300]}
    raise ValueError(f"unknown worker task '{task}'")


def die_with_parent() -> None:
    """Exit when the process that started this worker goes away, however it went (even ``kill -9``).

    The worker runs in its own session (so a timeout can kill its whole group), which also means no
    terminal signal reaches it: without this, a killed CLI would leave it running, holding GPU
    memory. Linux delivers SIGKILL on the parent's death (``PR_SET_PDEATHSIG``); a watchdog thread
    covers other systems and the window before the request was made.
    """
    import threading

    expected = os.environ.get("ACTBENCH_PARENT_PID")
    if not expected:
        return
    parent = int(expected)
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the request above took effect
        os._exit(3)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="actbench-parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: python -m actbench.worker REQUEST.json RESULT.json\n")
        return 2
    die_with_parent()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    request = json.loads(Path(argv[0]).read_text())
    result = run_request(request, os.environ.get(FAULT_ENV))
    _write_json(Path(argv[1]), result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
