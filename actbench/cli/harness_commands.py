"""Harness commands: models, sweep-batch, max-scale, throughput, memory.

Thin by design: parse options, build a frozen config, call the library (actbench.search /
actbench.runner), render. Bad values exit 2 with one line on stderr and touch no results.
"""

from __future__ import annotations

import enum
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table

from actbench.cli.app import PREDICT_INSTEAD, Device, app, fail, require_device
from actbench.devices import PROFILES
from actbench.strategies import PLAIN_STRATEGIES
from actbench.schema import DEFAULT_TIMEOUT_S, DIMENSIONS, MIN_IMAGE_SIZE, PLAN_DIMENSIONS

log = logging.getLogger(__name__)


Dim = enum.Enum("Dim", {name: name for name in DIMENSIONS}, type=str)
PlanDim = enum.Enum("PlanDim", {name: name for name in PLAN_DIMENSIONS}, type=str)


# --- shared option aliases ---------------------------------------------------------------------
LevelsOpt = Annotated[Optional[str], typer.Option("--levels", help="ActNN levels: L1..L5, L1,L3 or all.")]
StrategiesOpt = Annotated[Optional[str], typer.Option(
    "--strategies", "--strategy",
    help=f"Comma list of {', '.join(PLAIN_STRATEGIES)} (levels allowed too); results/README.md describes each.")]
NoBaselineOpt = Annotated[bool, typer.Option("--no-baseline", help="Do not add fp32 as the baseline.")]
ImageSizeOpt = Annotated[int, typer.Option("--image-size", help="Input side in pixels.")]
DeviceOpt = Annotated[Device, typer.Option(
    "--device", help="; ".join(f"{name} {p.help}" for name, p in PROFILES.items()) + ".")]
