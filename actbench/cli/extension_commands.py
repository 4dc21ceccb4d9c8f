"""Extension commands: doctor, build, bench-kernels. Parse, call the library, render."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from actbench.cli.app import (MeasuringDevice, app, checked_out_dir, fail, new_bench_dir, require_device,
                              write_bench_csv)

console = Console()
err_console = Console(stderr=True)

#: bench-kernels' most timed calls per point: a median and IQR of 1000 samples are long settled, and every
#: op at every size is timed that often (a typo like 100000000 would run for days).
MAX_REPEATS = 1000
#: bench-kernels' largest input size, in MiB of fp32 (1 PiB): beyond any machine's memory, so sizes are
#: refused by what fits (kernels.bench.check_sizes_fit), not by this bound, which keeps the numbers sane.
MAX_SIZE_MIB = 2**30


@app.command()
def doctor() -> None:
    """Show torch, CUDA, nvcc and GPU as found; build/load the extension and self-check it.

    Exits non-zero when something is broken, with the cause on the failing line.
    """
    from actbench.kernels.doctor import diagnose

    report = diagnose()
    table = Table(title="actbench doctor", show_header=True)
    table.add_column("check")
    table.add_column("")
    table.add_column("detail", overflow="fold")
    for c in report.checks:
        table.add_row(c.name, "[green]ok[/]" if c.ok else "[red]FAIL[/]", c.detail)
    console.print(table)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def build(
    force: Annotated[bool, typer.Option("--force", help="Delete the cached build and compile from scratch.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show the compiler output.")] = False,
) -> None:
    """Compile actbench's C++/CUDA extension now (otherwise it builds on first use, once).

    CUDA kernels are compiled whenever nvcc is found (set ACTBENCH_WITH_CUDA=0 to skip them);
    TORCH_CUDA_ARCH_LIST picks the GPU architectures. The build is cached under
    ~/.cache/actbench (or $ACTBENCH_CACHE_DIR), keyed by sources, torch version and CUDA.
    """
    from actbench.kernels import extension

    start = time.perf_counter()
    try:
        plan = extension.load(force_rebuild=force, verbose=verbose)
    except extension.ExtensionError as err:
        fail(str(err), code=1)
    kinds = f"CPU + CUDA ({plan.cuda_archs})" if plan.with_cuda else "CPU only"
    console.print(f"extension ready: {kinds}, {plan.library} ({time.perf_counter() - start:.1f} s)")


def _parse_sizes(text: str) -> tuple[int, ...]:
    """--sizes-mib by the list parser every command's sizes go through (an empty entry is refused)."""
    from actbench.execution.parsing import parse_int_range

    try:
        return parse_int_range(text, "--sizes-mib", largest=MAX_SIZE_MIB)
    except ValueError as exc:
        fail(str(exc))


def _parse_bits(text: str) -> tuple[int, ...]:
    bits = tuple(s.strip() for s in text.split(",") if s.strip())
    if not bits or any(b not in ("1", "2", "4", "8") for b in bits):
        fail(f"--bits must be a comma list of 1, 2, 4, 8, got {text!r}")
    return tuple(int(b) for b in bits)


