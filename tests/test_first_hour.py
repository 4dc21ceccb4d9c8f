"""A new user's first hour: progress you can see, hints that answer the question, defaults
that compare, failures that say so, figures that agree with tables, and wording that means what it says.

Most cases run on the meta device (in this process, seconds) or with injected faults; the two that
need a real child process (SIGTERM/SIGHUP while a point runs) use the worker's ``hang`` hook.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from actbench.cli import app
from actbench.cli import harness_commands, tables
from actbench.cli import progress as progress_mod
from actbench.cli.progress import EXTENSION_NOTICE, PointProgress
from actbench.schema import ModelSpec, PointConfig, ResultRow
from workers import is_alive, live_workers

REPO = Path(__file__).resolve().parent.parent
META = ["--image-size", "16", "--device", "meta"]


def invoke(args: list[str], fault: str | None = None, **env: str):
    return CliRunner(env={"ACTBENCH_TEST_FAULT": fault, **env}).invoke(app, args, catch_exceptions=False)


def run_dir_of(out: Path) -> Path:
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return run_dir


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir_of(out) / "rows.jsonl").read_text().splitlines()]


def point(batch: int = 2, strategy: str = "fp32", device: str = "cpu") -> PointConfig:
    return PointConfig(ModelSpec("resnet18"), strategy, batch, 64, device)


def result_row(p: PointConfig, status: str = "ok", message: str = "", **measured) -> ResultRow:
    from actbench.schema import Measurement

    return ResultRow.build(p, Measurement(status=status, message=message, **measured), "run", "env")


# --- 1. progress you can see ---------------------------------------------------------------------
def test_plain_progress_is_one_flushed_line_per_point(capsys) -> None:
    with PointProgress(3, exact=True, plain=True) as bar:
        p1, p2 = point(2), point(4)
        bar.on_event("start", p1, None)
        assert capsys.readouterr().err == "[1/3] measuring resnet18 fp32 b2 64px cpu ... "  # flushed before it ends
        bar.on_event("done", p1, result_row(p1))
        bar.on_event("cached", p2, result_row(p2, "oom", "[enforce fail at alloc_cpu.cpp:117] can't allocate memory"))
    err = capsys.readouterr().err
    assert re.fullmatch(r"ok \(\d+\.\d s\)\n", err.splitlines(keepends=True)[0]), err
    # a resumed row says so; its message is printed as written, brackets and all
    assert err.splitlines()[1] == ("[2/3] resnet18 fp32 b4 64px cpu: oom: [enforce fail at alloc_cpu.cpp:117] "
                                   "can't allocate memory (resumed)")
    assert bar.summary("X/rows.jsonl") == "1 point measured, 1 resumed from X/rows.jsonl"


def test_search_progress_counts_up_to_a_bound_and_meta_predicts(capsys) -> None:
    with PointProgress(2, exact=False, predicts=True, plain=True) as bar:
        for batch in (2, 4, 8):  # a search may end early; here it takes one more than its bound says
            p = point(batch, device="meta")
            bar.on_event("start", p, None)
            bar.on_event("done", p, result_row(p))
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split(" predicting")[0] for ln in lines] == ["[1/≤2]", "[2/≤2]", "[3]"]
    assert "measuring" not in "".join(lines)
    assert bar.summary("r") == "3 points predicted, 0 resumed from r"


def test_terminal_progress_bar_ends_at_the_summary_count() -> None:
    console_file = io.StringIO()
    bar = PointProgress(8, exact=False, plain=False)
    with bar:
        bar._progress.console.file = console_file  # the bar renders into a buffer here
        for batch in (2, 4, 6):
            p = point(batch)
            bar.on_event("start", p, None)
            bar.on_event("cached" if batch == 2 else "done", p, result_row(p))
        task = bar._progress.tasks[0]
        assert (task.completed, task.total) == (3, 8)
        bar.close_task = task
    assert (bar.close_task.completed, bar.close_task.total) == (3, 3)  # "3/3", as the summary: 2 measured, 1 resumed
    assert bar.summary("r") == "2 points measured, 1 resumed from r"


def test_cli_progress_lines_and_plural_summary_on_meta(tmp_path: Path) -> None:
    args = ["memory", "resnet18", "--strategies", "fp32", "--batch", "2", *META, "--out", str(tmp_path)]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    assert re.search(r"^\[1/1\] predicting resnet18 fp32 b2 16px meta \.\.\. ok \(\d+\.\d s\)$", result.stderr, re.M)
    assert "1 point predicted, 0 resumed from " in result.stderr
    again = invoke(args)
    assert "[1/1] resnet18 fp32 b2 16px meta: ok (resumed)" in again.stderr
    assert "0 points predicted, 1 resumed" in again.stderr


def test_extension_build_is_announced_before_it_starts(monkeypatch, tmp_path: Path) -> None:
    from actbench.kernels import extension

    plan = extension.BuildPlan(False, None, None, "x", "0" * 64, tmp_path / "no-build-here")
    calls: list[str] = []
    monkeypatch.setattr(extension, "plan", lambda *a, **k: plan)
    monkeypatch.setattr(extension, "load", lambda *a, **k: calls.append("load"))
    said: list[str] = []
    assert progress_mod.ensure_extension(("fp32", "L3"), "cpu", lambda t: said.append(t) or calls.append("say")) is None
    assert calls == ["say", "load", "say"] and said[0] == EXTENSION_NOTICE and said[1].startswith("extension built in ")
    said.clear()
    assert progress_mod.ensure_extension(("fp32", "swap"), "cpu", said.append) is None and said == []  # no levels


def test_cli_announces_the_build_before_the_first_point(monkeypatch, tmp_path: Path) -> None:
    def fake(strategies, device, say):
        say(EXTENSION_NOTICE)
        return None

    monkeypatch.setattr(harness_commands, "ensure_extension", fake)
    result = invoke(["memory", "resnet18", "--strategies", "fp32", "--batch", "2", *META, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.stderr.index(EXTENSION_NOTICE) < result.stderr.index("[1/1] predicting")


def test_extension_check_in_a_child_reports_its_error_in_one_line(monkeypatch) -> None:
    """Devices whose parent must not touch them (cuda) check and build in a child: its error comes back."""
    monkeypatch.setenv("ACTBENCH_WITH_CUDA", "maybe")
    problem = progress_mod._ensure_in_child(lambda text: None, time.monotonic())
    assert problem is not None and "ACTBENCH_WITH_CUDA must be 0 or 1" in problem and "\n" not in problem


# --- 2. without a GPU: a hint that answers the question ------------------------------------------
@pytest.mark.parametrize("args", [["sweep-batch", "resnet50", "--levels", "L1..L5"], ["max-scale", "--dim", "depth"]])
def test_no_gpu_points_to_predictions(monkeypatch, tmp_path: Path, args: list[str]) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = invoke([*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "sees no CUDA GPU" in line and "--device meta --budget 16GiB" in line and "actbench plan" in line
    assert "--device cpu --image-size" in line  # cpu only with small sizes
    assert not (tmp_path / "out").exists()


def test_no_gpu_throughput_points_to_small_cpu_runs(monkeypatch, tmp_path: Path) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = invoke(["throughput", "resnet50", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "--device cpu --image-size 64" in result.stderr
    assert "no throughput" in result.stderr


# --- 3. a search on meta needs a budget -----------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["sweep-batch", "resnet50", "--levels", "L1..L5", "--device", "meta"],
    ["sweep-batch", "resnet50", "--find-max", "--device", "meta"],
    ["max-scale", "--dim", "depth", "--device", "meta"],
])
def test_searches_on_meta_need_a_budget(tmp_path: Path, args: list[str]) -> None:
    result = invoke([*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "--budget is required" in line and "lower bounds" in line
    assert not (tmp_path / "out").exists()


def test_an_experiment_step_gets_the_budget_rule_too(tmp_path: Path) -> None:
    from actbench.experiments import ExperimentError, load_experiment

    path = tmp_path / "e.toml"
    path.write_text('name = "e"\ndescription = "x"\n[[steps]]\ncommand = "sweep-batch"\nmodels = ["resnet18"]\n'
                    'strategies = ["fp32"]\ndevice = "meta"\nbatch = "2,4"\n')
    with pytest.raises(ExperimentError, match=r"steps\[0\]\.budget: is required for sweep-batch on meta"):
        load_experiment(path)
    assert load_experiment(path, device="cpu").steps  # the same step measures on cpu without one


# --- 4. the defaults compare ---------------------------------------------------------------------
@pytest.mark.parametrize("args, expected", [
    (["sweep-batch", "resnet50"], ["fp32", "L3"]),
    (["max-scale", "--dim", "depth"], ["fp32", "L3"]),
    (["throughput", "resnet50"], ["fp32", "L3"]),
    (["plan", "resnet50", "--budget", "16GiB"], ["fp32", "L3"]),
    (["sweep-batch", "resnet50", "--levels", "L2"], ["fp32", "L2"]),  # the user's choice replaces the default
    (["sweep-batch", "resnet50", "--strategies", "swap"], ["fp32", "swap"]),
    (["sweep-batch", "resnet50", "--no-baseline"], ["L3"]),
])
def test_defaults_compare_fp32_with_actnn(tmp_path: Path, args: list[str], expected: list[str]) -> None:
    result = invoke([*args, "--dry-run", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # one preview line per strategy (searches), or per point (grids: "resnet50 L3 b64 224px cuda")
    shown = re.findall(r"^(\w+): resnet", result.stdout, re.M) or re.findall(r"^resnet50 (\w+) b", result.stdout, re.M)
    assert shown == expected


def test_memory_default_and_help_say_which_levels(tmp_path: Path) -> None:
    result = invoke(["memory", "resnet50", "--batch", "8", "--dry-run", "--out", str(tmp_path)])
    assert [line.split()[1] for line in result.stdout.splitlines()[1:]] == ["fp32", "L3"]
    for command in ("sweep-batch", "max-scale", "plan", "throughput", "memory"):
        text = " ".join(CliRunner().invoke(app, [command, "--help"]).output.split())
        assert "Without --levels and --strategies: fp32 and L3" in text, command


def test_explicit_options_keep_their_run_names(tmp_path: Path) -> None:
    """Defaults changed; a command that names its strategies still names the same run directory."""
    from actbench.execution.specs import CommandSpec

    spec = CommandSpec(command="sweep-batch", model="resnet50", strategies=("fp32", "swap"), batch="16:64:16",
                       budget="16GiB")
    result = invoke(["sweep-batch", "resnet50", "--strategies", "swap", "--batch", "16:64:16", "--budget", "16GiB",
                     "--dry-run", "--out", str(tmp_path)])
    assert result.stdout.splitlines()[0] == f"run directory: {tmp_path / spec.plan().name}"


# --- 5. timing until the numbers settle -----------------------------------------------------------
class _Profile:
    min_timed_seconds, settle_iqr_fraction, max_timed_steps, max_timed_seconds = 2.0, 0.10, 50, 10.0


def test_timing_runs_to_a_minimum_time_until_the_spread_settles_within_bounds() -> None:
    from actbench.core.devices import PROFILES
    from actbench.measure.point import timing_done

    prof = _Profile()
    assert not timing_done([0.1] * 2, 3, prof)  # the steps asked for come first
    assert not timing_done([0.1] * 5, 3, prof)  # 0.5 s < the 2 s minimum
    assert timing_done([0.1] * 20, 3, prof)  # 2 s, and steady
    noisy = [0.1, 0.3] * 10
    assert not timing_done(noisy, 3, prof)  # 2 s but the IQR is far beyond 10% of the median
    assert timing_done([0.1, 0.3] * 25, 3, prof)  # bounded: 50 steps
    assert timing_done([1.0, 3.0] * 5, 3, prof)  # bounded: 10 s
    assert timing_done([5.0] * 3, 3, prof)  # slow steps: the asked-for steps already pass the minimum
    meta = PROFILES["meta"]
    assert timing_done([0.1] * 3, 3, meta)  # a profile without bounds times exactly the steps asked for
    cpu = PROFILES["cpu"]
    assert cpu.min_timed_seconds > 0 and cpu.max_timed_steps >= 10 and cpu.max_timed_seconds > cpu.min_timed_seconds


def test_tables_show_the_spread_beside_the_median(capsys) -> None:
    p = point()
    tables.render_rows([result_row(p, samples_per_s_median=20.0, samples_per_s_iqr=1.6)], "t")
    out = capsys.readouterr().out
    assert "1.6 (8%)" in out and "interquartile range" in " ".join(out.split())


# --- 6. failures that look like success ----------------------------------------------------------
def test_messages_are_never_rich_markup(capsys) -> None:
    p = point()
    text = "[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory"
    tables.render_rows([result_row(p, "oom", text)], "[bold]not a tag[/bold]")
    out = " ".join(capsys.readouterr().out.split())
    assert "[enforce fail at alloc_cpu.cpp:117]" in out and "[bold]not a tag[/bold]" in out


def test_host_out_of_memory_on_cpu_is_oom() -> None:
    from actbench.measure.accounting import classified, is_out_of_memory

    text = ("[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 137438953472 bytes. Error code 12 (Cannot allocate memory)")
    assert is_out_of_memory(RuntimeError(text)) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))

    def fill(result):
        raise RuntimeError(text)

    m = classified(fill)
    assert m.status == "oom" and "can't allocate memory" in m.message and "[enforce fail" in m.message


def test_a_real_host_allocation_failure_is_oom() -> None:
    import torch

    from actbench.measure.accounting import is_out_of_memory

    try:
        torch.empty(2**62, dtype=torch.uint8)
    except RuntimeError as exc:
        assert is_out_of_memory(exc), str(exc)
    else:  # pragma: no cover - no machine has 4 EiB
        pytest.fail("allocating 4 EiB succeeded")


def test_a_search_whose_every_probe_failed_says_so_and_exits_1(tmp_path: Path) -> None:
    result = invoke(["max-scale", "resnet18", "--strategies", "fp32", "--dim", "resolution", "--low", "16",
                     "--high", "48", "--step", "16", "--batch", "2", "--device", "meta", "--budget", "1GiB",
                     "--out", str(tmp_path)], fault="error")
    assert result.exit_code == 1, result.output
    assert re.search(r"fp32: no answer: every probe failed to measure \(\d probes?; error: RuntimeError: injected error",
                     " ".join(result.stderr.split()))
    assert "every probe failed to measure (error or timeout)" in result.stderr


def test_every_point_failed_exits_1_but_one_result_is_enough(tmp_path: Path) -> None:
    args = ["memory", "resnet18", "--strategies", "fp32,swap", "--batch", "2", *META]
    failed = invoke([*args, "--out", str(tmp_path / "a")], fault="error")
    assert failed.exit_code == 1 and "every point failed to measure" in failed.stderr
    mixed = invoke([*args, "--out", str(tmp_path / "b")], fault="error@strategy=fp32")
    assert mixed.exit_code == 0, mixed.output
    assert "fp32: no answer: every point failed to measure" in mixed.stderr
    oom = invoke([*args, "--out", str(tmp_path / "c")], fault="oom")
    assert oom.exit_code == 0  # out of memory is a result, not a failure to measure


# --- 7. × fp32 means one thing in the CLI and in the figures ------------------------------------
def test_max_scale_depth_multiple_agrees_between_cli_and_figure() -> None:
    from actbench.reporting.scale import ScaleGroup
    from actbench.planning.search import SearchOutcome

    def r(strategy: str, extra: int, status: str = "ok") -> ResultRow:
        p = PointConfig(ModelSpec("resnet152", extra_blocks=extra), strategy, 64, 224, "meta", budget_bytes=1)
        return result_row(p, status, depth=152 + 3 * extra if status == "ok" else None)

    rows = [r("fp32", 4), r("fp32", 8, "over_budget"), r("L3", 28), r("L3", 32, "over_budget")]
    outcome = SearchOutcome(rows=rows, maxima={"fp32": 4, "L3": 28},
                            best_rows={"fp32": rows[0], "L3": rows[2]}, dim="depth")
    _, cli = tables.max_cells(outcome, "L3")
    figure = next(e for e in ScaleGroup("depth", "run", tuple(rows)).table() if e.series.strategy == "L3")
    assert cli == figure.multiple_text == f"{(152 + 84) / (152 + 12):.2f}"  # layers, not extra blocks (7.00)


# --- 8. your runs and the committed results never blend -----------------------------------------
def test_default_out_is_runs_and_git_ignores_it(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(["sweep-batch", "resnet18", "--dry-run"])
    assert result.stdout.splitlines()[0].startswith("run directory: runs/sweep-batch_resnet18_cuda_224px_")
    result = invoke(["run", "--help"])
    assert "default runs/" in " ".join(result.output.split())
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "/runs/" in ignored and ".venv/" in ignored


# --- 9. a suite a laptop can run ------------------------------------------------------------------
def test_heavy_tests_are_marked_and_left_out_by_default() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert '-m "not heavy"' in config["addopts"] and any(m.startswith("heavy:") for m in config["markers"])
    source = (REPO / "tests" / "test_ops_quantize.py").read_text()
    assert re.search(r"@pytest\.mark\.heavy\n(@pytest\.mark\.\w+\n)*def test_tensor_over_2_pow_31_values_on_cpu", source)
    ci = (REPO / ".ci" / "run").read_text()
    assert "python3 -m pytest -m heavy" in ci


# --- 10. wording ----------------------------------------------------------------------------------
def test_help_prints_brackets_and_no_bool_types() -> None:
    text = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert "Apply the file's [quick] overrides" in text
    for command in sorted(typer.main.get_command(app).commands):
        text = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
        assert "<bool>" not in text, command


def test_force_measures_again_and_no_retry_keeps_errors(tmp_path: Path) -> None:
    args = ["memory", "resnet18", "--strategies", "fp32", "--batch", "2", *META, "--out", str(tmp_path)]
    assert invoke(args).exit_code == 0
    forced = invoke([*args, "--force"])
    assert forced.exit_code == 0 and "1 point predicted, 0 resumed" in forced.stderr
    assert [r["status"] for r in rows_of(tmp_path)] == ["ok", "ok"]  # the old row stays; the new one wins

    out2 = tmp_path / "retry"
    args2 = [*args[:-1], str(out2)]
    assert invoke(args2, fault="error").exit_code == 1
    kept = invoke([*args2, "--no-retry"])
    assert kept.exit_code == 1 and "0 points predicted, 1 resumed" in kept.stderr
    retried = invoke(args2)
    assert retried.exit_code == 0 and "1 point predicted, 0 resumed" in retried.stderr
    assert [r["status"] for r in rows_of(out2)] == ["error", "ok"]


# --- SIGTERM and SIGHUP behave like Ctrl-C --------------------------------------
def _workers_of(parent: int) -> list[int]:
    return live_workers(lambda p: p.ppid == parent)


@pytest.mark.memory_gb(2.2)  # 2.11 GB measured, children included
@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143),
                                          pytest.param(signal.SIGHUP, 129, marks=pytest.mark.heavy)])  # same path
def test_sigterm_and_sighup_end_the_run_like_ctrl_c(tmp_path: Path, signum: int, code: int) -> None:
    out = tmp_path / "X"
    env = {**os.environ, "PYTHONPATH": str(REPO), "ACTBENCH_TEST_FAULT": "hang"}
    proc = subprocess.Popen([sys.executable, "-m", "actbench", "sweep-batch", "resnet18", "--strategies", "fp32",
                             "--batch", "2", "--image-size", "32", "--device", "cpu", "--out", str(out)],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while time.monotonic() < deadline and not workers and proc.poll() is None:
            workers = _workers_of(proc.pid)
            time.sleep(0.2)
        assert workers, f"no worker started: {proc.poll()}"
        time.sleep(1.0)  # the worker is past its start, hanging inside the point
        sent = time.monotonic()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - sent < 15, "the command did not exit promptly"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, err.decode()
    assert f"{signal.Signals(signum).name} received: 0 finished rows kept" in err.decode()
    deadline = time.monotonic() + 10
    while any(is_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(is_alive(w) for w in workers), "a worker outlived its parent"
    rows_path = run_dir_of(out) / "rows.jsonl"
    assert not rows_path.exists() or not rows_path.read_text().strip()  # the hanging point left no row


def test_run_prints_a_line_per_step_and_per_point(capsys) -> None:
    from actbench.cli.experiment_commands import _StepPrinter

    class Exp:
        name, steps = "e", ()

    printer = _StepPrinter(Exp())
    printer.on_event("info", "accuracy resnet8 16px")
    printer.on_event("start", "training fp32")
    assert capsys.readouterr().err == "e: accuracy resnet8 16px\n  training fp32 ... "  # flushed before it ends
    printer.on_event("done", "fp32: test accuracy 0.900")
    printer.on_event("cached", "2 bits: test accuracy 0.880")
    printer.on_event("start", "resnet18 fp32 b2 16px cpu")
    printer.on_event("done", "resnet18 fp32 b2 16px cpu: ok")
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"fp32: test accuracy 0\.900 \(\d+\.\d s\)", err[0])
    assert err[1] == "  2 bits: test accuracy 0.880 (resumed)"
    assert re.fullmatch(r"  resnet18 fp32 b2 16px cpu \.\.\. ok \(\d+\.\d s\)", err[2])
