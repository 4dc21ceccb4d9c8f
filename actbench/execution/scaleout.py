"""Scale-out (docs/design.md §7, "Executors and isolation"): a run's points side by side, or on a cluster.

How a run executes is never part of what it measures: :class:`ExecutionOptions` (``--executor``,
``--jobs``, ``--gpus``, ``--isolate``, ``--slurm``) change neither a point's key nor the run
directory's name, so a run started on a laptop resumes on eight GPUs or on a cluster, and back.

- **local** (:func:`execute`, the default): the run's search is split into *parts* that cannot
  influence each other, one per strategy (a grid command: one per point), and the parts run in
  threads, each part's points going to one shared executor whose slots bound how many points run at
  once (``--jobs N`` on cpu and meta, one per GPU of ``--gpus``). Inside a linear batch scan the next
  points run together only while the scan's stopping rule cannot skip them (:func:`scan_window`), so
  a parallel run records exactly the points, keys and statuses a serial one does. A model-guided
  search with a slot to spare (:class:`_PartRun`) probes its predicted answer with the neighbour that
  certifies it at once: the same maxima, and at most one row a serial run would not make. Every thread has
  its own :class:`~actbench.execution.runner.PointRunner` (and run-store handle): the run directory's lock and
  claims keep several writers consistent (docs/design.md §9).
- **slurm** (through submitit): the parts become one job array; each array task runs its part's
  search on its node, with a persistent worker, into the same run directory (a shared filesystem),
  resuming as a local run does. The submitting process waits, reports rows as they land, and turns a
  task that died (preempted, out of time, node failure, killed) into an ``error`` row for the point
  it was measuring, naming the job and its log; parts left unfinished go out again as a new array,
  so the run ends with every point recorded. Tests pass submitit's ``LocalExecutor`` or
  ``DebugExecutor`` as ``executor_class``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import io
import json
import logging
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from actbench.core.devices import profile
from actbench.schema import DEFAULT_TIMEOUT_S, Measurement, PointConfig, ResultRow, error_line, one_line

log = logging.getLogger(__name__)

Event = Callable[[str, Any, Any], None]  # (kind, point, row): the runner's on_event
EXECUTORS = ("local", "slurm")
#: Test hook in a Slurm task: ``kill@batch=N`` (conditions as ``ACTBENCH_TEST_FAULT``'s) kills the task
#: itself as it starts measuring a matching point, as a preemption or a node failure would.
JOB_FAULT_ENV = "ACTBENCH_TEST_JOB_FAULT"


# --- options --------------------------------------------------------------------------------------
#: ``--slurm KEY=VALUE`` keys with a meaning of their own; any other key is passed to sbatch as ``--KEY=VALUE``.
SLURM_KEYS = ("partition", "account", "time", "gpus-per-job", "cpus-per-job", "array-parallelism", "poll")
#: sbatch options the job array sets itself (its tasks, logs, signal, name, resources): never from ``--slurm``.
SLURM_RESERVED = ("array", "output", "error", "open-mode", "signal", "job-name", "wrap", "gpus-per-node",
                  "cpus-per-task", "partition", "account", "time")
#: What an option's value may hold: it becomes part of an ``#SBATCH`` line of a shell script, so no
#: control characters (a new line would be a command) and no shell metacharacters.
SLURM_VALUE = re.compile(r"[A-Za-z0-9_.,:=+/@%-]{1,200}")
SLURM_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}(,[A-Za-z0-9_.+-]{1,64}){0,15}")  # partition(s), account
SLURM_COUNT_MAX = 1_000_000
SLURM_VALUE_HELP = "letters, digits and _ . , : = + / @ % -"
#: What no text written into the sbatch script may hold (a new line there would be a command).
SCRIPT_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class SubmitError(RuntimeError):
    """The job array could not be submitted (one line); ``code``: the exit status it deserves."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SlurmOptions:
    """The job array's resources. ``time_min``: each task's limit; ``gpus_per_job`` None: one on a
    device that needs a GPU, none otherwise; ``sbatch``: extra ``#SBATCH --KEY=VALUE`` lines (value
    ``True``: a bare flag); ``poll_s``: how often the submitter looks at the jobs and the rows;
    ``given``: the keys set (so an option given where it does nothing can be refused)."""

    partition: str | None = None
    account: str | None = None
    time_min: int = 60
    gpus_per_job: int | None = None
    cpus_per_job: int | None = None
    array_parallelism: int | None = None
    sbatch: tuple[tuple[str, Any], ...] = ()
    poll_s: float = 15.0
    given: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, items: Iterable[str] | Mapping[str, Any] | None, base: "SlurmOptions | None" = None,
              where: str = "--slurm") -> "SlurmOptions":
        """Options from ``KEY=VALUE`` strings (the CLI) or a table (an experiment file's ``[slurm]``),
        over ``base``; ValueError naming ``where`` and the key for a bad key or value."""
        values = dataclasses.asdict(base or cls())
        extra = dict(values.pop("sbatch"))
        given = list(values.pop("given"))
        for raw_key, value in _pairs(items, where):
            key = _key(raw_key, where)
            given.append(key)
            if key == "sbatch":  # a table's list of raw options: ["--qos=high", "--exclusive"]
                if not isinstance(value, (list, tuple, str)):
                    raise ValueError(f"{where}: sbatch must be a list of options like \"--qos=high\", "
                                     f"got {short_repr(value)}")
                raw = cls.parse(list(value) if isinstance(value, (list, tuple)) else [value], where=where)
                own = [k for k in raw.given if k not in dict(raw.sbatch)]
                if own:  # a key of its own would be parsed here and then dropped: say where it belongs
                    raise ValueError(f"{where}: sbatch lists other sbatch options only; {own[0]} is a key of its "
                                     f"own: write {own[0]} = VALUE in the table (keys: {', '.join(SLURM_KEYS)})")
                extra.update(raw.sbatch)
                continue
            _scalar(value, key, where)
            if key in ("partition", "account"):
                values[key] = _text(value, key, where, SLURM_NAME, "names of letters, digits and _ . + - "
                                    "(a comma list for several partitions)")
            elif key == "time":
                values["time_min"] = parse_time_minutes(value, where)
            elif key in ("gpus-per-job", "cpus-per-job", "array-parallelism"):
                values[key.replace("-", "_")] = _count(value, key, where, minimum=0 if key == "gpus-per-job" else 1)
            elif key == "poll":
                values["poll_s"] = _number(value, key, where)
            elif key in SLURM_RESERVED:
                raise ValueError(f"{where}: {key} is set by actbench's job array itself; allowed keys: "
                                 f"{', '.join(SLURM_KEYS)} or another sbatch option")
            else:
                extra[key] = value if value is True else _text(value, key, where, SLURM_VALUE, SLURM_VALUE_HELP)
        return cls(**values, sbatch=tuple(extra.items()), given=tuple(dict.fromkeys(given)))

    def parameters(self, gpus: int, name: str) -> dict[str, Any]:
        """submitit ``SlurmExecutor`` parameters for an array of tasks with ``gpus`` GPUs each."""
        params: dict[str, Any] = {"time": self.time_min, "job_name": name, "signal_delay_s": 120}
        for key, value in (("partition", self.partition), ("account", self.account),
                           ("cpus_per_task", self.cpus_per_job), ("array_parallelism", self.array_parallelism)):
            if value is not None:
                params[key] = value
        if gpus:
            params["gpus_per_node"] = gpus
        if self.sbatch:
            params["additional_parameters"] = dict(self.sbatch)
        return params


