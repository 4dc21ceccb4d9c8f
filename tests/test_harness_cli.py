"""End-to-end tests of the harness commands: real child processes, tiny settings (resnet18, 32 px).

Failures are injected through the worker's test hook ``ACTBENCH_TEST_FAULT`` (see actbench.worker):
the child really crashes (abort), hangs (and is killed by the timeout) or raises out-of-memory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from actbench.cli import app

pytestmark = pytest.mark.slow

ON_CPU = ["--device", "cpu", "--warmup-steps", "1", "--timed-steps", "2"]
TINY = ["--image-size", "32", *ON_CPU]
#: fp32 alone (without --levels/--strategies the commands compare fp32 with ActNN L3)
FP32 = ["--strategies", "fp32"]
REPO = Path(__file__).resolve().parent.parent


def invoke(args: list[str], fault: str | None = None):
    env = {"ACTBENCH_TEST_FAULT": fault} if fault else {"ACTBENCH_TEST_FAULT": None}
    return CliRunner(env=env).invoke(app, args, catch_exceptions=False)


def only_run_dir(out: Path) -> Path:
    dirs = [d for d in out.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """One sweep of every non-ActNN strategy, shared by the resume and bad-input tests."""
    out = tmp_path_factory.mktemp("sweep")
    args = ["sweep-batch", "resnet18", "--strategies", "fp32,swap,checkpoint", "--batch", "2", *TINY,
            "--out", str(out)]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    return out, only_run_dir(out), args


def test_models_lists_torchvision_names() -> None:
    result = invoke(["models", "resnet*"])
    assert result.exit_code == 0
    assert "resnet18" in result.stdout.split() and "resnet152" in result.stdout.split()
    assert "vgg16" not in result.stdout


@pytest.mark.memory_gb(2.8)  # 2.68 GB measured, children included
def test_sweep_writes_rows_table_env_for_every_strategy(swept) -> None:
    _, run_dir, _ = swept
    assert run_dir.name.startswith("sweep-batch_resnet18_cpu_32px_")
    got = rows(run_dir)
    assert [r["strategy"] for r in got] == ["fp32", "swap", "checkpoint"]
    for r in got:
        assert r["status"] == "ok", r
        assert r["device"] == "cpu" and r["batch_size"] == 2 and r["image_size"] == 32 and r["depth"] == 18
        assert r["activation_bytes"] > 0 and r["peak_alloc_bytes"] > r["activation_bytes"]
        assert r["reserved_bytes"] is None and r["samples_per_s_median"] > 0 and r["flops_per_sample"] > 0
        assert r["key"] and r["run_id"] == run_dir.name
    by = {r["strategy"]: r for r in got}
    assert by["swap"]["activation_bytes"] < by["fp32"]["activation_bytes"] / 10
    assert by["checkpoint"]["activation_bytes"] < by["fp32"]["activation_bytes"]
    env = json.loads((run_dir / "env.json").read_text())
    assert env["env_id"] == got[0]["env_id"] and env["torch"] and env["cpu_model"] and env["device"] == "cpu"
    header = (run_dir / "table.csv").read_text().splitlines()[0].split(",")
    assert {"activation_bytes", "peak_alloc_bytes", "reserved_bytes", "model_bytes", "samples_per_s_median",
            "samples_per_s_iqr", "flops_per_sample", "budget_bytes", "status", "message"} <= set(header)
    assert len((run_dir / "table.csv").read_text().splitlines()) == 4


def test_rerun_resumes_and_skips_finished_points(swept) -> None:
    out, run_dir, args = swept
    before = (run_dir / "rows.jsonl").read_bytes()
    started = time.monotonic()
    result = invoke(args)
    assert result.exit_code == 0
    assert (run_dir / "rows.jsonl").read_bytes() == before  # nothing re-measured or duplicated
    assert "resumed" in result.stderr
    assert time.monotonic() - started < 20  # no child processes were started
    assert only_run_dir(out) == run_dir


@pytest.mark.parametrize("bad_args, expected", [
    (["sweep-batch", "resnt18"], "unknown model 'resnt18'; did you mean resnet18"),
    (["sweep-batch", "resnet18", "--levels", "L1..L9"], "bad level range 'L1..L9'"),
    (["sweep-batch", "resnet18", "--batch", "0:8:2"], "batch sizes must be positive, got 0"),
    (["sweep-batch", "resnet18", "--budget", "16XB"], "cannot parse budget '16XB'"),
    (["max-scale", "resnet18", "--dim", "depth"], "grows resnet152 only"),
    (["throughput", "resnet18", "--device", "meta", "--timed-steps", "3"], "--timed-steps must be 0 on meta: it predicts memory only"),
])
def test_bad_input_exits_with_one_line_and_keeps_results(swept, bad_args, expected) -> None:
    out, run_dir, _ = swept
    before = (run_dir / "rows.jsonl").read_bytes()
    result = invoke([*bad_args, "--out", str(out)])
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert (run_dir / "rows.jsonl").read_bytes() == before
    assert only_run_dir(out) == run_dir


def test_unwritable_output_directory(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = invoke(["memory", "resnet18", *FP32, *TINY, "--batch", "2", "--out", str(blocker / "results")])
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not writable" in lines[0] and str(blocker) in lines[0]
    assert blocker.read_text() == "not a directory"


def test_dry_run_prints_points_and_writes_nothing(tmp_path) -> None:
    result = invoke(["sweep-batch", "resnet50", "--levels", "L1..L5", "--batch", "16:64:16", "--dry-run",
                     "--out", str(tmp_path)])
    assert result.exit_code == 0
    assert "fp32:" in result.stdout and "L5:" in result.stdout and "16, 32, 48, 64" in result.stdout
    result = invoke(["max-scale", "--dim", "width", "--strategies", "swap", "--dry-run", "--out", str(tmp_path)])
    assert result.exit_code == 0 and "64..512 step 8" in result.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.memory_gb(2.1)  # 2.04 GB measured, children included
def test_throughput_and_memory_commands(tmp_path) -> None:
    result = invoke(["throughput", "resnet18", "--strategy", "checkpoint", "--no-baseline", "--batch", "2",
                     *TINY, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (row,) = rows(only_run_dir(tmp_path))
    assert row["strategy"] == "checkpoint" and row["samples_per_s_median"] > 0 and row["timed_steps"] == 2

    out2 = tmp_path / "mem"
    result = invoke(["memory", "resnet18", "--strategy", "swap", "--no-baseline", "--batch", "2", *TINY,
                     "--timed-steps", "0", "--out", str(out2)])
    assert result.exit_code == 0, result.output
    (row,) = rows(only_run_dir(out2))
    assert row["status"] == "ok" and row["samples_per_s_median"] is None and row["host_bytes"] > 0
    assert row["model_bytes"] == row["param_bytes"] + row["grad_bytes"] + row["optimizer_state_bytes"]
    assert "optimizer state" in result.stdout


@pytest.mark.memory_gb(2.1)  # 2.01 GB measured, children included
def test_tiny_budget_gives_over_budget_row(tmp_path) -> None:
    result = invoke(["memory", "resnet18", *FP32, "--batch", "2", *TINY, "--budget", "1MiB", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (row,) = rows(only_run_dir(tmp_path))
    assert row["status"] == "over_budget" and row["budget_bytes"] == 2**20
    assert row["peak_alloc_bytes"] > 2**20


@pytest.mark.memory_gb(2.1)  # 2.04 GB measured, children included
def test_crashing_child_becomes_error_row_and_sweep_goes_on(tmp_path) -> None:
    result = invoke(["sweep-batch", "resnet18", *FP32, "--batch", "2,4", *TINY, "--timed-steps", "0",
                     "--out", str(tmp_path)], fault="crash@batch=2")
    assert result.exit_code == 0, result.output
    got = rows(only_run_dir(tmp_path))
    assert [(r["batch_size"], r["status"]) for r in got] == [(2, "error"), (4, "ok")]
    assert "SIGABRT" in got[0]["message"] and "injected crash" in got[0]["message"]


def test_hanging_child_times_out(tmp_path) -> None:
    result = invoke(["memory", "resnet18", *FP32, "--batch", "2", *TINY, "--timeout", "2", "--out", str(tmp_path)],
                    fault="hang")
    assert result.exit_code == 1, result.output  # its only point failed to measure
    (row,) = rows(only_run_dir(tmp_path))
    assert row["status"] == "timeout" and "2 s" in row["message"]
    assert "every point failed to measure" in result.stderr


@pytest.mark.memory_gb(2.0)  # 1.89 GB measured, children included
def test_oom_rows_and_stop_after(tmp_path) -> None:
    result = invoke(["sweep-batch", "resnet18", *FP32, "--batch", "2,4,6", "--stop-after", "2", *TINY,
                     "--out", str(tmp_path)], fault="oom")
    assert result.exit_code == 0, result.output
    got = rows(only_run_dir(tmp_path))
    assert [(r["batch_size"], r["status"]) for r in got] == [(2, "oom"), (4, "oom")]
    assert "injected out-of-memory" in got[0]["message"]


@pytest.mark.memory_gb(2.2)  # 2.07 GB measured, children included
def test_find_max_binary_search(tmp_path) -> None:
    """Candidates 4, 8, 12, 16; points above 8 'run out of memory': probes 8 (ok) then 12 (oom)."""
    result = invoke(["sweep-batch", "resnet18", *FP32, "--batch", "4:16", "--find-max", *TINY, "--timed-steps", "0",
                     "--out", str(tmp_path)], fault="oom@batch>8")
    assert result.exit_code == 0, result.output
    run_dir = only_run_dir(tmp_path)
    assert [(r["batch_size"], r["status"]) for r in rows(run_dir)] == [(8, "ok"), (12, "oom")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["max_batch"]["fp32"] == {"max": 8, "bounded": True, "key": rows(run_dir)[0]["key"],
                                            "method": "bisection", "probes": 2, "fit": None,
                                            "fallback": "no budget to aim at"}  # no --budget: bisection
    assert "≥" not in result.stdout  # 12 was seen failing: 8 is the maximum, not a lower bound


@pytest.mark.memory_gb(2.1)  # 1.99 GB measured, children included
def test_maximum_without_a_failure_is_a_lower_bound(tmp_path) -> None:
    """Everything tried fits: the table says ≥ and why, and summary.json says bounded = false."""
    result = invoke(["sweep-batch", "resnet18", *FP32, "--batch", "2,4", *TINY, "--timed-steps", "0",
                     "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # the caption wraps at the table's width
    assert "≥4" in text and "beyond the range searched (widen the range, or set --budget)" in text
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["max_batch"]["fp32"]["max"] == 4 and summary["max_batch"]["fp32"]["bounded"] is False


@pytest.mark.memory_gb(2.1)  # 2.02 GB measured, children included
def test_max_scale_resolution(tmp_path) -> None:
    result = invoke(["max-scale", "resnet18", *FP32, "--dim", "resolution", "--low", "32", "--high", "96", "--step",
                     "32", "--batch", "2", *ON_CPU, "--out", str(tmp_path)], fault="oom@image>64")  # no --image-size
    assert result.exit_code == 0, result.output
    run_dir = only_run_dir(tmp_path)
    got = rows(run_dir)
    assert [(r["image_size"], r["status"]) for r in got] == [(64, "ok"), (96, "oom")]
    assert got[0]["samples_per_s_median"] > 0 and got[0]["flops_per_sample"] > 0
    assert json.loads((run_dir / "summary.json").read_text())["max"]["fp32"]["max"] == 64
    assert json.loads((run_dir / "summary.json").read_text())["max"]["fp32"]["bounded"] is True


@pytest.mark.heavy  # ResNet-152 trained on the CPU: minutes on 2 cores
def test_max_scale_depth_grows_resnet152(tmp_path) -> None:
    result = invoke(["max-scale", *FP32, "--dim", "depth", "--low", "0", "--high", "2", "--step", "2", "--batch", "2",
                     *TINY, "--timed-steps", "0", "--out", str(tmp_path)], fault="oom@blocks>0")
    assert result.exit_code == 0, result.output
    got = rows(only_run_dir(tmp_path))
    assert [(r["extra_blocks"], r["status"]) for r in got] == [(0, "ok"), (2, "oom")]
    assert got[0]["depth"] == 152 and got[0]["model"] == "resnet152"


@pytest.mark.memory_gb(2.6)  # 2.49 GB measured, children included
def test_ctrl_c_keeps_finished_rows(tmp_path) -> None:
    """SIGINT while the second point runs: exit 130, the first row is on disk, CSV rebuilt from it."""
    # A shell starts commands with SIGINT at its default. Restore it explicitly: a child inherits
    # *ignored* signals, and after the in-process unit tests this pytest process was seen with SIGINT
    # and SIGQUIT ignored (SigIgn 0x1001006), which made the CLI deaf to Ctrl-C here (not in real use).
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from actbench.cli import app; sys.argv[0] = 'actbench'; app()")
    args = ["sweep-batch", "resnet18", *FP32, "--batch", "2,4", *TINY, "--timed-steps", "0", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "ACTBENCH_TEST_FAULT": "hang@batch=4"}
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        rows_path = None
        while time.monotonic() < deadline:
            found = list(tmp_path.glob("*/rows.jsonl"))
            if found and found[0].read_text().strip():
                rows_path = found[0]
                break
            time.sleep(0.5)
        assert rows_path is not None, "first point never finished"
        time.sleep(0.5)  # the worker that wrote the first row is on the second (hanging) point by now
        status = Path(f"/proc/{proc.pid}/status").read_text()
        sig_lines = [ln for ln in status.splitlines() if ln.startswith(("SigBlk", "SigIgn", "SigCgt"))]
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"no exit after SIGINT; {sig_lines}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err.decode()
    got = rows(rows_path.parent)
    assert [(r["batch_size"], r["status"]) for r in got] == [(2, "ok")]
    assert len((rows_path.parent / "table.csv").read_text().splitlines()) == 2


@pytest.mark.memory_gb(2.1)  # 2.03 GB measured, children included
def test_actnn_level_through_the_cli_gets_its_allocator_setting(tmp_path) -> None:
    """L5's PYTORCH_CUDA_ALLOC_CONF comes from actbench.actnn's level config and is set in the child's
    environment at start (before CUDA could start); the child reports what it saw. Needs actbench.actnn."""
    result = invoke(["memory", "resnet18", "--levels", "L5", "--no-baseline", "--batch", "2", *TINY,
                     "--timed-steps", "0", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (row,) = rows(only_run_dir(tmp_path))
    assert row["status"] == "ok", row["message"]
    assert row["strategy"] == "L5" and row["alloc_conf"] == "expandable_segments:True"
    assert row["strategy_note"].startswith("ActNN L5")


TEACHING_COMMANDS = ("sweep-batch", "max-scale", "throughput", "memory", "plan", "trust", "verify-grads", "plot", "report",
                     "run")


@pytest.mark.parametrize("command", sorted(typer.main.get_command(app).commands))
def test_every_command_has_help(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Usage: actbench " + command in " ".join(result.output.split())
    if command in TEACHING_COMMANDS:  # the commands users compose: --help shows a runnable example
        assert "Example" in result.output and f"actbench {command} " in result.output


def test_plan_predicts_with_one_job_per_core_unless_told(monkeypatch) -> None:
    """plan's default --jobs: one per core, at most PLAN_MAX_DEFAULT_JOBS; as given otherwise; 1 where the
    points' placement is another option's (--gpus, --executor slurm)."""
    from actbench.execution import executors
    from actbench.cli import harness_commands as hc

    monkeypatch.setattr(executors, "cpu_count", lambda: 2)
    assert hc.plan_jobs(None, None, "local") == 2
    monkeypatch.setattr(executors, "cpu_count", lambda: 64)
    assert hc.plan_jobs(None, None, "local") == hc.PLAN_MAX_DEFAULT_JOBS == 4
    monkeypatch.setattr(executors, "cpu_count", lambda: 1)
    assert hc.plan_jobs(None, None, "local") == 1
    assert hc.plan_jobs(3, None, "local") == 3
    assert hc.plan_jobs(None, "0,1", "local") == 1 and hc.plan_jobs(None, None, "slurm") == 1
