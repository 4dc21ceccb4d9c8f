"""The Typer app shared by every command module, and options used by several commands."""

import enum
from typing import NoReturn

import typer

from actbench.devices import DEVICE_NAMES, MEASURING_DEVICES, profile

app = typer.Typer(
    name="actbench",
    help=(
        "Benchmark memory-saving training strategies (ActNN levels L0-L5, swapping, checkpointing) "
        "against plain fp32 on torchvision models: memory, maximum batch/depth/width/resolution, "
        "and throughput. Rows go to results/<run>/rows.jsonl and table.csv."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one clear line on stderr and exit with ``code`` (used for every bad input)."""
    typer.echo(f"actbench: error: {message}", err=True)
    raise typer.Exit(code)


#: --device choices, from the device profiles (actbench/devices.py).
Device = enum.Enum("Device", {name: name for name in DEVICE_NAMES}, type=str)
#: Devices that compute (not meta): bench-kernels, verify-grads, trust.
MeasuringDevice = enum.Enum("MeasuringDevice", {name: name for name in MEASURING_DEVICES}, type=str)


#: What to do without a GPU when the question is memory or scale: predict it.
PREDICT_INSTEAD = ("without a GPU, predict with --device meta --budget 16GiB (or `actbench plan`), "
                   "or measure small sizes with --device cpu --image-size 64")


def require_device(name: str, instead: str = "use --device cpu") -> None:
    """Exit 2 with one line when this machine cannot run points on device ``name`` (e.g. no GPU).

    Called before anything is written; the profile says why, ``instead`` what to do.
    """
    reason = profile(name).unavailable()
    if reason is not None:
        fail(f"{reason}; {instead}")
