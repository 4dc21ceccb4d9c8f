"""Scale-out (docs/design.md §7, "Executors and isolation"): a run's points side by side, or on a cluster.

How a run executes is never part of what it measures: the options (:mod:`.execution_options`) change
neither a point's key nor the run directory's name, so a run started on a laptop resumes on eight
GPUs or on a cluster, and back. :func:`execute` checks them and hands the run's search to
:mod:`.local_run` (``local``, the default: its parts in threads sharing one executor's slots) or to
:mod:`.slurm` (``slurm``: the parts as a submitit job array, resubmitted until every point has a row).
"""

from __future__ import annotations

from typing import Any

from actbench.execution.execution_options import ExecutionOptions
from actbench.execution.local_run import Event, run_local, store_end
from actbench.execution.slurm import run_slurm


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
                     force=force, options=options, timeout_s=timeout_s, executor=executor, since=store_end(store))
