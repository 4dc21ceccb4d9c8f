"""``actbench trust``: how far meta's predictions are from measurements on this machine.

Thin: validate, call actbench.studies.trust, print each point as it finishes, keep the CSV current: the
rows earlier runs wrote stay, a point measured again replaces its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from actbench.cli.app import (PRECISION_HELP, MeasuringDevice, Precision, app, checked_out_dir, fail,
                              interrupted_by, interrupted_exit_code, require_device, require_train_batch,
                              terminate_like_ctrl_c)
from actbench.cli.progress import ensure_extension
from actbench.studies.trust import TRUST_MODELS, TRUST_STRATEGIES
from actbench.schema import DEFAULT_PRECISION


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


@app.command("trust")
def trust_command(
    device: Annotated[MeasuringDevice, typer.Option("--device", help="Where to measure the points meta predicts.")] = MeasuringDevice.cpu,
    models: Annotated[str, typer.Option("--models", help="Comma list of model names.")] = ",".join(TRUST_MODELS),
    strategies: Annotated[str, typer.Option(
        "--strategies", help="Comma list of strategies and levels.")] = ",".join(TRUST_STRATEGIES),
    batch_size: Annotated[int, typer.Option("--batch", help="Batch size of every point.")] = 2,
    image_size: Annotated[str, typer.Option("--image-size", help=(
        "Input size of every point: N (square) or HxW; a video model's clip has its task's frames."))] = "32",
    precision: Annotated[Precision, typer.Option("--precision", help=PRECISION_HELP)] = Precision(DEFAULT_PRECISION),
    out: Annotated[Path, typer.Option("--out", parser=checked_out_dir, help=(
        "Folder for meta_vs_<device>.csv (meta_vs_<device>_<precision>.csv at bf16, fp16). Rows accumulate: "
        "a point measured again replaces its row, the other points' rows stay."))] = Path("runs/trust"),
    device_model: Annotated[Optional[Path], typer.Option("--device-model", help=(
        "Compare step times instead: predicted on this device model (from `actbench calibrate`) ÷ measured; "
        "writes speed_vs_<device>.csv (its rows accumulate as --out says) and names each pair of strategies "
        "predicted in the other order than measured, with the measured gap beside the steps' spread (a gap "
        "within it the measurement does not settle)."))] = None,
) -> None:
    """How far to trust meta: the same points predicted on meta and measured on cpu or cuda.

    Prints activation and peak bytes as ratios meta ÷ measured (1.0000 = exact) and keeps
    OUT/meta_vs_<device>.csv current after every point; rows of earlier runs stay in it (a point measured
    again replaces its own row). On cuda the gap includes what the caching
    allocator and cuDNN workspaces add, which meta does not model. --precision runs both sides under
    the same autocast. Exit 1 if a point failed.

    \b
    Examples:
      actbench trust --models resnet18 --strategies fp32,L3
      actbench trust --models resnet18 --strategies fp32,L3 --precision bf16
      actbench trust --device cuda --batch 16 --image-size 224      # on a GPU
      actbench trust --models resnet18 --strategies fp32,L3,swap --batch 4 --image-size 64 --device-model runs/device_models/cpu.json
    """
    names, chosen = _checked_points(models, strategies, batch_size, image_size)
    require_device(device.value)
    from actbench.schema import one_line
    from actbench.store.outputs import check_writable
    from actbench.studies.trust import csv_name, read_table, speed_csv_name

    path = out / (csv_name if device_model is None else speed_csv_name)(device.value, precision.value)
    try:
        check_writable(out)
        read_table(path)  # checked before anything is measured: its rows are written back
    except ValueError as exc:
        fail(one_line(exc))
    if device_model is not None:
        return _speed(device.value, names, chosen, batch_size, image_size, precision.value, path, device_model)
    _memory_trust(device.value, names, chosen, batch_size, image_size, precision.value, path)


def _checked_points(models: str, strategies: str, batch_size: int, image_size: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(model names, strategies) of the points to compare, each refused in one line when out of range."""
    from actbench.execution.parsing import parse_strategies
    from actbench.training.model_names import ModelSpec, validate_model_spec
    from actbench.schema import SizeError
    from actbench.training.tasks import input_size_for

    require_train_batch(batch_size)
    names = tuple(dict.fromkeys(m.strip() for m in models.split(",") if m.strip()))  # each point once
    if not names:
        fail("--models is empty: give at least one model name (see `actbench models`)")
    try:
        for name in names:
            validate_model_spec(ModelSpec(name))
            try:
                input_size_for(name, image_size)
            except SizeError as exc:
                fail(exc.as_option())
        chosen = parse_strategies(strategies)
    except ValueError as exc:
        fail(str(exc))
    if not chosen:
        fail("--strategies is empty: give at least one of fp32, swap, checkpoint, L0..L5")
    return names, chosen


