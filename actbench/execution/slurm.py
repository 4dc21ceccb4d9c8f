"""A run's parts as a Slurm job array (through submitit): each array task runs its part's search on its
node into the same run directory (a shared filesystem); the submitter waits, reports rows as they
land, writes an ``error`` row for the point a dead task was measuring, and submits unfinished parts
again. Tests pass submitit's ``LocalExecutor`` or ``DebugExecutor`` as ``executor_class``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from actbench.core.devices import DeviceProfile
from actbench.execution.execution_options import ExecutionOptions, SlurmOptions
from actbench.execution.local_run import Event, make_runner, merge, run_local, serialized, split, store_end
from actbench.planning.point import Point
from actbench.schema import DEFAULT_TIMEOUT_S, Measurement, ResultRow, error_line, one_line

log = logging.getLogger(__name__)

#: Test hook in a Slurm task: ``kill@batch=N`` (conditions as ``ACTBENCH_TEST_FAULT``'s) kills the task
#: itself as it starts measuring a matching point, as a preemption or a node failure would.
JOB_FAULT_ENV = "ACTBENCH_TEST_JOB_FAULT"
#: What no text written into the sbatch script may hold (a new line there would be a command).
SCRIPT_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class SubmitError(RuntimeError):
    """The job array could not be submitted (one line); ``code``: the exit status it deserves."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


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

    def __init__(self, point: Point) -> None:
        super().__init__(point.describe())
        self.point = point


def replay(search: Callable, config: Any, runner: Any, seen: set[str] | None = None,
           on_event: Event | None = None) -> tuple[Any, Point | None]:
    """Run a search over recorded rows only: (its outcome, None) when every point it asks for has a
    standing row, else (None, the first point that has none). Rows found are announced once each
    (``cached``)."""

    def run(point: Point) -> ResultRow:
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
                cond, point.batch_size, point.image_size, point.model.extra_blocks, point.strategy.name):
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
        return f"{model} {r.strategy} b{r.batch_size} {r.size.label()} {r.device}"


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
    emit = serialized(on_event)
    since = store_end(store)
    announce = _RowAnnouncer(store, emit)
    runner = make_runner(store.run_dir, device, None, None, retry_failed, force, since)
    parts = split(config)
    gpus = _gpus_per_job(options.slurm, device)
    folder = store.run_dir / "slurm"
    for round_no in range(max_rounds):
        missing = {i: point for i, part in enumerate(parts)
                   if (point := replay(search, part, runner, announce.seen, emit)[1]) is not None}
        if not missing:
            break
        executor = _submitit_executor(executor_class, folder, options.slurm, gpus, f"actbench-{store.run_id}"[:64])
        shards = [Shard(str(store.run_dir), search, parts[i], retry_failed, force, since, timeout_s,
                        options.isolate, gpus) for i in missing]
        jobs = _submit(executor, shards)
        log.info("round %d: %d array task(s) submitted (job %s), logs in %s", round_no + 1, len(jobs),
                 jobs[0].job_id.split("_")[0] if jobs else "-", folder)
        _wait_for(jobs, announce, options.slurm.poll_s)
        _record_dead_tasks(search, [parts[i] for i in missing], jobs, runner, store, announce)
    else:
        raise RuntimeError(f"{store.run_dir}: parts still unfinished after {max_rounds} rounds of jobs")
    return _outcome(search, parts, runner)


def _gpus_per_job(options: SlurmOptions, device: DeviceProfile) -> int:
    """GPUs each array task asks for: as given, else one on a device that needs a GPU, none otherwise."""
    if options.gpus_per_job is not None:
        return options.gpus_per_job
    return 1 if device.environment_in_child else 0


class _RowAnnouncer:
    """Reports each row the array's tasks append (once, as ``done``), from the rows there at the start on."""

    def __init__(self, store: Any, emit: Event) -> None:
        self.store, self.emit = store, emit
        self.seen: set[str] = set()
        self.announced = len(store.read_rows())

    def __call__(self) -> None:
        rows = self.store.read_rows()
        for row in rows[self.announced:]:
            self.seen.add(row.key)
            self.emit("done", _RowPoint(row), row)
        self.announced = len(rows)


def _wait_for(jobs: list[Any], announce: _RowAnnouncer, poll_s: float) -> None:
    """Until every job is done, reporting rows as they land; an interruption cancels the jobs."""
    try:
        while not all(job.done() for job in jobs):
            announce()
            time.sleep(poll_s)
    except BaseException:
        for job in jobs:
            try:
                job.cancel(check=False)
            except Exception:  # noqa: BLE001
                pass
        raise
    announce()


def _record_dead_tasks(search: Callable, parts: list[Any], jobs: list[Any], runner: Any, store: Any,
                       announce: _RowAnnouncer) -> None:
    """An ``error`` row, naming the job and its log, for the point each unfinished part was at; the table."""
    for part, job in zip(parts, jobs):
        failure = _job_failure(job)
        point = replay(search, part, runner)[1]
        if point is None:
            continue  # the part finished (a task that died after its last row lost nothing)
        if failure is None:
            failure = f"job {job.job_id} ended without measuring this point; log {job.paths.stderr}"
        row = ResultRow.build(point.config, Measurement.failure("error", failure), store.run_id, _env_id(store))
        store.append(row)
        announce()
    store.write_table()


def _outcome(search: Callable, parts: list[Any], runner: Any) -> Any:
    """The whole search's outcome, replayed part by part over the recorded rows."""
    outcomes = []
    for part in parts:
        outcome, point = replay(search, part, runner)
        if point is not None:  # cannot happen after the rounds of jobs
            raise RuntimeError(f"{point.describe()}: no row after the jobs ended")
        outcomes.append(outcome)
    return merge(outcomes)


def _env_id(store: Any) -> str:
    """The environment the run's tasks recorded (``env.json``), for a row the submitter writes."""
    try:
        return str(json.loads((store.run_dir / "env.json").read_text()).get("env_id") or "unknown")
    except (OSError, ValueError, AttributeError):
        return "unknown"