def _pairs(items: Iterable[str] | Mapping[str, Any] | None, where: str) -> list[tuple[str, Any]]:
    """(key, value) pairs of a table, or of ``KEY=VALUE`` strings (a bare ``KEY``: the value True)."""
    if isinstance(items, Mapping):
        return [(str(k), v) for k, v in items.items()]
    if isinstance(items, str):
        items = [items]
    pairs = []
    for item in items or ():
        if not isinstance(item, str):
            raise ValueError(f"{where}: expected KEY=VALUE strings, got {short_repr(item)}")
        key, eq, value = item.partition("=")
        pairs.append((key, value if eq else True))
    return pairs


def _key(raw_key: str, where: str) -> str:
    key = raw_key.strip().lstrip("-").replace("_", "-")
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,63}", key):
        raise ValueError(f"{where}: bad option name {short_repr(raw_key)} (expected KEY=VALUE with a lower-case name, "
                         "e.g. partition=gpu)")
    return key


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a 5000-digit integer has no repr at all)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** 60:
        return "an integer of more than 60 digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _scalar(value: Any, key: str, where: str) -> None:
    """A key that takes one value got one: a string, a number or true (a flag), never a list or table."""
    if isinstance(value, bool):
        if value is False:
            raise ValueError(f"{where}: {key} = false sets nothing; leave {key} out, or give it a value")
        return
    if not isinstance(value, (str, int, float)):
        raise ValueError(f"{where}: {key} takes one value (a string or a number), got {type(value).__name__} "
                         f"{short_repr(value)}")


