"""The Typer app shared by every command module, and options used by several commands."""

from typing import NoReturn

import typer

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


def require_cuda() -> None:
    """Exit 2 with one line when ``--device cuda`` meets a torch that sees no GPU.

    Called before anything is written. ``is_available()`` asks the driver for a device count; it
    creates no CUDA context in this process.
    """
    import torch

    if not torch.cuda.is_available():
        fail(f"--device cuda: torch {torch.__version__} sees no CUDA GPU here; use --device cpu")
