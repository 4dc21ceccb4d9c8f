"""Huge, meaningless or hostile values are refused in one line, before anything runs (issue 11, items 5-7).

Each case names what a hostile user tried; each must exit 2 with one line on stderr, quickly (no list
of billions of points is ever built) and without writing anything under --out.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from actbench.cli import app
from actbench.experiments import ExperimentError, load_experiment


def invoke(args: list[str]):
    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("args, needle", [
    (["sweep-batch", "resnet18", "--batch", "1:100000000000:1", "--dry-run"], "at most 1048576"),
    (["sweep-batch", "resnet18", "--batch", "1:1000000:1", "--dry-run"], "1000000 values, at most 10000"),
    (["sweep-batch", "resnet18", "--batch", "16:100000000000", "--find-max", "--dry-run"], "at most 1048576"),
    (["plan", "resnet50", "--budget", "16GiB", "--high", "100000000000"], "--high must be at most 1048576"),
    (["plan", "resnet152", "--budget", "16GiB", "--dim", "depth", "--high", "100000000000"], "at most 65536"),
    (["memory", "resnet18", "--batch", "99999999999999999999", "--device", "meta"], "at most 1048576"),
    (["memory", "resnet152", "--width-per-group", "100000000", "--device", "meta"], "--width-per-group must be at most"),
    (["memory", "resnet152", "--extra-blocks", "100000000", "--device", "meta"], "--extra-blocks must be at most"),
    (["memory", "resnet18", "--image-size", "100000", "--device", "meta"], "--image-size must be at most"),
    (["sweep-batch", "resnet18", "--timeout", "nan"], "--timeout must be a positive number of seconds, got nan"),
    (["sweep-batch", "resnet18", "--timeout", "inf"], "--timeout must be a positive number of seconds, got inf"),
])
def test_huge_or_meaningless_numbers_are_one_line_errors(tmp_path: Path, args: list[str], needle: str) -> None:
    started = time.perf_counter()
    result = invoke([*args, "--out", str(tmp_path / "out")])
    assert time.perf_counter() - started < 30  # refused, not expanded
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


HEAD = 'name = "{name}"\ndescription = "x"\n'
STEP = ('[[steps]]\ncommand = "{command}"\nmodels = ["resnet18"]\nstrategies = ["fp32"]\ndevice = "meta"\n'
        'image_size = 32\nbatch = "2"\n{extra}')


def _file(tmp_path: Path, name: str = "ok", command: str = "memory", extra: str = "", tail: str = "") -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(HEAD.format(name=name) + STEP.format(command=command, extra=extra) + tail)
    return path


@pytest.mark.parametrize("kwargs, needle", [
    (dict(name="../../../X"), "'name' must be letters, digits"),
    (dict(name="/tmp/elsewhere"), "not a path"),
    (dict(command="rm -rf /", tail="[quick]\nimage_size = 16\n"), "steps[0].command: must be one of"),
    (dict(extra="timeout_s = nan\n"), "steps[0].timeout_s: must be a positive number of seconds, got nan"),
    (dict(), None),  # control: the same file with nothing wrong loads
])
def test_experiment_files_cannot_write_elsewhere_or_blame_the_wrong_key(tmp_path: Path, kwargs, needle) -> None:
    path = _file(tmp_path, **kwargs)
    if needle is None:
        assert load_experiment(path).name == "ok"
        return
    with pytest.raises(ExperimentError) as info:
        load_experiment(path)
    assert needle in str(info.value) and "\n" not in str(info.value)
    result = invoke(["run", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and needle in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "X").exists()


def test_accuracy_rejects_non_finite_hyperparameters(tmp_path: Path) -> None:
    path = tmp_path / "acc.toml"
    path.write_text('name = "acc"\ndescription = "x"\n[[steps]]\ncommand = "accuracy"\nlr = nan\n')
    with pytest.raises(ExperimentError, match="lr must be a finite number > 0, got nan"):
        load_experiment(path)


@pytest.mark.parametrize("args, needle", [
    (["memory", "resnet18", "--precision", "fp8", "--device", "meta"], "'fp8' is not one of 'fp32', 'bf16', 'fp16'"),
    (["memory", "resnet18", "--device", "tpu"], "'tpu' is not one of 'cpu', 'cuda', 'meta'"),
    (["memory", "resnet18", "--bogus"], "No such option: --bogus"),
    (["memroy", "resnet18"], "No such command 'memroy'"),
    (["plan"], "Missing argument 'model'"),
])
def test_usage_errors_from_the_command_line_are_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    """The installed command (not only the app object): choices and unknown options, one line, exit 2."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "actbench", *args, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("actbench: error: "), done.stderr
    assert not (tmp_path / "out").exists()


# --- rows read back: values out of range, outputs that would clobber inputs -----------------------
REPO = Path(__file__).resolve().parent.parent
ROW_TEMPLATE = REPO / "results/quick/modern_baselines-quick/memory_resnet18_cpu_32px_f2b38499/rows.jsonl"