@app.command("bench-kernels")
def bench_kernels(
    device: Annotated[MeasuringDevice, typer.Option("--device", help="The device to time on.")] = MeasuringDevice.cpu,
    sizes_mib: Annotated[str, typer.Option("--sizes-mib", help="Input sizes in MiB of fp32.")] = "1,4,16,64,256,1024",
    bits: Annotated[str, typer.Option("--bits", help="Bit widths to time, comma list of 1,2,4,8.")] = "2",
    repeats: Annotated[int, typer.Option("--repeats", help=(
        f"Timed calls per point (after one warm-up), 1..{MAX_REPEATS}."))] = 5,
    oracle_max_mib: Annotated[
        int, typer.Option("--oracle-max-mib", help="Time the pure-torch oracle up to this size (0: never).")
    ] = 256,
    out: Annotated[Path, typer.Option("--out", parser=checked_out_dir,
                                      help="Results root; writes OUT/bench-kernels_<device>_<time>/.")] = Path("runs"),
) -> None:
    """Time every op of the extension against a plain copy, the oracle and torch's own ops.

    Ops: quantize (one pass: ranges and codes), dequantize, their per-sample-bits forms, group
    min/max, mask pack/unpack/apply (pack and unpack against x > 0, apply against
    threshold_backward) and the max pool with its backward (against max_pool2d_with_indices). Sizes
    that cannot fit in memory are refused before anything runs. Rates are GB/s of fp32 input. Each
    op is timed in turn with x.clone() of its input, the bandwidth ceiling the kernels are judged
    against, and with torch's op, one sample of each per round (targets at 256 MiB: >= 90% of copy
    and no slower than torch's op, on CPU also >= 5x the oracle). On cuda each timed sample is 10
    back-to-back calls between two
    synchronisations (the ops never synchronise, so launches overlap kernels as in training).
    Writes kernels.csv and env.json; prints a table.
    """
    from actbench.kernels import bench as kernel_bench
    from actbench.store.outputs import atomic_write_csv

    config = _kernel_config(device.value, sizes_mib, bits, repeats, oracle_max_mib)
    run_dir = new_bench_dir(out, f"bench-kernels_{config.device}", config.device)
    fields = [f.name for f in dataclasses.fields(kernel_bench.KernelRow)]
    csv_path = run_dir / "kernels.csv"
    table = Table(title=f"bench-kernels on {config.device} (GB/s of fp32 input)")
    for name in ("size", "op", "backend", "bits", "GB/s", "copy GB/s", "of copy", "vs ref", "vs torch"):
        table.add_column(name, justify="right")
    done: list[list] = []

    def on_row(row: kernel_bench.KernelRow) -> None:
        done.append([getattr(row, n) for n in fields])
        atomic_write_csv(csv_path, fields, done, "CSV")  # rewritten whole: rows survive an interrupted run
        err_console.print(f"  {row.input_bytes // 2**20} MiB {row.op} {row.backend}: {row.input_gb_per_s:.2f} GB/s")
        table.add_row(*_kernel_cells(row))

    try:
        rows = kernel_bench.run(config, on_row=on_row)
    except ValueError as err:  # OutputError too: the rows written so far stay in the CSV
        fail(str(err))
    console.print(table)
    for text, ok in kernel_bench.verdicts(rows, config.device):
        console.print(("[green]met[/]  " if ok else "[red]missed[/] ") + text)
    console.print(f"wrote {csv_path}")


def _kernel_config(device: str, sizes_mib: str, bits: str, repeats: int, oracle_max_mib: int):
    """bench-kernels' options checked (sizes that cannot fit refused before anything runs)."""
    from actbench.kernels import bench as kernel_bench

    from actbench.execution.parsing import check_int

    try:
        check_int(repeats, "--repeats", MAX_REPEATS)
        check_int(oracle_max_mib, "--oracle-max-mib", MAX_SIZE_MIB, smallest=0)
    except ValueError as err:
        fail(str(err))
    require_device(device)
    config = kernel_bench.KernelBenchConfig(device=device, sizes_mib=_parse_sizes(sizes_mib), bits=_parse_bits(bits),
                                            repeats=repeats, oracle_max_mib=oracle_max_mib)
    try:
        kernel_bench.check_sizes_fit(config)
    except ValueError as err:
        fail(str(err))
    return config


def _kernel_cells(row) -> tuple[str, ...]:
    """One bench-kernels row as the table prints it."""
    return (f"{row.input_bytes // 2**20} MiB", row.op, row.backend, str(row.bits or ""), f"{row.input_gb_per_s:.2f}",
            f"{row.copy_gb_per_s:.2f}", f"{row.fraction_of_copy:.0%}",
            f"{row.speedup_vs_oracle:.1f}x" if row.speedup_vs_oracle else "",
            f"{row.speedup_vs_torch:.2f}x" if row.speedup_vs_torch else "")