def _memory_trust(device: str, names: tuple[str, ...], chosen: tuple[str, ...], batch_size: int, image_size: str,
                  precision: str, path: Path) -> None:
    """meta ÷ measured bytes per point, printed as each finishes, the CSV at ``path`` kept current (the
    rows it holds and this run's: :func:`~actbench.studies.trust.add_to_table`); exit 1 if one failed."""
    from actbench.store.outputs import OutputError
    from actbench.studies.trust import add_to_table, compare, write_csv

    tag = "" if precision == DEFAULT_PRECISION else f" {precision}"
    console = Console()
    err = Console(stderr=True, highlight=False)
    done = []

    def on_point(c) -> None:
        done.append(c)
        add_to_table(path, done, write_csv)
        console.print(f"{c.model:14s} {c.strategy + tag:10s} activation {_ratio(c.activation_ratio)}  "
                      f"peak {_ratio(c.peak_ratio)}  {c.meta_status}/{c.measured_status} {c.message}",
                      highlight=False, markup=False, soft_wrap=True)

    with terminate_like_ctrl_c():
        try:
            problem = ensure_extension(chosen, device, lambda text: err.print(text, markup=False))
            if problem is not None:
                fail(problem, code=1)
            err.print(f"comparing {len(names) * len(chosen)} points, each predicted on meta and measured on "
                      f"{device} ...", markup=False)
            rows = compare(device, names, chosen, batch_size=batch_size, image_size=image_size, on_point=on_point,
                           precision=precision)
        except OutputError as exc:  # a full disk: the CSV keeps the points written before
            fail(str(exc))
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP
            err.print(f"{interrupted_by(exc)}: {len(done)} finished points kept in {path}", markup=False)
            raise typer.Exit(interrupted_exit_code(exc))
    table = Table(title=f"meta ÷ {device}, batch {batch_size}, {image_size}px{tag} -> {path}")
    for col in ("model", "strategy", "activation", "peak", "status (meta/measured)"):
        table.add_column(col)
    for c in rows:
        table.add_row(c.model, c.strategy + tag, _ratio(c.activation_ratio), _ratio(c.peak_ratio),
                      f"{c.meta_status}/{c.measured_status}")
    console.print(table)
    if not all(c.meta_status == "ok" and c.measured_status == "ok" for c in rows):
        raise typer.Exit(1)


def _speed(device: str, names: tuple[str, ...], chosen: tuple[str, ...], batch_size: int, image_size: str,
           precision: str, path: Path, device_model: Path) -> None:
    """--device-model: trust for speed (actbench.cli.speed_commands), with the options checked above."""
    from actbench.cli.speed_commands import speed_trust

    with terminate_like_ctrl_c():
        problem = ensure_extension(chosen, device, lambda text: typer.echo(text, err=True))
        if problem is not None:
            fail(problem, code=1)
        speed_trust(device, names, tuple(chosen), batch_size, image_size, precision, path, device_model)
