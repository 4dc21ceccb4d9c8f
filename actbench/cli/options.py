"""The options the five measuring commands share, declared once, and how a command takes them.

A command lists only its own parameters and is decorated with :func:`shared_options`, which adds
the shared groups to its signature (what Typer reads) and hands them to the command as one frozen
:class:`SharedOptions`, so no command passes its parameters on by name.
"""

from __future__ import annotations

import enum
import functools
import inspect
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from actbench.cli.app import DEFAULT_OUT, Device, Gpu, Precision, checked_out_dir
from actbench.core.devices import PROFILES
from actbench.core.gpus import GPU_NAMES
from actbench.execution.specs import DEFAULT_STRATEGIES
from actbench.schema import DEFAULT_TIMEOUT_S, column_range
from actbench.strategies import PLAIN_STRATEGIES
from actbench.training.tasks import registered

#: the strategies compared without --levels and --strategies, in words
DEFAULT_TEXT = " and ".join(DEFAULT_STRATEGIES)
LevelsOpt = Annotated[Optional[str], typer.Option("--levels", help=(
    f"ActNN levels: L1..L5, L1,L3 or all. Without --levels and --strategies: {DEFAULT_TEXT} (fp32 against "
    "ActNN L3, the paper's comparison); either option replaces that default."))]
StrategiesOpt = Annotated[Optional[str], typer.Option(
    "--strategies", "--strategy",
    help=f"Comma list of {', '.join(PLAIN_STRATEGIES)} (levels allowed too); results/README.md describes each. "
         f"Default: {DEFAULT_TEXT}.")]
NoBaselineOpt = Annotated[bool, typer.Option("--no-baseline", help="Do not add fp32 as the baseline.")]
#: each task's default size, in words (video: frames x side)
TASK_SIZES = ", ".join(f"{task.name} {task.default_size.label()}" for task in registered().values())
#: ``--device-model FILE``, shared by the commands whose rows carry a predicted step time.
DeviceModelOpt = Annotated[Optional[Path], typer.Option("--device-model", help=(
    "Device-model JSON file (from `actbench calibrate`) to predict each row's step time on; meta rows "
    "with --gpu use that GPU's built-in model without it."))]
ImageSizeOpt = Annotated[Optional[str], typer.Option("--image-size", show_default=False, help=(
    "Input size in pixels: N (square) or HxW, e.g. 512x1024. Default: the model's task's, as torchvision's "
    f"reference trains it ({TASK_SIZES}; `actbench models --task T` lists each task's models), or the "
    "smallest side above it a model takes (inception_v3: 299)."))]
FramesOpt = Annotated[Optional[int], typer.Option("--frames", show_default=False, help=(
    "Video models only: frames per clip (default: the video task's, as torchvision's reference trains)."))]
DeviceOpt = Annotated[Device, typer.Option(
    "--device", help="; ".join(f"{name} {p.help}" for name, p in PROFILES.items()) + ".")]
BudgetOpt = Annotated[Optional[str], typer.Option("--budget", help=(
    "Memory cap, e.g. 16GiB (cuda: enforced; cpu and meta: peak compared). Required for searches on meta."))]
GpuOpt = Annotated[Optional[Gpu], typer.Option("--gpu", help=(
    f"meta: plan for a GPU model ({', '.join(GPU_NAMES)}): its memory less "
    "ECC and the CUDA context, and out-of-memory decided on the reserved bytes of a caching-allocator model "
    "(docs/design.md §10). Instead of --budget."))]
HostBudgetOpt = Annotated[Optional[str], typer.Option("--host-budget", help=(
    "Pinned host memory allowed for swapped tensors (swap, save_on_cpu, L4/L5), e.g. 64GiB; above it a point is "
    "host_over_budget. meta: the pinned allocator's power-of-two blocks are modelled."))]
OutOpt = Annotated[Path, typer.Option("--out", parser=checked_out_dir, help=(
    "Where your runs go: OUT/<run>/ (default runs/, ignored by git; results/ holds the committed reference "
    "results)."))]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the planned points and exit.")]
ForceOpt = Annotated[bool, typer.Option("--force", help=(
    "Measure every point again, even those already recorded (old rows stay in rows.jsonl; the new ones win)."))]
