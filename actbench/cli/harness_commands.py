"""Harness commands: models, sweep-batch, max-scale, throughput, memory.

Thin by design: parse options, build a frozen config, call the library (actbench.planning.search /
actbench.execution.runner), render. Bad values exit 2 with one line on stderr and touch no results.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console

from actbench.cli.app import (MEASURE_SMALL_INSTEAD, PREDICT_INSTEAD, app, fail, interrupted_by,
                              interrupted_exit_code, require_device, terminate_like_ctrl_c)
from actbench.cli.options import (DEFAULT_TEXT, EXECUTION, GROWTH, PLAN_MAX_DEFAULT_JOBS, RUN, SELECTION, STEPS, TARGET,
                                  PlanJobsOpt, SIZE, Shared, SharedOptions, shared_options, shared_values)
from actbench.cli.progress import PointProgress, ensure_extension, plural
from actbench.cli.tables import (precision_suffix, print_plan, render_maxima, render_memory, render_plan,
                                 render_rows)
from actbench.cli.speed_commands import use_device_model
from actbench.execution.specs import DEFAULT_STRATEGIES, PLAN_DEVICE
from actbench.core.devices import profile
from actbench.schema import DIMENSIONS, PLAN_DIMENSIONS, RETRIED_STATUSES, one_line
from actbench.training.tasks import TASK_NAMES

log = logging.getLogger(__name__)


Dim = enum.Enum("Dim", {name: name for name in DIMENSIONS}, type=str)
PlanDim = enum.Enum("PlanDim", {name: name for name in PLAN_DIMENSIONS}, type=str)
#: --task choices, from the task registry (actbench/training/tasks/).
TaskChoice = enum.Enum("TaskChoice", {name: name for name in TASK_NAMES}, type=str)

#: The model argument of sweep-batch, throughput and memory, and the batch list throughput and memory take.
ModelArg = Annotated[str, typer.Argument(help="Model name (see `actbench models`).")]
BatchesOpt = Annotated[str, typer.Option("--batch", help="Batch size(s): N, N,M or START:STOP:STEP.")]


def plan_jobs(jobs: Optional[int], gpus: Optional[str], executor: Any) -> int:
    """plan's --jobs: as given; otherwise one per core (at most PLAN_MAX_DEFAULT_JOBS) on this machine,
    and 1 with --gpus or another executor (whose options say where points run)."""
    if jobs is not None:
        return jobs
    if gpus or getattr(executor, "value", executor) != "local":
        return 1
    from actbench.execution.executors import cpu_count

    return max(1, min(PLAN_MAX_DEFAULT_JOBS, cpu_count()))


def _checked(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ValueError as exc:
        fail(str(exc))


def _spec(**fields: Any):
    """The command's spec (actbench/execution/specs.py): every check and default, shared with experiment files."""
    from actbench.execution.specs import CommandSpec, SpecError

    try:
        return CommandSpec(**fields)
    except SpecError as exc:
        fail(exc.as_option())


#: Commands whose point count is exact (a grid); the others search and take at most their count.
_GRID_COMMANDS = ("throughput", "memory")


def _execution(jobs: int = 1, gpus: Optional[str] = None, executor: Any = "local", isolate: bool = False,
               slurm: Optional[list[str]] = None):
    """How the run executes (actbench/execution/execution_options.py): --executor, --jobs, --gpus, --isolate, --slurm."""
    from actbench.execution.execution_options import ExecutionOptions, SlurmOptions, parse_gpus

    return _checked(lambda: ExecutionOptions(executor=getattr(executor, "value", executor), jobs=jobs,
                                             gpus=parse_gpus(gpus), isolate=isolate, slurm=SlurmOptions.parse(slurm)))


def _run_spec(spec, out: Path, dry_run: bool, force: bool = False, no_retry: bool = False, execution=None):
    """Dry run: print the plan. Otherwise measure it into OUT/<run>/ -> (store, outcome), or None."""
    plan = spec.plan()
    if execution is not None:
        _checked(lambda: execution.check(plan.device))
    if dry_run:
        print_plan(out / plan.name, list(plan.preview))
        return None
    store = _open_store(out, plan)
    outcome = _execute(store, plan, force=force, retry_failed=not no_retry, execution=execution)
    if plan.summary is not None:
        _checked(lambda: store.write_summary(plan.summary(outcome)))
    return store, outcome


