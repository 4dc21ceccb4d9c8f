"""``actbench calibrate`` and device-model files: the schema, loading, refusals, --device-model, trust for speed."""

from __future__ import annotations

import csv
import json
import math
import re
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


INF = float("inf")
SECONDS, BYTES = "a number of seconds in 0..3600", "a number of bytes/s in 1..1e+21"


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(version=99), "version must be 1 (the layout this actbench reads), got 99"),
    (lambda d: d.update(version=True), "version must be 1 (the layout this actbench reads), got true"),
    (lambda d: d.pop("dram_bytes_per_s"), "missing field(s) dram_bytes_per_s"),
    (lambda d: d.update(dram_bytes_per_s=-1), f"dram_bytes_per_s must be {BYTES}, got -1"),
    (lambda d: d.update(dram_bytes_per_s=INF), f"dram_bytes_per_s must be {BYTES}, got Infinity"),
    (lambda d: d.update(dram_bytes_per_s=True), f"dram_bytes_per_s must be {BYTES}, got true"),
    (lambda d: d.update(peak_flops={"fp8": 1e12}), "peak_flops must map fp32, tf32, bf16, fp16"),
    (lambda d: d["peak_flops"].update(fp32=INF), "peak_flops.fp32 must be a number of FLOP/s in 1..1e+21, got Infinity"),
    (lambda d: d.update(host_op_s="fast"), f"host_op_s must be {SECONDS}, got \"fast\""),
    (lambda d: d.update(host_op_s=1e308), f"host_op_s must be {SECONDS}, got 1e+308"),
    (lambda d: d.update(launch_s=INF), f"launch_s must be {SECONDS}, got Infinity"),
    (lambda d: d.update(launch_s=float("nan")), f"launch_s must be {SECONDS}, got NaN"),
    (lambda d: d.update(backward_efficiency=0), "backward_efficiency must be a number (a share of peak) in "
                                                "1e-06..1000, got 0"),
    (lambda d: d.update(extension_bytes_per_s=-2), f"extension_bytes_per_s must be {BYTES} or null, got -2"),
    (lambda d: d.update(extension_bytes_per_s=INF), f"extension_bytes_per_s must be {BYTES} or null, got Infinity"),
    (lambda d: d.update(strategy_call_s={"actnn_layer": -1}), f"strategy_call_s.actnn_layer must be {SECONDS}, got -1"),
    (lambda d: d.update(strategy_call_s={"actnn_layer": INF}), f"strategy_call_s.actnn_layer must be {SECONDS}, "
                                                               "got Infinity"),
    (lambda d: d.update(strategy_call_s=[1e-4]), "strategy_call_s must map names to seconds in 0..3600, got [0.0001]"),
    (lambda d: d.update(conv_rates={"fp8:pointwise": [[16, 1e9]]}), "conv_rates must map DTYPE:CURVE"),
    (lambda d: d.update(conv_rates={"fp32:spatial": [[64, 1e9], [16, 2e9]]}), "conv_rates.fp32:spatial must be"),
    (lambda d: d.update(conv_rates={"fp32:spatial": [[16, -1]]}), "conv_rates.fp32:spatial must be"),
    (lambda d: d.update(conv_rates={"fp32:spatial": [[16, INF]]}), "conv_rates.fp32:spatial must be"),
    (lambda d: d.update(op_bytes_per_s={"native_batch_norm": 0}), f"op_bytes_per_s.native_batch_norm must be {BYTES}"),
    (lambda d: d.update(op_bytes_per_s={"native_batch_norm": INF}), "op_bytes_per_s.native_batch_norm must be"),
    (lambda d: d.update(name={"a": 1}), 'name must be a non-empty string of at most 100 printable characters (no new '
                                        'line, tab or other control character), got {"a": 1}'),
    (lambda d: d.update(name="evil\nname"), r'name must be a non-empty string of at most 100 printable characters '
                                            r'(no new line, tab or other control character), got "evil\nname"'),
    (lambda d: d.update(name=" "), "name must be a non-empty string"),
    (lambda d: d.update(name="x" * 101), "name must be a non-empty string of at most 100"),
    (lambda d: d.update(label=None), "label must be a non-empty string"),
    (lambda d: d.update(async_copies="no"), 'async_copies must be true or false, got "no"'),
    (lambda d: d.update(calibrated=1), "calibrated must be true or false, got 1"),
    (lambda d: d.update(pcie_generation="gen9"), 'pcie_generation must be one of 1, 2, 3, 4, 5, 6, 7 or null, got "gen9"'),
    (lambda d: d.update(pcie_generation=9), "pcie_generation must be one of 1, 2, 3, 4, 5, 6, 7 or null, got 9"),
])
def test_a_bad_model_file_is_refused_naming_what_is_wrong(tmp_path: Path, change, message: str) -> None:
    """Every field by type and bounds: a number finite and within its bounds (``true`` is no number), a
    flag true or false, a name one printable line; the message names the file, the field and the value
    as the file spells it (json.dump writes ``Infinity`` for inf)."""
    data = gpu_speed_model("t4").to_dict()
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=re.escape(f"device model {path}: {message}")) as raised:
        load_device_model(path)
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError):
        DeviceModel.from_dict(data)


