"""Scale-out (docs/design.md §7 "Executors and isolation"): several points at once, Slurm
job arrays through submitit, persistent workers.

- a parallel run (strategies side by side, a grid all at once, a linear scan's certain next points
  together) records the keys and statuses a serial run does, in the same order;
- several writers keep one run directory consistent: one row per key, a table that agrees;
- a persistent worker gives the memory figures a fresh child gives; a crash, an oom or a timeout
  costs one row and the next point is measured by a fresh worker;
- the slurm path runs real (tiny) points through submitit's debug and local executors; a killed
  task becomes an error row naming the job and its log; a rerun resumes;
- options that do not go together, and Slurm where there is none, are one-line errors.

Scripted executors (no torch) cover the protocol; real points are resnet18 at 16 px, batch 2-4, on
cpu with no timed steps (memory only), or meta.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest
from typer.testing import CliRunner

from actbench import strategies as registry
from actbench.core.devices import PROFILES
from actbench.execution.executors import ChildProcessExecutor
from actbench.store.results import RunStore
from actbench.execution.execution_options import ExecutionOptions, SlurmOptions, parse_time_minutes
from actbench.execution.local_run import run_local, scan_window, split
from actbench.execution.scaleout import execute
from actbench.schema import InputSize, MEMORY_FAILURES, Measurement, ModelSpec, PointConfig
from actbench.planning.configs import GridConfig, SweepConfig
from actbench.planning.point import Point
from actbench.planning.search import run_grid, run_sweep
from actbench.planning.settings import MeasureSettings
from workers import live_workers

FAULT_ENV = "ACTBENCH_TEST_FAULT"
JOB_FAULT_ENV = "ACTBENCH_TEST_JOB_FAULT"


# --- helpers --------------------------------------------------------------------------------------
class Scripted:
    """A thread-safe executor that answers from a script, with a delay; records what ran at once.

    ``statuses[(strategy, batch)]`` (default ok); with a ``budget``, a peak of 1000 bytes per sample
    over it is ``over_budget`` (so guided searches have peaks to aim with).
    """

    def __init__(self, statuses: dict[tuple[str, int], str] | None = None, delay_s: float = 0.05,
                 budget: int | None = None) -> None:
        self.statuses = statuses or {}
        self.delay_s = delay_s
        self.budget = budget
        self.calls: list[tuple[str, int]] = []
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def measure(self, points: Iterable[Point]) -> Iterator[Measurement]:
        for p in points:
            with self._lock:
                self.calls.append((p.strategy.name, p.batch_size))
                self.running += 1
                self.most = max(self.most, self.running)
            time.sleep(self.delay_s)
            with self._lock:
                self.running -= 1
            peak = 1000 * p.batch_size
            status = self.statuses.get((p.strategy.name, p.batch_size), "ok")
            if status == "ok" and self.budget is not None and peak > self.budget:
                status = "over_budget"
            yield Measurement(status=status, message="" if status == "ok" else f"scripted {status}",
                              peak_alloc_bytes=peak if status in ("ok", "over_budget") else None,
                              activation_bytes=peak)

    def environment(self, device) -> dict[str, Any]:
        return {"device": device.name, "scripted": True}


def lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


def table(run_dir: Path) -> list[dict]:
    with (run_dir / "table.csv").open() as fh:
        return list(csv.DictReader(fh))


def resolved(*names: str) -> tuple:
    """The strategies called ``names``, as search configs hold them."""
    return tuple(registry.get(n) for n in names)


def names(strategies) -> tuple[str, ...]:
    return tuple(s.name for s in strategies)


def sweep(strategies=("fp32", "L3"), batches=tuple(range(2, 18, 2)), stop_after=2, find_max=False,
          budget=None, device="meta") -> SweepConfig:
    settings = MeasureSettings(device=PROFILES[device], budget_bytes=budget, warmup_steps=1, timed_steps=0)
    return SweepConfig(ModelSpec("resnet18"), resolved(*strategies), batches, InputSize(16, 16), settings, stop_after, find_max)


def shape(outcome) -> list[tuple[str, int, str]]:
    return [(r.strategy, r.batch_size, r.status) for r in outcome.rows]


# --- the protocol: parallel = serial --------------------------------------------------------------
def test_scan_window_measures_only_points_a_serial_scan_measures() -> None:
    assert scan_window(stop_after=2, failures=0, width=8, left=10) == 2
    assert scan_window(stop_after=2, failures=1, width=8, left=10) == 1
    assert scan_window(stop_after=3, failures=0, width=2, left=10) == 2
    assert scan_window(stop_after=3, failures=0, width=8, left=1) == 1


PATTERNS = [
    {},
    {("fp32", 6): "oom", ("fp32", 8): "oom"},
    {("fp32", 4): "error", ("fp32", 8): "oom", ("fp32", 10): "oom", ("L3", 2): "timeout", ("L3", 6): "oom"},
    {("L3", 2): "oom", ("L3", 4): "oom"},
    {("fp32", 2): "error", ("fp32", 6): "oom", ("fp32", 12): "oom", ("fp32", 14): "oom", ("L3", 16): "oom"},
]


@pytest.mark.parametrize("stop_after", [1, 2, 3])
@pytest.mark.parametrize("pattern", range(len(PATTERNS)))
def test_a_parallel_scan_records_what_a_serial_one_does(tmp_path: Path, pattern: int, stop_after: int) -> None:
    cfg = sweep(stop_after=stop_after)
    serial_ex, parallel_ex = Scripted(PATTERNS[pattern], 0.0), Scripted(PATTERNS[pattern], 0.02)
    serial = run_local(run_sweep, cfg, tmp_path / "serial", executor=serial_ex)
    parallel = run_local(run_sweep, cfg, tmp_path / "parallel", options=ExecutionOptions(jobs=4), executor=parallel_ex)
    assert shape(parallel) == shape(serial)
    assert parallel.maxima == serial.maxima and parallel.summary() == serial.summary()
    assert sorted(parallel_ex.calls) == sorted(serial_ex.calls)  # nothing measured that a serial scan skips
    assert [(r["key"], r["status"]) for r in sorted(lines(tmp_path / "parallel"), key=lambda r: r["key"])] == \
        [(r["key"], r["status"]) for r in sorted(lines(tmp_path / "serial"), key=lambda r: r["key"])]
    assert parallel_ex.most <= 4


def test_strategies_and_scans_really_run_side_by_side(tmp_path: Path) -> None:
    ex = Scripted(delay_s=0.2)
    run_local(run_sweep, sweep(strategies=("fp32", "L3")), tmp_path / "run", options=ExecutionOptions(jobs=4),
              executor=ex)
    assert ex.most == 4  # two strategies, each scan with its next two (certain) points at once


def test_guided_searches_and_grids_in_parallel_give_the_serial_answers(tmp_path: Path) -> None:
    cfg = sweep(strategies=("fp32", "L2", "L3"), batches=(4, 400), find_max=True, budget=150_000)
    statuses = {("L2", 100): "error"}
    serial = run_local(run_sweep, cfg, tmp_path / "s", executor=Scripted(statuses, 0.0, 150_000))
    parallel = run_local(run_sweep, cfg, tmp_path / "p", options=ExecutionOptions(jobs=3),
                         executor=Scripted(statuses, 0.01, 150_000))
    assert shape(parallel) == shape(serial) and parallel.summary() == serial.summary()
    assert serial.maxima["fp32"] == 148

    grid = GridConfig("memory", ModelSpec("resnet18"), resolved("fp32", "L3"), (2, 4, 6), InputSize(16, 16),
                      MeasureSettings(device=PROFILES["meta"], timed_steps=0))
    assert len(split(grid)) == 6  # all points at once
    ex = Scripted({("L3", 4): "oom"}, 0.1)
    parallel = run_local(run_grid, grid, tmp_path / "g", options=ExecutionOptions(jobs=6), executor=ex)
    assert shape(parallel) == [(s, b, "oom" if (s, b) == ("L3", 4) else "ok") for s in ("fp32", "L3") for b in (2, 4, 6)]
    assert ex.most == 6


def test_a_strategy_predicted_as_another_searches_in_that_strategys_part() -> None:
    """On meta L5's step is L4's: one part (one thread, one worker) searches both, so L5 reuses L4's
    steps; on a measuring device every strategy is a part of its own."""
    from actbench.planning.configs import ScaleConfig

    def plan(device: str) -> ScaleConfig:
        return ScaleConfig("batch", "resnet50", resolved("fp32", "L4", "L3", "L5"), 64, InputSize(224, 224), 4, 64, 4,
                           MeasureSettings(device=PROFILES[device], budget_bytes=2**34), command="plan")

    assert [names(p.strategies) for p in split(plan("meta"))] == [("fp32",), ("L4", "L5"), ("L3",)]
    assert [names(p.strategies) for p in split(plan("cpu"))] == [("fp32",), ("L4",), ("L3",), ("L5",)]
    only_l5 = dataclasses.replace(plan("meta"), strategies=resolved("fp32", "L5"))
    assert [names(p.strategies) for p in split(only_l5)] == [("fp32",), ("L5",)]


def test_several_writers_keep_the_run_directory_consistent(tmp_path: Path) -> None:
    """Two parallel runs of one plan at once (4 threads each) into one directory: one row per key."""
    run_dir = tmp_path / "run"
    cfg = sweep(strategies=("fp32", "L1", "L2", "L3"), stop_after=3)
    executors = [Scripted({("L1", 8): "oom"}, 0.05), Scripted({("L1", 8): "oom"}, 0.05)]
    outcomes: list[Any] = [None, None]

    def go(i: int) -> None:
        outcomes[i] = run_local(run_sweep, cfg, run_dir, options=ExecutionOptions(jobs=4), executor=executors[i])

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert shape(outcomes[0]) == shape(outcomes[1])
    rows = lines(run_dir)
    assert len(rows) == len({r["key"] for r in rows}) == len(outcomes[0].rows)  # each point measured once
    assert len(executors[0].calls) + len(executors[1].calls) == len(rows)
    RunStore(run_dir).write_table()
    assert sorted(r["key"] for r in table(run_dir)) == sorted(r["key"] for r in rows)
    assert not list(run_dir.glob("*.tmp")) and not list((run_dir / ".claims").iterdir())
    assert json.loads((run_dir / "env.json").read_text())["scripted"] is True


@pytest.mark.memory_gb(2.7)  # 2.59 GB measured, children included
@pytest.mark.slow
def test_meta_with_jobs_predicts_in_workers_what_one_process_predicts(tmp_path: Path) -> None:
    """--jobs 2 on meta: predictions in two worker children, same keys, statuses and bytes as in process."""
    from actbench.execution.specs import CommandSpec

    spec = CommandSpec(command="sweep-batch", model="resnet18", strategies=("fp32", "L3"), batch="8:24:8",
                       image_size=32, device="meta", budget="140MiB")  # fp32 fails at 24
    plan = spec.plan()
    serial = execute(plan, RunStore(tmp_path / "s" / plan.name))
    parallel = execute(plan, RunStore(tmp_path / "p" / plan.name), options=ExecutionOptions(jobs=2))
    assert shape(parallel) == shape(serial) and any(r.status in MEMORY_FAILURES for r in serial.rows)
    assert [(r.key, r.peak_alloc_bytes, r.activation_bytes) for r in parallel.rows] == \
        [(r.key, r.peak_alloc_bytes, r.activation_bytes) for r in serial.rows]
    env = json.loads((tmp_path / "p" / plan.name / "env.json").read_text())
    assert env["points_at_once"] == 2


@pytest.mark.memory_gb(2.7)  # 2.58 GB measured, children included
@pytest.mark.slow
def test_a_plan_with_a_spare_slot_certifies_side_by_side_and_finds_the_same_maxima(tmp_path: Path) -> None:
    """One strategy, two jobs: the guided search probes its predicted answer with the neighbour that
    certifies it at once (two points in flight together); same maximum as one job, at most one
    probe more."""
    from actbench.execution.specs import CommandSpec

    spec = CommandSpec(command="plan", model="resnet18", strategies=("fp32",), image_size=32, device="meta",
                       budget="300MiB", dim="batch", batch="8")
    plan = spec.plan()
    serial = execute(plan, RunStore(tmp_path / "s" / plan.name))
    in_flight, most = [0], [0]
    lock = threading.Lock()

    def on_event(kind: str, point: Any, row: Any) -> None:
        with lock:
            in_flight[0] += {"start": 1, "done": -1}.get(kind, 0)
            most[0] = max(most[0], in_flight[0])

    parallel = execute(plan, RunStore(tmp_path / "p" / plan.name), options=ExecutionOptions(jobs=2),
                       on_event=on_event)
    assert parallel.maxima == serial.maxima and serial.maxima["fp32"] is not None
    assert len(serial.rows) <= len(parallel.rows) <= len(serial.rows) + 1
    assert {r.key for r in serial.rows[:-2]} <= {r.key for r in parallel.rows}
    assert most[0] == 2, "the certifying pair never ran side by side"


@pytest.mark.slow
def test_a_run_made_one_job_at_a_time_resumes_with_two_jobs_measuring_nothing(tmp_path: Path) -> None:
    """Whether a search probed its certifying pair side by side depends on the slots spare when it ran:
    a resume with more jobs than the run had must ask for exactly the points the run recorded."""
    from actbench.execution.specs import CommandSpec

    spec = CommandSpec(command="plan", model="resnet18", strategies=("fp32",), image_size=32, device="meta",
                       budget="300MiB", dim="batch", batch="8")
    plan = spec.plan()
    first = execute(plan, RunStore(tmp_path / plan.name))
    started: list[str] = []
    again = execute(plan, RunStore(tmp_path / plan.name), options=ExecutionOptions(jobs=2),
                    on_event=lambda kind, point, row: started.append(point.describe()) if kind == "start" else None)
    assert started == [] and again.maxima == first.maxima
    assert [r.key for r in again.rows] == [r.key for r in first.rows]


# --- persistent workers -----------------------------------------------------------------------------
def cpu_point(batch: int, strategy: str = "fp32") -> Point:
    return Point.resolve(PointConfig(ModelSpec("resnet18"), strategy, batch, 16, "cpu", warmup_steps=1,
                                     timed_steps=0))


MEMORY = ("status", "activation_bytes", "peak_alloc_bytes", "model_bytes", "host_bytes")


@pytest.mark.memory_gb(2.7)  # 2.64 GB measured, children included
@pytest.mark.slow
def test_a_persistent_worker_gives_the_memory_figures_of_a_fresh_child(monkeypatch) -> None:
    """Also: with a spare (one more strategy than slots), the next strategy's first point goes to a
    worker started while the last one measured; a strategy with an allocator setting (L5) gets a new
    worker instead; closing the executor ends every worker, the spare too."""
    monkeypatch.delenv(FAULT_ENV, raising=False)
    points = [cpu_point(2), cpu_point(4, "L3"), cpu_point(2, "L3")]
    # Only the last point follows another in its worker: the first two are each their worker's first,
    # measured as in a fresh child by construction, so one fresh child (for the last) is the reference.
    with ChildProcessExecutor(timeout_s=600, persistent=False) as isolated:
        fresh = list(isolated.measure(points[2:]))
    with ChildProcessExecutor(timeout_s=600, persistent=True, spares=2) as persistent:
        state = persistent._states[0]
        # fp32 b2 first, then two L3 points in one L3 worker, the second after the first left its state;
        # the L3 worker is started from a thread that ends before the worker's next point (it must live on)
        kept = [next(persistent.measure(points[:1]))]
        spare = state.spare
        assert spare is not None and spare.key is None and persistent.spares == 1
        thread = threading.Thread(target=lambda: kept.append(next(persistent.measure(points[1:2]))))
        thread.start()
        thread.join(600)
        assert state.worker is spare and state.spare is not None and persistent.spares == 0  # L3 took the spare
        kept.append(next(persistent.measure(points[2:])))
        assert state.worker.points == 2
        second = state.spare
        assert next(persistent.measure([cpu_point(2, "L5")])).status == "ok"
        assert state.worker is not second and state.worker.alloc_conf and state.spare is None
        pids = [spare.proc.pid, second.proc.pid, state.worker.proc.pid]
    assert [getattr(fresh[0], f) for f in MEMORY] == [getattr(kept[2], f) for f in MEMORY], (fresh[0], kept[2])
    assert all(m.status == "ok" for m in kept)
    deadline = time.time() + 20
    while any(pid in live_workers() for pid in pids) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(pid in live_workers() for pid in pids)


@pytest.mark.slow
# Heavy: oom rows are also tests/test_harness_cli.py's; a hanging worker is killed at its timeout in
# test_harness_cli.py's test_hanging_child_times_out, and a failed worker's successor is the crash case's.
@pytest.mark.memory_gb(2.2)  # 2.07 GB measured, children included
@pytest.mark.parametrize("fault", ["crash", pytest.param("oom", marks=pytest.mark.heavy),
                                   pytest.param("hang", marks=pytest.mark.heavy)])
def test_a_failure_costs_one_row_and_the_next_point_gets_a_fresh_worker(monkeypatch, tmp_path: Path,
                                                                         fault: str) -> None:
    monkeypatch.setenv(FAULT_ENV, f"{fault}@batch=2")
    executor = ChildProcessExecutor(timeout_s=600, log_dir=tmp_path / "logs", persistent=True)
    with executor:
        if fault == "hang":  # a warm worker first: the short timeout then covers the hanging point alone
            assert next(executor.measure([cpu_point(8)])).status == "ok"
            executor.timeout_s = 3
        bad = next(executor.measure([cpu_point(2)]))
        assert executor._states[0].worker is None  # replaced after the failure
        executor.timeout_s = 600
        good = list(executor.measure([cpu_point(4), cpu_point(6)]))
        worker = executor._states[0].worker
        assert worker is not None and worker.points == 2  # a fresh worker took both points
    expected = {"crash": "error", "oom": "oom", "hang": "timeout"}[fault]
    assert bad.status == expected, bad
    if fault == "crash":
        assert "SIGABRT" in bad.message and "injected crash" in bad.message
        assert "injected crash" in (tmp_path / "logs" / f"{cpu_point(2).key()}.log").read_text()
    assert [m.status for m in good] == ["ok", "ok"]


def _serving_workers(marker: str) -> list[int]:
    """Live persistent workers whose working folder is under a folder named ``marker``."""
    return live_workers(lambda p: marker in p.cwd, command="actbench.worker --serve")


@pytest.mark.slow
def test_a_persistent_worker_dies_with_its_parent(tmp_path: Path) -> None:
    """kill -9 of the process whose search thread started a worker leaves no worker behind."""
    import signal
    import subprocess
    import sys
    import textwrap

    marker = tmp_path / f"parent-{os.getpid()}"
    marker.mkdir()
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import os, threading
        os.environ["ACTBENCH_TEST_FAULT"] = "hang"
        from actbench.execution.executors import ChildProcessExecutor
        from actbench.planning.point import Point
        from actbench.schema import ModelSpec, PointConfig
        point = Point.resolve(PointConfig(ModelSpec("resnet18"), "fp32", 2, 16, "cpu", timed_steps=0))
        executor = ChildProcessExecutor(timeout_s=600, persistent=True)
        thread = threading.Thread(target=lambda: list(executor.measure([point])))
        thread.start()
        thread.join()
    """))
    parent = subprocess.Popen([sys.executable, str(script)], cwd=marker, env={**os.environ, "TMPDIR": str(marker)})
    try:
        deadline = time.time() + 120
        while not _serving_workers(str(marker)) and time.time() < deadline:
            time.sleep(0.5)
        assert _serving_workers(str(marker)), "the worker never started"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.time() + 20
        while _serving_workers(str(marker)) and time.time() < deadline:
            time.sleep(0.5)
        assert not _serving_workers(str(marker)), "the worker outlived its parent"
    finally:
        parent.kill()
        for pid in _serving_workers(str(marker)):
            os.kill(pid, signal.SIGKILL)