#: A command's parameters that steer the run, not what it measures (never in the spec nor the run's name).
_RUN_SWITCHES = ("out", "dry_run", "force", "no_retry")
_EXECUTION_OPTIONS = ("jobs", "gpus", "executor", "isolate", "slurm")
#: Options whose CLI default is None (the spec's default applies), so that one given where it does nothing
#: can be told from one left out.
_DEFAULTED = ("timeout", "stop_after")


def _launch(command: str, shared: SharedOptions, **fields: Any):
    """One path from a command's parameters to a run: build its spec, then dry-run or measure it.

    ``shared`` holds the options the measuring commands share, ``fields`` the command's own. Strategy
    selection (--strategies, --levels, --no-baseline), the execution options and the run switches are
    mapped here once; every other option is a CommandSpec field of the same name (``timeout`` is
    ``timeout_s``; enums give their value). Returns (store, outcome), or None after a dry run.
    """
    options = {**shared_values(shared), **fields}
    given = {name: value for name, value in options.items() if value is not None or name not in _DEFAULTED}
    use_device_model(given.pop("device_model", None))
    switches = {name: given.pop(name) for name in _RUN_SWITCHES if name in given}
    switches["explicit"] = {name for name in _DEFAULTED if name in given}
    execution = _execution(**{name: given.pop(name) for name in _EXECUTION_OPTIONS if name in given})
    strategies = _strategies(given.pop("strategies"), given.pop("levels"), given.pop("no_baseline"))
    if "timeout" in given:
        given["timeout_s"] = given.pop("timeout")
    values = {name: value.value if isinstance(value, enum.Enum) else value for name, value in given.items()}
    spec = _spec(**{**values, "command": command, "strategies": strategies})
    _refuse_idle_switches(spec, execution, switches)
    return spec, _run_spec(spec, switches["out"], switches["dry_run"], switches.get("force", False),
                           switches.get("no_retry", False), execution)


def _refuse_idle_switches(spec, execution, switches: dict[str, Any]) -> None:
    """Run and execution options that would do nothing here are one-line errors, not silently recorded.

    --isolate asks for a child per point where points are predicted in this process, as does --timeout
    (no child to stop there); --stop-after ends a scan that --find-max does not run; --no-retry keeps
    error rows that --force measures again anyway. (--jobs beyond this machine's cores is refused by
    ``ExecutionOptions.check``, for every command that runs points.)
    """
    in_this_process = profile(spec.device).in_process and execution.jobs <= 1 and not execution.gpus
    if execution.isolate and in_this_process:
        fail(f"--isolate starts a child process per point, but on {spec.device} with --jobs 1 points are predicted "
             "in this process: add --jobs 2 (points in worker processes) or drop --isolate")
    if "timeout" in switches["explicit"] and in_this_process:
        fail(f"--timeout limits a point's child process, but on {spec.device} with --jobs 1 points are predicted in "
             "this process (no child to stop): add --jobs 2 (points in worker processes) or drop --timeout")
    if "stop_after" in switches["explicit"] and spec.find_max:
        fail("--stop-after ends a scan of the batches given; --find-max searches instead (it stops where the "
             "memory runs out): give one of them")
    if switches.get("force") and switches.get("no_retry"):
        fail("--no-retry keeps recorded error rows and --force measures every point again: give one of them")
    if spec.dim == "resolution" and spec.image_size is not None:
        fail(f"--image-size {spec.image_size} does nothing with --dim resolution: the search sets the side, "
             "from --low to --high (their defaults: --dim resolution's range)")


def _strategies(strategies: Optional[str], levels: Optional[str], no_baseline: bool) -> tuple[str, ...]:
    """--strategies and --levels add up (fp32 leads unless --no-baseline); neither: the default comparison."""
    from actbench.execution.parsing import combine_strategies, parse_levels, parse_strategies

    for option, given in (("--strategies", strategies), ("--levels", levels)):
        if given is not None and not given.strip(" ,"):
            fail(f"{option} is empty: give names (e.g. --strategies fp32,swap or --levels L1..L5), or leave the "
                 f"option out for the default comparison ({DEFAULT_TEXT}), got {given!r}")
    if strategies is None and levels is None:
        chosen = tuple(s for s in DEFAULT_STRATEGIES if not (no_baseline and s == "fp32"))
        return _checked(lambda: combine_strategies(chosen, (), not no_baseline))
    return _checked(lambda: combine_strategies(parse_strategies(strategies), parse_levels(levels), not no_baseline))


def _instead(command: str) -> str:
    """What to do on a machine without the device asked for (no GPU): answer the question another way."""
    if command == "throughput":
        return MEASURE_SMALL_INSTEAD
    if command == "max-scale":
        return ("without a GPU, predict with --device meta --budget 16GiB (or `actbench plan MODEL --budget 16GiB "
                "--dim DIM`), or measure small sizes with --device cpu --image-size 32 --batch 2")
    return PREDICT_INSTEAD


