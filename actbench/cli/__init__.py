"""The ``actbench`` command line. Each module registers the commands of one group on the app."""

from actbench.cli.app import app
from actbench.cli import extension_commands  # noqa: F401  (registers doctor, build, bench-kernels)
from actbench.cli import harness_commands  # noqa: F401  (registers models, sweep-batch, max-scale, throughput, memory, plan)
from actbench.cli import trust_commands  # noqa: F401  (registers trust)
from actbench.cli import actnn_commands  # noqa: F401  (registers verify-grads)
from actbench.cli import report_commands  # noqa: F401  (registers plot, report)
from actbench.cli import experiment_commands  # noqa: F401  (registers run)
from actbench.cli import bench_commands  # noqa: F401  (registers bench-harness)
from actbench.cli import speed_commands  # noqa: F401  (registers calibrate)


@app.callback()
def check_environment() -> None:
    """Before any command: the environment variables actbench reads are checked as its options are
    (one line naming the variable, exit 2, nothing written), and ``ACTBENCH_CACHE_DIR`` is made
    absolute here, so every child (whose working directory is private) finds the same cache."""
    import os

    from actbench.kernels import extension
    from actbench.cli.app import fail
    from actbench.core.devices import exact_steps

    try:
        exact_steps()
        os.environ.update(extension.check_environment())
    except (ValueError, extension.ExtensionError) as exc:
        fail(str(exc))


def main() -> None:
    """Run the app; a usage error (unknown option, a value outside its choices) is one line on stderr.

    Typer would print a usage block and a boxed message; the project's rule for bad input is one line
    naming the value and what is allowed, exit code 2 (as ``actbench.cli.app.fail`` does).
    """
    import sys

    import typer

    # Typer may carry its own copy of click: take the exception classes from Typer's own.
    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    click_exception = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    try:
        code = app(standalone_mode=False)
    except usage_error as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "actbench"
        message = " ".join(exc.format_message().replace("Value error, ", "").split())
        typer.echo(f"actbench: error: {message} (see '{command} --help')", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:  # Ctrl-C outside a command's own handling
        typer.echo("Aborted.", err=True)
        sys.exit(1)
    except click_exception as exc:
        typer.echo(f"actbench: error: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