def _text(value: Any, key: str, where: str, pattern: "re.Pattern[str]" = SLURM_VALUE,
          allowed: str = SLURM_VALUE_HELP) -> str:
    if value is True or not str(value).strip():
        raise ValueError(f"{where}: {key} needs a value ({key}=VALUE)")
    text = "" if isinstance(value, int) and abs(value) > 10 ** 60 else str(value).strip()
    if not pattern.fullmatch(text):
        raise ValueError(f"{where}: {key} must be {allowed} (at most 200 characters; it becomes an #SBATCH line), "
                         f"got {short_repr(value)}")
    return text


def _number(value: Any, key: str, where: str) -> float:
    try:
        number = float(value) if len(str(value)) <= 100 else math.nan
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not (math.isfinite(number) and 0 < number <= 86400) or value is True:
        raise ValueError(f"{where}: {key} must be a positive number of seconds up to 86400, got {short_repr(value)}")
    return number


def _count(value: Any, key: str, where: str, minimum: int = 1) -> int:
    text = str(value).strip() if not isinstance(value, int) or abs(value) < 10 ** 60 else ""
    number = int(text) if re.fullmatch(r"\d{1,7}", text) and not isinstance(value, (bool, float)) else -1
    if number < minimum or number > SLURM_COUNT_MAX:
        raise ValueError(f"{where}: {key} must be an integer from {minimum} to {SLURM_COUNT_MAX}, "
                         f"got {short_repr(value)}")
    return number


def parse_time_minutes(value: Any, where: str = "--slurm") -> int:
    """Slurm's time formats -> whole minutes (rounded up): ``90``, ``1:30:00``, ``2-00:00:00``, ``45:00``."""
    text = "" if isinstance(value, (bool, float)) or (isinstance(value, int) and abs(value) > 10 ** 60) else str(value)
    match = re.fullmatch(r"(?:(\d{1,3})-)?(\d{1,7})(?::(\d{1,2}))?(?::(\d{1,2}))?", text.strip())
    if not match:
        raise ValueError(f"{where}: time must be minutes or [D-]HH:MM:SS, got {short_repr(value)}")
    days, a, b, c = match.groups()
    numbers = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        numbers += [0] * (3 - len(numbers))
        seconds = int(days) * 86400 + numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    elif len(numbers) == 1:  # minutes
        seconds = numbers[0] * 60
    elif len(numbers) == 2:  # MM:SS
        seconds = numbers[0] * 60 + numbers[1]
    else:  # HH:MM:SS
        seconds = numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    if not 0 < seconds <= 365 * 86400:
        raise ValueError(f"{where}: time must be positive and at most a year, got {short_repr(value)}")
    return math.ceil(seconds / 60)


def parse_gpus(text: str | None) -> tuple[int, ...]:
    """``--gpus 0,1,3`` -> (0, 1, 3): distinct GPU indices, in order."""
    if text is None or not str(text).strip():
        return ()
    try:
        gpus = tuple(int(part) for part in str(text).split(","))
    except ValueError:
        raise ValueError(f"--gpus must be GPU indices like 0,1,2, got '{text}'") from None
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus must be distinct GPU indices >= 0, got '{text}'")
    return gpus