def _open_store(out: Path, plan):
    """Checks that need the machine (not needed for --dry-run), then the run directory."""
    from actbench.store.outputs import check_writable
    from actbench.store.results import RunStore

    require_device(plan.device.name, _instead(plan.command))
    _checked(lambda: check_writable(out))
    store = RunStore(out / plan.name)
    _checked(lambda: store.write_config(plan.config.identity()))
    return store


def _execute(store, plan, force: bool = False, retry_failed: bool = True, execution=None) -> Any:
    """Run the plan's search with progress on stderr; Ctrl-C, SIGTERM and SIGHUP keep every finished row."""
    from actbench.store.outputs import OutputError
    from actbench.store.reading import RunFileError
    from actbench.execution.runner import EnvironmentCaptureError
    from actbench.execution.scaleout import execute
    from actbench.execution.slurm import SubmitError

    settings = plan.config.settings
    err = Console(stderr=True, highlight=False)
    with terminate_like_ctrl_c():
        progress = PointProgress(plan.points, exact=plan.command in _GRID_COMMANDS,
                                 predicts=plan.device.predicts)
        try:
            with progress:
                problem = ensure_extension((s.name for s in plan.config.strategies), plan.device.name,
                                           progress.say)
                if problem is not None:
                    progress.close()
                    fail(f"{problem} (strategies without ActNN levels need no extension, e.g. --strategies "
                         "fp32,swap,checkpoint)", code=1)
                result = execute(plan, store, on_event=progress.on_event, options=execution,
                                 timeout_s=settings.timeout_s, retry_failed=retry_failed, force=force)
        except (EnvironmentCaptureError, OutputError, RunFileError) as exc:  # finished rows stay in rows.jsonl
            fail(str(exc))
        except SubmitError as exc:
            fail(str(exc), code=exc.code)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (Terminated)
            _checked(store.write_table)
            err.print(f"{interrupted_by(exc)}: {plural(len(store.read_rows()), 'finished row')} kept in "
                      f"{store.rows_path}", markup=False, soft_wrap=True)
            raise typer.Exit(interrupted_exit_code(exc))
        _checked(store.write_table)
    err.print(progress.summary(store.rows_path), markup=False, soft_wrap=True)
    return result


def _finish_throughput(outcome) -> None:
    """throughput exists for samples/s: when no point gave one (every point oom, over budget or failed),
    say so and exit 1, after the table."""
    _finish(outcome, search=False)
    if not any(r.samples_per_s_median is not None for r in outcome.rows):
        statuses = ", ".join(dict.fromkeys(r.status for r in outcome.rows)) or "no points"
        Console(stderr=True, highlight=False).print(
            f"actbench: no throughput measured: no point completed its timed steps ({statuses}); try a smaller "
            "--batch or a larger --budget", markup=False, soft_wrap=True)
        raise typer.Exit(1)


def _finish(outcome, search: bool) -> None:
    """Say which strategies got no answer because their points failed to measure; exit 1 when every point did.

    ``error`` and ``timeout`` are failures to measure; ``oom`` and ``over_budget`` are results (the
    point does not fit). A command whose every point failed to measure exits 1, after its tables.
    """
    rows = list(outcome.rows)
    err = Console(stderr=True, highlight=False)
    what = "probe" if search else "point"
    for strategy in dict.fromkeys(r.strategy for r in rows):
        mine = [r for r in rows if r.strategy == strategy]
        if all(r.status in RETRIED_STATUSES for r in mine):
            first = mine[0]
            err.print(f"{strategy}: no answer: every {what} failed to measure ({plural(len(mine), what)}; "
                      f"{first.status}: {one_line(first.message, 160)})", markup=False, soft_wrap=True)
    if rows and all(r.status in RETRIED_STATUSES for r in rows):
        err.print(f"actbench: every {what} failed to measure ({' or '.join(RETRIED_STATUSES)}); see the messages "
                  "above and the run's logs/ folder", markup=False, soft_wrap=True)
        raise typer.Exit(1)


# --- commands ----------------------------------------------------------------------------------
@app.command("models")
def models_command(pattern: Annotated[Optional[str], typer.Argument(help="Glob filter, e.g. 'resnet*'.")] = None,
                   task: Annotated[Optional[TaskChoice], typer.Option("--task", show_default=False, help=(
                       "Only the models of this task."))] = None) -> None:
    """List the model names every measuring command accepts: torchvision's models of every task (--task picks one)."""
    from actbench.training.tasks import model_names

    names = model_names(pattern, None if task is None else task.value)
    if not names:
        fail(f"no model matches '{pattern}'" + ("" if task is None else f" among {task.value} models"))
    for name in names:
        typer.echo(name)


