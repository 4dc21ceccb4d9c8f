"""What the harness itself costs: ``actbench bench-harness`` (docs/design.md §7, "Executors and isolation").

Two benchmarks, each running actbench as a user does (a fresh ``python -m actbench`` process, a fresh
run directory), so interpreter start-up, workers, model builds and row writing all count:

- ``sweep_overhead``: a cpu sweep's wall time ÷ the training steps its rows say they ran (``steps_s``:
  warm-up, the memory step and every timed step). 1.0 would be a harness that costs nothing.
- ``plan_jobs``: a meta plan's wall time with ``--jobs 1`` ÷ with ``--jobs N``, and whether both
  found the same maxima (a speed-up that changes answers is no speed-up).

Targets are those of the scale-out work: overhead ≤ 1.3, plan speed-up ≥ 1.6 with two jobs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from actbench.store.results import RunStore

SWEEP_ARGS: tuple[str, ...] = ("sweep-batch", "resnet18", "--levels", "L3", "--batch", "2:8:2", "--image-size", "32",
                               "--device", "cpu")
PLAN_ARGS: tuple[str, ...] = ("plan", "resnet50", "--budget", "16GiB", "--levels", "L0..L5", "--strategies",
                              "swap,checkpoint")
#: smaller versions that finish in seconds (tests, a first look)
QUICK_SWEEP_ARGS: tuple[str, ...] = ("sweep-batch", "resnet18", "--levels", "L3", "--batch", "2,4", "--image-size", "16",
                                     "--device", "cpu", "--timed-steps", "1")
QUICK_PLAN_ARGS: tuple[str, ...] = ("plan", "resnet18", "--budget", "1GiB", "--image-size", "32", "--levels", "L3",
                                    "--strategies", "swap")
OVERHEAD_TARGET = 1.3
SPEEDUP_TARGET = 1.6


@dataclass(frozen=True)
class HarnessBenchRow:
    """One benchmark's result: ``ratio`` against ``target`` (``≤`` for overhead, ``≥`` for speed-up)."""

    benchmark: str
    command: str
    wall_s: float
    reference_s: float  #: sweep: summed steps_s of its rows; plan: the --jobs 1 wall time
    ratio: float
    target: str
    met: bool
    points: int
    detail: str


def _run(args: tuple[str, ...], out: Path, log: Callable[[str], None]) -> float:
    """Run ``actbench ARGS --out OUT`` in a fresh interpreter; its wall seconds. Raises on failure.

    Isolated as every child is (``-P``, a private working directory, no user ``PYTHONPATH``), so a
    ``json.py`` where the user stands never runs.
    """
    from actbench.core.child_env import python_child_env

    command = [sys.executable, "-P", "-m", "actbench", *args, "--out", str(Path(out).absolute())]
    log(f"running: actbench {' '.join(args)}")
    with tempfile.TemporaryDirectory(prefix="actbench-bench-cwd-") as cwd:
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=python_child_env(),
                              stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"actbench {' '.join(args)} exited {done.returncode}: {tail[0]}")
    return wall


def _run_dirs(out: Path) -> list[Path]:
    return sorted(p.parent for p in out.glob("*/rows.jsonl"))


def sweep_overhead(args: tuple[str, ...], work: Path, log: Callable[[str], None]) -> HarnessBenchRow:
    out = work / "sweep"
    wall = _run(args, out, log)
    rows = [r for d in _run_dirs(out) for r in RunStore(d).rows]
    missing = [r.key for r in rows if r.steps_s is None]
    if not rows or missing:
        raise RuntimeError(f"bench-harness: the sweep's rows do not say their step time ({len(missing)} of {len(rows)})")
    steps = sum(r.steps_s for r in rows)
    ratio = wall / steps
    return HarnessBenchRow("sweep_overhead", "actbench " + " ".join(args), round(wall, 2), round(steps, 2),
                           round(ratio, 3), f"<= {OVERHEAD_TARGET}", ratio <= OVERHEAD_TARGET, len(rows),
                           f"{sum(r.steps_run for r in rows)} training steps in {len(rows)} points")


def _maxima(out: Path) -> dict[str, int | None]:
    found: dict[str, int | None] = {}
    for summary in sorted(out.glob("*/summary.json")):
        for strategy, entry in json.loads(summary.read_text())["max"].items():
            found[strategy] = entry.get("max")
    return found


def plan_jobs(args: tuple[str, ...], jobs: int, work: Path, log: Callable[[str], None]) -> HarnessBenchRow:
    serial_out, parallel_out = work / "plan_jobs1", work / f"plan_jobs{jobs}"
    serial = _run(args + ("--jobs", "1"), serial_out, log)
    parallel = _run(args + ("--jobs", str(jobs)), parallel_out, log)
    a, b = _maxima(serial_out), _maxima(parallel_out)
    if not a:
        raise RuntimeError("bench-harness: the plan wrote no summary.json")
    same = a == b
    speedup = serial / parallel
    detail = "same maxima: " + ("yes" if same else f"no ({a} vs {b})") + "; " + ", ".join(f"{k} {v}" for k, v in a.items())
    return HarnessBenchRow("plan_jobs", f"actbench {' '.join(args)} --jobs {jobs} vs --jobs 1", round(parallel, 2),
                           round(serial, 2), round(speedup, 3), f">= {SPEEDUP_TARGET}",
                           same and speedup >= SPEEDUP_TARGET, len(a), detail)


BENCHMARKS: tuple[str, ...] = ("sweep", "plan")


def run_benchmarks(which: tuple[str, ...], quick: bool, jobs: int,
                   log: Callable[[str], None] = lambda _: None) -> list[HarnessBenchRow]:
    """Run the chosen benchmarks in a scratch folder (removed afterwards); rows in order."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="actbench-bench-harness-") as tmp:
        work = Path(tmp)
        if "sweep" in which:
            rows.append(sweep_overhead(QUICK_SWEEP_ARGS if quick else SWEEP_ARGS, work, log))
        if "plan" in which:
            rows.append(plan_jobs(QUICK_PLAN_ARGS if quick else PLAN_ARGS, jobs, work, log))
    return rows
