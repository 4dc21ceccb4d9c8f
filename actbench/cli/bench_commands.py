"""``bench-harness``: what the harness itself costs (actbench/studies/harness_cost.py). Parse, call, render."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from actbench.cli.app import app, checked_out_dir, fail, new_bench_dir, write_bench_csv

console = Console()
err_console = Console(stderr=True)


@app.command("bench-harness")
def bench_harness(
    only: Annotated[str, typer.Option("--only", help="Benchmarks to run, comma list of sweep, plan.")] = "sweep,plan",
    jobs: Annotated[int, typer.Option("--jobs", help="Jobs of the parallel plan (compared with --jobs 1).")] = 2,
    quick: Annotated[bool, typer.Option("--quick", help="Small versions that finish in seconds (a check, not the targets).")] = False,
    out: Annotated[Path, typer.Option("--out", parser=checked_out_dir,
                                      help="Results root; writes OUT/bench-harness_<time>/.")] = Path("runs"),
) -> None:
    """Time the harness itself: a cpu sweep's wall time against the training steps its rows ran, and a
    meta plan with --jobs 1 against --jobs N (same maxima required).

    Each benchmark runs actbench as a user does (a fresh process and run directory), so start-up,
    workers, model builds and row writing count. Targets: sweep overhead <= 1.3 (wall ÷ summed
    steps_s), plan speed-up >= 1.6 with 2 jobs. Writes harness.csv and env.json; about 2-4 minutes
    on 2 cores (--quick: under a minute).

    \b
    Examples:
      actbench bench-harness                       # both benchmarks at the targets' sizes
      actbench bench-harness --only plan --jobs 2  # only plan's speed-up from a second job
      actbench bench-harness --quick               # a first look in under a minute
    """
    from actbench.studies import harness_cost as harness_bench

    which = tuple(dict.fromkeys(w.strip() for w in only.split(",") if w.strip()))
    bad = [w for w in which if w not in harness_bench.BENCHMARKS]
    if bad or not which:
        fail(f"--only must list {', '.join(harness_bench.BENCHMARKS)}, got {only!r}")
    if jobs < 2:
        fail(f"--jobs must be >= 2 (it is compared with --jobs 1), got {jobs}")
    from actbench.execution.executors import cpu_count

    if jobs > max(2, cpu_count()):
        fail(f"--jobs must be between 2 and {max(2, cpu_count())} (this machine's cores: each job of the plan takes "
             f"one), got {jobs}")
    run_dir = new_bench_dir(out, "bench-harness", "cpu")
    try:
        rows = harness_bench.run_benchmarks(which, quick, jobs, log=lambda line: err_console.print(escape(line)))
    except RuntimeError as err:
        fail(str(err), code=1)
    csv_path = run_dir / "harness.csv"
    write_bench_csv(csv_path, harness_bench.HarnessBenchRow, rows)
    table = Table(title="bench-harness" + (" (quick: not the targets' sizes)" if quick else ""))
    for name in ("benchmark", "wall s", "reference s", "ratio", "target", "", "detail"):
        table.add_column(name)
    for row in rows:
        table.add_row(row.benchmark, f"{row.wall_s:.1f}", f"{row.reference_s:.1f}", f"{row.ratio:.2f}", row.target,
                      "[green]met[/]" if row.met else "[red]missed[/]", escape(row.detail))
    console.print(table)
    console.print(f"wrote {escape(str(csv_path))}")
