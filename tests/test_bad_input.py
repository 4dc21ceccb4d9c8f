"""Huge, meaningless or hostile values are refused in one line, before anything runs.

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
    (["sweep-batch", "resnet18", "--batch", "5:7", "--find-max", "--dry-run"], "5..7 holds none"),
    (["memory", "resnet18", "--batch", "1_0", "--device", "meta"], "bad batch '1_0'"),
    (["memory", "resnet18", "--batch", "\u0663", "--device", "meta"], "bad batch '\u0663'"),
    (["memory", "resnet18", "--batch", "2,4,2", "--device", "meta"], "it lists 2 twice"),
    (["memory", "resnet18", "--budget", "1.5", "--device", "meta"], "--budget '1.5' is not a whole number of bytes"),
    (["memory", "resnet18", "--image-size", "\u0663\u0662", "--device", "meta"], "--image-size must be N or HxW"),
    (["memory", "resnet18", "--levels", "all,L1", "--device", "meta"], "'all' stands alone"),
    (["plan", "resnet18", "--dim", "resolution", "--image-size", "64", "--budget", "1GiB"],
     "--image-size 64 does nothing with --dim resolution"),
    (["plan", "resnet50", "--budget", "16GiB", "--high", "100000000000"], "--high must be at most 1048576"),
    (["plan", "resnet152", "--budget", "16GiB", "--dim", "depth", "--high", "100000000000"], "at most 65536"),
    (["memory", "resnet18", "--batch", "99999999999999999999", "--device", "meta"], "at most 1048576"),
    (["memory", "resnet152", "--width-per-group", "100000000", "--device", "meta"], "--width-per-group must be at most"),
    (["memory", "resnet152", "--extra-blocks", "100000000", "--device", "meta"], "--extra-blocks must be at most"),
    (["memory", "resnet18", "--image-size", "100000", "--device", "meta"], "--image-size height must be in 16..16384 pixels, got 100000"),
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
    (["plan", "resnet18", "--gpu", "t5"], "'t5' is not one of 't4', 'v100', 'l4', 'a10', 'a100-40gb', 'a100-80gb', "
                                          "'h100-80gb', 'h200', 'rtx3090', 'rtx4090'"),
    (["trust", "--precision", "fp8"], "'fp8' is not one of 'fp32', 'bf16', 'fp16'"),
    (["verify-grads", "resnet18", "--precision", "fp8"], "'fp8' is not one of 'fp32', 'bf16', 'fp16'"),
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


# --- environment variables are checked as options are ---------------------------------------------
@pytest.mark.parametrize("name, value, needle", [
    ("ACTBENCH_EXACT_STEPS", "yes", "ACTBENCH_EXACT_STEPS must be 0 or 1"),
    ("ACTBENCH_WITH_CUDA", "garbage", "ACTBENCH_WITH_CUDA must be 0 or 1"),
    ("TORCH_CUDA_ARCH_LIST", "garbage", "TORCH_CUDA_ARCH_LIST must be compute capabilities"),
    ("TORCH_CUDA_ARCH_LIST", "8.0;sm_90", "TORCH_CUDA_ARCH_LIST must be compute capabilities"),
    ("ACTBENCH_CACHE_DIR", "cache\nx", "ACTBENCH_CACHE_DIR must be a folder path without control characters"),
    ("ACTBENCH_CACHE_DIR", "/dev/null", "ACTBENCH_CACHE_DIR must be a folder"),
])
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_bad_environment_variables_are_one_line_errors(tmp_path: Path, monkeypatch, name: str, value: str,
                                                      needle: str, device: str) -> None:
    monkeypatch.setenv(name, value)
    result = invoke(["memory", "resnet18", "--device", device, "--batch", "2", "--image-size", "16",
                     "--strategies", "fp32", "--no-baseline", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and name in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_a_relative_cache_dir_is_made_absolute_for_every_child(tmp_path: Path, monkeypatch) -> None:
    import os

    from actbench.execution.worker_processes import _child_env

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACTBENCH_CACHE_DIR", "relative-cache")
    result = invoke(["memory", "resnet18", "--device", "meta", "--batch", "2", "--image-size", "16",
                     "--strategies", "fp32", "--no-baseline", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert os.environ["ACTBENCH_CACHE_DIR"] == str(tmp_path / "relative-cache")
    assert _child_env(None)["ACTBENCH_CACHE_DIR"] == str(tmp_path / "relative-cache")


def test_a_failed_build_names_the_compilers_error_and_the_variable(tmp_path: Path, monkeypatch) -> None:
    from actbench.kernels import extension

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    p = extension.plan(cache_dir=tmp_path / "cache", with_cuda=False)
    with pytest.raises(extension.ExtensionError) as info:
        extension.build(p)
    message = str(info.value)
    assert "\n" not in message
    cause = message.split(": ", 1)[1].split(". Full log")[0]
    assert "no-such-compiler" in cause and "not found" in cause and "CXX=" in cause, message


# --- experiment files: any content is one line naming the key, before anything is written ------------
def _raw_file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "exp.toml"
    path.write_bytes(data)
    return path


GOOD = (HEAD.format(name="x") + STEP.format(command="memory", extra="")).encode()
ACCURACY = b'name = "x"\ndescription = "x"\n[[steps]]\ncommand = "accuracy"\nsteps = 1\n'


@pytest.mark.parametrize("data, needle", [
    (GOOD.replace(b'batch = "2"', b"batch = " + b"9" * 5000), "integer"),
    (GOOD + b"timeout_s = " + b"9" * 400 + b"\n", "steps[0].timeout_s"),
    (GOOD.replace(b'description = "x"', b'description = "\xff\xfe"'), "UTF-8"),
    (GOOD + b"z = " + b"[" * 100000 + b"]" * 100000 + b"\n", "exp.toml"),
    (GOOD + b"timed_steps = " + b"[" * 50 + b"1" + b"]" * 50 + b"\n", "steps[0].timed_steps"),
    (GOOD.replace(b'models = ["resnet18"]', b"models = [" + b'"resnet18", ' * 20000 + b"]"),
     "steps[0].models: 'resnet18' is listed more than once"),
    (GOOD.replace(b'models = ["resnet18"]', b'models = ["resnet18", "resnet34", "resnet50"]')
     .replace(b'batch = "2"', b'batch = "1:10000:1"').replace(b'strategies = ["fp32"]',
                                                            b'strategies = ["fp32", "L1", "L2", "L3", "L4"]'),
     "steps[0]: 150000 points"),
    (ACCURACY + b"model_depth = 9\n", "steps[0].model_depth"),
    (ACCURACY + b"group_size = 7\n", "steps[0].group_size"),
    (ACCURACY + b"model_depth = 8000002\n", "steps[0].model_depth"),
    (ACCURACY + b"seed = -1\n", "steps[0].seed"),
    (ACCURACY + b"train_size = 1000000000000\n", "steps[0].train_size"),
    (ACCURACY + b'model = "vit"\npatch_size = 48\nimage_size = 48\nwidth = 100000\nheads = 1\n', "steps[0].width"),
    (GOOD + b'[slurm]\npartition = ["gpu", "cpu"]\n', "[slurm]: partition"),
    (GOOD.replace(b'name = "x"', b'name = "' + b"x" * 5000 + b'"'), "'name' must be"),
], ids=["5000-digit-batch", "400-digit-timeout", "not-utf8", "deep-nesting", "nested-list", "20000-same-models",
        "150000-points", "resnet-depth", "group-size", "huge-depth", "negative-seed", "huge-train-size", "huge-width",
        "slurm-list", "5000-character-name"])
def test_experiment_files_of_any_content_are_one_line_errors(tmp_path: Path, data: bytes, needle: str) -> None:
    path = _raw_file(tmp_path, data)
    with pytest.raises(ExperimentError) as info:
        load_experiment(path)
    message = str(info.value)
    assert needle in message and "\n" not in message and len(message) < 400, message[:500]
    result = invoke(["run", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output[-500:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr[-500:]
    assert not (tmp_path / "out").exists()


def test_the_same_files_without_the_fault_load(tmp_path: Path) -> None:
    assert load_experiment(_raw_file(tmp_path, GOOD)).name == "x"
    assert load_experiment(_raw_file(tmp_path, ACCURACY + b"model_depth = 14\ngroup_size = 64\n")).name == "x"


# --- options that do nothing, outputs checked first, records of what was used ---------------------
META = ["--device", "meta", "--image-size", "32", "--batch", "2"]


@pytest.mark.parametrize("args, needle", [
    (["throughput", "resnet18", *META], "--device meta predicts memory only, no throughput"),
    (["sweep-batch", "resnet18", "--strategies", "", "--levels", "", *META, "--budget", "1GiB"],
     "--strategies is empty"),
    (["memory", "resnet18", "--levels", " ", *META], "--levels is empty"),
    (["memory", "resnet18", *META, "--budget", "0.5"], "GB or TB), got '0.5'"),
    (["memory", "resnet18", *META, "--budget", "lots"], "--budget cannot parse budget 'lots': it must be a size in bytes of at least 1"),
    (["memory", "resnet18", *META, "--strategies", "swap", "--host-budget", "0"],
     "--host-budget must be a size in bytes of at least 1"),
    (["memory", "resnet18", *META, "--host-budget", "1GiB"], "--host-budget limits the pinned host memory"),
    (["plan", "resnet18", "--budget", "1GiB", "--low", "0"], "--low must be at least 1"),
    (["max-scale", "resnet152", "--dim", "width", "--low", "96", "--high", "64", *META, "--budget", "1GiB"],
     "--low must be at most --high"),
    (["memory", "resnet18", *META, "--strategies", "checkpoint", "--checkpoint-segments", "1000000"],
     "--checkpoint-segments must be at most 8"),
    (["memory", "resnet18", *META, "--checkpoint-segments", "2"], "--checkpoint-segments applies to"),
    (["memory", "resnet18", *META, "--warmup-steps", "5"], "--warmup-steps does nothing on meta"),
    (["memory", "resnet18", *META, "--jobs", "1000"], "--jobs must be between 1 and"),
    (["memory", "resnet18", *META, "--isolate"], "--isolate"),
    (["memory", "resnet18", *META, "--force", "--no-retry"], "--no-retry"),
    (["memory", "resnet18", *META, "--timeout", "5"], "--timeout limits a point's child process"),
    (["sweep-batch", "resnet18", *META, "--batch", "4:64", "--budget", "1GiB", "--find-max", "--stop-after", "3"],
     "--stop-after"),
    (["sweep-batch", "resnet18", "--strategies", ",", *META, "--budget", "1GiB"], "--strategies is empty"),
    (["throughput", "resnet18", "--device", "cpu", "--timed-steps", "0"], "--timed-steps must be at least 1 for"),
    (["memory", "resnet18", "--batch", "16:8", "--device", "meta"], "START <= STOP"),
])
def test_options_that_do_nothing_or_bad_sizes_are_one_line_errors(tmp_path: Path, args: list[str],
                                                                    needle: str) -> None:
    result = invoke([*args, "--dry-run", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


def _out_cases(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """--out values that cannot hold results, with what the one-line error says."""
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone" / "runs")
    return {"empty": ("", "--out must name a directory, got ''"),
            "file": (str(afile), "is a file"),
            "under a file": (str(afile / "sub"), "is not a directory"),
            "control": ("runs\ntouch x", "got 'runs\\ntouch x'"),
            "dangling link": (str(tmp_path / "dangling"), f"is a dangling symbolic link (to '{tmp_path}/gone/runs')")}


@pytest.mark.parametrize("case", ["empty", "file", "under a file", "control", "dangling link"])
@pytest.mark.parametrize("args", [
    ["memory", "resnet18", *META],
    ["sweep-batch", "resnet18", *META, "--budget", "1GiB", "--dry-run"],
    ["plan", "resnet18", "--budget", "1GiB", "--dry-run"],
    ["verify-grads", "resnet18", "--batch", "2", "--seeds", "2", "--image-size", "32"],
    ["bench-harness", "--quick"],
    ["bench-kernels", "--sizes-mib", "1", "--repeats", "1"],
    ["bench-actnn", "--quick"],
    ["trust", "--models", "resnet18", "--strategies", "fp32"],
    ["run", "memory_per_level", "--quick", "--device", "meta", "--no-report"],
], ids=lambda a: a[0])
def test_out_is_checked_before_any_work(tmp_path: Path, monkeypatch, args: list[str], case: str) -> None:
    monkeypatch.chdir(tmp_path)
    out, needle = _out_cases(tmp_path)[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    started = time.perf_counter()
    result = invoke([*args, "--out", out])
    assert time.perf_counter() - started < 20  # refused up front, not after computing
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "afile").read_text() == "keep me\n"


def test_bench_harness_refuses_more_jobs_than_cores(tmp_path: Path) -> None:
    result = invoke(["bench-harness", "--quick", "--jobs", "1000", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--jobs must be between 2 and" in lines[0] and "got 1000" in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_verify_grads_refuses_one_sample_for_batchnorm_up_front(tmp_path: Path) -> None:
    result = invoke(["verify-grads", "resnet18", "--batch", "1", "--seeds", "2", "--image-size", "32",
                     "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--batch must be >= 2 for resnet18" in lines[0], result.stderr
    assert "BatchNorm" in lines[0] and not (tmp_path / "out").exists()


def test_verify_grads_device_is_a_choice_like_elsewhere(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "actbench", "verify-grads", "resnet18", "--device", "meta",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'meta' is not one of 'cpu', 'cuda'" in lines[0], done.stderr


def test_two_benchmark_folders_started_in_one_second_differ(tmp_path: Path, monkeypatch) -> None:
    import time as clock

    from actbench.cli.app import new_bench_dir

    monkeypatch.setattr(clock, "gmtime", lambda *_: clock.struct_time((2026, 1, 2, 3, 4, 5, 4, 2, 0)))
    monkeypatch.setattr("actbench.measure.environment.capture_environment", lambda device: {"device": device.name})
    first = new_bench_dir(tmp_path, "bench-kernels", "cpu")
    second = new_bench_dir(tmp_path, "bench-kernels", "cpu")
    assert first != second and first.is_dir() and second.is_dir()
    assert (first / "env.json").exists() and (second / "env.json").exists()


def test_throughput_that_measured_no_throughput_exits_non_zero(tmp_path: Path) -> None:
    """Every point over its budget: the table is written, and the exit code says no throughput came out."""
    result = invoke(["throughput", "resnet18", "--strategies", "fp32", "--device", "cpu", "--image-size", "32",
                     "--batch", "2", "--budget", "1KiB", "--warmup-steps", "1", "--timed-steps", "1",
                     "--out", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    assert "no throughput measured" in result.stderr and "over_budget" in result.stderr


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
    ({"precision": "fp8" + "x" * 5000}, "unknown precision 'fp8" + "x" * 36 + "…' (expected"),  # cut, as device's
    ({"strategy": "magic"}, "unknown strategy 'magic'"),
    ({"gpu": "voodoo2"}, "unknown GPU spec 'voodoo2'"),
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
    from actbench.studies.accuracy import find_accuracy_runs
    from actbench.store.results import RunStore

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
    (["report", "--out", "{dir}/r\n.md"], "/r\\n.md'"),
    (["report", "--figures", "{dir}/figs\x1b"], "/figs\\x1b'"),
    (["plot", "--out", "{dir}/figs\r"], "/figs\\r'"),
    (["report", "--paper-csv", "/dev/zero", "--out", "{dir}/r.md"], "'/dev/zero' is a character device"),
    (["report", "--paper-csv", "{file}", "--out", "{dir}/r.md", "--no-figures"],
     "/file': missing column(s) strategy, batch_size, ips, status (it has no line but notes and blank ones)"),
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


# --- device-model files: read as run files are --------------------------------------------------
def _device_model_file(tmp_path: Path, kind: str) -> Path:
    import os

    path = tmp_path / f"{kind}.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "not-utf8":
        path.write_bytes(b'{"version": 1, "name": "\xff\xfe"}')
    elif kind == "digits":
        path.write_text('{"version": ' + "9" * 5000 + "}")
    elif kind == "huge":
        path.write_bytes(b" " * (17 << 20) + b"{}")
    return path


@pytest.mark.parametrize("kind, needle", [
    ("fifo", "is a FIFO; expected a regular file"),
    ("device", "is a character device; expected a regular file"),
    ("deep", "nested"),
    ("not-utf8", "is not UTF-8"),
    ("digits", "an integer of 5000 digits"),
    ("huge", "larger than 16 MiB"),
])
def test_a_device_model_file_is_read_with_limits(tmp_path: Path, kind: str, needle: str) -> None:
    """A FIFO or /dev/zero never hangs; hostile content is one line naming the file (a child: a hang
    would otherwise stop the suite)."""
    import subprocess
    import sys

    path = _device_model_file(tmp_path, kind)
    done = subprocess.run([sys.executable, "-m", "actbench", "memory", "resnet18", *META, "--strategies", "fp32",
                           "--no-baseline", "--dry-run", "--device-model", str(path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"'{path}'" in lines[0] and needle in lines[0], done.stderr
    assert not (tmp_path / "out").exists()


def test_calibrate_out_with_control_characters_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(["calibrate", "--quick", "--out", "cpu\n.json"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "got 'cpu\\n.json'" in lines[0], result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["report", "plot"])
def test_an_output_that_is_a_pipe_or_device_is_refused_not_replaced(tmp_path: Path, command: str) -> None:
    """Writing goes through a temporary file renamed over the target: over a FIFO or a device node that
    would replace the node itself (as root, /dev/null). Such a target is refused in one line."""
    import os
    import stat

    run_dir = hand_made_run(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = CliRunner().invoke(app, [command, str(run_dir.parent), "--out", str(fifo)]
                                + (["--no-figures"] if command == "report" else []))
    assert result.exit_code == 2 and "device, pipe or socket" in result.output, result.output
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
