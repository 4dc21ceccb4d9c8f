"""``python -m actbench`` runs the command line (used where the console script is not installed)."""

from actbench.cli import main

main()
