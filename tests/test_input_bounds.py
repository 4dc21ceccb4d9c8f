"""Every count and size a command takes is bounded where its rows, its readers or its run time bound it.

A value the row reader would skip (``actbench/schema.py``'s column ranges) is refused before the run, in
one line naming the maximum: the options and experiment files take their bounds from the same ranges,
so the two cannot drift apart. Counts that only cost time (verify-grads' draws, bench-kernels' calls,
points at once) are bounded too, with the validators the other commands use.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from actbench.cli import app
from actbench.execution.parsing import MAX_SIZE_BYTES
from actbench.execution.specs import CommandSpec, SpecError
from actbench.experiments import ExperimentError, load_experiment
from actbench.schema import Measurement, ResultRow, column_range, row_value_problem

META = ["--device", "meta", "--image-size", "32", "--batch", "2", "--strategies", "fp32", "--no-baseline"]
CPU = ["--device", "cpu", "--image-size", "32", "--batch", "2", "--strategies", "fp32"]
MAX_STEPS = column_range("timed_steps")[1]


def _one_line_refusal(tmp_path: Path, args: list[str], needle: str) -> None:
    started = time.perf_counter()
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert time.perf_counter() - started < 60  # refused up front, not after running
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, needle", [
    (["memory", "resnet18", *META, "--budget", "10000000TB"], f"at most {MAX_SIZE_BYTES}"),
    (["memory", "resnet18", *META, "--strategies", "swap", "--host-budget", "10000000TB"],
     f"--host-budget must be a size in bytes of at least 1 and at most {MAX_SIZE_BYTES}"),
    (["plan", "resnet18", "--image-size", "32", "--batch", "4", "--budget", "10000000TB"], "got '10000000TB'"),
    (["memory", "resnet18", *META, "--budget", str(MAX_SIZE_BYTES + 1)], f"at most {MAX_SIZE_BYTES}"),
    (["throughput", "resnet18", *CPU, "--timed-steps", str(MAX_STEPS + 1)],
     f"--timed-steps must be in 0..{MAX_STEPS}, got {MAX_STEPS + 1}"),
    (["throughput", "resnet18", *CPU, "--timed-steps", "2000000"], f"--timed-steps must be in 0..{MAX_STEPS}"),
    (["throughput", "resnet18", *CPU, "--warmup-steps", "100000000"], f"--warmup-steps must be in 0..{MAX_STEPS}"),
    (["memory", "resnet18", *META, "--timed-steps", "1000001"], "--timed-steps must be in 0..1000000"),
])
def test_values_a_row_cannot_hold_are_refused_up_front(tmp_path: Path, args: list[str], needle: str) -> None:
    _one_line_refusal(tmp_path, [*args, "--dry-run"], needle)


@pytest.mark.parametrize("args, needle", [
    (["verify-grads", "resnet18", "--batch", "100000000", "--seeds", "2"],
     "--batch must be between 1 and 1048576, got 100000000"),
    # below the range: the same one line naming the value and the range, not the parser's own wording
    (["verify-grads", "resnet18", "--batch", "0", "--seeds", "2"], "--batch must be between 1 and 1048576, got 0"),
    (["verify-grads", "resnet18", "--batch", "-3"], "--batch must be between 1 and 1048576, got -3"),
    (["verify-grads", "resnet18", "--batch", "2", "--seeds", "1"],
     "--seeds (compressed draws: a variance needs two) must be between 2 and 10000, got 1"),
    (["verify-grads", "resnet18", "--seeds", "0", "--device", "cuda"], "must be between 2 and 10000, got 0"),
    # cuda: refused before the device is asked for (where there is one, before a run of months)
    (["verify-grads", "resnet18", "--batch", "2", "--seeds", "100000000", "--device", "cuda"],
     "must be between 2 and 10000, got 100000000"),
])
def test_verify_grads_counts_are_bounded(tmp_path: Path, args: list[str], needle: str) -> None:
    _one_line_refusal(tmp_path, args, needle)


STEP = ('name = "bounds"\ndescription = "x"\n[[steps]]\ncommand = "{command}"\nmodels = ["resnet18"]\n'
        'strategies = ["{strategy}"]\ndevice = "{device}"\nimage_size = 32\nbatch = "2"\n{extra}\n')


@pytest.mark.parametrize("command, strategy, device, extra, needle", [
    ("memory", "fp32", "meta", 'budget = "10000000TB"', f"steps[0].budget: must be a size in bytes of at least 1 "
                                                       f"and at most {MAX_SIZE_BYTES}"),
    ("memory", "swap", "meta", 'host_budget = "10000000TB"', "steps[0].host_budget: must be a size in bytes"),
    ("throughput", "fp32", "cpu", "timed_steps = 2000000", f"steps[0].timed_steps: must be in 0..{MAX_STEPS}, got"),
    ("throughput", "fp32", "cpu", "warmup_steps = 2000000", f"steps[0].warmup_steps: must be in 0..{MAX_STEPS}"),
])
def test_experiment_files_keep_the_same_bounds(tmp_path: Path, command: str, strategy: str, device: str,
                                               extra: str, needle: str) -> None:
    path = tmp_path / "bounds.toml"
    path.write_text(STEP.format(command=command, strategy=strategy, device=device, extra=extra))
    with pytest.raises(ExperimentError) as info:
        load_experiment(path)
    assert needle in str(info.value) and "\n" not in str(info.value)
    _one_line_refusal(tmp_path, ["run", str(path)], needle)


def test_the_largest_values_taken_make_rows_their_readers_keep() -> None:
    """The largest budget, host budget and step counts the spec takes give a row that reads back; one more
    of each is refused. The bounds are the row schema's own, so this holds whenever either changes."""
    largest = CommandSpec(command="throughput", model="resnet18", strategies=("swap",), batch="2", image_size=32,
                          device="cpu", budget=str(MAX_SIZE_BYTES), host_budget=str(MAX_SIZE_BYTES),
                          warmup_steps=column_range("warmup_steps")[1], timed_steps=column_range("timed_steps")[1])
    (point,) = largest.plan().config.points()
    row = ResultRow.build(point.config, Measurement("ok"), "run", "env")
    assert row_value_problem(dataclasses.asdict(row)) is None
    assert (row.budget_bytes, row.host_budget_bytes) == (MAX_SIZE_BYTES, MAX_SIZE_BYTES)
    for field, value in (("budget", str(MAX_SIZE_BYTES + 1)), ("host_budget", str(MAX_SIZE_BYTES + 1)),
                         ("warmup_steps", column_range("warmup_steps")[1] + 1),
                         ("timed_steps", column_range("timed_steps")[1] + 1)):
        with pytest.raises(SpecError) as info:
            dataclasses.replace(largest, **{field: value})
        assert info.value.field == field


