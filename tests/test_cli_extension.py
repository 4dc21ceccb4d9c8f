"""doctor, build and bench-kernels through the CLI: they run, write what they say, reject bad input."""

import csv
import json

import pytest
from typer.testing import CliRunner

from actbench.kernels import extension

from actbench.kernels import bench as kernel_bench
from actbench.cli import app

runner = CliRunner()


def test_doctor_reports_extension_and_self_check():
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    for name in ("torch", "nvcc", "extension", "self-check cpu"):
        assert name in result.output
    assert "FAIL" not in result.output


def test_doctor_fails_when_the_extension_cannot_load(monkeypatch):
    def broken(*args, **kwargs):
        raise extension.ExtensionError("actbench extension failed to build in /x: error: boom")

    monkeypatch.setattr(extension, "load", broken)
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 1
    assert "FAIL" in result.output and "boom" in result.output


def test_build_uses_the_cache():
    result = runner.invoke(app, ["build"])
    assert result.exit_code == 0, result.output
    assert "extension ready" in result.output


def test_bench_kernels_writes_rows_and_env(tmp_path):
    result = runner.invoke(
        app, ["bench-kernels", "--sizes-mib", "1", "--bits", "2,4", "--repeats", "2", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.startswith("bench-kernels_cpu_")
    rows = list(csv.DictReader((run_dir / "kernels.csv").open()))
    kinds = {(r["op"], r["backend"], r["bits"]) for r in rows}
    assert ("copy", "torch", "") in kinds
    for bits in ("2", "4"):
        for op in ("quantize", "dequantize"):
            assert (op, "extension", bits) in kinds and (op, "oracle", bits) in kinds
    ext = [r for r in rows if r["backend"] == "extension"]
    assert all(float(r["input_gb_per_s"]) > 0 for r in ext)
    assert all(float(r["speedup_vs_oracle"]) > 0 for r in ext if r["op"] in ("quantize", "dequantize"))
    # every op of the extension, and torch's own op beside the mask and pool kernels
    assert {r["op"] for r in ext} == {name for name, _ in kernel_bench.OPS_BENCHED}
    for op in ("pack_mask", "unpack_mask", "apply_mask", "max_pool2d_with_argmax", "max_pool2d_backward"):
        assert (op, "torch", "") in kinds
        assert all(float(r["speedup_vs_torch"]) > 0 for r in ext if r["op"] == op)
    assert all(r["device"] == "cpu" and r["calls_per_sample"] == "1" for r in rows)
    assert json.loads((run_dir / "env.json").read_text())["device"] == "cpu"


def test_bench_kernels_times_every_op_the_extension_registers():
    """A new op in csrc/registration.cpp is benchmarked too (allocate_bits works on per-layer costs,
    not on activations)."""
    import re

    registered = set(re.findall(r'm\.def\(\s*"(\w+)\(', (extension.CSRC / "registration.cpp").read_text()))
    assert len(registered) >= 10
    assert registered - {"allocate_bits"} == {name for name, _ in kernel_bench.OPS_BENCHED}


@pytest.mark.parametrize(
    "args,message",
    [
        (["--sizes-mib", "0"], "--sizes-mib sizes must be positive, got 0"),
        (["--sizes-mib", "big"], "bad --sizes-mib 'big': use START:STOP:STEP"),
        (["--sizes-mib", "1,,2"], "bad --sizes-mib '1,,2': use START:STOP:STEP"),
        (["--sizes-mib", "1:2000000000"], "--sizes-mib sizes must be at most 1073741824, got 2000000000"),
        (["--bits", "3"], "--bits must be a comma list of 1, 2, 4, 8, got '3'"),
        (["--device", "tpu"], "'tpu' is not one of 'cpu', 'cuda'"),
        (["--repeats", "0"], "--repeats must be between 1 and 1000, got 0"),
        (["--repeats", "100000000"], "--repeats must be between 1 and 1000, got 100000000"),
        (["--oracle-max-mib", "-5"], "--oracle-max-mib must be between 0 and 1073741824, got -5"),
    ],
)
def test_bench_kernels_bad_input(tmp_path, args, message):
    result = runner.invoke(app, ["bench-kernels", "--out", str(tmp_path), *args])
    assert result.exit_code == 2
    assert message in result.output
    assert list(tmp_path.iterdir()) == []  # nothing written for a rejected command


def test_bench_kernels_refuses_a_size_that_cannot_fit(tmp_path):
    result = runner.invoke(app, ["bench-kernels", "--sizes-mib", "1,1000000000", "--out", str(tmp_path)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--sizes-mib 1000000000 needs about" in lines[0] and "GiB of cpu memory available" in lines[0]
    assert list(tmp_path.iterdir()) == []  # refused up front: no header-only CSV


def test_bench_kernels_cuda_without_a_gpu_is_one_line(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = runner.invoke(app, ["bench-kernels", "--device", "cuda", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "sees no CUDA GPU here; use --device cpu" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("device,calls_per_sample", [("cpu", 1), ("cuda", 10)])
def test_time_call_samples_per_device(monkeypatch, device, calls_per_sample):
    """cpu times each call alone; cuda times back-to-back calls between syncs and reports seconds per call."""
    calls, syncs = [], []
    monkeypatch.setattr(kernel_bench, "_sync", lambda dev: syncs.append(dev))
    ticks = iter(range(1000))  # the clock advances 1 s per read: a sample of k calls lasts 1 s
    median, iqr = kernel_bench.time_call(lambda: calls.append(1), device, repeats=4,
                                         clock=lambda: float(next(ticks)))
    assert len(calls) == 1 + 4 * calls_per_sample  # one warm-up call, then the samples
    assert median == pytest.approx(1.0 / calls_per_sample) and iqr == 0
    assert len(syncs) == 1 + 2 * 4


def test_time_calls_takes_each_functions_samples_in_turn(monkeypatch):
    """The copy, an op and torch's op are sampled round by round, each round starting one further
    along, so a drift in the machine's speed reaches all three; each gets its own median and IQR."""
    monkeypatch.setattr(kernel_bench, "_sync", lambda dev: None)
    order, now = [], [0.0]
    cost = {"copy": 1.0, "extension": 2.0, "torch": 4.0}

    def call(name):  # a call lasts its cost, 10 % longer in each timed round than in the one before
        order.append(name)
        timed_round = max(0, len(order) - 1 - len(cost)) // len(cost)
        now[0] += cost[name] * 1.1**timed_round

    fns = {name: (lambda name=name: call(name)) for name in cost}
    result = kernel_bench.time_calls(fns, "cpu", repeats=3, clock=lambda: now[0])
    assert order[:3] == ["copy", "extension", "torch"]  # one warm-up call each
    assert order[3:] == ["copy", "extension", "torch", "extension", "torch", "copy", "torch", "copy", "extension"]
    for name, c in cost.items():
        median, iqr = result[name]
        assert median == pytest.approx(c * 1.1) and iqr > 0  # the middle round's sample
    assert result["extension"][0] / result["copy"][0] == pytest.approx(2.0)  # the drift reaches both alike


@pytest.mark.memory_gb(3.1)  # 2.99 GB measured, children included
def test_bench_actnn_quick_writes_ratios_to_fp32(tmp_path):
    """The quick variant runs throughput in a child and writes each strategy's img/s and ratio to fp32."""
    result = runner.invoke(app, ["bench-actnn", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.startswith("bench-actnn_cpu_")
    rows = list(csv.DictReader((run_dir / "actnn.csv").open()))
    by_strategy = {r["strategy"]: r for r in rows}
    assert set(by_strategy) == {"fp32", "L0", "L3"}
    assert float(by_strategy["fp32"]["ratio_to_fp32"]) == 1.0
    assert all(float(r["images_per_s"]) > 0 and float(r["ratio_to_fp32"]) > 0 for r in rows)
    assert by_strategy["L3"]["target"] == ">= 0.8" and by_strategy["L3"]["met"] in ("True", "False")
    assert "actbench throughput resnet18" in by_strategy["L0"]["command"]
    assert all(r["rounds"] == "1" and r["ratio_min"] == r["ratio_to_fp32"] == r["ratio_max"] for r in rows)


def test_bench_actnn_rounds_give_the_median_ratio_and_its_range():
    """Rounds combine per (model, strategy): the median rate and ratio, the ratio's range, the target on the median."""
    from actbench.studies.actnn_cost import ActnnBenchRow, combine_rounds

    def row(strategy, rate, ratio, iqr=0.1):
        need = {"L3": ">= 0.8"}.get(strategy, "")
        return ActnnBenchRow("resnet50", 8, 112, "cpu", strategy, rate, iqr, ratio, need, None, "cmd", 1, ratio, ratio)

    rounds = [[row("fp32", 10.0, 1.0), row("L3", 7.0, 0.70, 0.3)],
              [row("fp32", 12.0, 1.0), row("L3", 10.2, 0.85, 0.2)],
              [row("fp32", 11.0, 1.0), row("L3", 9.0, 0.82, 0.1)]]
    fp32, l3 = combine_rounds(rounds)
    assert (fp32.images_per_s, fp32.ratio_to_fp32, fp32.met, fp32.rounds) == (11.0, 1.0, None, 3)
    assert (l3.images_per_s, l3.images_per_s_iqr, l3.ratio_to_fp32) == (9.0, 0.1, 0.82)
    assert (l3.ratio_min, l3.ratio_max, l3.met) == (0.70, 0.85, True)


def test_bench_actnn_in_turn_ratios_pair_each_rounds_steps():
    """--in-turn: each round's fp32 step over the strategy's, their median the ratio, images/s from the median step."""
    from actbench.studies.actnn_cost import ratio_rows

    # the machine slows 2x in round 2: paired, L3's ratio stays 0.8 where the medians alone would give 1.0
    samples = {"fp32": [1.0, 2.0, 1.0], "L3": [1.25, 2.5, 1.25], "L0": [1.0, 4.0, 0.5]}
    fp32, l3, l0 = ratio_rows(samples, "resnet50", 8, 112, "cpu", "cmd")
    assert (fp32.strategy, fp32.ratio_to_fp32, fp32.ratio_min, fp32.ratio_max, fp32.met) == ("fp32", 1.0, 1.0, 1.0, None)
    assert (l3.ratio_to_fp32, l3.ratio_min, l3.ratio_max, l3.met) == (0.8, 0.8, 0.8, True)
    assert l3.images_per_s == pytest.approx(8 / 1.25) and l3.rounds == 3 and l3.target == ">= 0.8"
    assert (l0.ratio_to_fp32, l0.ratio_min, l0.ratio_max, l0.met) == (1.0, 0.5, 2.0, True)


def test_bench_actnn_in_turn_quick_times_every_strategy_in_one_process(tmp_path):
    result = runner.invoke(app, ["bench-actnn", "--quick", "--in-turn", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (run_dir,) = tmp_path.iterdir()
    rows = {r["strategy"]: r for r in csv.DictReader((run_dir / "actnn.csv").open())}
    assert list(rows) == ["fp32", "L0", "L3"]
    assert float(rows["fp32"]["ratio_to_fp32"]) == 1.0 and all(r["rounds"] == "3" for r in rows.values())
    assert all(float(r["ratio_min"]) <= float(r["ratio_to_fp32"]) <= float(r["ratio_max"]) for r in rows.values())
    assert all(float(r["images_per_s"]) > 0 for r in rows.values())
    assert rows["L0"]["command"].startswith("actbench bench-actnn --in-turn --device cpu --rounds 3: resnet18, batch 2")


@pytest.mark.memory_gb(1.9)  # 1.80 GB measured, children included
def test_l0_twin_costs_script_times_l0_with_its_relu_twins_run_as_torchs_layers(capsys):
    """scripts/l0_twin_costs.py, which split L0's gap to fp32 by twin in docs/design.md §2, still runs, and
    its variant does run torch's own ReLU (ResNet-18: 9 ReLU modules); L0's batch norms are torch's already."""
    import importlib.util
    from pathlib import Path

    import torch

    from actbench.actnn import convert
    from actbench.training.models import build_model
    from actbench.schema import ModelSpec

    path = Path(__file__).resolve().parents[1] / "scripts" / "l0_twin_costs.py"
    spec = importlib.util.spec_from_file_location("l0_twin_costs", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    model = convert(build_model(ModelSpec("resnet18"), 32), "L0").model
    x = torch.randn(2, 64, 8, 8, requires_grad=True)
    assert type(model.relu(x * 1).grad_fn).__name__ == "ClampFunctionBackward"
    assert script.run_as_torch(model, relu=True) == 9
    assert type(model.relu(x * 1).grad_fn).__name__ == "ReluBackward0"
    assert type(model.bn1(x).grad_fn).__name__ == "NativeBatchNormBackward0"
    script.main(["resnet18", "32", "2", "1"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(r["strategy"], r["modules_run_as_torch"]) for r in rows] == [("fp32", 0), ("L0", 0), ("L0, torch's ReLU", 9)]
    assert rows[0]["ratio_to_fp32"] == 1.0 and all(r["images_per_s"] > 0 and r["rounds"] == 1 for r in rows)


def test_bench_actnn_bad_device_is_one_line(tmp_path):
    result = runner.invoke(app, ["bench-actnn", "--device", "tpu", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "'tpu' is not one of 'cpu', 'cuda'" in result.output
    assert list(tmp_path.iterdir()) == []