# --- Slurm through submitit -------------------------------------------------------------------------
def cpu_plan():
    from actbench.execution.specs import CommandSpec

    spec = CommandSpec(command="sweep-batch", model="resnet18", strategies=("fp32",), batch="2,4", image_size=16,
                       device="cpu", warmup_steps=1, timed_steps=0)
    return spec.plan()


SLURM = ExecutionOptions(executor="slurm", slurm=SlurmOptions(poll_s=0.2, time_min=20))


@pytest.mark.memory_gb(2.2)  # 2.06 GB measured, children included
@pytest.mark.slow
def test_slurm_path_runs_real_points_through_the_debug_executor_and_resumes(tmp_path: Path, monkeypatch) -> None:
    import submitit

    monkeypatch.delenv(FAULT_ENV, raising=False)

    class Counting(submitit.DebugExecutor):
        submitted = 0

        def _internal_process_submissions(self, delayed):
            Counting.submitted += len(delayed)
            return super()._internal_process_submissions(delayed)

    plan = cpu_plan()
    store = RunStore(tmp_path / plan.name)
    events: list[tuple[str, str]] = []
    outcome = execute(plan, store, options=SLURM, executor_class=Counting,
                      on_event=lambda kind, point, row: events.append((kind, point.describe())))
    assert shape(outcome) == [("fp32", 2, "ok"), ("fp32", 4, "ok")] and Counting.submitted == 1
    assert [r["status"] for r in lines(store.run_dir)] == ["ok", "ok"]
    assert (store.run_dir / "env.json").exists() and list((store.run_dir / "slurm").glob("*_log.err"))
    assert [k for k, _ in events] == ["done", "done"]
    again = execute(plan, RunStore(store.run_dir), options=SLURM, executor_class=Counting)
    assert Counting.submitted == 1 and shape(again) == shape(outcome)  # all recorded: nothing submitted


