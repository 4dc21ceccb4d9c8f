"""``actbench calibrate`` and device-model files: the schema, loading, refusals, --device-model, trust for speed."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from actbench.cli import app
from actbench.planning.device_models import (DEVICE_MODEL_ENV, MODEL_FILE_VERSION, NO_STRATEGY_CALLS, DeviceModel,
                                             gpu_speed_model, load_device_model, save_device_model)

#: every CLI call restores the variable --device-model sets, so no test leaks it into the next
ENV = {DEVICE_MODEL_ENV: None, "ACTBENCH_TEST_FAULT": None}


def invoke(args: list[str]):
    return CliRunner(env=ENV).invoke(app, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "cpu.json"
    result = invoke(["calibrate", "--device", "cpu", "--quick", "--out", str(path)])
    assert result.exit_code == 0, result.output
    return path


def test_calibrate_writes_a_device_model_file_that_loads(calibrated: Path) -> None:
    data = json.loads(calibrated.read_text())
    assert data["version"] == MODEL_FILE_VERSION and data["name"] == "calibrated-cpu" and data["calibrated"] is True
    assert set(data["peak_flops"]) == {"fp32", "bf16"} and all(v > 0 for v in data["peak_flops"].values())
    for name in ("dram_bytes_per_s", "h2d_bytes_per_s", "d2h_bytes_per_s", "host_op_s"):
        assert data[name] > 0, name
    assert 0 < data["compute_efficiency"] <= 1 and 0 < data["memory_efficiency"] <= 1
    assert data["host_overlaps_device"] is False and data["launch_s"] == 0  # a CPU: one core dispatches and computes
    assert {"peaks", "dram", "copies", "backward", "extension", "host_op", "machine"} <= set(data["sources"])
    assert data["sources"]["copies"].startswith("calibrate: the tiny conv-BN-ReLU model")  # swap's copies
    assert set(data["op_bytes_per_s"]) == {"native_batch_norm", "native_batch_norm_backward", "native_layer_norm",
                                           "native_layer_norm_backward"}
    assert all(v > 0 for v in data["op_bytes_per_s"].values()) and "op_bytes" in data["sources"]
    assert data["h2d_bytes_per_s"] == data["d2h_bytes_per_s"]
    assert data["extension_bytes_per_s"] > 0  # the extension is built here
    assert data["backward_efficiency"] > 0
    curves = data["conv_rates"]  # fp32 and the CPU's bf16, each kernel class forward and backward, rising rows
    assert set(curves) == {f"{d}:{c}" for d in ("fp32", "bf16") for c in
                           ("pointwise", "spatial", "pointwise_backward", "spatial_backward")}
    assert all([r for r, _ in v] == [4 * 2 * 2, 4 * 8 * 8] for v in curves.values()), curves  # batch 4, sides 2, 8
    assert all(rate > 0 for v in curves.values() for _, rate in v) and "conv_rates" in data["sources"]
    calls = data["strategy_call_s"]  # measured here: each probed kind, and the kinds derived from them
    assert {"actnn_layer:L0", "actnn_layer:L3", "actnn_layer:L4", "actnn_layer", "checkpoint_module",
            "selective_module", "host_copy:swap", "host_copy:save_on_cpu"} <= set(calls)
    assert all(v >= 0 for v in calls.values())
    assert calls["actnn_layer:L4"] == calls["actnn_layer:L3"] and calls["actnn_layer"] == calls["actnn_layer:L0"]
    assert data["sources"]["strategy_calls"].startswith("calibrate: tiny conv-BN-ReLU model")
    model = load_device_model(calibrated)
    assert model.peak_for("fp32") == data["peak_flops"]["fp32"]


def test_a_cpus_host_copies_are_priced_as_a_swap_step_makes_them(monkeypatch) -> None:
    """The bytes swap's step copies beyond fp32's, over its time beyond fp32's less its extra ops' host
    cost; a step that took no longer measures nothing (infinite: calibrate then takes a copy's rate)."""
    from actbench.measure import host_probes
    from actbench.measure.host_probes import StrategyProbe, swap_copy_rate

    def probes(swap_s: float):
        return lambda *a, **k: {"fp32": StrategyProbe(0.050, 1000, {}, 10 << 20),
                                "swap": StrategyProbe(swap_s, 1100, {}, 70 << 20)}

    monkeypatch.setattr(host_probes, "probe_strategies", probes(0.0565))
    rate, line = swap_copy_rate(None, None, host_op_s=5e-6)
    assert rate == pytest.approx((60 << 20) / (0.0065 - 100 * 5e-6)) and "60.0 MiB more" in line
    monkeypatch.setattr(host_probes, "probe_strategies", probes(0.050))
    assert swap_copy_rate(None, None, host_op_s=5e-6)[0] == float("inf")
    # the Python of swap's hook, priced per copy beside the layers' calls, is not a copy's time
    monkeypatch.setattr(host_probes, "probe_strategies", lambda *a, **k: {
        "fp32": StrategyProbe(0.050, 1000, {}, 10 << 20),
        "swap": StrategyProbe(0.0565, 1100, {"host_copy:swap": 40}, 70 << 20)})
    rate, _ = swap_copy_rate(None, None, host_op_s=5e-6, copy_call_s={"host_copy:swap": 50e-6})
    assert rate == pytest.approx((60 << 20) / (0.0065 - 100 * 5e-6 - 40 * 50e-6))


def test_a_saved_model_loads_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "t4.json"
    save_device_model(gpu_speed_model("t4"), path)
    assert load_device_model(path) == gpu_speed_model("t4")


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(version=99), "version 99 is not 1"),
    (lambda d: d.pop("dram_bytes_per_s"), "missing field(s) dram_bytes_per_s"),
    (lambda d: d.update(dram_bytes_per_s=-1), "dram_bytes_per_s must be a positive number, got -1"),
    (lambda d: d.update(peak_flops={"fp8": 1e12}), "peak_flops must map fp32, tf32, bf16, fp16"),
    (lambda d: d.update(host_op_s="fast"), "host_op_s must be a number >= 0, got 'fast'"),
    (lambda d: d.update(backward_efficiency=0), "backward_efficiency must be a positive number, got 0"),
    (lambda d: d.update(extension_bytes_per_s=-2), "extension_bytes_per_s must be a positive number or null, got -2"),
    (lambda d: d.update(strategy_call_s={"actnn_layer": -1}), "strategy_call_s must map names to seconds >= 0"),
    (lambda d: d.update(strategy_call_s=[1e-4]), "strategy_call_s must map names to seconds >= 0"),
    (lambda d: d.update(conv_rates={"fp8:pointwise": [[16, 1e9]]}), "conv_rates must map DTYPE:CURVE"),
    (lambda d: d.update(conv_rates={"fp32:spatial": [[64, 1e9], [16, 2e9]]}), "conv_rates.fp32:spatial must be"),
    (lambda d: d.update(conv_rates={"fp32:spatial": [[16, -1]]}), "conv_rates.fp32:spatial must be"),
    (lambda d: d.update(op_bytes_per_s={"native_batch_norm": 0}), "op_bytes_per_s must map op names to positive"),
])
def test_a_bad_model_file_is_refused_naming_what_is_wrong(tmp_path: Path, change, message: str) -> None:
    data = gpu_speed_model("t4").to_dict()
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"device model {path}: " + message.replace("(", r"\(").replace(")", r"\)")):
        load_device_model(path)
    with pytest.raises(ValueError):
        DeviceModel.from_dict(data)


