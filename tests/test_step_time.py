"""The step-time model: device speed models, per-op pricing on hand-computed ops, predictions on meta rows."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest
import torch

from actbench.core.gpus import GPU_NAMES
from actbench.measure.tracker import LiveStorageTracker
from actbench.planning.device_models import GPU_SPEED_MODELS, DeviceModel, gpu_speed_model
from actbench.planning.step_time import (COPY, HOST_ONLY, KERNEL, OVERLAPPED_COPY, STRATEGY_CALL, OpCost,
                                         OpRecorder, predict_step)
from actbench.schema import COLUMNS, Measurement, ModelSpec, PointConfig, ResultRow

#: A device with round numbers: 1 TFLOP/s fp32, 4 TFLOP/s bf16, 100 GB/s DRAM, 10 GB/s copies, halved
#: by the efficiencies; 5 us per launch, 20 us of host per op.
ROUND = DeviceModel(name="round", label="round numbers", peak_flops=MappingProxyType({"fp32": 1e12, "bf16": 4e12}),
                    dram_bytes_per_s=100e9, h2d_bytes_per_s=10e9, d2h_bytes_per_s=10e9, launch_s=5e-6,
                    host_op_s=20e-6, compute_efficiency=0.5, memory_efficiency=0.5)


def test_a_kernel_costs_the_larger_of_compute_and_memory_plus_its_launch() -> None:
    compute_bound = OpCost("mm", KERNEL, flops=10**9, bytes_moved=10**6)  # 1e9/(1e12*0.5) = 2 ms; 1e6/5e10 = 20 us
    memory_bound = OpCost("add", KERNEL, flops=0, bytes_moved=10**8)  # 1e8/(100e9*0.5) = 2 ms
    p = predict_step([compute_bound, memory_bound], ROUND)
    assert p.device_s == pytest.approx(2e-3 + 5e-6 + 2e-3 + 5e-6)
    assert p.compute_bound_s == pytest.approx(2e-3) and p.memory_bound_s == pytest.approx(2e-3)
    assert p.host_s == pytest.approx(2 * 20e-6)
    assert p.step_s == pytest.approx(p.device_s)  # the host runs ahead: the device is the bound


def test_a_dtype_runs_at_its_own_peak_and_one_without_a_peak_at_fp32s() -> None:
    bf16 = predict_step([OpCost("mm", KERNEL, flops=4 * 10**9, dtype="bf16")], ROUND)
    fp16 = predict_step([OpCost("mm", KERNEL, flops=4 * 10**9, dtype="fp16")], ROUND)
    assert bf16.device_s == pytest.approx(4e9 / (4e12 * 0.5) + 5e-6)
    assert fp16.device_s == pytest.approx(4e9 / (1e12 * 0.5) + 5e-6)


def test_a_backward_kernel_runs_at_the_models_backward_efficiency() -> None:
    slow_backward = dataclasses.replace(ROUND, backward_efficiency=0.25)
    grad = OpCost("convolution_backward", KERNEL, flops=10**9, convolution=True, backward=True)
    assert predict_step([grad], slow_backward).device_s == pytest.approx(1e9 / (1e12 * 0.5 * 0.25) + 5e-6)
    assert predict_step([grad], ROUND).device_s == pytest.approx(1e9 / (1e12 * 0.5) + 5e-6)


def test_tensor_core_dtypes_run_at_their_own_efficiency() -> None:
    tensor = dataclasses.replace(ROUND, tensor_core_efficiency=0.25)
    bf16 = OpCost("mm", KERNEL, flops=10**9, dtype="bf16")
    fp32 = OpCost("mm", KERNEL, flops=10**9)
    assert predict_step([bf16], tensor).device_s == pytest.approx(1e9 / (4e12 * 0.25) + 5e-6)
    assert predict_step([fp32], tensor).device_s == pytest.approx(1e9 / (1e12 * 0.5) + 5e-6)
    assert gpu_speed_model("a100-80gb").efficiency_for("tf32") == 0.25
    assert gpu_speed_model("t4").efficiency_for("bf16") == 0.6  # no bf16 unit: runs at fp32's peak and efficiency


def test_the_extensions_ops_run_at_its_own_bandwidth_when_the_model_has_one() -> None:
    pack = OpCost("quantize", KERNEL, bytes_moved=10**8, extension=True)
    assert predict_step([pack], ROUND).device_s == pytest.approx(1e8 / (100e9 * 0.5) + 5e-6)  # DRAM's
    measured = dataclasses.replace(ROUND, extension_bytes_per_s=1e9)
    assert predict_step([pack], measured).device_s == pytest.approx(1e8 / 1e9 + 5e-6)


def test_the_recorder_marks_the_extensions_ops() -> None:
    from actbench.kernels import ops

    ops.ensure_loaded()
    recorder = OpRecorder()
    x = torch.randn(4, 256)
    with LiveStorageTracker(observer=recorder):
        ops.dequantize(ops.quantize(x, 2))
    marked = {op.name for op in recorder.ops if op.extension}
    assert {"quantize", "dequantize"} <= marked and not any(op.extension for op in recorder.ops
                                                             if op.name not in marked)


def test_fp32_convolutions_run_as_tf32_where_the_device_does_that() -> None:
    tf32 = dataclasses.replace(ROUND, peak_flops=MappingProxyType({"fp32": 1e12, "tf32": 8e12}),
                               conv_fp32_as_tf32=True)
    conv = OpCost("convolution", KERNEL, flops=8 * 10**9, convolution=True)
    matmul = OpCost("mm", KERNEL, flops=8 * 10**9)
    assert predict_step([conv], tf32).device_s == pytest.approx(8e9 / (8e12 * 0.5) + 5e-6)
    assert predict_step([matmul], tf32).device_s == pytest.approx(8e9 / (1e12 * 0.5) + 5e-6)


def test_copies_are_serial_unless_overlapped_on_a_device_with_async_copies() -> None:
    kernel = OpCost("add", KERNEL, bytes_moved=10**8)  # 2 ms
    copy = OpCost("copy_", COPY, bytes_moved=10**7)  # 1e7 / 10e9 = 1 ms
    overlapped = OpCost("clone", OVERLAPPED_COPY, bytes_moved=10**7)
    assert predict_step([kernel, copy], ROUND).device_s == pytest.approx(3e-3 + 10e-6)
    assert predict_step([kernel, overlapped], ROUND).device_s == pytest.approx(2e-3 + 5e-6)  # hidden behind it
    serial_device = dataclasses.replace(ROUND, async_copies=False)
    assert predict_step([kernel, overlapped], serial_device).device_s == pytest.approx(3e-3 + 10e-6)


def test_the_host_bounds_a_step_from_below_and_adds_on_a_cpu() -> None:
    tiny = [OpCost("add_", KERNEL, bytes_moved=8)] * 100 + [OpCost("view", HOST_ONLY)] * 50
    p = predict_step(tiny, ROUND)
    assert p.host_s == pytest.approx(150 * 20e-6) and p.step_s == pytest.approx(p.host_s)  # host-bound
    cpu = dataclasses.replace(ROUND, host_overlaps_device=False)
    assert predict_step(tiny, cpu).step_s == pytest.approx(p.host_s + p.device_s)


def test_each_strategy_call_adds_its_host_cost_to_the_cpus_sum_and_bounds_an_async_device() -> None:
    kernels = [OpCost("add", KERNEL, bytes_moved=10**8)] * 3  # 3 x (2 ms + 5 us launch) of device time
    twins = [OpCost("actnn_layer:L3", STRATEGY_CALL)] * 7
    model = dataclasses.replace(ROUND, strategy_call_s=MappingProxyType({"actnn_layer:L3": 1e-3}))
    cpu = dataclasses.replace(model, host_overlaps_device=False)
    plain = predict_step(kernels, dataclasses.replace(cpu, strategy_call_s={}))
    with_twins = predict_step(kernels + twins, cpu)
    # on a cpu: 7 x 1 ms more host, and the 7 calls are not dispatched ops (no host_op_s, no launch)
    assert with_twins.strategy_host_s == pytest.approx(7e-3) and with_twins.ops == 3
    assert with_twins.host_s == pytest.approx(3 * 20e-6 + 7e-3)
    assert with_twins.device_s == pytest.approx(plain.device_s) == pytest.approx(3 * (2e-3 + 5e-6))
    assert with_twins.step_s == pytest.approx(plain.step_s + 7e-3) == pytest.approx(6.015e-3 + 60e-6 + 7e-3)
    # on an async device: the larger of host (7.06 ms) and device (6.015 ms)
    assert predict_step(kernels + twins, model).step_s == pytest.approx(7e-3 + 60e-6)
    assert predict_step(kernels + twins[:2], model).step_s == pytest.approx(6.015e-3)  # device-bound


def test_a_level_without_its_own_value_takes_the_generic_actnn_layers_and_unknown_kinds_cost_nothing() -> None:
    model = dataclasses.replace(ROUND, strategy_call_s=MappingProxyType({"actnn_layer:L3": 2e-3, "actnn_layer": 1e-3}))
    assert model.strategy_call_seconds("actnn_layer:L3") == 2e-3
    assert model.strategy_call_seconds("actnn_layer:L4") == 1e-3
    assert model.strategy_call_seconds("checkpoint_module") == 0.0


def test_the_recorder_writes_down_actnn_layers_and_checkpoint_segments_of_a_real_step() -> None:
    from actbench.measure.host_probes import tiny_model
    from actbench import strategies
    from actbench.training.step import build_training_step

    images, targets = torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2,))
    counts = {}
    for strategy in ("fp32", "L0", "L2", "checkpoint", "sac"):
        step, _ = build_training_step(strategies.get(strategy), tiny_model(blocks=2), torch.device("cpu"))
        recorder = OpRecorder()
        with LiveStorageTracker(observer=recorder):
            step(images, targets)
        step(images, targets)  # after the tracker: nothing more is written down
        calls = [op.name for op in recorder.ops if op.kind == STRATEGY_CALL]
        counts[strategy] = {name: calls.count(name) for name in calls}
        assert any(op.kind == KERNEL for op in recorder.ops)
    # 3 conv-BN-ReLU blocks and the linear head: 10 ActNN layers, of which L0 runs the convs, batch norms
    # and the head as torch's own layers (no twin Python: no call); 3 blocks, one checkpoint segment
    # each of 4 modules (the block's Sequential and its 3 layers)
    assert counts == {"fp32": {}, "L0": {"actnn_layer:L0": 3}, "L2": {"actnn_layer:L2": 10},
                      "checkpoint": {"checkpoint_module": 12}, "sac": {"selective_module": 12}}


@pytest.mark.parametrize("strategy", ["swap", "save_on_cpu"])
def test_each_host_copy_of_a_hook_strategy_is_also_a_call_of_its_python(strategy: str) -> None:
    """swap's and save_on_cpu's saved-tensor hooks run Python per tensor: a cpu step records one call of
    ``host_copy:<strategy>`` beside each host copy, and the model prices it like a layer's call."""
    from actbench.measure.host_probes import tiny_model
    from actbench import strategies
    from actbench.training.step import build_training_step

    images, targets = torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2,))
    recorder = OpRecorder.for_strategy(strategies.get(strategy))
    tracker = LiveStorageTracker(observer=recorder)
    step, _ = build_training_step(strategies.get(strategy), tiny_model(blocks=2), torch.device("cpu"),
                                  host_scope=tracker.host_allocations)
    with tracker:
        step(images, targets)
    copies = [op for op in recorder.ops if op.kind == COPY]
    calls = [op for op in recorder.ops if op.kind == STRATEGY_CALL]
    assert copies and [op.name for op in calls] == [f"host_copy:{strategy}"] * len(copies)
    model = dataclasses.replace(ROUND, host_overlaps_device=False)
    priced = dataclasses.replace(model, strategy_call_s=MappingProxyType({f"host_copy:{strategy}": 1e-3}))
    assert predict_step(recorder.ops, priced).step_s == pytest.approx(
        predict_step(recorder.ops, model).step_s + 1e-3 * len(copies))