@pytest.mark.heavy  # about 25 s: a real job killed mid-point (CI runs it; the default run stays near 5 minutes)
def test_a_killed_slurm_task_is_an_error_row_naming_job_and_log(tmp_path: Path, monkeypatch) -> None:
    """submitit's LocalExecutor runs the array task as a process; the hook kills it at batch 4."""
    import submitit

    monkeypatch.delenv(FAULT_ENV, raising=False)
    monkeypatch.setenv(JOB_FAULT_ENV, "kill@batch=4")
    plan = cpu_plan()
    store = RunStore(tmp_path / plan.name)
    outcome = execute(plan, store, options=SLURM, executor_class=submitit.LocalExecutor)
    assert shape(outcome) == [("fp32", 2, "ok"), ("fp32", 4, "error")]
    message = outcome.rows[1].message
    job_id = message.split()[1]
    assert message.startswith(f"job {job_id} died") and job_id.isdigit()
    log = message.split("; log ")[1].split(":")[0]
    assert Path(log).parent == store.run_dir / "slurm" and job_id in Path(log).name
    # a rerun retries the error row (recorded before it started) and keeps the ok row
    monkeypatch.delenv(JOB_FAULT_ENV)
    again = execute(plan, RunStore(store.run_dir), options=SLURM, executor_class=submitit.LocalExecutor)
    assert shape(again) == [("fp32", 2, "ok"), ("fp32", 4, "ok")]
    assert [r["status"] for r in lines(store.run_dir)] == ["ok", "error", "ok"]


