"""The executor seam: where and how points are measured (docs/design.md §7).

An executor takes points and yields their measurements, in order; it also captures the environment
the points run in, and runs other named work (:class:`Task`: an accuracy setting's training, a
gradient verification) the same way. The runner (:mod:`actbench.execution.runner`), the searches
(:mod:`actbench.planning.search`), ``actbench trust``, the accuracy experiment and ``verify-grads`` only see
this interface, so they never know whether work ran in a child process, in this process, or on
another machine (:mod:`actbench.execution.slurm` runs whole searches as a Slurm job array).

- :class:`ChildProcessExecutor` — points run in child processes (``python -P -m actbench.worker``)
  with a timeout, one point per *slot* at a time (``--jobs N`` slots, or one per GPU of ``--gpus``,
  each child pinned with ``CUDA_VISIBLE_DEVICES``). ``persistent=True``: a worker child measures
  consecutive points of one strategy and is replaced after any failure (oom, error, crash,
  timeout); ``persistent=False`` (``--isolate``): a fresh child per point. An
  out-of-memory, a crash or a hang costs one row either way. Used for devices that compute (cpu,
  cuda), and for meta with ``--jobs`` > 1. Safe to call from several threads at once.
- :class:`InProcessExecutor` — in this process: predictions on fake tensors (meta), where a child's
  start-up would cost more than the step and nothing can leak; also what ``actbench trust`` uses.

:func:`executor_for` picks by the device profile (``DeviceProfile.in_process``) and the parallelism.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

from actbench.core.devices import DeviceProfile
from actbench.execution.worker_processes import (WorkerProcess, last_line, outcome_to_measurement, run_child,
                                                 worker_key)
from actbench.planning.point import Point
from actbench.schema import DEFAULT_TIMEOUT_S, Measurement

log = logging.getLogger(__name__)

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


class EnvironmentCaptureError(RuntimeError):
    """The environment block could not be captured (e.g. no usable GPU for a cuda run)."""


class TaskError(RuntimeError):
    """A task failed where it ran; the message is that failure's one line."""


class ExecutorClosed(RuntimeError):
    """The executor was aborted (Ctrl-C, another part failed) while a point ran: no row is written."""


#: Work an executor runs by name: "module:function", a function taking and returning JSON-able dicts.
#: (Declared beside the worker, which runs it in a child; the worker never imports this module.)
from actbench.worker import TASKS, task_function  # noqa: E402


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
        return task_function(self.name)


class Executor(Protocol):
    """Measures points (one measurement per point, in the order given) and runs tasks."""

    def measure(self, points: Iterable[Point]) -> Iterator[Measurement]: ...

    def environment(self, device: DeviceProfile) -> dict[str, Any]: ...

    def call(self, task: Task) -> dict[str, Any]: ...


