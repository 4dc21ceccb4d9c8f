"""Speed commands: ``actbench calibrate`` (this machine's device model) and the ``--device-model`` option.

Thin: validate, call actbench.planning, print. The step-time model and the device models are in
:mod:`actbench.planning`; docs/design.md §11 says how a step is priced.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from actbench.cli.app import (Gpu, MeasuringDevice, app, fail, refuse_control_characters, refuse_run_file,
                              require_device, require_train_batch)
from actbench.cli.options import ImageSizeOpt
from actbench.schema import one_line


def use_device_model(path: Optional[Path]) -> None:
    """Load ``path`` up front (exit 2 with one line when it is not a device model) and have every point of
    this run, in this process and its children, predicted on it."""
    from actbench.planning.device_models import DEVICE_MODEL_ENV, load_device_model

    if path is None:
        return
    try:
        load_device_model(path)
    except ValueError as exc:
        fail(f"--device-model: {exc}")
    os.environ[DEVICE_MODEL_ENV] = str(Path(path).resolve())


@app.command("calibrate")
def calibrate_command(
    device: Annotated[MeasuringDevice, typer.Option("--device", help="The device of this machine to measure.")] = MeasuringDevice.cpu,
    out: Annotated[Optional[Path], typer.Option("--out", help=(
        "Device-model file to write (default runs/device_models/<device>.json).")) ] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="The model's name in rows (default calibrated-<device>).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Small probes (seconds; for tests): a rough model.")] = False,
) -> None:
    """Measure this machine's device and write its device model (JSON) for --device-model.

    Times matmuls and convolutions at a few shapes and dtypes, copies, elementwise ops, reductions, a
    tiny op's cost per call and, on cuda, the kernel launch gap and pinned host<->device copies. Under a
    minute on a CPU (the machine should be otherwise idle: a shared CPU gives a slower, noisier model).

    \b
    Examples:
      actbench calibrate --device cpu
      actbench throughput resnet18 --device cpu --batch 8 --image-size 64 --device-model runs/device_models/cpu.json
    """
    from actbench.planning.device_models import save_device_model

    if name is not None and not name.strip():
        fail("--name is empty: give the model a name, e.g. --name my-laptop")
    if name is not None:
        refuse_control_characters("--name", name, "a name")
    if out is not None:
        refuse_control_characters("--out", str(out))
        if not str(out).strip() or str(out) == ".":
            fail(f"--out must name a file, e.g. runs/device_models/{device.value}.json, got {str(out)!r}")
    require_device(device.value)
    path = out if out is not None else Path("runs/device_models") / f"{device.value}.json"
    refuse_run_file("--out", path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--out: cannot create folder '{path.parent}': {exc.strerror or exc}")
    if path.is_dir():
        fail(f"--out '{path}' is a folder; give a file name, e.g. {path / (device.value + '.json')}")
    if path.exists() and not path.is_file():
        fail(f"--out '{path}' is a device, pipe or socket; give a file name, e.g. runs/device_models/{device.value}.json")
    model = _calibrated(device.value, quick, name)
    try:
        save_device_model(model, path)
    except (OSError, ValueError) as exc:  # ValueError: the store's OutputError (a full disk, a special file)
        fail(f"--out: cannot write '{path}': {getattr(exc, 'strerror', None) or exc}")
    _print_model(model, path)


def _calibrated(device: str, quick: bool, name: Optional[str]):
    from actbench.measure.calibrate import QUICK, calibrate

    typer.echo(f"calibrating {device}{' (quick)' if quick else ''} ...", err=True)
    return calibrate(device, QUICK if quick else None, name=name.strip() if name else None)


def _print_model(model, path: Path) -> None:
    peaks = ", ".join(f"{d} {v / 1e9:.1f}" for d, v in model.peak_flops.items())
    typer.echo(f"{model.name} ({model.label}) -> {path}")
    typer.echo(f"  peak GFLOP/s {peaks} (x {model.compute_efficiency:.2f} in a step); DRAM "
               f"{model.dram_bytes_per_s / 1e9:.2f} GB/s (x {model.memory_efficiency:.2f}); copies "
               f"{model.h2d_bytes_per_s / 1e9:.2f}/{model.d2h_bytes_per_s / 1e9:.2f} GB/s; host "
               f"{model.host_op_s * 1e6:.2f} us/op; launch {model.launch_s * 1e6:.2f} us; strategy calls "
               + (", ".join(f"{k} {v * 1e6:.0f} us" for k, v in sorted(model.strategy_call_s.items())) or "none"))


def speed_trust(device: str, models: tuple[str, ...], strategies: tuple[str, ...], batch_size: int, image_size: str,
                precision: str, path: Path, model_path: Path) -> None:
    """``actbench trust --device-model FILE``: predicted ÷ measured step time per point, printed as each
    finishes, ``path`` (``OUT/speed_vs_<device>.csv``) kept current with the rows it holds and this run's;
    exit 1 if a point failed."""
    from rich.console import Console
    from rich.table import Table

    from actbench.studies.trust import (add_to_table, compare_speed, describe_speed_order, speed_order_misses,
                                        write_speed_csv)
    from actbench.planning.device_models import load_device_model
    from actbench.store.outputs import OutputError

    try:
        speed_model = load_device_model(model_path)
    except ValueError as exc:
        fail(f"--device-model: {exc}")
    console, done = Console(), []

    def on_point(c) -> None:
        done.append(c)
        add_to_table(path, done, write_speed_csv)
        console.print(f"{c.model:12s} {c.strategy:10s} predicted {_seconds(c.predicted_step_s)}  measured "
                      f"{_seconds(c.measured_step_s)} (spread {_share(c.measured_spread)})  ratio "
                      f"{_share(c.step_ratio, '.3f')}  {c.predicted_status}/{c.measured_status} {c.message}",
                      highlight=False, markup=False, soft_wrap=True)

    typer.echo(f"timing {len(models) * len(strategies)} points on {device}, each also predicted on meta with "
               f"{speed_model.name} ...", err=True)
    try:
        rows = compare_speed(device, speed_model, models, strategies, batch_size, image_size, on_point=on_point,
                             precision=precision)
    except OutputError as exc:  # a full disk: the CSV keeps the points written before
        fail(str(exc))
    table = Table(title=f"predicted ({speed_model.name}) ÷ measured step time on {device}, batch {batch_size}, "
                        f"{image_size}px -> {path}")
    for col in ("model", "strategy", "predicted s", "measured s", "ratio", "status"):
        table.add_column(col)
    for c in rows:
        table.add_row(c.model, c.strategy, _seconds(c.predicted_step_s), _seconds(c.measured_step_s),
                      _share(c.step_ratio, ".3f"), f"{c.predicted_status}/{c.measured_status}")
    console.print(table)
    console.print(describe_speed_order(speed_order_misses(rows)), highlight=False, markup=False)
    if not all(c.predicted_status == "ok" and c.measured_status == "ok" for c in rows):
        raise typer.Exit(1)


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4f}"


def _share(value: Optional[float], spec: str = ".0%") -> str:
    return "-" if value is None else format(value, spec)


#: What ``fastest`` compares without --strategies: the baseline, the classic savers and every ActNN level.
FASTEST_DEFAULT = "fp32,checkpoint,swap,L0,L1,L2,L3,L4,L5"


@app.command("fastest")
def fastest_command(
    model: Annotated[str, typer.Argument(help="Model name (see `actbench models`).")],
    gpu: Annotated[Gpu, typer.Option("--gpu", help="The GPU to plan for (a profile of actbench/core/gpus.py).")],
    batch_size: Annotated[int, typer.Option("--batch", help="Batch size to train at.")],
    image_size: ImageSizeOpt = None,
    strategies: Annotated[str, typer.Option("--strategies", help="Comma list of strategies and levels.")] = FASTEST_DEFAULT,
) -> None:
    """Which strategy trains MODEL at BATCH fastest on a GPU you may not have (predicted on meta).

    Per strategy: fits or not on the GPU (the caching-allocator model, docs/design.md §10), predicted
    peak and reserved bytes, and predicted samples/s on the GPU's built-in speed model (§11); those that
    fit come first, fastest first.

    \b
    Examples:
      actbench fastest resnet50 --gpu t4 --batch 300
      actbench fastest resnet18 --gpu a100-80gb --batch 1024 --image-size 128 --strategies fp32,L3,swap
    """
    from actbench.core.gpus import gpu_spec
    from actbench.training.model_names import ModelSpec, validate_model_spec
    from actbench.execution.parsing import parse_strategies
    from actbench.schema import SizeError
    from actbench.training.tasks import input_size_for

    try:
        spec = gpu_spec(gpu.value)
        validate_model_spec(ModelSpec(model))
        size = input_size_for(model, image_size)  # the sizes every command takes, and the least this model trains at
        chosen = parse_strategies(strategies)
    except SizeError as exc:
        fail(exc.as_option())
    except ValueError as exc:
        fail(str(exc))
    require_train_batch(batch_size)
    if not chosen:
        fail("--strategies is empty: give at least one of fp32, swap, checkpoint, L0..L5")
    _print_choices(model, spec, batch_size, size.text(), _choices(model, spec, batch_size, size, chosen))


def _choices(model: str, gpu, batch_size: int, size, chosen: tuple[str, ...]) -> list:
    from actbench.measure.meta import MetaSessions
    from actbench.planning.device_models import gpu_speed_model
    from actbench.planning.point import Point
    from actbench.planning.step_time import StrategyChoice
    from actbench.schema import ModelSpec, PointConfig
    from actbench.worker import error_measurement

    sessions = MetaSessions(speed_model=gpu_speed_model(gpu.name))
    out = []
    for strategy in chosen:
        typer.echo(f"predicting {model} {strategy} b{batch_size} {size.text()}px on {gpu.name} ...", err=True)
        point = Point.resolve(PointConfig(ModelSpec(model), strategy, batch_size, **size.point_fields(),
                                          device="meta", budget_bytes=gpu.usable_bytes, timed_steps=0,
                                          gpu=gpu.name))
        try:
            m = sessions.measure_point(point)
        except Exception as exc:  # a step that cannot run: its row says why in one line, as every command's
            m = error_measurement(exc)
        out.append(StrategyChoice(strategy, m.status, m.peak_alloc_bytes, m.reserved_bytes,
                                  m.predicted_samples_per_s, m.message))
    return out


def _print_choices(model: str, gpu, batch_size: int, image_size: str, choices: list) -> None:
    from rich.console import Console
    from rich.table import Table

    from actbench.schema import format_bytes
    from actbench.planning.step_time import fastest_first

    table = Table(title=f"{model} batch {batch_size}, {image_size}px on {gpu.describe()} (predicted on meta)")
    for col in ("strategy", "fits", "peak", "reserved", "samples/s (predicted)", "message"):
        table.add_column(col)
    for c in fastest_first(choices):
        speed = "-" if c.predicted_samples_per_s is None or not c.fits else f"{c.predicted_samples_per_s:.1f}"
        table.add_row(c.strategy, "yes" if c.fits else "no", format_bytes(c.peak_alloc_bytes),
                      format_bytes(c.reserved_bytes), speed, one_line(c.message, 60))
    Console().print(table)


@app.command("repredict")
def repredict_command(
    rows: Annotated[Path, typer.Argument(help="A speed_vs_<device>.csv from `actbench trust --device-model`.")],
    device_model: Annotated[Path, typer.Option("--device-model", help=(
        "Device-model file to price every row on: a calibrated model, or a built-in one saved as a file."))],
    out: Annotated[Path, typer.Option("--out", help="CSV to write (the measured rows, predicted anew).")],
) -> None:
    """Predict measured speed rows again on meta, on a device model (a changed one, a GPU not at hand).

    Measured columns are copied as they were; predicted_step_s is the new prediction, and the row's
    earlier one stays in predicted_step_s_earlier (its model in device_model_earlier). A line that is not
    a measured point (an unknown model, strategy, precision, device or status, a size out of range, a
    time that is not a positive number) is skipped with one warning naming file, line and field; with no
    row left, OUT is not written and the exit code is 2.

    \b
    Example:
      actbench repredict results/gpu/h200_2026-12-04/second/datasheet/speed_vs_cuda.csv --device-model h200.json --out h200_again.csv
    """
    from actbench.planning.device_models import load_device_model
    from actbench.store.outputs import OutputError, check_output
    from actbench.studies.repredict import read_speed_csv, repredict_speed
    from actbench.studies.trust import describe_speed_order, speed_order_misses, write_speed_csv

    refuse_control_characters("--out", str(out))
    refuse_run_file("--out", out)
    try:
        model = load_device_model(device_model)
        check_output(out, [rows, device_model])
        measured = read_speed_csv(rows)
    except (ValueError, OutputError) as exc:
        fail(one_line(str(exc)))
    again = repredict_speed(measured, model)
    try:
        write_speed_csv(again, out)
    except OutputError as exc:
        fail(str(exc))
    for r in again:
        earlier = "-" if r.predicted_step_s_earlier is None or not r.measured_step_s else \
            f"{r.predicted_step_s_earlier / r.measured_step_s:.3f}"
        failed = "" if r.predicted_status == "ok" else f" {r.predicted_status}: {r.message}"
        typer.echo(f"{r.model} {r.strategy} b{r.batch_size} {r.image_size}px: predicted ÷ measured {earlier} "
                   f"({r.device_model_earlier}) -> {_share(r.step_ratio, '.3f')} ({r.device_model}){failed}")
    typer.echo(describe_speed_order(speed_order_misses(again)))