def test_the_recorder_counts_flops_and_bytes_of_real_ops() -> None:
    recorder = OpRecorder()
    a, b = torch.randn(4, 8), torch.randn(8, 16)
    with LiveStorageTracker(observer=recorder):
        c = a @ b
        c.view(-1)
        c.relu()
    recorder.observe(torch.ops.prim.device.default, (c,), {}, c.device, False)  # a query, as fake tensors see it
    mm, view, relu, query = recorder.ops
    assert not mm.backward and not relu.backward
    assert query.kind == HOST_ONLY and query.bytes_moved == 0
    assert (mm.kind, mm.flops, mm.bytes_moved, mm.dtype) == (KERNEL, 2 * 4 * 8 * 16, (32 + 128 + 64) * 4, "fp32")
    assert view.kind == HOST_ONLY
    assert (relu.kind, relu.flops, relu.bytes_moved) == (KERNEL, 0, 2 * 64 * 4)


def test_a_convolution_runs_at_the_rate_its_curve_gives_for_its_rows() -> None:
    """Between measured rows the rate is interpolated on log-log scales; outside them, the nearest."""
    curves = MappingProxyType({"fp32:pointwise": ((16, 1e9), (1024, 64e9)), "fp32:pointwise_backward": ((16, 0.5e9),)})
    model = dataclasses.replace(ROUND, conv_rates=curves, backward_efficiency=0.25)

    def seconds(rows: int, **kw) -> float:
        op = OpCost("convolution", KERNEL, flops=8 * 10**9, convolution=True, rows=rows, **{"pointwise": True, **kw})
        return predict_step([op], model).device_s - 5e-6

    assert seconds(128) == pytest.approx(8e9 / 8e9)  # halfway in log rows: the geometric mean of 1 and 64 GFLOP/s
    assert seconds(4) == pytest.approx(8.0) and seconds(4096) == pytest.approx(8e9 / 64e9)
    assert seconds(64, backward=True) == pytest.approx(16.0)  # its own curve, not backward_efficiency
    # no curve for its kernel or dtype, or no rows (an unbatched convolution): peak x efficiency as before
    plain = 8e9 / (1e12 * 0.5)
    assert seconds(64, pointwise=False) == pytest.approx(plain)
    assert seconds(64, dtype="bf16") == pytest.approx(8e9 / (4e12 * 0.5))
    assert seconds(0) == pytest.approx(plain)


