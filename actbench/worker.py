"""Child-process entry: ``python -m actbench.worker REQUEST.json RESULT.json``, or ``--serve``.

One request: JSON request file in, JSON result file out. ``--serve``: a persistent worker
(:class:`actbench.execution.worker_processes.WorkerProcess`), one JSON request line in and one reply line
out per point, each point measured exactly as in a fresh child and released afterwards. Also reads
the test hook ``ACTBENCH_TEST_FAULT``. The protocol, what a worker keeps between points and the
hook's syntax: docs/design.md §7 ("Executors and isolation") and §8.
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

from actbench.schema import error_line

if TYPE_CHECKING:
    from actbench.planning.point import Point
    from actbench.schema import Measurement

FAULT_ENV = "ACTBENCH_TEST_FAULT"
#: Set for a spare worker (actbench/execution/executors.py): one started before it is needed, which does its
#: imports at the lowest priority while the points of another worker run.
SPARE_ENV = "ACTBENCH_WORKER_SPARE"
#: What a point imports: a worker imports it before its first request.
_WARM_MODULES = ("actbench.measure.point", "actbench.training.models", "torchvision")

#: Work an executor runs by name (``actbench.execution.executors.Task``): "module:function", a function taking
#: and returning JSON-able dicts.
TASKS: dict[str, str] = {
    "accuracy-setting": "actbench.studies.accuracy:train_setting_task",
    "verify-grads": "actbench.studies.gradients:verify_task",
}


def task_function(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The function of task ``name``; ValueError naming the known tasks."""
    import importlib

    if name not in TASKS:
        raise ValueError(f"unknown task '{name}'; known: {', '.join(TASKS)}")
    module, _, attr = TASKS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


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


def fault_action(spec: str | None, point: "Point") -> Callable[[], None] | None:
    """The injected failure for this point, or None. Only tests set the variable."""
    if not spec:
        return None
    kind, _, cond = spec.partition("@")
    if not fault_applies(cond, point.batch_size, point.image_size, point.model.extra_blocks, point.strategy.name):
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
    message = error_line(exc)
    return Measurement(status="error", message=message, alloc_conf=alloc_conf)


def run_request(request: dict[str, Any], fault_spec: str | None) -> dict[str, Any]:
    """Execute one request dict and return the result dict (no process-level effects)."""
    task = request["task"]
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if task == "environment":
        from actbench.core.devices import profile
        from actbench.measure.environment import capture_environment

        return {"environment": capture_environment(profile(request["device"]), alloc_conf)}
    if task == "measure":
        from actbench.measure.point import measure_point
        from actbench.planning.point import Point
        from actbench.schema import PointConfig

        try:
            point = Point.resolve(PointConfig.from_dict(request["point"]))  # names become objects once, here
            fault = fault_action(fault_spec, point)
            if point.device.predicts:  # meta with --jobs: predictions in worker children
                measurement = _meta_sessions().measure_point(point, fault)
            else:
                measurement = measure_point(point, alloc_conf=alloc_conf, fault=fault)
        except Exception as exc:  # any other failure is a row, not a dead sweep
            traceback.print_exc(file=sys.stderr)
            measurement = error_measurement(exc, alloc_conf)
        from dataclasses import asdict

        return {"measurement": asdict(measurement)}
    if task == "call":  # a named task of TASKS (actbench.execution.executors.Task in the parent)
        try:
            return {"result": task_function(request["name"])(request["args"])}
        except Exception as exc:  # the parent raises TaskError with this line
            traceback.print_exc(file=sys.stderr)
            return {"error": error_line(exc)}
    raise ValueError(f"unknown worker task '{task}'")


_SESSIONS: Any = None


def _meta_sessions() -> Any:
    """One MetaSessions per worker, as the in-process executor keeps one (same predictions)."""
    global _SESSIONS
    if _SESSIONS is None:
        from actbench.measure.meta import MetaSessions

        _SESSIONS = MetaSessions()
    return _SESSIONS