BudgetOpt = Annotated[Optional[str], typer.Option("--budget", help="Memory cap, e.g. 16GiB (cuda: enforced; cpu: peak compared).")]
OutOpt = Annotated[Path, typer.Option("--out", help="Results root; the run goes to OUT/<run>/.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the planned points and exit.")]
WarmupOpt = Annotated[Optional[int], typer.Option("--warmup-steps", help="Untimed steps first (default: cpu 1, cuda 3).")]
TimedOpt = Annotated[Optional[int], typer.Option("--timed-steps", help="Timed steps (default: cpu 3, cuda 10).")]
SegmentsOpt = Annotated[Optional[int], typer.Option("--checkpoint-segments", help="Checkpoint segments (default: one per block).")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds before a point's child is killed (status timeout).")]
ExtraBlocksOpt = Annotated[int, typer.Option("--extra-blocks", help="resnet152 only: bottleneck blocks added to stages 2/3 (8:36).")]
WidthOpt = Annotated[Optional[int], typer.Option("--width-per-group", help="resnet152 only: width_per_group (default 64).")]


def _checked(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ValueError as exc:
        fail(str(exc))


def _spec(**fields: Any):
    """The command's spec (actbench/commands.py): every check and default, shared with experiment files."""
    from actbench.commands import CommandSpec, SpecError

    try:
        return CommandSpec(**fields)
    except SpecError as exc:
        fail(exc.as_option())


def _run_spec(spec, out: Path, dry_run: bool):
    """Dry run: print the plan. Otherwise measure it into OUT/<run>/ -> (store, outcome), or None."""
    plan = spec.plan()
    if dry_run:
        _print_plan(out / plan.name, list(plan.preview))
        return None
    store = _open_store(out, plan.name, plan.config.identity(), plan.device)
    outcome = _execute(store, plan.config.settings, plan.points, lambda run: plan.search(plan.config, run))
    if plan.summary is not None:
        store.write_summary(plan.summary(outcome))
    return store, outcome


def _strategies(strategies: Optional[str], levels: Optional[str], no_baseline: bool) -> tuple[str, ...]:
    from actbench.parsing import combine_strategies, parse_levels, parse_strategies

    return _checked(lambda: combine_strategies(parse_strategies(strategies), parse_levels(levels), not no_baseline))


def _open_store(out: Path, name: str, identity: dict[str, Any], device: str):
    """Checks that need the machine (not needed for --dry-run), then the run directory."""
    from actbench.results import RunStore, check_writable

    require_device(device, PREDICT_INSTEAD)
    _checked(lambda: check_writable(out))
    store = RunStore(out / name)
    _checked(lambda: store.write_config(identity))
    return store


def _execute(store, settings, total: int, job: Callable[[Callable], Any]) -> Any:
    """Run ``job(run_point)`` with a progress bar on stderr; Ctrl-C keeps every finished row."""
    from actbench.runner import EnvironmentCaptureError, PointRunner

    err = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=False) as progress:
        task = progress.add_task("starting", total=total)
        counts = {"done": 0, "cached": 0}

        def on_event(kind: str, point, row) -> None:
            if kind != "start":
                counts[kind] += 1
            if kind == "start":
                progress.update(task, description=f"measuring {point.describe()}")
            else:
                progress.update(task, advance=1, description=f"{point.describe()}: {row.status}"
                                + (" (resumed)" if kind == "cached" else ""))

        runner = PointRunner(store, settings.device, timeout_s=settings.timeout_s, on_event=on_event)
        try:
            result = job(runner.run)
        except EnvironmentCaptureError as exc:
            progress.stop()
            fail(str(exc))
        except KeyboardInterrupt:
            progress.stop()
            store.write_table()
            err.print(f"interrupted: {len(store.read_rows())} finished rows kept in {store.rows_path}")
            raise typer.Exit(130)
        progress.update(task, completed=total, description="done")
    store.write_table()
    err.print(f"{counts['done']} points measured, {counts['cached']} resumed from {store.rows_path}",
              highlight=False, soft_wrap=True)
    return result


def _console() -> Console:
    """Stdout console; wide when redirected so tables in logs do not wrap into unreadable columns."""
    return Console(width=None if sys.stdout.isatty() else 180)


def _render(rows, title: str) -> None:
    from actbench.parsing import format_bytes

    table = Table(title=title)
    for col in ("strategy", "model", "depth", "batch", "px", "status", "activation", "peak alloc",
                "reserved", "model bytes", "samples/s", "IQR", "GFLOP/sample", "message"):
        table.add_column(col, overflow="fold")
    for r in rows:
        rate = "-" if r.samples_per_s_median is None else f"{r.samples_per_s_median:.1f}"
        iqr = "-" if r.samples_per_s_iqr is None else f"{r.samples_per_s_iqr:.1f}"
        flops = "-" if r.flops_per_sample is None else f"{r.flops_per_sample / 1e9:.3f}"
        model = r.model + (f"+{r.extra_blocks}" if r.extra_blocks else "") + (
            f" w{r.width_per_group}" if r.width_per_group else "")
        table.add_row(r.strategy, model, str(r.depth or "-"), str(r.batch_size), str(r.image_size), r.status,
                      format_bytes(r.activation_bytes), format_bytes(r.peak_alloc_bytes),
                      format_bytes(r.reserved_bytes), format_bytes(r.model_bytes), rate, iqr, flops, r.message[:60])
    _console().print(table)


def _bound_caption(outcome) -> str | None:
    """Explains "≥" under a table of maxima, when any maximum is only a lower bound."""
    if all(outcome.bounded(s) for s, v in outcome.maxima.items() if v is not None):
        return None
    return ("≥ = nothing larger was seen failing: the limit lies beyond the range searched "
            "(widen the range, or set --budget)")


def _max_cells(outcome, strategy: str) -> tuple[str, str]:
    """(maximum, × fp32) as text; "≥" marks a lower bound, and a ratio to or of one is only a bound."""
    value, base = outcome.maxima.get(strategy), outcome.maxima.get("fp32")
    exact, base_exact = outcome.bounded(strategy), outcome.bounded("fp32")
    if value is None:
        return "none", "-"
    text = str(value) if exact else f"≥{value}"
    if not base or (not exact and not base_exact):
        return text, "-"
    ratio = f"{value / base:.2f}"
    return text, ratio if exact and base_exact else (f"≥{ratio}" if base_exact else f"≤{ratio}")


def _render_maxima(outcome, what: str) -> None:
    table = Table(title=f"largest {what} that fits")
    for col in ("strategy", what, "depth", "samples/s", "GFLOP/sample", "x fp32"):
        table.add_column(col)
    for strategy in outcome.maxima:
        row = outcome.best_rows.get(strategy)
        value, ratio = _max_cells(outcome, strategy)
        rate = "-" if row is None or row.samples_per_s_median is None else f"{row.samples_per_s_median:.1f}"
        flops = "-" if row is None or row.flops_per_sample is None else f"{row.flops_per_sample / 1e9:.3f}"
        table.add_row(strategy, value, str(row.depth) if row is not None and row.depth else "-", rate, flops, ratio)
    table.caption = _bound_caption(outcome)
    _console().print(table)


def _print_plan(run_dir: Path, lines: list[str]) -> None:
    console = _console()
    console.print(f"run directory: {run_dir}")
    for line in lines:
        console.print(line, highlight=False)


# --- commands ----------------------------------------------------------------------------------
@app.command("models")
def models_command(pattern: Annotated[Optional[str], typer.Argument(help="Glob filter, e.g. 'resnet*'.")] = None) -> None:
    """List the model names every measuring command accepts (torchvision classification models)."""
    from actbench.models import list_model_names

    names = list_model_names(pattern)
    if not names:
        fail(f"no model matches '{pattern}'")
    for name in names:
        typer.echo(name)


@app.command("sweep-batch")
def sweep_batch(
    model: Annotated[str, typer.Argument(help="Model name (see `actbench models`).")],
    levels: LevelsOpt = None,
    strategies: StrategiesOpt = None,
    no_baseline: NoBaselineOpt = False,
    batch: Annotated[str, typer.Option("--batch", help="START:STOP:STEP, N, or N,M,...")] = "16:1024:16",
    image_size: ImageSizeOpt = 224,
    device: DeviceOpt = Device.cuda,
    budget: BudgetOpt = None,
    out: OutOpt = Path("results"),
    stop_after: Annotated[int, typer.Option("--stop-after", help="Stop a strategy after k consecutive failures.")] = 2,
    find_max: Annotated[bool, typer.Option("--find-max", help="Binary search for the largest batch (multiples of 4).")] = False,
    extra_blocks: ExtraBlocksOpt = 0,
    width_per_group: WidthOpt = None,
    warmup_steps: WarmupOpt = None,
    timed_steps: TimedOpt = None,
    checkpoint_segments: SegmentsOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
    dry_run: DryRunOpt = False,
) -> None:
    """Scan batch sizes per strategy (or --find-max): memory and throughput at each.

    Examples:
      actbench sweep-batch resnet50 --levels L1..L5 --budget 16GiB                  # on a GPU
      actbench sweep-batch resnet50 --levels all --strategies swap --find-max --budget 16GiB
      actbench sweep-batch resnet18 --levels L3 --batch 4:16:4 --image-size 64 --device cpu
    """
    spec = _spec(command="sweep-batch", model=model, strategies=_strategies(strategies, levels, no_baseline),
                 batch=batch, image_size=image_size, device=device.value, budget=budget, stop_after=stop_after,
                 find_max=find_max, extra_blocks=extra_blocks, width_per_group=width_per_group,
                 warmup_steps=warmup_steps, timed_steps=timed_steps, checkpoint_segments=checkpoint_segments,
                 timeout_s=timeout)
    ran = _run_spec(spec, out, dry_run)
    if ran is not None:
        store, outcome = ran
        _render(outcome.rows, f"sweep-batch {spec.model_spec().label()} {image_size}px on {device.value} -> {store.run_dir}")
        _render_maxima(outcome, "batch")


@app.command("max-scale")
def max_scale(
    model: Annotated[str, typer.Argument(help="Model (depth/width: resnet152 only).")] = "resnet152",
    dim: Annotated[Dim, typer.Option("--dim", help="What to grow.")] = Dim.depth,
    levels: LevelsOpt = None,
    strategies: StrategiesOpt = None,
    no_baseline: NoBaselineOpt = False,
    batch: Annotated[int, typer.Option("--batch", help="Batch size (upstream: 64).")] = 64,
    image_size: ImageSizeOpt = 224,
    low: Annotated[Optional[int], typer.Option("--low", help="Smallest value (depth: extra blocks 0; width 64; resolution 224).")] = None,
    high: Annotated[Optional[int], typer.Option("--high", help="Largest value (depth 4096 blocks; width 512; resolution 768).")] = None,
    step: Annotated[Optional[int], typer.Option("--step", help="Granularity (depth 1; width 8; resolution 32).")] = None,
    device: DeviceOpt = Device.cuda,
    budget: BudgetOpt = None,
    out: OutOpt = Path("results"),
    warmup_steps: WarmupOpt = None,
    timed_steps: TimedOpt = None,
    checkpoint_segments: SegmentsOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
    dry_run: DryRunOpt = False,
) -> None:
    """Binary search of the largest depth, width or resolution that fits, with throughput and FLOPs there.

    Examples:
      actbench max-scale --dim depth --levels L3 --budget 16GiB        # ResNet-152 grown in depth
      actbench max-scale --dim resolution resnet50 --levels L2,L3 --batch 32 --budget 16GiB
    """
    spec = _spec(command="max-scale", model=model, strategies=_strategies(strategies, levels, no_baseline),
                 batch=str(batch), image_size=image_size, device=device.value, budget=budget, dim=dim.value,
                 low=low, high=high, step=step, warmup_steps=warmup_steps, timed_steps=timed_steps,
                 checkpoint_segments=checkpoint_segments, timeout_s=timeout)
    ran = _run_spec(spec, out, dry_run)
    if ran is not None:
        store, outcome = ran
        _render(outcome.rows, f"max-scale --dim {dim.value} {model} batch {batch} on {device.value} -> {store.run_dir}")
        label = {"depth": "extra blocks", "width": "width_per_group", "resolution": "image size"}[dim.value]
        _render_maxima(outcome, label)


def _grid(command: str, model: str, strategies, levels, no_baseline, batch, image_size, device, budget, out,
          extra_blocks, width_per_group, warmup_steps, timed_steps, checkpoint_segments, timeout, dry_run):
    spec = _spec(command=command, model=model, strategies=_strategies(strategies, levels, no_baseline), batch=batch,
                 image_size=image_size, device=device.value, budget=budget, extra_blocks=extra_blocks,
                 width_per_group=width_per_group, warmup_steps=warmup_steps, timed_steps=timed_steps,
                 checkpoint_segments=checkpoint_segments, timeout_s=timeout)
    ran = _run_spec(spec, out, dry_run)
    return (None, None) if ran is None else ran


@app.command("throughput")
def throughput(
    model: Annotated[str, typer.Argument(help="Model name (see `actbench models`).")],
    strategies: StrategiesOpt = None,
    levels: LevelsOpt = None,
    no_baseline: NoBaselineOpt = False,
    batch: Annotated[str, typer.Option("--batch", help="Batch size(s): N, N,M or START:STOP:STEP.")] = "64",
    image_size: ImageSizeOpt = 224,
    device: DeviceOpt = Device.cuda,
    budget: BudgetOpt = None,
    out: OutOpt = Path("results"),
    extra_blocks: ExtraBlocksOpt = 0,
    width_per_group: WidthOpt = None,
    warmup_steps: WarmupOpt = None,
    timed_steps: TimedOpt = None,
    checkpoint_segments: SegmentsOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
    dry_run: DryRunOpt = False,
) -> None:
    """Training throughput (images/s, median and IQR) per strategy and batch size.

    Example:
      actbench throughput resnet50 --levels L2,L3 --strategies swap,checkpoint --batch 64,128
    """
    store, outcome = _grid("throughput", model, strategies, levels, no_baseline, batch, image_size, device, budget,
                           out, extra_blocks, width_per_group, warmup_steps, timed_steps, checkpoint_segments,
                           timeout, dry_run)
    if store is not None:
        _render(outcome.rows, f"throughput {model} on {device.value} -> {store.run_dir}")


@app.command("memory")
def memory(
    model: Annotated[str, typer.Argument(help="Model name (see `actbench models`).")],
    strategies: StrategiesOpt = None,
    levels: LevelsOpt = None,
    no_baseline: NoBaselineOpt = False,
    batch: Annotated[str, typer.Option("--batch", help="Batch size(s): N, N,M or START:STOP:STEP.")] = "64",
    image_size: ImageSizeOpt = 224,
    device: DeviceOpt = Device.cuda,
    budget: BudgetOpt = None,
    out: OutOpt = Path("results"),
    extra_blocks: ExtraBlocksOpt = 0,
    width_per_group: WidthOpt = None,
    warmup_steps: WarmupOpt = None,
    timed_steps: Annotated[int, typer.Option("--timed-steps", help="Timed steps (default 0: memory only).")] = 0,
    checkpoint_segments: SegmentsOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
    dry_run: DryRunOpt = False,
) -> None:
    """One point's memory breakdown: activations, peak, reserved, parameters, gradients, optimizer state.

    Examples:
      actbench memory resnet50 --levels L0..L5 --batch 64 --device meta     # predicted, no GPU
      actbench memory resnet18 --levels L3 --batch 8 --image-size 64 --device cpu
    """
    from actbench.parsing import format_bytes

    store, outcome = _grid("memory", model, strategies, levels, no_baseline, batch, image_size, device, budget, out,
                           extra_blocks, width_per_group, warmup_steps, timed_steps, checkpoint_segments, timeout,
                           dry_run)
    if store is None:
        return
    table = Table(title=f"memory {model} on {device.value} -> {store.run_dir}")
    cols = ("strategy", "batch", "status", "activation", "peak alloc", "reserved", "params", "grads",
            "optimizer state", "model total", "host (swap)", "message")
    for col in cols:
        table.add_column(col)
    for r in outcome.rows:
        table.add_row(r.strategy, str(r.batch_size), r.status, *(format_bytes(v) for v in (
            r.activation_bytes, r.peak_alloc_bytes, r.reserved_bytes, r.param_bytes, r.grad_bytes,
            r.optimizer_state_bytes, r.model_bytes, r.host_bytes)), r.message[:60])
    _console().print(table)


@app.command("plan")
def plan(
    model: Annotated[str, typer.Argument(help="Model name (depth/width: resnet152 only).")],
    budget: Annotated[str, typer.Option("--budget", help="Device memory to plan for, e.g. 16GiB.")],
    strategies: StrategiesOpt = None,
    levels: LevelsOpt = None,
    no_baseline: NoBaselineOpt = False,
    dim: Annotated[PlanDim, typer.Option("--dim", help="What to grow.")] = PlanDim.batch,
    batch: Annotated[int, typer.Option("--batch", help="dim batch: where the search starts; other dims: the batch size.")] = 64,
    image_size: ImageSizeOpt = 224,
    low: Annotated[Optional[int], typer.Option("--low", help="Smallest value (batch 4; depth 0; width 64; resolution 224).")] = None,
    high: Annotated[Optional[int], typer.Option("--high", help="Largest value (batch 16384; depth 4096; width 512; resolution 768).")] = None,
    step: Annotated[Optional[int], typer.Option("--step", help="Granularity (batch 4; depth 1; width 8; resolution 32).")] = None,
    out: OutOpt = Path("results"),
    checkpoint_segments: SegmentsOpt = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Predict, without a GPU, the largest batch (or depth, width, resolution) per strategy under a budget.

    Searches on the meta device (fake tensors): peak = device bytes over one training step, model
    included; swap's and L4/L5's host copies are reported apart (host column), not counted.

    Examples:
      actbench plan resnet50 --budget 16GiB --strategies swap,checkpoint --levels L0..L5
      actbench plan resnet152 --budget 40GiB --dim depth --levels L3
    """
    from actbench.commands import PLAN_DEVICE
    from actbench.parsing import format_bytes

    spec = _spec(command="plan", model=model, strategies=_strategies(strategies, levels, no_baseline),
                 batch=str(batch), image_size=image_size, device=PLAN_DEVICE, budget=budget, dim=dim.value, low=low,
                 high=high, step=step, checkpoint_segments=checkpoint_segments)
    ran = _run_spec(spec, out, dry_run)
    if ran is None:
        return
    store, outcome = ran
    settings = spec.settings()
    table = Table(title=f"plan {model} {image_size}px under {format_bytes(settings.budget_bytes)} "
                        f"(predicted on meta) -> {store.run_dir}")
    for col in ("strategy", f"max {dim.value}", "x fp32", "peak alloc", "activation", "model bytes",
                "host (not counted)", "probes", "note"):
        table.add_column(col)
    for strategy in outcome.maxima:
        row = outcome.best_rows.get(strategy)
        probes = [r for r in outcome.rows if r.strategy == strategy]
        note = "" if row is not None else next((r.message for r in probes if r.status == "error"),
                                               "nothing in the range fits")
        table.add_row(strategy, *_max_cells(outcome, strategy),
                      *(format_bytes(None if row is None else getattr(row, f)) for f in
                        ("peak_alloc_bytes", "activation_bytes", "model_bytes", "host_bytes")),
                      str(len(probes)), note[:60])
    table.caption = _bound_caption(outcome)
    _console().print(table)