NoRetryOpt = Annotated[bool, typer.Option("--no-retry", help=(
    "Keep recorded error and timeout rows instead of measuring those points again."))]
#: the most warm-up and timed steps a row holds (actbench/schema.py): the options take no more
MAX_WARMUP_STEPS, MAX_TIMED_STEPS = column_range("warmup_steps")[1], column_range("timed_steps")[1]
#: how each device that times extends the timed steps asked for, in words (its profile's bounds)
TIMING_BOUNDS = "; ".join(f"{p.name}: {p.min_timed_seconds:g} s minimum, then at most {p.max_timed_steps} steps or "
                          f"{p.max_timed_seconds:g} s" for p in PROFILES.values() if p.max_timed_steps)
WarmupOpt = Annotated[Optional[int], typer.Option("--warmup-steps", help=(
    f"Untimed steps first, 0..{MAX_WARMUP_STEPS} (default: cpu 1, cuda 3)."))]
TimedOpt = Annotated[Optional[int], typer.Option("--timed-steps", help=(
    f"Timed steps, at least: 0..{MAX_TIMED_STEPS} (default: cpu 3, cuda 10), every one of them run. Past them, "
    "timing goes on until the device's minimum time has passed and the spread (IQR) is within 10% of the "
    f"median, within bounds ({TIMING_BOUNDS}); the bounds never cut the steps asked for, --timeout does."))]
SegmentsOpt = Annotated[Optional[int], typer.Option("--checkpoint-segments", help="Checkpoint segments (default: one per block).")]
PrecisionOpt = Annotated[Precision, typer.Option("--precision", help=(
    "fp32, or autocast to bf16 / fp16 (fp16 with a gradient scaler), for every strategy; rows record it."))]
TimeoutOpt = Annotated[Optional[float], typer.Option("--timeout", show_default=False, help=(
    f"Seconds before a point's child is killed (status timeout; default {DEFAULT_TIMEOUT_S:g})."))]
# How a run executes (actbench/execution/execution_options.py): never part of what it measures, nor of the run's name.
ExecutorChoice = enum.Enum("ExecutorChoice", {"local": "local", "slurm": "slurm"}, type=str)
JobsOpt = Annotated[int, typer.Option("--jobs", help=(
    "cpu and meta: points measured at once (strategies side by side; each cpu child gets cores/N threads)."))]
PlanJobsOpt = Annotated[Optional[int], typer.Option("--jobs", show_default=False, help=(
    "Predictions at once, in worker processes: strategies side by side, and an answer's two certifying probes "
    "together. Default: one per core, at most 4; --jobs 1 predicts in this process."))]
#: plan's default --jobs at most: a prediction is single-threaded Python (a core each), and each job is a process
PLAN_MAX_DEFAULT_JOBS = 4
GpusOpt = Annotated[Optional[str], typer.Option("--gpus", help=(
    "cuda: GPU indices, e.g. 0,1,2,3: one point per GPU at a time, each child pinned with CUDA_VISIBLE_DEVICES."))]
ExecutorOpt = Annotated[ExecutorChoice, typer.Option("--executor", help=(
    "local (this machine) or slurm (one job array through submitit; rows land in the same run directory)."))]
IsolateOpt = Annotated[bool, typer.Option("--isolate", help=(
    "A fresh child process per point (default: a persistent worker per strategy, replaced after any failure)."))]
SlurmOpt = Annotated[Optional[list[str]], typer.Option("--slurm", metavar="KEY=VALUE", help=(
    "KEY=VALUE for --executor slurm, repeatable: partition, account, time (minutes or HH:MM:SS), gpus-per-job, "
    "cpus-per-job, array-parallelism; any other key goes to sbatch as --KEY=VALUE (e.g. --slurm qos=high)."))]
ExtraBlocksOpt = Annotated[int, typer.Option("--extra-blocks", help="resnet152 only: bottleneck blocks added to stages 2/3 (8:36).")]
WidthOpt = Annotated[Optional[int], typer.Option("--width-per-group", help="resnet152 only: width_per_group (default 64).")]


@dataclass(frozen=True)
class Shared:
    """One shared option: its parameter name, its Typer annotation and its default."""

    name: str
    annotation: Any
    default: Any