def _predicted(request: dict[str, Any]) -> bool:
    """A predicting device's point (meta): its fake tensors hold no device memory, so there is nothing to
    release, as in the in-process executor, whose predictions a worker's must equal. Releasing anyway
    (a garbage collection per point) would only slow the session's next point (docs/design.md §7)."""
    from actbench.core.devices import profile

    point = request.get("point") if request.get("task") == "measure" else None
    return point is not None and profile(point["device"]).predicts


def release_point() -> bool:
    """After a point in a persistent worker: drop what it left behind; True when the device is clean.

    Garbage is collected (models, optimizers and saved tensors of the point), compiled graphs are
    forgotten (``torch.compile`` would otherwise reuse the last point's), and where CUDA started its
    cached blocks and cuBLAS workspaces are returned, so the next point's allocator starts from zero
    as in a fresh process; memory still allocated after that means something leaked: not clean.
    """
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is None:
        return True
    from actbench.core import compat

    compat.forget_compiled_graphs()
    if not torch.cuda.is_initialized():
        return True
    torch.cuda.synchronize()
    compat.clear_cublas_workspaces()
    gc.collect()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated() == 0


def _point_output_to(path: str | None) -> None:
    """Send fd 1 and fd 2 (and Python's streams) to ``path``: this point's log."""
    sys.stdout.flush()
    sys.stderr.flush()
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def serve() -> int:
    """The persistent worker's loop: one JSON request line in, one JSON reply line out, until EOF."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # nothing but replies reaches the reply channel
    fault_spec = os.environ.get(FAULT_ENV)
    # Import before the first request; a broken install fails the first point. A spare imports in a
    # thread at the lowest priority (Linux: one thread's nice value), so that while another worker's
    # point runs it takes only what that point leaves idle; its first request then waits for it.
    warming = None
    if os.environ.get(SPARE_ENV) == "1":
        import threading

        warming = threading.Thread(target=_warm_up, args=(True,), name="actbench-warm-up", daemon=True)
        warming.start()
    else:
        _warm_up(False)
    for line in sys.stdin:
        if not line.strip():
            continue
        if warming is not None:  # one import at a time: the request waits for the warm-up to end
            warming.join()
            warming = None
        request = json.loads(line)
        _point_output_to(request.get("log"))
        try:
            result = run_request(request, fault_spec)
        except Exception as exc:  # a malformed request: say so, stop serving
            traceback.print_exc(file=sys.stderr)
            result = {"error": error_line(exc)}
            result["clean"] = False
        else:
            result["clean"] = True if _predicted(request) else release_point()
        sys.stdout.flush()
        sys.stderr.flush()
        replies.write(json.dumps(result) + "\n")
        if not result["clean"]:
            return 0
    return 0


def lowest_priority_for_this_thread() -> None:
    """Put the calling thread alone at the lowest scheduling priority (Linux: a thread's own nice
    value, 19), so it runs on a core others leave idle and takes about 1 % of a busy one. Where a
    thread's priority cannot be set, nothing changes."""
    import threading

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def _warm_up(lowest_priority: bool) -> None:
    import importlib

    if lowest_priority:
        lowest_priority_for_this_thread()
    for name in _WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the point that needs it fails with the cause
            traceback.print_exc(file=sys.stderr)
            return
    # What the imports made lives as long as the worker: out of the collector's sight, the collection
    # after each point (release_point) looks at the point's objects only (docs/design.md §7).
    import gc

    gc.collect()
    gc.freeze()


def die_with_parent() -> None:
    """Exit when the process that started this worker goes away, however it went (even ``kill -9``).

    The worker runs in its own process group (so a timeout can kill its whole group), which also means
    no terminal signal reaches it: without this, a killed CLI would leave it running, holding GPU
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
    if argv == ["--serve"]:
        die_with_parent()
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        return serve()
    if len(argv) != 2:
        sys.stderr.write("usage: python -m actbench.worker REQUEST.json RESULT.json | --serve\n")
        return 2
    die_with_parent()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    request = json.loads(Path(argv[0]).read_text())
    result = run_request(request, os.environ.get(FAULT_ENV))
    _write_json(Path(argv[1]), result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