def hand_made_run(tmp_path: Path, *bad: dict) -> Path:
    """A results folder with one run: a real cpu row of the committed results, then ``bad`` variants of it."""
    import json

    good = json.loads(ROW_TEMPLATE.read_text().splitlines()[0])
    run_dir = tmp_path / "results" / "run"
    run_dir.mkdir(parents=True)
    lines = [good] + [{**good, "key": f"{i:016x}", **changes} for i, changes in enumerate(bad, 1)]
    (run_dir / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run_dir


@pytest.mark.parametrize("changes, needle", [
    ({"batch_size": 0}, "'batch_size' is 0"),
    ({"batch_size": -4}, "'batch_size' is -4"),
    ({"batch_size": 2**63}, "'batch_size' is 9223372036854775808"),
    ({"image_size": 0}, "'image_size' is 0"),
    ({"samples_per_s_median": float("nan")}, "'samples_per_s_median' is nan"),
    ({"samples_per_s_median": float("inf")}, "'samples_per_s_median' is inf"),
    ({"samples_per_s_iqr": float("-inf")}, "'samples_per_s_iqr' is -inf"),
    ({"activation_bytes": -1}, "'activation_bytes' is -1"),
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"precision": "fp8"}, "unknown precision 'fp8'"),
    ({"strategy": "magic"}, "unknown strategy 'magic'"),
    ({"gpu": "voodoo2"}, "unknown GPU profile 'voodoo2'"),
])
def test_rows_out_of_range_are_skipped_with_one_warning(tmp_path: Path, caplog, changes: dict, needle: str) -> None:
    """report and plot publish no impossible row: it is skipped, one warning naming file and line."""
    run_dir = hand_made_run(tmp_path, {**changes, "status": changes.get("status", "ok"), "batch_size":
                                       changes.get("batch_size", 8)})
    results = run_dir.parent
    for command in (["report", str(results), "--out", str(tmp_path / "r.md"), "--no-figures"],
                    ["plot", str(results), "--out", str(tmp_path / "figs")]):
        caplog.clear()
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 0, (command[0], result.output, result.exception)
        found = [r.getMessage() for r in caplog.records if f"{run_dir / 'rows.jsonl'}:2: skipped" in r.getMessage()]
        assert len(found) == 1 and needle in found[0], caplog.text
    assert "| 8 |" not in (tmp_path / "r.md").read_text()


def test_the_committed_rows_are_all_in_range() -> None:
    """The range checks skip nothing the harness wrote: every committed row reads back."""
    from actbench.accuracy import find_accuracy_runs
    from actbench.results import RunStore

    results = REPO / "results"
    lines = sum(len([x for x in p.read_text().splitlines() if x.strip()]) for p in results.rglob("rows.jsonl"))
    read = sum(len(RunStore(p.parent).read_rows()) for p in results.rglob("rows.jsonl"))
    acc_lines = sum(len(p.read_text().splitlines()) for p in results.rglob("accuracy.jsonl"))
    assert read == lines > 1000
    assert sum(len(rows) for _, rows in find_accuracy_runs(results)) == acc_lines > 0


@pytest.mark.parametrize("command, target", [
    ("report", "rows.jsonl"), ("report", "env.json"), ("report", "config.json"), ("report", "table.csv"),
    ("report", "link-to-rows"), ("plot", "rows.jsonl"), ("plot", "rows.jsonl/figs"), ("report", "paper-csv"),
])
def test_outputs_never_replace_what_the_command_reads(tmp_path: Path, command: str, target: str) -> None:
    run_dir = hand_made_run(tmp_path)
    for name in ("env.json", "config.json", "table.csv"):
        (run_dir / name).write_text("{}\n")
    (run_dir / "link-to-rows").symlink_to(run_dir / "rows.jsonl")
    paper = tmp_path / "paper.csv"
    paper.write_text("strategy,batch_size,ips,status\nfp32,64,100,ok\n")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    out = paper if target == "paper-csv" else run_dir / target
    result = CliRunner().invoke(app, [command, str(run_dir.parent), "--out", str(out), "--paper-csv", str(paper)]
                                + (["--no-figures"] if command == "report" else []))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "would overwrite" in lines[0], result.stderr
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    assert paper.read_text().startswith("strategy,")


@pytest.mark.parametrize("args, needle", [
    (["report", "--out", ""], "--out must not be empty"),
    (["plot", "--out", ""], "--out must not be empty"),
    (["report", "--figures", ""], "--figures must not be empty"),
    (["report", "--out", "{dir}"], "is a directory; expected a file path"),
    (["report", "--out", "{file}/r.md"], "not writable"),
    (["plot", "--out", "{file}/figs"], "not writable"),
])
def test_output_paths_are_checked_before_any_work(tmp_path: Path, args: list[str], needle: str) -> None:
    run_dir = hand_made_run(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    args = [a.format(dir=tmp_path / "dir", file=tmp_path / "file") for a in args]
    result = CliRunner().invoke(app, [args[0], str(run_dir.parent), *args[1:]])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert not (run_dir.parent / "figures").exists() and not (run_dir.parent / "report.md").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file", "results"]
