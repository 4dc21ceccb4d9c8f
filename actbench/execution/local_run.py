"""A run's search on this machine, its parts side by side: the search is split into parts that cannot
influence each other (:func:`split`), each part runs in a thread with its own
:class:`~actbench.execution.runner.PointRunner`, and one shared executor's slots bound how many points
run at once. A linear scan runs only its certain next points together (:func:`scan_window`), so a
parallel run records exactly what a serial one does (docs/design.md §7, "Searches in parallel").
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from actbench.execution.execution_options import ExecutionOptions
from actbench.planning.point import Point
from actbench.schema import DEFAULT_TIMEOUT_S, ResultRow

Event = Callable[[str, Any, Any], None]  # (kind, point, row): the runner's on_event


# --- parts ----------------------------------------------------------------------------------------
def split(config: Any) -> list[Any]:
    """Configs of the parts a run's search splits into, in the order their rows would come.

    A grid (``throughput``, ``memory``): one part per point. A search: one part per strategy (each
    strategy's search depends only on its own rows), except that on a predicting device a strategy
    whose step is another's there (``Strategy.same_on_meta_as``: L5 is L4 on meta) joins that
    strategy's part, so one worker predicts both and the second reuses the first's step instead of
    stepping it again. Anything else: itself.
    """
    from actbench.planning.configs import GridConfig

    strategies = getattr(config, "strategies", None)
    if isinstance(config, GridConfig):
        return [dataclasses.replace(config, strategies=(s,), batch_sizes=(b,))
                for s in config.strategies for b in config.batch_sizes]
    if not dataclasses.is_dataclass(config) or not strategies or len(strategies) == 1:
        return [config]
    groups: dict[str, list[Any]] = {}
    predicts = config.settings.device.predicts
    names = [s.name for s in strategies]
    for strategy in strategies:
        twin = (strategy.same_on_meta_as or strategy.name) if predicts else strategy.name
        groups.setdefault(twin if twin in names else strategy.name, []).append(strategy)
    return [dataclasses.replace(config, strategies=tuple(group)) for group in groups.values()]


def merge(outcomes: Sequence[Any]) -> Any:
    """One outcome from the parts' outcomes, as the whole search would have built it: lists joined
    and tables updated in part order, other fields from the first part."""
    from actbench.planning.search import SearchOutcome

    if not outcomes:
        return SearchOutcome()
    merged = dataclasses.replace(outcomes[0])
    for f in dataclasses.fields(merged):
        value = getattr(outcomes[0], f.name)
        if isinstance(value, list):
            setattr(merged, f.name, [x for o in outcomes for x in getattr(o, f.name)])
        elif isinstance(value, dict):
            setattr(merged, f.name, {k: v for o in outcomes for k, v in getattr(o, f.name).items()})
    return merged


def _is_linear_scan(config: Any) -> bool:
    from actbench.planning.configs import SweepConfig

    return isinstance(config, SweepConfig) and not config.find_max and len(config.strategies) == 1


def scan_window(stop_after: int, failures: int, width: int, left: int) -> int:
    """How many of a linear scan's next points are certain to be measured, so may run at once.

    The scan stops after ``stop_after`` consecutive failures; with ``failures`` already in a row, the
    next ``stop_after - failures`` points are measured whatever their outcome (the scan could stop
    only after the last of them), so running them together measures exactly what a serial scan does.
    """
    return max(1, min(width, stop_after - failures, left))


# --- runners: one per thread ------------------------------------------------------------------------
def make_runner(run_dir: Path, device: Any, executor: Any, on_event: Event | None, retry_failed: bool,
                force: bool, since: int):
    """A :class:`~actbench.execution.runner.PointRunner` on its own handle of the run directory, treating rows
    recorded before byte ``since`` of ``rows.jsonl`` as recorded before the run started (and already
    warned of, where unreadable, by the handle that found ``since``)."""
    from actbench.store.results import RunStore
    from actbench.execution.runner import PointRunner

    return PointRunner(RunStore(run_dir, quiet_before=since), device, executor=executor, on_event=on_event, retry_failed=retry_failed,
                       force=force, started_at=since)


class _Runners:
    """A pool of runners sharing one executor: a thread takes one, uses it alone, gives it back."""

    def __init__(self, run_dir: Path, device: Any, executor: Any, on_event: Event | None, retry_failed: bool,
                 force: bool, since: int) -> None:
        self._args = (run_dir, device, executor, on_event, retry_failed, force, since)
        self._free: list[Any] = []
        self._lock = threading.Lock()

    def take(self):
        with self._lock:
            if self._free:
                return self._free.pop()
        return make_runner(*self._args)

    def give(self, runner: Any) -> None:
        with self._lock:
            self._free.append(runner)


def serialized(on_event: Event | None) -> Event:
    """``on_event`` called by one thread at a time (the runners' threads share it)."""
    lock = threading.Lock()

    def emit(kind: str, point: Any, row: Any) -> None:
        if on_event is not None:
            with lock:
                on_event(kind, point, row)

    return emit


def store_end(store: Any) -> int:
    """Bytes of ``rows.jsonl`` recorded now: rows before it were there before the run started."""
    store.refresh()
    return store.end


def run_local(search: Callable, config: Any, run_dir: Path, *, on_event: Event | None = None,
              retry_failed: bool = True, force: bool = False, options: ExecutionOptions | None = None,
              timeout_s: float = DEFAULT_TIMEOUT_S, executor: Any = None, since: int | None = None) -> Any:
    """``search(config, run)`` on this machine, its parts side by side when ``options.width`` > 1."""
    from actbench.execution.executors import executor_for
    from actbench.store.results import RunStore

    options = options or ExecutionOptions()
    device = config.settings.device
    own = executor is None
    if own:
        executor = executor_for(device, timeout_s, Path(run_dir) / "logs", jobs=options.jobs, gpus=options.gpus,
                                isolate=options.isolate, worker_keys=len(getattr(config, "strategies", ()) or (1,)))
    if since is None:
        since = store_end(RunStore(Path(run_dir)))
    runners = _Runners(Path(run_dir), device, executor, serialized(on_event), retry_failed, force, since)
    try:
        if options.width <= 1:
            runner = runners.take()
            return search(config, runner.run)
        return _run_parts(search, split(config), runners, options.width, executor)
    except BaseException:
        if hasattr(executor, "abort"):
            executor.abort()
        raise
    finally:
        if own and hasattr(executor, "close"):
            executor.close()


def _run_parts(search: Callable, parts: list[Any], runners: _Runners, width: int, executor: Any) -> Any:
    """Each part's search in a thread (at most ``width`` at once); outcomes merged in part order."""
    unfinished = [len(parts)]
    lock = threading.Lock()

    def share() -> int:  # slots per part still running, for a scan's window
        with lock:
            return max(1, width // max(1, min(width, unfinished[0])))

    def run_part(config: Any) -> Any:
        runner = runners.take()
        try:
            if _is_linear_scan(config):
                return _windowed_scan(search, config, runner, runners, share)
            return search(config, _PartRun(runner, runners, share))
        finally:
            runners.give(runner)
            with lock:
                unfinished[0] -= 1

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=width, thread_name_prefix="actbench-part")
    futures = [pool.submit(run_part, part) for part in parts]
    try:
        _wait_all(futures)
        return merge([f.result() for f in futures])
    except BaseException:
        if hasattr(executor, "abort"):
            executor.abort()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _wait_all(futures: Sequence[concurrent.futures.Future]) -> None:
    """Wait for every future, in short waits (Ctrl-C gets through); the first failure raises."""
    pending = set(futures)
    while pending:
        done, pending = concurrent.futures.wait(pending, timeout=0.5, return_when=concurrent.futures.FIRST_EXCEPTION)
        for future in done:
            if future.exception() is not None:
                raise future.exception()


def _windowed_scan(search: Callable, config: Any, runner: Any, runners: _Runners, share: Callable[[], int]) -> Any:
    """A one-strategy linear batch scan with its certain next points measured together
    (:func:`scan_window`), then the scan itself replayed over those rows, so its outcome is the
    serial scan's."""
    points = [config.settings.point(config.model, config.strategies[0], b, config.size) for b in config.batch_sizes]
    rows: dict[str, ResultRow] = {}
    i = failures = 0
    while i < len(points):
        window = points[i:i + scan_window(config.stop_after, failures, share(), len(points) - i)]
        for point, row in zip(window, _run_together(window, runner, runners)):
            rows[point.key()] = row
            i += 1
            failures = 0 if row.ok else failures + 1
        if failures >= config.stop_after:
            break
    return search(config, lambda point: rows.get(point.key()) or runner.run(point))


class _PartRun:
    """A part's ``run``: one point at a time, or (``together``) several at once while the run has
    slots to spare, which a model-guided search uses to certify its answer in one probe's time."""

    def __init__(self, runner: Any, runners: _Runners, share: Callable[[], int]) -> None:
        self.runner, self.runners, self.share = runner, runners, share

    def __call__(self, point: Point) -> ResultRow:
        return self.runner.run(point)

    def together(self, points: Sequence[Point]) -> list[ResultRow] | None:
        """Rows of ``points`` measured side by side; None (nothing measured) without the slots.

        A resume pairs what the run it resumes paired, whatever slots are spare now: points all recorded
        come back as they are, and points of which only some are recorded were probed one at a time,
        so they are again (pairing them would ask for a point the run never measured)."""
        recorded = [self.runner.recorded(p) is not None for p in points]
        if all(recorded):
            return [self.runner.run(p) for p in points]
        if any(recorded) or self.share() < len(points):
            return None
        return _run_together(points, self.runner, self.runners)


def _run_together(points: Sequence[Point], runner: Any, runners: _Runners) -> list[ResultRow]:
    """Rows of ``points``, the first measured in this thread, the others in threads of their own."""
    if len(points) == 1:
        return [runner.run(points[0])]

    def run_other(point: Point) -> ResultRow:
        other = runners.take()
        try:
            return other.run(point)
        finally:
            runners.give(other)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(points) - 1,
                                               thread_name_prefix="actbench-scan") as pool:
        futures = [pool.submit(run_other, p) for p in points[1:]]
        first = runner.run(points[0])
        _wait_all(futures)
        return [first] + [f.result() for f in futures]
