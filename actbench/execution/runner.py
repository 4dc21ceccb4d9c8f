"""Turns points into rows of one run directory: resume what is recorded, measure the rest.

Measuring goes through an executor (:mod:`actbench.execution.executors`), so the runner never knows
whether a point ran in a child process or in this one. It captures the environment once per run,
measures again failures recorded before it started, and shares the run directory with concurrent
writers through the run lock and claims. The rules: docs/design.md §9.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from actbench.core.devices import EXACT_STEPS_ENV, DeviceProfile, exact_steps
from actbench.execution.executors import EnvironmentCaptureError, Executor, InProcessExecutor, executor_for
from actbench.measure.environment import environment_id
from actbench.planning.point import Point
from actbench.store.results import RunStore
from actbench.schema import DEFAULT_TIMEOUT_S, RETRIED_STATUSES, ResultRow
from actbench.worker import lowest_priority_for_this_thread

log = logging.getLogger(__name__)

__all__ = ["EnvironmentCaptureError", "PointRunner", "TimingMismatch"]


class TimingMismatch(EnvironmentCaptureError, ValueError):
    """A resume would time its points otherwise than the run's recorded rows were timed."""


def check_resume_timing(store: RunStore, device: DeviceProfile) -> None:
    """Refuse to add timed rows to a run whose ``env.json`` says they were timed the other way.

    ``ACTBENCH_EXACT_STEPS=1`` times exactly the steps asked for; without it timing goes on to a
    minimum time and a steady spread. Rows of both in one run would compare unlike timings, so a
    resume must be started as the run was. Devices that predict (meta) time nothing.
    """
    path = store.run_dir / "env.json"
    if device.predicts or not path.is_file():
        return
    try:
        recorded = json.loads(path.read_text())
        now = exact_steps()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return
    except ValueError as exc:
        raise TimingMismatch(str(exc)) from None
    if not isinstance(recorded, dict) or ("timing" in recorded) == now:
        return

    def setting(exact: bool) -> str:
        return f"{EXACT_STEPS_ENV}=1" if exact else f"{EXACT_STEPS_ENV} unset"

    was = "timing" in recorded
    raise TimingMismatch(f"{store.run_dir} was timed with {setting(was)}, this resume has {setting(now)}: its "
                         f"rows would mix the two timings; resume with {setting(was)}, or give another --out")


class PointRunner:
    """Measures points for one run directory, skipping points whose key is already recorded.

    ``retry_failed``: measure again points whose latest row is ``error`` or ``timeout`` and was
    recorded before this runner started (``False``: keep those rows as they are). ``force``: measure
    again every point recorded before this runner started, whatever its status (``--force``).
    """

    def __init__(self, store: RunStore, device: DeviceProfile, timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_event: Callable[[str, Point, ResultRow | None], None] | None = None,
                 executor: Executor | None = None, retry_failed: bool = True, force: bool = False,
                 started_at: int | None = None) -> None:
        self.store = store
        self.device = device
        self.retry_failed = retry_failed
        self.force = force
        self.executor = executor or executor_for(device, timeout_s, store.run_dir / "logs")
        self.on_event = on_event or (lambda *_: None)
        self._env_id: str | None = None
        self._env_lock = threading.Lock()
        self._env_future: Future[dict[str, Any]] | None = None
        store.refresh()
        check_resume_timing(store, device)
        #: rows of rows.jsonl before this byte offset were there when the run started; several
        #: runners of one run (actbench/execution/local_run.py) pass the same ``started_at`` so they agree
        self.started_at = store.end if started_at is None else started_at

    def environment_id(self) -> str:
        """Capture the environment once per run and record it in the run directory."""
        with self._env_lock:
            if self._env_id is None:
                started, self._env_future = self._env_future, None  # a failed capture is tried again
                env = started.result() if started is not None else self.executor.environment(self.device)
                self._env_id = environment_id(env)
                self.store.record_environment(env, self._env_id)
        return self._env_id

    def _start_environment(self) -> None:
        """Begin the capture before a point: beside it, in a thread of its own, when it is measured in
        a child.

        Capturing imports torch here; run beside the first point's worker start it costs no wall
        time on a machine with a core to spare (docs/design.md §7). Points measured in this
        process (meta with one job) capture it first: their step needs
        this interpreter. So do devices captured in a child of their own (cuda): that child's device
        context must not hold device memory while a point is measured.
        """
        if isinstance(self.executor, InProcessExecutor) or self.device.environment_in_child:
            self.environment_id()
            return
        with self._env_lock:
            if self._env_id is None and self._env_future is None:
                pool = ThreadPoolExecutor(1, thread_name_prefix="actbench-environment")
                self._env_future = pool.submit(_at_lowest_priority, self.executor.environment, self.device)
                pool.shutdown(wait=False)

    def is_final(self, key: str, row: ResultRow) -> bool:
        """Whether a recorded row stands: a result, or a failure this runner must not retry."""
        if not self.force and (row.status not in RETRIED_STATUSES or not self.retry_failed):
            return True
        offset = self.store.offset(key)
        return offset is not None and offset >= self.started_at

    def recorded(self, point: Point) -> ResultRow | None:
        """The row that stands for ``point`` (resume, retry and force rules), or None: still to measure."""
        key = point.key()
        self.store.refresh()
        row = self.store.get(key)
        return row if row is not None and self.is_final(key, row) else None

    def run(self, point: Point) -> ResultRow:
        key = point.key()
        store = self.store
        while True:
            with store.locked():  # re-reads what other writers appended
                existing = store.get(key)
                if existing is not None and self.is_final(key, existing):
                    self.on_event("cached", point, existing)
                    return existing
                claim = store.try_claim(key)
            if claim is not None:
                break
            log.info("%s: being measured by another writer (pid %s); waiting for its row",
                     point.describe(), store.claim_holder(key))
            store.wait_claim(key)
        try:
            if existing is not None:
                log.info("%s: measuring again (recorded %s: %s)", point.describe(), existing.status, existing.message)
            self._start_environment()
            self.on_event("start", point, None)
            measurement = next(iter(self.executor.measure([point])))
            env_id = self.environment_id()
            row = ResultRow.build(point.config, measurement, store.run_id, env_id)
            store.append(row)
        finally:
            store.release_claim(key, claim)
        store.write_table()
        log.info("%s -> %s %s", point.describe(), row.status, row.message)
        self.on_event("done", point, row)
        return row


def _at_lowest_priority(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in this thread at the lowest priority (:func:`lowest_priority_for_this_thread`)."""
    lowest_priority_for_this_thread()
    return function(*args)