@app.command("bench-actnn")
def bench_actnn(
    device: Annotated[MeasuringDevice, typer.Option("--device", help="The device to time on.")] = MeasuringDevice.cpu,
    quick: Annotated[bool, typer.Option("--quick", help="ResNet-18, batch 2, 32 px, one timed step: a check, not the targets.")] = False,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, max=50,
                                               help="Times the table is run (default 3; 1 with --quick); each ratio is "
                                                    "the median over the rounds, with its range (one round on a shared "
                                                    "machine moves by up to 0.15). With --in-turn: steps of each "
                                                    "strategy (default 10; 3 with --quick).")] = None,
    in_turn: Annotated[bool, typer.Option("--in-turn",
                                          help="Build every strategy's step in this one process and time one step of "
                                               "each in turn, round after round: each ratio is the median of the "
                                               "rounds' own ratios, so load that drifts reaches every strategy alike. "
                                               "For comparing two builds; a user's run is the default's fresh process.")] = False,
    out: Annotated[Path, typer.Option("--out", parser=checked_out_dir,
                                      help="Results root; writes OUT/bench-actnn_<device>_<time>/.")] = Path("runs"),
) -> None:
    """What ActNN costs in speed: img/s of fp32, L0, L1, L3 and checkpoint, and each one's ratio to fp32.

    Runs `actbench throughput MODEL --strategies fp32,L0,L1,L3,checkpoint --image-size 112` for
    ResNet-18 at batch 16 and ResNet-50 at batch 8, each in a fresh process, points one at a time,
    --rounds times (models taking turns). Targets: L0 >= 0.95x fp32, L3 >= 0.80x, judged on the
    median ratio. Writes actnn.csv and env.json; prints a table. With --in-turn the same table comes
    from one process, every strategy's step timed in turn (steadier on a shared machine).

    \b
    Examples:
      actbench bench-actnn                 # the table, three rounds, on cpu (about 4 minutes on 2 cores)
      actbench bench-actnn --rounds 1      # one round: a quicker look, noisier
      actbench bench-actnn --in-turn       # ten steps of each strategy in turn, one process
      actbench bench-actnn --quick         # a check in about a minute
    """
    from actbench.studies import actnn_cost as actnn_bench

    device = device.value
    require_device(device)
    run_dir = new_bench_dir(out, f"bench-actnn_{device}", device)
    try:
        default_rounds = (3 if quick else actnn_bench.IN_TURN_ROUNDS) if in_turn else (1 if quick else 3)
        rows = actnn_bench.run(device, quick, rounds=rounds or default_rounds,
                               log=lambda line: err_console.print(line, markup=False), in_turn=in_turn)
    except RuntimeError as err:
        fail(str(err), code=1)
    csv_path = run_dir / "actnn.csv"
    write_bench_csv(csv_path, actnn_bench.ActnnBenchRow, rows)
    table = Table(title=f"bench-actnn on {device}" + (" (quick: not the targets' sizes)" if quick else ""))
    for name in ("model", "batch", "px", "strategy", "img/s", "x fp32", "range", "target", ""):
        table.add_column(name, justify="right")
    for r in rows:
        verdict = "" if r.met is None else ("[green]met[/]" if r.met else "[red]missed[/]")
        table.add_row(r.model, str(r.batch_size), str(r.image_size), r.strategy,
                      "" if r.images_per_s is None else f"{r.images_per_s:.2f}",
                      "" if r.ratio_to_fp32 is None else f"{r.ratio_to_fp32:.2f}",
                      "" if r.ratio_min is None or r.rounds < 2 else f"{r.ratio_min:.2f}-{r.ratio_max:.2f}", r.target, verdict)
    console.print(table)
    console.print(f"wrote {csv_path}")
