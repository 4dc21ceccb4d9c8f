"""ActNN commands: verify-grads. Parses options, calls actbench.studies.gradients, renders."""

from __future__ import annotations

import dataclasses
import enum
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from actbench.cli.app import (PRECISION_HELP, MeasuringDevice, Precision, app, checked_out_dir, fail,
                              require_device)
from actbench.schema import DEFAULT_PRECISION, LEVEL_NAMES, LIMITS, MAX_SEEDS


Level = enum.Enum("Level", {name: name for name in LEVEL_NAMES}, type=str)


class QuantBackend(str, enum.Enum):
    extension = "extension"
    reference = "oracle"


def _check_model_and_size(model: str, batch_size: int, seeds: int, image_size: str, frames: int | None) -> None:
    """The counts, the model's name, its size (its task's rules) and, for one sample, BatchNorm: one line each."""
    from actbench.schema import SizeError
    from actbench.studies.gradients import check_counts
    from actbench.training.model_names import ModelSpec, validate_model_spec
    from actbench.training.tasks import input_size_for

    try:
        check_counts(batch_size, seeds, prefix="--")  # before the model is looked at
        validate_model_spec(ModelSpec(model))
        size = input_size_for(model, image_size, frames)
    except SizeError as exc:
        fail(exc.as_option())
    except ValueError as exc:
        fail(str(exc))
    _check_batchnorm_batch(model, batch_size, size)


def _check_batchnorm_batch(model: str, batch_size: int, size) -> None:
    """One sample is refused up front for a model with BatchNorm: in training it needs more than one
    value per channel, which a batch of one lacks where a feature map shrinks to 1x1."""
    if batch_size >= 2:
        return
    import torch
    from torch import nn

    from actbench.training.model_names import ModelSpec
    from actbench.training.tasks import task_of

    with torch.device("meta"):
        built = task_of(model).build(ModelSpec(model), size)
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in built.modules()):
        fail(f"--batch must be >= 2 for {model}: BatchNorm in training needs more than one value per channel "
             f"(two samples), got {batch_size}")


def _print_grad_table(rows, title: str) -> None:
    """verify-grads' table: per parameter its size, relative bias and spread, and the bias in standard errors."""
    table = Table(title=title)
    for col in ("parameter", "numel", "rel_bias", "rel_std", "bias_z"):
        table.add_column(col, justify="left" if col == "parameter" else "right")
    for r in rows:
        table.add_row(r.parameter, str(r.numel), f"{r.rel_bias:.3g}", f"{r.rel_std:.3g}", f"{r.bias_z:.2f}")
    Console().print(table)


@app.command("verify-grads")
def verify_grads_command(
    model: Annotated[str, typer.Argument(help="torchvision model name, e.g. resnet18.")],
    level: Annotated[Level, typer.Option("--level", help="ActNN level.")] = Level.L3,
    batch_size: Annotated[int, typer.Option("--batch", help=f"Batch size (1..{LIMITS['batch']}).")] = 4,
    seeds: Annotated[int, typer.Option("--seeds", help=f"Compressed draws K (2..{MAX_SEEDS}).")] = 8,
    image_size: Annotated[str, typer.Option("--image-size", help=(
        "Input size: N (square) or HxW (RAFT: multiples of 8, at least 128)."))] = "64",
    frames: Annotated[Optional[int], typer.Option("--frames", show_default=False, help=(
        "Video models only: frames per clip (default: the video task's)."))] = None,
    device: Annotated[MeasuringDevice, typer.Option(
        "--device", help="Where to compute the gradients.")] = MeasuringDevice.cpu,
    backend: Annotated[QuantBackend, typer.Option("--backend", help="Quantizer backend.")] = QuantBackend.extension,
    precision: Annotated[Precision, typer.Option("--precision", help=PRECISION_HELP + (
        " The reference is the unconverted model's gradient at the same precision."))] = Precision(DEFAULT_PRECISION),
    out: Annotated[Path, typer.Option("--out", parser=checked_out_dir,
                                      help="Directory for the CSV.")] = Path("runs/verify-grads"),
) -> None:
    """Bias and variance of ActNN's compressed gradients vs fp32, per parameter (table + CSV).

    Any task's model trains its task's loss on its task's synthetic batch (a detector's sampled
    proposals are drawn alike in every draw). With --precision bf16 or fp16 both the compressed and the reference gradients come from autocast
    at that precision, so the bias and spread are compression's alone.

    \b
    Examples:
      actbench verify-grads resnet18 --level L3 --batch 8 --seeds 16
      actbench verify-grads resnet18 --level L3 --batch 8 --seeds 16 --precision bf16
      actbench verify-grads lraspp_mobilenet_v3_large --level L3 --batch 2 --seeds 4
      actbench verify-grads raft_small --image-size 128 --batch 1 --seeds 4
    """
    from actbench.actnn import level_config
    from actbench.studies.gradients import GradRow, VerifyConfig, write_csv
    from actbench.store.outputs import OutputError
    from actbench.execution.executors import InProcessExecutor, Task
    precision = precision.value
    _check_model_and_size(model, batch_size, seeds, image_size, frames)
    try:  # the config's own checks: the precision (the counts and the size passed above)
        config = VerifyConfig(model, level_config(level.value, backend=backend.value), batch_size, seeds, image_size,
                              device.value, precision=precision, frames=frames)
    except ValueError as exc:
        fail(str(exc))
    require_device(device.value)
    tag = "" if precision == DEFAULT_PRECISION else f" {precision}"
    err = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=err) as bar:
        task = bar.add_task(f"{model} {level.value}{tag}", total=seeds)
        args = dataclasses.asdict(config)
        result = InProcessExecutor().call(Task("verify-grads", args,
                                               progress=lambda done, total: bar.update(task, completed=done)))
        rows = [GradRow(**r) for r in result["rows"]]
    reference = "fp32" if precision == DEFAULT_PRECISION else f"uncompressed {precision}"
    _print_grad_table(rows, f"{model} at {level.value}{tag}: compressed vs {reference} gradients ({seeds} seeds, "
                            f"batch {batch_size})")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{model}-{level.value}" + ("" if precision == DEFAULT_PRECISION else f"-{precision}")
    try:
        path = write_csv(rows, out / f"{name}-b{batch_size}-k{seeds}-{stamp}.csv")
    except OutputError as exc:
        fail(str(exc))
    err.print(f"wrote {path}")