def test_slurm_options_become_sbatch_lines() -> None:
    from submitit.slurm.slurm import _make_sbatch_string

    options = SlurmOptions.parse(["partition=gpu", "time=1:30:00", "account=lab", "gpus-per-job=2",
                                  "cpus-per-job=8", "qos=high", "exclusive"])
    text = _make_sbatch_string("python x.py", "/tmp/f", map_count=12, **options.parameters(2, "actbench-run"))
    for line in ("--partition=gpu", "--time=90", "--account=lab", "--gpus-per-node=2", "--cpus-per-task=8",
                 "--qos=high", "--exclusive", "--array=0-11"):
        assert f"#SBATCH {line}" in text, line
    table_form = SlurmOptions.parse({"partition": "gpu", "time": 90, "sbatch": ["--qos=high"]})
    assert table_form.time_min == 90 and dict(table_form.sbatch) == {"qos": "high"}
    assert SlurmOptions.parse(["time=2"], base=table_form).partition == "gpu"
    assert [parse_time_minutes(t) for t in ("45", "1:00:30", "2-00:00:00", "10:30")] == [45, 61, 2880, 11]
    for bad in (["time=soon"], ["gpus-per-job=-1"], ["partition"], ["=x"]):
        with pytest.raises(ValueError, match="--slurm"):
            SlurmOptions.parse(bad)