def test_an_op_with_its_own_measured_rate_moves_its_bytes_at_that_rate() -> None:
    slow = dataclasses.replace(ROUND, op_bytes_per_s=MappingProxyType({"native_batch_norm": 1e9}))
    norm = OpCost("native_batch_norm", KERNEL, bytes_moved=10**8)
    add = OpCost("add", KERNEL, bytes_moved=10**8)
    assert predict_step([norm], slow).device_s == pytest.approx(0.1 + 5e-6)  # 1e8 B at 1 GB/s
    assert predict_step([add], slow).device_s == pytest.approx(1e8 / (100e9 * 0.5) + 5e-6)  # DRAM, as before
    assert predict_step([norm], ROUND).device_s == pytest.approx(1e8 / (100e9 * 0.5) + 5e-6)


def test_the_recorder_gives_a_convolution_its_gemm_rows_forward_and_backward() -> None:
    recorder = OpRecorder()
    x = torch.randn(2, 8, 6, 6, requires_grad=True)
    pointwise, spatial = torch.randn(4, 8, 1, 1, requires_grad=True), torch.randn(4, 8, 3, 3, requires_grad=True)
    with LiveStorageTracker(observer=recorder):
        torch.nn.functional.conv2d(x, pointwise, stride=2).sum().backward()
        torch.nn.functional.conv2d(x, spatial, padding=1).sum().backward()
    convs = [op for op in recorder.ops if op.convolution]
    assert [(op.name, op.rows, op.pointwise, op.conv_curve) for op in convs] == [
        ("convolution", 2 * 3 * 3, True, "pointwise"), ("convolution_backward", 2 * 3 * 3, True, "pointwise_backward"),
        ("convolution", 2 * 6 * 6, False, "spatial"), ("convolution_backward", 2 * 6 * 6, False, "spatial_backward")]