# --- slots: where one point at a time runs ---------------------------------------------------------
def cpu_count() -> int:
    """CPUs this process may use (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Slot:
    """One point at a time runs here: a label, and what its children's environment adds (a pinned GPU,
    a thread cap)."""

    label: str
    env: tuple[tuple[str, str], ...] = ()

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


def local_slots(jobs: int = 1, gpus: Sequence[int] | None = None) -> tuple[Slot, ...]:
    """The slots of this machine: one per GPU of ``gpus`` (indices among the GPUs this process sees,
    each child pinned with ``CUDA_VISIBLE_DEVICES``), else ``jobs`` of them.

    With several CPU slots the cores are shared out: each child gets ``cpus // jobs`` threads
    (``OMP_NUM_THREADS``, unless already set), so N points at once do not oversubscribe the CPU.
    """
    if gpus:
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        slots = []
        for g in gpus:
            if visible and not 0 <= g < len(visible):
                raise ValueError(f"--gpus {g}: only {len(visible)} GPU(s) are visible here "
                                 f"(CUDA_VISIBLE_DEVICES={','.join(visible)})")
            physical = visible[g] if visible else str(g)
            slots.append(Slot(f"gpu {g}", (("CUDA_VISIBLE_DEVICES", physical),)))
        return tuple(slots)
    if jobs <= 1:
        return (Slot("job 1"),)
    threads = str(max(1, cpu_count() // jobs))
    env = tuple((name, threads) for name in THREAD_VARS if name not in os.environ)
    return tuple(Slot(f"job {i + 1}", env) for i in range(jobs))


# --- children, one point per slot at a time --------------------------------------------------------
class _SlotState:
    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.busy = False
        self.worker: WorkerProcess | None = None
        #: a worker started ahead of need, with torch and the models imported, for the next key
        self.spare: WorkerProcess | None = None


class ChildProcessExecutor:
    """Points in child processes, one per slot at a time, killed after ``timeout_s``; each point's
    stderr goes to ``log_dir/<key>.log``.

    ``slots`` (default: one): where points may run at once (:func:`local_slots`). ``persistent``: a
    worker per slot measures consecutive points that share its :func:`worker_key` and is replaced
    after any failure (an oom, an error, a crash, a timeout, or memory left behind); otherwise a
    fresh child per point. :meth:`measure` may be called from several threads: each call waits for a free slot,
    preferring one whose worker already fits the point. :meth:`close` ends the workers;
    :meth:`abort` also kills points in flight, whose :meth:`measure` then raises
    :class:`ExecutorClosed` instead of yielding a row.
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, log_dir: Path | None = None,
                 slots: Sequence[Slot] | None = None, persistent: bool = False, spares: int = 0) -> None:
        self.timeout_s = timeout_s
        self.log_dir = log_dir
        self.slots = tuple(slots or (Slot("job 1"),))
        self.persistent = persistent
        #: workers still to start ahead of need (persistent only): how many more keys the run will
        #: need beyond each slot's first (:meth:`_next_worker`)
        self.spares = spares if persistent else 0
        self._states = [_SlotState(s) for s in self.slots]
        self._cond = threading.Condition()
        self._aborted = False
        self._children: set[subprocess.Popen] = set()
        self._environments: dict[str, dict[str, Any]] = {}
        self._last_slot = threading.local()  # .state: the slot the calling thread had last

    # --- slots ------------------------------------------------------------------------------------
    def _acquire(self, key: tuple) -> _SlotState:
        with self._cond:
            while True:
                if self._aborted:
                    raise ExecutorClosed("executor aborted")
                free = [s for s in self._states if not s.busy]
                if free:
                    fitting = [s for s in free if s.worker is not None and s.worker.key == key and s.worker.alive]
                    # A thread keeps to the worker it had when that one fits: a search's next probe
                    # then meets the model (and, on meta, the steps) its last probe left there.
                    fitting.sort(key=lambda s: s is not getattr(self._last_slot, "state", None))
                    empty = [s for s in free if s.worker is None]
                    state = (fitting or empty or free)[0]
                    state.busy = True
                    self._last_slot.state = state
                    return state
                self._cond.wait()

    def _release(self, state: _SlotState) -> None:
        with self._cond:
            state.busy = False
            self._cond.notify_all()

    def _track(self, proc: subprocess.Popen | None, holder: list) -> None:
        """Remember a fresh child while it runs (``holder`` keeps it for the ``None`` that follows)."""
        with self._cond:
            if proc is None:
                if holder:
                    self._children.discard(holder.pop())
                return
            holder.append(proc)
            self._children.add(proc)
            if self._aborted:
                _kill_quietly(proc)

    # --- the executor interface ---------------------------------------------------------------------
    def measure(self, points: Iterable[Point]) -> Iterator[Measurement]:
        for point in points:
            yield self._measure_one(point)

    def _measure_one(self, point: Point) -> Measurement:
        alloc_conf = point.strategy.cuda_alloc_conf
        log_path = None if self.log_dir is None else self.log_dir / f"{point.key()}.log"
        key = worker_key(point, alloc_conf)
        state = self._acquire(key)
        try:
            if not self.persistent:
                holder: list = []
                outcome = run_child({"task": "measure", "point": point.config.to_dict()}, self.timeout_s, alloc_conf,
                                    log_path, state.slot.env_dict(), lambda p: self._track(p, holder))
                measurement = outcome_to_measurement(outcome, self.timeout_s)
            else:
                worker = state.worker
                if worker is None or worker.key != key or not worker.alive:
                    if worker is not None:
                        self._forget(worker)
                    worker = state.worker = self._next_worker(state, key, alloc_conf)
                measurement, keep = worker.measure(point, self.timeout_s, log_path)
                if not keep:
                    state.worker = None
                    self._forget(worker)
            if self._aborted:
                raise ExecutorClosed(f"{point.describe()}: interrupted")
            return measurement
        finally:
            self._release(state)

    def _next_worker(self, state: _SlotState, key: tuple, alloc_conf: str | None) -> WorkerProcess:
        """A worker for ``key`` in ``state``'s slot: its spare when that one suits, else a new one;
        then, while the run expects more keys (``spares``), the slot's next spare.

        A spare is a worker started before it is needed, whose start (a Python, torch and
        torchvision: about 4 s on 2 cores) runs at the lowest priority in a core the points leave
        idle (actbench/worker.py). It has measured nothing; taking it is taking a fresh worker. It is
        started without an allocator setting, so it serves only keys without one.
        """
        spare, state.spare = state.spare, None
        if spare is not None and (spare.alloc_conf != alloc_conf or not spare.alive):
            self._forget(spare)
            spare = None
        if spare is not None:
            spare.key = key
            worker = spare
        else:
            worker = self._started(WorkerProcess(key, alloc_conf, state.slot.env_dict()))
        with self._cond:
            more = self.spares > 0 and not self._aborted
            if more:
                self.spares -= 1
        if more:
            state.spare = self._started(WorkerProcess(None, None, state.slot.env_dict(), spare=True))
        return worker

    def _started(self, worker: WorkerProcess) -> WorkerProcess:
        with self._cond:
            self._children.add(worker.proc)
            if self._aborted:
                _kill_quietly(worker.proc)
        return worker

    def _forget(self, worker: WorkerProcess) -> None:
        worker.close()
        with self._cond:
            self._children.discard(worker.proc)

    def call(self, task: Task) -> dict[str, Any]:
        """Run ``task`` in a fresh child; its failure (or death, or timeout) raises :class:`TaskError`."""
        task.function()  # an unknown task fails here, in one line, not in the child
        log_path = None if self.log_dir is None else self.log_dir / f"{task.name}.log"
        outcome = run_child({"task": "call", "name": task.name, "args": task.args}, self.timeout_s,
                            log_path=log_path, extra_env=self.slots[0].env_dict())
        if outcome.result is not None and "result" in outcome.result:
            return outcome.result["result"]
        if outcome.result is not None and "error" in outcome.result:
            raise TaskError(outcome.result["error"])
        raise TaskError(outcome_to_measurement(outcome, self.timeout_s).message)

    def environment(self, device: DeviceProfile) -> dict[str, Any]:
        """The environment the points run in (captured once per device; in a child pinned like the
        first slot where the device needs it), plus the parallelism when points share the machine."""
        with self._cond:
            if device.name in self._environments:
                return dict(self._environments[device.name])
        first = self.slots[0].env_dict()
        if not device.environment_in_child:
            from actbench.measure.environment import capture_environment

            env = capture_environment(device)
        else:
            outcome = run_child({"task": "environment", "device": device.name}, timeout_s=300, extra_env=first)
            if outcome.result is None:
                raise EnvironmentCaptureError(f"environment capture failed on {device.name}: "
                                              f"{last_line(outcome.stderr_tail)}")
            env = outcome.result["environment"]
        if len(self.slots) > 1:
            env["points_at_once"] = len(self.slots)
            gpus = [dict(s.env).get("CUDA_VISIBLE_DEVICES") for s in self.slots]
            if all(gpus):
                env["gpus"] = gpus
            elif first.get(THREAD_VARS[0]):
                env["torch_num_threads"] = int(first[THREAD_VARS[0]])
        with self._cond:
            self._environments[device.name] = env
        return dict(env)

    # --- ending -----------------------------------------------------------------------------------
    def close(self) -> None:
        """End every idle worker (the executor stays usable: later points start new ones)."""
        with self._cond:
            states = [s for s in self._states if not s.busy]
            workers = [w for s in states for w in (s.worker, s.spare) if w is not None]
            for s in states:
                s.worker = s.spare = None
            for worker in workers:
                self._children.discard(worker.proc)
        for worker in workers:
            worker.close()

    def abort(self) -> None:
        """Kill every child, busy or not: points in flight raise :class:`ExecutorClosed`, none is recorded."""
        with self._cond:
            self._aborted = True
            children = list(self._children)
            self._cond.notify_all()
        for proc in children:
            _kill_quietly(proc)
        self.close()

    def __enter__(self) -> "ChildProcessExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kill_quietly(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --- in this process --------------------------------------------------------------------------------
