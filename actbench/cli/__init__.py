"""The ``actbench`` command line. Each module registers the commands of one room on the app."""

from actbench.cli.app import app
from actbench.cli import extension_commands  # noqa: F401  (registers doctor, build, bench-kernels)
from actbench.cli import harness_commands  # noqa: F401  (registers models, sweep-batch, max-scale, throughput, memory, plan)
from actbench.cli import trust_commands  # noqa: F401  (registers trust)
from actbench.cli import actnn_commands  # noqa: F401  (registers verify-grads)
from actbench.cli import report_commands  # noqa: F401  (registers plot, report)
from actbench.cli import experiment_commands  # noqa: F401  (registers run)


def main() -> None:
    app()