@dataclass(frozen=True)
class ExecutionOptions:
    """How a run executes (never what it measures). ``jobs``: points at once on cpu and meta;
    ``gpus``: one point at a time per GPU, each child pinned to its GPU; ``isolate``: a fresh child
    per point instead of a persistent worker; ``slurm``: the job array's resources."""

    executor: str = "local"
    jobs: int = 1
    gpus: tuple[int, ...] = ()
    isolate: bool = False
    slurm: SlurmOptions = field(default_factory=SlurmOptions)

    def __post_init__(self) -> None:
        if self.slurm.given and self.executor != "slurm":
            raise ValueError(f"--slurm {', '.join(self.slurm.given)} applies only to --executor slurm "
                             f"(this run uses --executor {self.executor}); add --executor slurm or drop --slurm")

    @property
    def width(self) -> int:
        """Points that may run at once here."""
        return len(self.gpus) or self.jobs

    def check(self, device: str, executor_class: Any = None) -> None:
        """One-line ValueError for options that do not go together (before anything is written).

        A device whose profile captures its environment in a child is one the parent must not
        initialise: a GPU, shared out with ``--gpus``, never with ``--jobs``.
        """
        if self.executor not in EXECUTORS:
            raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}, got '{self.executor}'")
        if self.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {self.jobs}")
        on_gpus = profile(device).environment_in_child
        if self.gpus and self.jobs > 1:
            raise ValueError("--jobs and --gpus do not go together: --gpus runs one point per GPU at a time")
        if self.gpus and not on_gpus:
            raise ValueError(f"--gpus pins points to GPUs; on {device} use --jobs N (points at once)")
        if self.jobs > 1 and on_gpus:
            raise ValueError(f"--jobs {self.jobs} would put {self.jobs} points on one GPU at once (their memory "
                             f"figures would mix); use --gpus 0,1,... for one point per GPU")
        if self.executor == "slurm":
            if self.gpus:
                raise ValueError("--gpus applies to --executor local; on Slurm use --slurm gpus-per-job=N")
            missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
            if executor_class is None and missing:
                raise ValueError(f"--executor slurm: no Slurm here ({missing[0]} is not on PATH); run on the "
                                 "cluster's login node, or use --executor local")


# --- parts ----------------------------------------------------------------------------------------
def split(config: Any) -> list[Any]:
    """Configs of the parts a run's search splits into, in the order their rows would come.

    A grid (``throughput``, ``memory``): one part per point. A search: one part per strategy (each
    strategy's search depends only on its own rows), except that on a predicting device a strategy
    whose step is another's there (``Strategy.same_on_meta_as``: L5 is L4 on meta) joins that
    strategy's part, so one worker predicts both and the second reuses the first's step instead of
    stepping it again. Anything else: itself.
    """
    from actbench.core.devices import profile
    from actbench.planning.configs import GridConfig

    strategies = getattr(config, "strategies", None)
    if isinstance(config, GridConfig):
        return [dataclasses.replace(config, strategies=(s,), batches=(b,))
                for s in config.strategies for b in config.batches]
    if not dataclasses.is_dataclass(config) or not strategies or len(strategies) == 1:
        return [config]
    groups: dict[str, list[str]] = {}
    predicts = profile(config.settings.device).predicts
    for strategy in strategies:
        twin = _meta_twin(strategy) if predicts else strategy
        groups.setdefault(twin if twin in strategies else strategy, []).append(strategy)
    return [dataclasses.replace(config, strategies=tuple(group)) for group in groups.values()]