def test_the_recorder_sees_copies_between_device_and_host() -> None:
    recorder = OpRecorder()
    tracker = LiveStorageTracker(observer=recorder)
    x = torch.randn(1000)
    tracker.adopt([x])
    with tracker:
        with tracker.host_allocations():
            host = x.clone()  # an offload
        back = host.clone()  # a fetch
        x.clone()  # a copy on the device
    assert [op.kind for op in recorder.ops] == [COPY, COPY, KERNEL]
    assert recorder.ops[0].bytes_moved == recorder.ops[1].bytes_moved == 4000 and back.numel() == 1000
    assert OpRecorder(overlaps_copies=True).overlaps_copies


def test_the_observer_without_a_tracker_sees_copies_across_devices() -> None:
    from actbench.measure.tracker import OpObserver

    recorder = OpRecorder(overlaps_copies=True)
    x = torch.randn(1000)
    with OpObserver(recorder):
        x.to("meta")  # a copy to another device
        x.clone()  # a copy on the same device
    assert [op.kind for op in recorder.ops] == [OVERLAPPED_COPY, KERNEL]
    assert recorder.ops[0].bytes_moved == 4000


# --- the built-in device models -----------------------------------------------------------------------
def test_every_gpu_spec_has_a_speed_model_with_its_sources() -> None:
    assert tuple(GPU_SPEED_MODELS) == GPU_NAMES
    for name, model in GPU_SPEED_MODELS.items():
        assert {"peaks", "dram", "pcie"} <= set(model.sources), name
        assert model.peak_flops["fp32"] > 0 and model.dram_bytes_per_s > 0 and model.pcie_generation in (3, 4, 5)
    assert gpu_speed_model("l4").dram_bytes_per_s == 300e9  # not the 3,350 GB/s torch's own table gives it
    assert gpu_speed_model("h100-80gb").peak_flops["fp32"] == 67e12  # no sparsity factor
    assert "tf32" not in gpu_speed_model("t4").peak_flops and "bf16" not in gpu_speed_model("v100").peak_flops
    with pytest.raises(ValueError, match="unknown GPU 'k80'; choose t4, v100"):
        gpu_speed_model("k80")