def test_a_model_file_from_before_strategy_calls_loads_pricing_them_at_nothing_and_says_so(tmp_path: Path) -> None:
    data = gpu_speed_model("h200").to_dict()
    assert data["strategy_call_s"]["actnn_layer:L3"] > 0  # the built-in has them (fitted on the H200 loan)
    del data["strategy_call_s"], data["sources"]["strategy_calls"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = load_device_model(path)
    assert dict(old.strategy_call_s) == {} and old.strategy_call_seconds("actnn_layer:L3") == 0.0
    assert old.sources["strategy_calls"] == NO_STRATEGY_CALLS and old.name == "h200"
    save_device_model(old, tmp_path / "again.json")  # saved again, it keeps the note and an explicit empty map
    assert load_device_model(tmp_path / "again.json") == old


def test_every_built_in_gpu_model_prices_strategy_calls_and_says_where_from() -> None:
    from actbench.planning.device_models import GPU_SPEED_MODELS

    for model in GPU_SPEED_MODELS.values():
        assert model.strategy_call_seconds("actnn_layer:L3") > model.strategy_call_seconds("actnn_layer:L0") > 0
        assert model.strategy_call_seconds("checkpoint_module") > 0
        assert "h200_2026-12-04" in model.sources["strategy_calls"]


def test_repredict_prices_measured_rows_anew_and_keeps_the_earlier_prediction(tmp_path: Path) -> None:
    rows = tmp_path / "speed_vs_cpu.csv"
    rows.write_text("model,strategy,batch_size,image_size,device,device_model,predicted_status,measured_status,"
                    "predicted_step_s,measured_step_s,measured_spread,message,precision\n"
                    "resnet18,fp32,2,32,cpu,old-model,ok,ok,0.1,0.5,0.02,,fp32\n")
    model = tmp_path / "t4.json"
    save_device_model(gpu_speed_model("t4"), model)
    out = tmp_path / "again.csv"
    result = invoke(["repredict", str(rows), "--device-model", str(model), "--out", str(out)])
    assert result.exit_code == 0, result.output
    (row,) = list(csv.DictReader(out.open()))
    assert (row["device_model"], row["device_model_earlier"], row["predicted_step_s_earlier"]) == ("t4", "old-model", "0.1")
    assert (row["measured_step_s"], row["measured_spread"], row["measured_status"]) == ("0.5", "0.02", "ok")
    assert 0 < float(row["predicted_step_s"]) != 0.1
    assert float(row["step_ratio"]) == pytest.approx(float(row["predicted_step_s"]) / 0.5, rel=1e-4)
    rows.write_text("model,strategy\nresnet18,fp32\n")
    refused = invoke(["repredict", str(rows), "--device-model", str(model), "--out", str(tmp_path / "x.csv")])
    assert refused.exit_code == 2 and "missing column(s) batch_size" in refused.output


def _speed_row(strategy: str, predicted: float, measured: float, spread: float | None, batch: int = 4):
    from actbench.studies.trust import SpeedComparison

    return SpeedComparison("resnet18", strategy, batch, 64, "cpu", "m", "ok", "ok", predicted, measured, spread, "")


def test_order_misses_name_each_pair_with_its_measured_gap_beside_the_spread() -> None:
    from actbench.studies.trust import describe_speed_order, speed_order_misses

    rows = [_speed_row("fp32", 1.0, 1.00, 0.01), _speed_row("L0", 1.2, 1.10, 0.01),
            _speed_row("swap", 1.1, 1.20, 0.05), _speed_row("L3", 1.3, 1.50, None),
            # another batch is another order: only pairs of one model, batch and size are compared
            _speed_row("swap", 0.1, 9.0, 0.01, batch=8), _speed_row("fp32", 0.2, 1.0, 0.01, batch=8)]
    misses = speed_order_misses(rows)
    by_pair = {(m.batch_size, m.measured_faster, m.measured_slower): m for m in misses}
    assert set(by_pair) == {(4, "L0", "swap"), (8, "fp32", "swap")}
    within = by_pair[(4, "L0", "swap")]  # swap 9.1 % slower than L0, steps varying by 5 %
    assert within.measured_gap == pytest.approx(0.1 / 1.1) and within.spread == 0.05 and within.beyond_spread
    assert by_pair[(8, "fp32", "swap")].measured_gap == pytest.approx(8.0)
    rows[2] = _speed_row("swap", 1.1, 1.12, 0.05)  # 1.8 % slower than L0, steps varying by 5 %
    (small,) = [m for m in speed_order_misses(rows) if m.batch_size == 4]
    assert not small.beyond_spread
    line = describe_speed_order(speed_order_misses(rows))
    assert line.startswith("order of strategies by speed: NOT as measured in 2 pair(s), 1 by more than the measured "
                           "spread: ")
    assert "resnet18 b4 64px L0 < swap measured by 1.8% (spread 5.0%)" in line
    assert describe_speed_order(speed_order_misses(rows[:2])) == "order of strategies by speed: as measured"
    # a spread unknown on either side cannot excuse a miss
    rows[1] = _speed_row("L0", 1.2, 1.10, None)
    assert all(m.beyond_spread for m in speed_order_misses(rows))


def test_device_model_option_refuses_a_bad_file_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = tmp_path / "out"
    result = invoke(["throughput", "resnet18", "--device", "cpu", "--batch", "2", "--image-size", "32",
                     "--device-model", str(bad), "--out", str(out)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"actbench: error: --device-model: device model '{bad}' is not "
                                                  "valid JSON (Expecting property name enclosed in double quotes: "
                                                  "line 1 column 2 (char 1))"]
    assert not out.exists()


def test_calibrate_refuses_a_folder_as_its_output(tmp_path: Path) -> None:
    result = invoke(["calibrate", "--device", "cpu", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "is a folder; give a file name" in result.output
    assert list(tmp_path.iterdir()) == []


def test_cpu_rows_carry_the_calibrated_prediction_beside_the_measurement(calibrated: Path, tmp_path: Path) -> None:
    result = invoke(["throughput", "resnet18", "--device", "cpu", "--strategies", "fp32", "--batch", "2",
                     "--image-size", "16", "--warmup-steps", "1", "--timed-steps", "1", "--device-model",
                     str(calibrated), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (rows,) = tmp_path.glob("*/rows.jsonl")
    (row,) = [json.loads(line) for line in rows.read_text().splitlines()]
    assert row["device_model"] == "calibrated-cpu" and row["predicted_step_s"] > 0
    assert row["step_time_s_median"] > 0 and row["step_time_s_median"] != row["predicted_step_s"]


def test_trust_for_speed_on_cpu_at_a_tiny_size(calibrated: Path, tmp_path: Path) -> None:
    result = invoke(["trust", "--models", "resnet18", "--strategies", "fp32,swap", "--batch", "2", "--image-size",
                     "16", "--device-model", str(calibrated), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "speed_vs_cpu.csv").read_text().splitlines()
    rows = [dict(zip(lines[0].split(","), ln.split(","))) for ln in lines[1:]]
    assert [r["strategy"] for r in rows] == ["fp32", "swap"]
    for r in rows:
        assert r["predicted_status"] == r["measured_status"] == "ok" and r["device_model"] == "calibrated-cpu"
        assert float(r["step_ratio"]) == pytest.approx(float(r["predicted_step_s"]) / float(r["measured_step_s"]),
                                                       rel=1e-3)
    assert "order of strategies by speed" in result.output and not (tmp_path / "meta_vs_cpu.csv").exists()
