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

    from actbench.executors import _child_env

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACTBENCH_CACHE_DIR", "relative-cache")
    result = invoke(["memory", "resnet18", "--device", "meta", "--batch", "2", "--image-size", "16",
                     "--strategies", "fp32", "--no-baseline", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert os.environ["ACTBENCH_CACHE_DIR"] == str(tmp_path / "relative-cache")
    assert _child_env(None)["ACTBENCH_CACHE_DIR"] == str(tmp_path / "relative-cache")


def test_a_failed_build_names_the_compilers_error_and_the_variable(tmp_path: Path, monkeypatch) -> None:
    from actbench import extension

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