# --- rows -----------------------------------------------------------------------------------------
def test_prediction_columns_are_their_own_and_old_rows_load_without_them() -> None:
    assert {"predicted_step_s", "predicted_samples_per_s", "device_model"} <= set(COLUMNS)
    point = PointConfig(ModelSpec("resnet18"), "fp32", 2, 32, "meta")
    row = ResultRow.build(point, Measurement(status="ok"), "run", "env")
    old = {k: v for k, v in dataclasses.asdict(row).items() if not k.startswith("predicted") and k != "device_model"}
    loaded = ResultRow.from_dict(old)
    assert loaded.predicted_step_s is None and loaded.device_model is None


_A_STEP = [OpCost("size", HOST_ONLY), OpCost("add", KERNEL, bytes_moved=100)]


@pytest.mark.parametrize("change, ops", [(dict(launch_s=float("inf")), _A_STEP), (dict(host_op_s=1e308), _A_STEP),
                                         (dict(launch_s=float("nan")), _A_STEP),
                                         (dict(host_op_s=0.0), [OpCost("size", HOST_ONLY)])])
def test_a_prediction_a_row_cannot_hold_leaves_the_columns_empty(change: dict, ops: list, caplog) -> None:
    """A model built in code skips the file's bounds: a step it prices at Infinity, NaN or nothing (an
    infinite rate) leaves the predicted columns empty, with a warning, never non-finite JSON in a row."""
    from actbench.planning.step_time import fill_prediction

    result = Measurement(status="ok")
    fill_prediction(result, ops, dataclasses.replace(ROUND, **change), 2)
    assert (result.predicted_step_s, result.predicted_samples_per_s, result.device_model) == (None, None, None)
    assert "the predicted columns are left empty" in caplog.text
    fill_prediction(result, _A_STEP, ROUND, 2)
    assert result.predicted_step_s > 0 and result.device_model == "round"