SELECTION = (Shared("levels", LevelsOpt, None), Shared("strategies", StrategiesOpt, None),
             Shared("no_baseline", NoBaselineOpt, False))
TARGET = (Shared("device", DeviceOpt, Device.cuda), Shared("budget", BudgetOpt, None), Shared("gpu", GpuOpt, None),
          Shared("device_model", DeviceModelOpt, None), Shared("host_budget", HostBudgetOpt, None))
GROWTH = (Shared("extra_blocks", ExtraBlocksOpt, 0), Shared("width_per_group", WidthOpt, None))
SIZE = (Shared("image_size", ImageSizeOpt, None), Shared("frames", FramesOpt, None))
STEPS = (Shared("warmup_steps", WarmupOpt, None), Shared("timed_steps", TimedOpt, None),
         Shared("checkpoint_segments", SegmentsOpt, None), Shared("precision", PrecisionOpt, Precision.fp32),
         Shared("timeout", TimeoutOpt, None))
RUN = (Shared("out", OutOpt, DEFAULT_OUT), Shared("dry_run", DryRunOpt, False), Shared("force", ForceOpt, False),
       Shared("no_retry", NoRetryOpt, False))
EXECUTION = (Shared("jobs", JobsOpt, 1), Shared("gpus", GpusOpt, None),
             Shared("executor", ExecutorOpt, ExecutorChoice.local), Shared("isolate", IsolateOpt, False),
             Shared("slurm", SlurmOpt, None))


@dataclass(frozen=True)
class SharedOptions:
    """The shared options one command was given (those it does not take keep these defaults)."""

    levels: Optional[str] = None
    strategies: Optional[str] = None
    no_baseline: bool = False
    device: Optional[Device] = None
    budget: Optional[str] = None
    gpu: Optional[Gpu] = None
    device_model: Optional[Path] = None
    host_budget: Optional[str] = None
    extra_blocks: int = 0
    width_per_group: Optional[int] = None
    image_size: Optional[str] = None
    frames: Optional[int] = None
    warmup_steps: Optional[int] = None
    timed_steps: Optional[int] = None
    checkpoint_segments: Optional[int] = None
    precision: Precision = Precision.fp32
    timeout: Optional[float] = None
    out: Path = DEFAULT_OUT
    dry_run: bool = False
    force: bool = False
    no_retry: bool = False
    jobs: Optional[int] = 1
    gpus: Optional[str] = None
    executor: ExecutorChoice = ExecutorChoice.local
    isolate: bool = False
    slurm: Optional[list[str]] = None
    #: the names this command takes (the others were not options of it)
    taken: frozenset[str] = frozenset()


def shared_options(*groups: tuple[Shared, ...], without: tuple[str, ...] = (),
                   replace: tuple[Shared, ...] = ()) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Add the options of ``groups`` (less ``without``; ``replace`` swaps one for a command's own form)
    after the command's own parameters; the command receives them as ``shared: SharedOptions``."""
    swapped = {s.name: s for s in replace}
    chosen = [swapped.get(s.name, s) for group in groups for s in group if s.name not in without]

    def wrap(command: Callable[..., None]) -> Callable[..., None]:
        hints = typing.get_type_hints(command, include_extras=True)
        own = [p.replace(annotation=hints[p.name]) for p in inspect.signature(command).parameters.values()
               if p.name != "shared"]
        added = [inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=s.default, annotation=s.annotation)
                 for s in chosen]

        @functools.wraps(command)
        def run(**given: Any) -> None:
            picked = {s.name: given.pop(s.name) for s in chosen}
            return command(**given, shared=SharedOptions(**picked, taken=frozenset(picked)))

        del run.__wrapped__  # Typer reads the signature below, not the undecorated one
        run.__signature__ = inspect.Signature(own + added)
        run.__annotations__ = {p.name: p.annotation for p in own + added}
        return run

    return wrap


def shared_values(shared: SharedOptions) -> dict[str, Any]:
    """The options ``shared`` holds that its command takes, by name (enums as their values' enums)."""
    return {f.name: getattr(shared, f.name) for f in fields(shared) if f.name in shared.taken}