def test_the_widest_model_the_bounds_allow_still_prices_a_step_finitely() -> None:
    """The bounds keep every prediction finite: the slowest rates, smallest shares and longest times a
    file may hold, over a step of the largest counts, still add up to a finite time."""
    from actbench.planning.step_time import HOST_ONLY, KERNEL, OpCost, STRATEGY_CALL, predict_step

    data = gpu_speed_model("t4").to_dict()
    data.update(peak_flops={"fp32": 1}, dram_bytes_per_s=1, h2d_bytes_per_s=1, d2h_bytes_per_s=1, launch_s=3600,
                host_op_s=3600, compute_efficiency=1e-6, memory_efficiency=1e-6, backward_efficiency=1e-6,
                tensor_core_efficiency=1e-6, extension_bytes_per_s=1, strategy_call_s={"actnn_layer": 3600})
    model = DeviceModel.from_dict(data)
    ops = [OpCost("mm", KERNEL, flops=2**63 - 1, bytes_moved=2**63 - 1, backward=True)] * 1000 + \
        [OpCost("copy_", "copy", bytes_moved=2**63 - 1), OpCost("size", HOST_ONLY),
         OpCost("actnn_layer", STRATEGY_CALL)] * 1000
    assert math.isfinite(predict_step(ops, model).step_s)


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


META_RUN = ["memory", "resnet18", "--device", "meta", "--image-size", "32", "--batch", "2", "--strategies", "fp32",
            "--no-baseline"]


@pytest.mark.parametrize("field, value", [("launch_s", float("inf")), ("host_op_s", 1e308), ("name", "evil\nname")])
@pytest.mark.parametrize("given", ["option", "environment"])
def test_a_model_file_with_an_unpriceable_value_is_one_line_and_writes_no_row(tmp_path: Path, field: str, value,
                                                                              given: str) -> None:
    """Refused up front, by --device-model or ACTBENCH_DEVICE_MODEL alike, before a run folder exists:
    never a row with ``Infinity`` in it (skipped on reading) or a model name over two lines."""
    data = gpu_speed_model("t4").to_dict()
    data[field] = value
    path = tmp_path / "model.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "out"
    args = [*META_RUN, "--out", str(out)]
    if given == "option":
        result = invoke([*args, "--device-model", str(path)])
    else:
        result = CliRunner(env={**ENV, DEVICE_MODEL_ENV: str(path)}).invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and f"device model {path}: {field} must be" in lines[0], result.output
    assert not out.exists()


def _run_folders(out: Path) -> dict[str, float | None]:
    """Each run folder under ``out`` and its one row's predicted step time."""
    found = {}
    for rows in sorted(out.glob("*/rows.jsonl")):
        (row,) = [json.loads(line) for line in rows.read_text().splitlines()]
        found[rows.parent.name] = row["predicted_step_s"]
    return found


def test_another_device_model_is_another_run_not_a_resume_of_rows_priced_on_none_or_another(tmp_path: Path) -> None:
    """A run folder's name holds the model file's name and fingerprint: adding --device-model, or changing
    the file, predicts anew into a folder of its own; the same file again resumes. The folder made
    without a model keeps its name (and its rows)."""
    out, model = tmp_path / "out", tmp_path / "model.json"
    assert invoke([*META_RUN, "--out", str(out)]).exit_code == 0
    (plain,) = _run_folders(out)
    save_device_model(gpu_speed_model("t4"), model)
    first = invoke([*META_RUN, "--out", str(out), "--device-model", str(model)])
    assert first.exit_code == 0 and "(resumed)" not in first.output, first.output
    folders = _run_folders(out)
    assert folders[plain] is None and len(folders) == 2
    (priced,) = set(folders) - {plain}
    assert folders[priced] > 0
    assert json.loads((out / priced / "config.json").read_text())["device_model"] == {
        "name": "t4", "sha256": gpu_speed_model("t4").fingerprint()}
    again = invoke([*META_RUN, "--out", str(out), "--device-model", str(model)])
    assert again.exit_code == 0 and "(resumed)" in again.output and len(_run_folders(out)) == 2
    data = gpu_speed_model("t4").to_dict()
    data["host_op_s"] *= 100  # a corrected model, same name
    model.write_text(json.dumps(data))
    corrected = invoke([*META_RUN, "--out", str(out), "--device-model", str(model)])
    assert corrected.exit_code == 0 and "(resumed)" not in corrected.output, corrected.output
    folders = _run_folders(out)
    (newest,) = set(folders) - {plain, priced}
    assert folders[newest] > folders[priced]


def test_a_gpus_built_in_model_keeps_the_run_folders_name() -> None:
    """--gpu prices meta rows on the GPU's built-in model: that is not named in the identity, so runs made
    before device models were part of it still resume; a file's model is, even one holding the same values."""
    from actbench.core.devices import profile
    from actbench.core.gpus import gpu_spec
    from actbench.planning.settings import MeasureSettings

    def identity(model):
        return MeasureSettings.resolve(profile("meta"), "memory", gpu=gpu_spec("t4"), speed_model=model).identity()

    assert identity(None) == identity(gpu_speed_model("t4")) and "device_model" not in identity(None)
    from_a_file = DeviceModel.from_dict(gpu_speed_model("t4").to_dict())
    assert identity(from_a_file)["device_model"] == {"name": "t4", "sha256": gpu_speed_model("t4").fingerprint()}


def test_calibrate_refuses_a_folder_as_its_output(tmp_path: Path) -> None:
    result = invoke(["calibrate", "--device", "cpu", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "is a folder; give a file name" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.memory_gb(2.0)  # 1.93 GB measured, children included
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