@app.command("sweep-batch")
@shared_options(SELECTION, TARGET, RUN, SIZE, GROWTH, STEPS, EXECUTION)
def sweep_batch(
    model: ModelArg,
    batch: Annotated[str, typer.Option("--batch", help="START:STOP:STEP, N, or N,M,...")] = "16:1024:16",
    stop_after: Annotated[Optional[int], typer.Option("--stop-after", show_default=False, help=(
        "Stop a strategy's scan after k consecutive failures (default 2; not with --find-max)."))] = None,
    find_max: Annotated[bool, typer.Option("--find-max", help="Search for the largest batch (multiples of 4): fit how the peak grows, confirm around the limit.")] = False,
    shared: SharedOptions = SharedOptions(),
) -> None:
    """Scan batch sizes per strategy (or --find-max): memory and throughput at each.

    Without --levels/--strategies: fp32 and ActNN L3. On meta (predictions) a budget is required.

    \b
    Examples:
      actbench sweep-batch resnet50 --levels L1..L5 --budget 16GiB                  # on a GPU
      actbench sweep-batch resnet50 --levels L1..L5 --find-max --device meta --budget 16GiB   # predicted, no GPU
      actbench sweep-batch resnet50 --levels all --strategies swap --find-max --budget 16GiB
      actbench sweep-batch resnet18 --levels L3 --batch 4:16:4 --image-size 64 --device cpu
    """
    spec, ran = _launch("sweep-batch", shared, model=model, batch=batch, stop_after=stop_after,
                        find_max=find_max)
    if ran is not None:
        store, outcome = ran
        render_rows(outcome.rows, f"sweep-batch {spec.model_spec().label()} {spec.input_size().label()} on {shared.device.value} -> "
                              f"{store.run_dir}")
        render_maxima(outcome, "batch")
        _finish(outcome, search=True)


@app.command("max-scale")
@shared_options(SELECTION, TARGET, RUN, SIZE, STEPS, EXECUTION, without=("device_model",))
def max_scale(
    model: Annotated[str, typer.Argument(help="Model (depth/width: resnet152 only).")] = "resnet152",
    dim: Annotated[Dim, typer.Option("--dim", help="What to grow.")] = Dim.depth,
    batch: Annotated[int, typer.Option("--batch", help="Batch size (upstream: 64).")] = 64,
    low: Annotated[Optional[int], typer.Option("--low", help="Smallest value (depth: extra blocks 0; width 64; resolution 224).")] = None,
    high: Annotated[Optional[int], typer.Option("--high", help="Largest value (depth 4096 blocks; width 512; resolution 768).")] = None,
    step: Annotated[Optional[int], typer.Option("--step", help="Granularity (depth 1; width 8; resolution 32).")] = None,
    shared: SharedOptions = SharedOptions(),
) -> None:
    """Search for the largest depth, width or resolution that fits, with throughput and FLOPs there.

    Model-guided: small probes, a fit of how the peak grows, a jump to the predicted limit and probes
    around it (bisection when the fit is poor); every probe is a row, summary.json says how.

    Without --levels/--strategies: fp32 and ActNN L3. On meta (predictions) a budget is required.
    × fp32 compares the maxima in the same unit as the figures and the report (depth: layers).

    \b
    Examples:
      actbench max-scale --dim depth --budget 16GiB                       # ResNet-152 grown in depth, on a GPU
      actbench max-scale --dim depth --device meta --budget 16GiB         # predicted, no GPU
      actbench max-scale --dim resolution resnet50 --levels L2,L3 --batch 32 --budget 16GiB
    """
    spec, ran = _launch("max-scale", shared, model=model, dim=dim, batch=batch, low=low,
                        high=high, step=step)
    if ran is not None:
        store, outcome = ran
        render_rows(outcome.rows, f"max-scale --dim {dim.value} {model} batch {batch} on {shared.device.value} -> "
                              f"{store.run_dir}")
        label = {"depth": "extra blocks", "width": "width_per_group", "resolution": "image size"}[dim.value]
        render_maxima(outcome, label)
        _finish(outcome, search=True)