def test_timed_steps_help_says_what_timing_does() -> None:
    """The help states each timing device's bounds from its profile, and that they never cut the steps asked
    for: timing_done runs every one of them, past the profile's step bound."""
    from actbench.cli.options import TimedOpt
    from actbench.core.devices import PROFILES
    from actbench.measure.point import timing_done

    text = " ".join(TimedOpt.__metadata__[0].help.split())
    assert f"0..{MAX_STEPS}" in text and "never cut the steps asked for" in text
    for prof in PROFILES.values():
        if prof.max_timed_steps:
            bounds = f"{prof.name}: {prof.min_timed_seconds:g} s minimum, then at most {prof.max_timed_steps} steps"
            assert bounds in text
            asked = prof.max_timed_steps * 2
            assert not timing_done([0.01] * (asked - 1), asked, prof)
            assert timing_done([0.01] * asked, asked, prof)


def test_run_refuses_more_jobs_than_cores_like_the_measuring_commands(tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text(STEP.format(command="memory", strategy="fp32", device="meta", extra=""))
    _one_line_refusal(tmp_path, ["run", str(path), "--jobs", "1000"], "--jobs must be between 1 and")


def test_run_refuses_more_jobs_than_cores_for_a_file_of_accuracy_steps_too(tmp_path: Path) -> None:
    accuracy_only = Path(__file__).resolve().parent.parent / "experiments" / "accuracy_vs_bits.toml"
    _one_line_refusal(tmp_path, ["run", str(accuracy_only), "--quick", "--jobs", "1000"], "--jobs must be between 1 and")