def _meta_twin(strategy: str) -> str:
    """The strategy whose step ``strategy``'s is on a predicting device (itself when none, or unknown)."""
    from actbench import strategies

    try:
        return strategies.get(strategy).same_on_meta_as or strategy
    except ValueError:
        return strategy


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
def make_runner(run_dir: Path, device: str, executor: Any, on_event: Event | None, retry_failed: bool,
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

    def __init__(self, run_dir: Path, device: str, executor: Any, on_event: Event | None, retry_failed: bool,
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


def _locked(on_event: Event | None) -> Event:
    lock = threading.Lock()

    def emit(kind: str, point: Any, row: Any) -> None:
        if on_event is not None:
            with lock:
                on_event(kind, point, row)

    return emit


# --- local -----------------------------------------------------------------------------------------
def execute(plan: Any, store: Any, *, on_event: Event | None = None, retry_failed: bool = True,
            force: bool = False, options: ExecutionOptions | None = None, timeout_s: float | None = None,
            executor: Any = None, executor_class: Any = None) -> Any:
    """Run ``plan``'s search into ``store``'s run directory as ``options`` say; its outcome.

    ``executor``: measure through this one (tests); by default one is made for the device and the
    options, and closed at the end. ``executor_class``: the submitit executor for ``slurm``
    (default ``submitit.SlurmExecutor``; tests pass ``LocalExecutor`` or ``DebugExecutor``). Ctrl-C
    (or any failure) kills the points in flight, which leave no row, and cancels submitted jobs.
    """
    options = options or ExecutionOptions()
    device = plan.config.settings.device
    timeout_s = plan.config.settings.timeout_s if timeout_s is None else timeout_s
    options.check(device, executor_class)
    if options.executor == "slurm":
        return run_slurm(plan.search, plan.config, store, on_event=on_event, retry_failed=retry_failed,
                         force=force, options=options, timeout_s=timeout_s, executor_class=executor_class)
    return run_local(plan.search, plan.config, store.run_dir, on_event=on_event, retry_failed=retry_failed,
                     force=force, options=options, timeout_s=timeout_s, executor=executor, since=_end(store))


def _end(store: Any) -> int:
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
        since = _end(RunStore(Path(run_dir)))
    runners = _Runners(Path(run_dir), device, executor, _locked(on_event), retry_failed, force, since)
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
    points = [config.settings.point(config.model, config.strategies[0], b, config.image_size) for b in config.batches]
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

    def __call__(self, point: PointConfig) -> ResultRow:
        return self.runner.run(point)

    def together(self, points: Sequence[PointConfig]) -> list[ResultRow] | None:
        """Rows of ``points`` measured side by side; None (nothing measured) without the slots."""
        if self.share() < len(points):
            return None
        return _run_together(points, self.runner, self.runners)


def _run_together(points: Sequence[PointConfig], runner: Any, runners: _Runners) -> list[ResultRow]:
    """Rows of ``points``, the first measured in this thread, the others in threads of their own."""
    if len(points) == 1:
        return [runner.run(points[0])]

    def run_other(point: PointConfig) -> ResultRow:
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


# --- slurm -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shard:
    """One array task: one part's search into a run directory on a shared filesystem."""

    run_dir: str
    search: Callable
    config: Any
    retry_failed: bool
    force: bool
    since: int
    timeout_s: float
    isolate: bool
    gpus: int


class _Unrecorded(Exception):
    """A replayed search asked for a point that has no standing row yet."""

    def __init__(self, point: PointConfig) -> None:
        super().__init__(point.describe())
        self.point = point


def replay(search: Callable, config: Any, runner: Any, seen: set[str] | None = None,
           on_event: Event | None = None) -> tuple[Any, PointConfig | None]:
    """Run a search over recorded rows only: (its outcome, None) when every point it asks for has a
    standing row, else (None, the first point that has none). Rows found are announced once each
    (``cached``)."""

    def run(point: PointConfig) -> ResultRow:
        row = runner.recorded(point)
        if row is None:
            raise _Unrecorded(point)
        if seen is not None and on_event is not None and row.key not in seen:
            seen.add(row.key)
            on_event("cached", point, row)
        return row

    try:
        return search(config, run), None
    except _Unrecorded as missing:
        return None, missing.point


def run_shard(shard: Shard) -> dict[str, Any]:
    """Inside an array task: the part's search on this node (a persistent worker per GPU of the task,
    or one for the CPU), resuming from the run directory. Never raises: a failure is returned (and
    submitit's debug executor would otherwise stop in a debugger)."""
    from actbench.execution.executors import executor_for

    device = shard.config.settings.device
    gpus: tuple[int, ...] = ()
    if shard.gpus > 1:
        gpus = tuple(range(len([v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()])))
    options = ExecutionOptions(gpus=gpus, isolate=shard.isolate)
    executor = executor_for(device, shard.timeout_s, Path(shard.run_dir) / "logs", gpus=gpus, isolate=shard.isolate)
    started = time.monotonic()
    try:
        outcome = run_local(shard.search, shard.config, Path(shard.run_dir), on_event=_job_fault_hook(),
                            retry_failed=shard.retry_failed, force=shard.force, options=options,
                            timeout_s=shard.timeout_s, executor=executor, since=shard.since)
        return {"rows": len(outcome.rows), "seconds": round(time.monotonic() - started, 1)}
    except Exception as exc:  # noqa: BLE001 - reported to the submitter, which writes the row
        log.exception("shard failed")
        return {"error": error_line(exc)}
    finally:
        if hasattr(executor, "close"):
            executor.close()


def _job_fault_hook() -> Event | None:
    spec = os.environ.get(JOB_FAULT_ENV)
    if not spec:
        return None
    from actbench.worker import fault_applies

    kind, _, cond = spec.partition("@")

    def hook(kind_of_event: str, point: Any, row: Any) -> None:
        if kind_of_event == "start" and kind == "kill" and fault_applies(
                cond, point.batch_size, point.image_size, point.model.extra_blocks, point.strategy):
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


@dataclass(frozen=True)
class _RowPoint:
    """What progress needs of a point (its description) for a row another process wrote."""

    row: ResultRow

    def describe(self) -> str:
        r = self.row
        model = r.model + (f"-+{r.extra_blocks}blk" if r.extra_blocks else "") + (
            f"-w{r.width_per_group}" if r.width_per_group is not None else "")
        return f"{model} {r.strategy} b{r.batch_size} {r.image_size}px {r.device}"


def _check_script_text(text: str, what: str) -> None:
    """SubmitError (exit 2) for text that would go into the sbatch script with a control character."""
    if SCRIPT_CONTROL.search(text):
        raise SubmitError(f"{what} {text!r} holds a control character, and it would be written into the sbatch "
                          "script; use a path of printable characters", code=2)


def _submitit_executor(executor_class: Any, folder: Path, options: SlurmOptions, gpus: int, name: str) -> Any:
    import submitit

    _check_script_text(os.path.abspath(folder), "the Slurm folder")
    _check_script_text(name, "the job name")
    _check_script_text(sys.executable, "the Python interpreter")
    cls = executor_class or submitit.SlurmExecutor
    if issubclass(cls, submitit.SlurmExecutor):  # a task's Python runs with -P: its directory is not on its path
        executor = cls(folder=folder, python=f"{shlex.quote(sys.executable)} -P")
    else:
        executor = cls(folder=folder)
    if issubclass(cls, submitit.SlurmExecutor):
        executor.update_parameters(**options.parameters(gpus, name))
    elif issubclass(cls, submitit.LocalExecutor):
        executor.update_parameters(timeout_min=options.time_min, gpus_per_node=gpus)
    return executor


def _job_failure(job: Any) -> str | None:
    """Why an array task did not finish its part (naming the job and its log), or None."""
    try:
        result = job.result()
    except Exception as exc:  # noqa: BLE001 - died: preempted, out of time, node failure, killed
        try:
            state = job.state
        except Exception:  # noqa: BLE001
            state = "UNKNOWN"
        reason = " ".join(str(exc).split())
        return f"job {job.job_id} died ({state}); log {job.paths.stderr}: {reason}"
    if isinstance(result, dict) and result.get("error"):
        return f"job {job.job_id} failed; log {job.paths.stderr}: {result['error']}"
    return None


def _submit(executor: Any, shards: list[Shard]) -> list[Any]:
    """The array's jobs; SubmitError (one line) when sbatch refuses it or says nothing readable."""
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's stderr itself
            return executor.map_array(run_shard, shards)
    except (FailedJobError, FailedSubmissionError, OSError) as exc:
        cause = exc.__cause__
        status = f" with status {cause.returncode}" if isinstance(cause, subprocess.CalledProcessError) else ""
        said = one_line(exc, 200) or "no message"
        raise SubmitError(f"sbatch failed{status} to submit the job array ({said}); no task of it runs, and "
                          "finished rows are kept") from None


def run_slurm(search: Callable, config: Any, store: Any, *, on_event: Event | None = None,
              retry_failed: bool = True, force: bool = False, options: ExecutionOptions | None = None,
              timeout_s: float = DEFAULT_TIMEOUT_S, executor_class: Any = None, max_rounds: int = 100) -> Any:
    """The run's parts as one submitit job array, again for parts a dead task left unfinished."""
    options = options or ExecutionOptions(executor="slurm")
    device = config.settings.device
    emit = _locked(on_event)
    since = _end(store)
    start_rows = len(store.read_rows())
    runner = make_runner(store.run_dir, device, None, None, retry_failed, force, since)
    parts = split(config)
    gpus = options.slurm.gpus_per_job
    if gpus is None:
        gpus = 1 if profile(device).environment_in_child else 0
    folder = store.run_dir / "slurm"
    seen: set[str] = set()
    announced = [start_rows]

    def announce_new_rows() -> None:
        rows = store.read_rows()
        for row in rows[announced[0]:]:
            seen.add(row.key)
            emit("done", _RowPoint(row), row)
        announced[0] = len(rows)

    for round_no in range(max_rounds):
        missing = {i: point for i, part in enumerate(parts)
                   if (point := replay(search, part, runner, seen, emit)[1]) is not None}
        if not missing:
            break
        executor = _submitit_executor(executor_class, folder, options.slurm, gpus, f"actbench-{store.run_id}"[:64])
        shards = [Shard(str(store.run_dir), search, parts[i], retry_failed, force, since, timeout_s,
                        options.isolate, gpus) for i in missing]
        jobs = _submit(executor, shards)
        log.info("round %d: %d array task(s) submitted (job %s), logs in %s", round_no + 1, len(jobs),
                 jobs[0].job_id.split("_")[0] if jobs else "-", folder)
        try:
            while not all(job.done() for job in jobs):
                announce_new_rows()
                time.sleep(options.slurm.poll_s)
        except BaseException:
            for job in jobs:
                try:
                    job.cancel(check=False)
                except Exception:  # noqa: BLE001
                    pass
            raise
        announce_new_rows()
        for i, job in zip(missing, jobs):
            failure = _job_failure(job)
            point = replay(search, parts[i], runner)[1]
            if point is None:
                continue  # the part finished (a task that died after its last row lost nothing)
            if failure is None:
                failure = f"job {job.job_id} ended without measuring this point; log {job.paths.stderr}"
            row = ResultRow.build(point, Measurement.failure("error", failure), store.run_id, _env_id(store))
            store.append(row)
            announce_new_rows()
        store.write_table()
    else:
        raise RuntimeError(f"{store.run_dir}: parts still unfinished after {max_rounds} rounds of jobs")
    outcomes = []
    for part in parts:
        outcome, point = replay(search, part, runner)
        if point is not None:  # cannot happen after the loop above
            raise RuntimeError(f"{point.describe()}: no row after the jobs ended")
        outcomes.append(outcome)
    return merge(outcomes)


def _env_id(store: Any) -> str:
    """The environment the run's tasks recorded (``env.json``), for a row the submitter writes."""
    try:
        return str(json.loads((store.run_dir / "env.json").read_text()).get("env_id") or "unknown")
    except (OSError, ValueError, AttributeError):
        return "unknown"


__all__ = ["EXECUTORS", "ExecutionOptions", "SlurmOptions", "Shard", "SubmitError", "execute", "merge", "parse_gpus",
           "parse_time_minutes", "replay", "short_repr", "run_local", "run_shard", "run_slurm", "scan_window", "split"]