def _resnet18_on_meta(strategy: str, **kw):
    """ResNet-18 at batch 32, 160 px, predicted on meta: the point resolved, as measure_point takes it."""
    from actbench.planning.point import Point

    return Point.resolve(PointConfig(ModelSpec("resnet18"), strategy, 32, 160, "meta", **kw))


def test_meta_rows_with_a_gpu_carry_its_predicted_speed(monkeypatch) -> None:
    from actbench.measure.meta import MetaSessions
    from actbench.planning.device_models import DEVICE_MODEL_ENV

    monkeypatch.delenv(DEVICE_MODEL_ENV, raising=False)
    sessions = MetaSessions()
    # 160 px, batch 32: large enough that the device, not the host's dispatch, bounds a T4's step
    rows = {s: sessions.measure_point(_resnet18_on_meta(s, gpu="t4", timed_steps=0))
            for s in ("fp32", "swap")}
    for m in rows.values():
        assert m.status == "ok" and m.device_model == "t4" and m.samples_per_s_median is None  # never measured
        assert m.predicted_samples_per_s == pytest.approx(32 / m.predicted_step_s)
    assert rows["swap"].predicted_step_s > rows["fp32"].predicted_step_s  # its copies cross PCIe, serially
    a100 = sessions.measure_point(_resnet18_on_meta("fp32", gpu="a100-80gb"))
    assert a100.device_model == "a100-80gb" and a100.predicted_step_s < rows["fp32"].predicted_step_s
    plain = sessions.measure_point(_resnet18_on_meta("fp32"))
    assert plain.predicted_step_s is None and plain.device_model is None  # an idealised device has no speed
    first_plain = sessions.measure_point(_resnet18_on_meta("L3"))
    then_gpu = sessions.measure_point(_resnet18_on_meta("L3", gpu="t4"))
    assert first_plain.predicted_step_s is None and then_gpu.predicted_step_s > 0  # stepped again, with its ops
    assert then_gpu.peak_alloc_bytes == first_plain.peak_alloc_bytes


# --- fastest: the user's question -----------------------------------------------------------------
def test_fastest_first_puts_what_fits_first_fastest_first() -> None:
    from actbench.planning.step_time import StrategyChoice, fastest_first

    choices = [StrategyChoice("fp32", "over_budget", 10, 12, 50.0, "too big"),
               StrategyChoice("L3", "ok", 3, 4, 40.0, ""), StrategyChoice("L2", "ok", 4, 5, 45.0, ""),
               StrategyChoice("swap", "ok", 2, 3, 10.0, "")]
    assert [c.strategy for c in fastest_first(choices)] == ["L2", "L3", "swap", "fp32"]


def test_fastest_command_answers_for_a_named_gpu_and_refuses_bad_input() -> None:
    from typer.testing import CliRunner

    from actbench.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["fastest", "resnet18", "--gpu", "t5", "--batch", "8"])
    assert bad.exit_code == 2 and ("'t5' is not one of 't4', 'v100', 'l4', 'a10', 'a100-40gb', 'a100-80gb', "
                                   "'h100-80gb', 'h200', 'rtx3090', 'rtx4090'") in bad.output
    assert runner.invoke(app, ["fastest", "resnet18", "--gpu", "t4", "--batch", "1"]).exit_code == 2
    result = runner.invoke(app, ["fastest", "resnet18", "--gpu", "t4", "--batch", "8", "--image-size", "32",
                                 "--strategies", "fp32,swap"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    table = result.stdout[result.stdout.index("strategy"):]
    assert table.index("fp32") < table.index("swap")  # both fit; swap crosses PCIe: slower
    assert "samples/s" in table and "predicted" in result.stdout
    wide = runner.invoke(app, ["fastest", "resnet18", "--gpu", "t4", "--batch", "8", "--image-size", "32x48",
                               "--strategies", "fp32"], catch_exceptions=False)  # HxW, as every command takes it
    assert wide.exit_code == 0 and "32x48px" in wide.stdout, wide.output