# --- the CLI -----------------------------------------------------------------------------------------
def invoke(args: list[str]):
    from actbench.cli import app

    return CliRunner(env={FAULT_ENV: None}).invoke(app, args, catch_exceptions=False)


@pytest.mark.parametrize("extra, message", [
    (["--device", "cpu", "--executor", "slurm"], "--executor slurm: no Slurm here (sbatch is not on PATH)"),
    (["--device", "cpu", "--gpus", "0,1"], "--gpus pins points to GPUs; on cpu use --jobs N"),
    (["--device", "cuda", "--jobs", "2"], "--jobs 2 would put 2 points on one GPU at once"),
    (["--device", "cpu", "--jobs", "0"], "--jobs must be >= 1"),
    (["--device", "cpu", "--gpus", "a"], "--gpus must be GPU indices"),
    (["--device", "cpu", "--slurm", "time=soon"], "--slurm: time must be minutes"),
])
def test_options_that_do_not_go_together_are_one_line_errors(tmp_path: Path, monkeypatch, extra, message) -> None:
    import actbench.execution.execution_options

    monkeypatch.setattr(actbench.execution.execution_options.shutil, "which", lambda name: None)
    result = invoke(["sweep-batch", "resnet18", "--strategies", "fp32", "--batch", "2", "--image-size", "16",
                     "--out", str(tmp_path / "out"), *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "out").exists()


def test_progress_names_each_result_with_its_point_when_points_overlap(capsys) -> None:
    from actbench.cli.progress import PointProgress

    class Row:
        status, message, elapsed_s = "ok", "", 2.5

    a, b = cpu_point(2), cpu_point(4)
    progress = PointProgress(2, exact=True, plain=True)
    with progress:
        progress.on_event("start", a, None)
        progress.on_event("start", b, None)
        progress.on_event("done", a, Row())
        progress.on_event("done", b, Row())
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("[1/2] measuring resnet18 fp32 b2") and lines[0].endswith("... ")
    assert lines[1].startswith("[1/2] measuring resnet18 fp32 b4") and lines[1].endswith("... ")
    assert lines[2].startswith("[1/2] resnet18 fp32 b2 16px cpu: ok (")
    assert lines[3].startswith("[2/2] resnet18 fp32 b4 16px cpu: ok (")


def test_experiment_files_take_a_slurm_table(tmp_path: Path) -> None:
    from actbench.experiments import ExperimentError, load_experiment

    path = tmp_path / "e.toml"
    body = ('name = "e"\ndescription = "d"\n[[steps]]\ncommand = "memory"\nmodels = ["resnet18"]\n'
            'strategies = ["fp32"]\nbatch = "2"\nimage_size = 16\ndevice = "meta"\n')
    path.write_text(body + '[slurm]\npartition = "gpu"\ntime = "2:00:00"\nqos = "high"\n')
    exp = load_experiment(path)
    assert exp.slurm.partition == "gpu" and exp.slurm.time_min == 120 and dict(exp.slurm.sbatch) == {"qos": "high"}
    path.write_text(body + '[slurm]\ntime = "later"\n')
    with pytest.raises(ExperimentError, match=r"e.toml: \[slurm\]: time must be"):
        load_experiment(path)