class InProcessExecutor:
    """Points measured in this process: predictions reuse one :class:`MetaSessions` across points.

    No timeout applies. Test faults that would take this process with them (``crash``, ``hang``)
    are child-only; ``error`` and ``oom`` fire here as in a child.
    """

    def __init__(self) -> None:
        self._sessions: Any = None

    def measure(self, points: Iterable[Point]) -> Iterator[Measurement]:
        for point in points:
            yield self._measure_one(point)

    def _measure_one(self, point: Point) -> Measurement:
        import time

        from actbench.worker import FAULT_ENV, error_measurement, fault_action

        started = time.perf_counter()
        spec = os.environ.get(FAULT_ENV)  # read at this edge, as the worker does in a child
        if spec and spec.partition("@")[0] in ("crash", "hang"):
            spec = None
        try:
            fault = fault_action(spec, point)
            if point.device.predicts:
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

    def environment(self, device: DeviceProfile) -> dict[str, Any]:
        from actbench.measure.environment import capture_environment

        return capture_environment(device)

    def call(self, task: Task) -> dict[str, Any]:
        """Run ``task`` here; its exception propagates as it is."""
        if task.progress is not None:
            return task.function()(task.args, progress=task.progress)
        return task.function()(task.args)


def executor_for(device: DeviceProfile, timeout_s: float = DEFAULT_TIMEOUT_S, log_dir: Path | None = None,
                 jobs: int = 1, gpus: Sequence[int] | None = None, isolate: bool = False,
                 worker_keys: int = 1) -> Executor:
    """The executor a device's profile asks for, with the parallelism asked for.

    A device measured in this process (meta) stays here with one job; with ``jobs`` > 1 its points
    go to that many worker children (fake-tensor predictions are Python-bound: threads would share
    one interpreter lock). Devices that compute get children: a persistent worker per slot, or a
    fresh child per point with ``isolate``.
    """
    if device.in_process and jobs <= 1 and not gpus:
        return InProcessExecutor()
    slots = local_slots(jobs, gpus)
    # ``worker_keys``: how many keys (strategies) the run will need; each slot's first worker is
    # started when needed, and the workers for the other keys ahead of need. Meta's workers take
    # any of its points, so they need no spares.
    spares = 0 if device.in_process else max(0, worker_keys - len(slots))
    return ChildProcessExecutor(timeout_s, log_dir, slots=slots, persistent=not isolate, spares=spares)