@app.command("throughput")
@shared_options(SELECTION, TARGET, RUN, SIZE, GROWTH, STEPS, EXECUTION)
def throughput(
    model: ModelArg,
    batch: BatchesOpt = "64",
    shared: SharedOptions = SharedOptions(),
) -> None:
    """Training throughput (images/s, median and IQR) per strategy and batch size.

    Without --levels/--strategies: fp32 and ActNN L3.

    \b
    Examples:
      actbench throughput resnet50 --levels L2,L3 --strategies swap,checkpoint --batch 64,128
      actbench throughput resnet18 --batch 8 --image-size 64 --device cpu       # no GPU: small sizes
    """
    _, ran = _launch("throughput", shared, model=model, batch=batch)
    if ran is not None:
        store, outcome = ran
        render_rows(outcome.rows, f"throughput {model} on {shared.device.value} -> {store.run_dir}")
        _finish_throughput(outcome)


@app.command("memory")
@shared_options(SELECTION, TARGET, RUN, SIZE, GROWTH, STEPS, EXECUTION, replace=(Shared("timed_steps", Annotated[int, typer.Option(
    "--timed-steps", help="Timed steps (default 0: memory only).")], 0),))
def memory(
    model: ModelArg,
    batch: BatchesOpt = "64",
    shared: SharedOptions = SharedOptions(),
) -> None:
    """One point's memory breakdown: activations, peak, reserved, parameters, gradients, optimizer state.

    Without --levels/--strategies: fp32 and ActNN L3.

    \b
    Examples:
      actbench memory resnet50 --levels L0..L5 --batch 64 --device meta     # predicted, no GPU
      actbench memory resnet18 --levels L3 --batch 8 --image-size 64 --device cpu
    """
    _, ran = _launch("memory", shared, model=model, batch=batch)
    if ran is None:
        return
    store, outcome = ran
    render_memory(outcome.rows, f"memory {model} on {shared.device.value} -> {store.run_dir}")
    _finish(outcome, search=False)


@app.command("plan")
@shared_options(SELECTION, TARGET, RUN, SIZE, STEPS, EXECUTION,
                without=("device", "device_model", "warmup_steps", "timed_steps", "timeout"),
                replace=(Shared("budget", Annotated[Optional[str], typer.Option(
                    "--budget", help="Device memory to plan for, e.g. 16GiB (or --gpu).")], None),
                         Shared("jobs", PlanJobsOpt, None)))
def plan(
    model: Annotated[str, typer.Argument(help="Model name (depth/width: resnet152 only).")],
    dim: Annotated[PlanDim, typer.Option("--dim", help="What to grow.")] = PlanDim.batch,
    batch: Annotated[int, typer.Option("--batch", help="dim batch: where the search starts; other dims: the batch size.")] = 64,
    low: Annotated[Optional[int], typer.Option("--low", help="Smallest value (batch 4; depth 0; width 64; resolution 224).")] = None,
    high: Annotated[Optional[int], typer.Option("--high", help="Largest value (batch 16384; depth 4096; width 512; resolution 768).")] = None,
    step: Annotated[Optional[int], typer.Option("--step", help="Granularity (batch 4; depth 1; width 8; resolution 32).")] = None,
    shared: SharedOptions = SharedOptions(),
) -> None:
    """Predict, without a GPU, the largest batch (or depth, width, resolution) per strategy under a budget.

    Searches on the meta device (fake tensors): peak = device bytes over one training step, model
    included; swap's and L4/L5's host copies are reported apart (host column), not counted.
    Without --levels/--strategies: fp32 and ActNN L3. Predictions run in worker processes, one per
    core (at most 4; --jobs sets it): strategies side by side, and an answer's two certifying probes
    at once when a slot is spare. The maxima do not depend on --jobs.

    \b
    Examples:
      actbench plan resnet50 --budget 16GiB --strategies swap,checkpoint --levels L0..L5
      actbench plan resnet152 --budget 16GiB --dim depth --levels L3 --batch 64
    """
    shared = dataclasses.replace(shared, jobs=plan_jobs(shared.jobs, shared.gpus, shared.executor))
    spec, ran = _launch("plan", shared, model=model, dim=dim, batch=batch, low=low, high=high,
                        step=step, device=PLAN_DEVICE)
    if ran is None:
        return
    from actbench.schema import format_bytes

    store, outcome = ran
    title = (f"plan {model} {spec.input_size().label()}{precision_suffix(outcome.rows)} under "
             f"{format_bytes(spec.settings().budget_bytes)}{spec.gpu_tag()} (predicted on meta) -> {store.run_dir}")
    render_plan(outcome, title, dim.value, counted_host=bool(spec.host_budget))
    _finish(outcome, search=True)
