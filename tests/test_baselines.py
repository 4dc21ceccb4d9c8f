"""Today's baselines: precision (fp32/bf16/fp16), sac, save_on_cpu, compile[@B], checkpoint+Lk.

Small sizes throughout (ResNet-18, 32 px, batch 2, cpu) except the bf16 targets, which are sized on
meta at the paper's setting (ResNet-50, 224 px, batch 64: fake tensors, seconds).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from typer.testing import CliRunner

from actbench import strategies
from actbench.execution.specs import CommandSpec, SpecError
from actbench.training.models import build_model
from actbench.execution.parsing import parse_strategies
from actbench.planning.point import Point
from actbench.schema import InputSize, Measurement, ModelSpec, PointConfig, ResultRow
from actbench.strategies import StrategyOptions
from actbench.training.step import build_training_step, synthetic_batch

CPU = torch.device("cpu")
SMALL = dict(image_size=32, batch=2)


# --- keys, rows and run names: fp32 unchanged ------------------------------------------------------
def test_fp32_points_keep_their_keys_and_other_precisions_get_new_ones() -> None:
    fp32 = PointConfig(ModelSpec("resnet18"), "fp32", 2, 32, "cpu")
    assert fp32.precision == "fp32" and fp32.key() == "5f07a606d92fe6d3"
    bf16 = dataclasses.replace(fp32, precision="bf16")
    assert bf16.key() != fp32.key()
    assert (fp32.describe(), bf16.describe()) == ("resnet18 fp32 b2 32px cpu", "resnet18 fp32 bf16 b2 32px cpu")
    assert PointConfig.from_dict(bf16.to_dict()) == bf16
    # a row written before the column existed reads as fp32
    old = ResultRow.build(fp32, Measurement("ok"), "run", "env").__dict__ | {}
    del old["precision"]
    assert ResultRow.from_dict(old).precision == "fp32"
    assert ResultRow.build(bf16, Measurement("ok"), "run", "env").precision == "bf16"


def test_fp32_run_directories_keep_their_names() -> None:
    spec = dict(command="memory", model="resnet18", strategies=("fp32",), device="cpu", batch="2", image_size=32)
    fp32 = CommandSpec(**spec)
    assert "precision" not in fp32.settings().identity()  # what run names hash: as before precision existed
    bf16 = CommandSpec(**spec, precision="bf16")
    assert bf16.settings().identity()["precision"] == "bf16"
    assert bf16.plan().name != fp32.plan().name
    assert [p.precision for p in bf16.plan().config.points()] == ["bf16"]


# --- names: parameters, combinations, refusals in one line -------------------------------------------
def test_parameterised_and_combined_names_have_one_spelling() -> None:
    assert parse_strategies("fp32,l3,compile@0.50,L2+checkpoint") == ("fp32", "L3", "compile@0.5", "checkpoint+L2")
    assert strategies.get("compile@0.5").budget == 0.5 and strategies.get("compile").budget is None
    assert strategies.rank("compile") < strategies.rank("compile@0.5")
    assert strategies.colour("checkpoint+L2") == strategies.colour("L2")
    assert not strategies.get("sac").uses_host_memory and strategies.get("save_on_cpu").uses_host_memory


@pytest.mark.parametrize("name, says", [
    ("compile@1.5", "strictly between 0 and 1"),
    ("compile@x", "strictly between 0 and 1"),
    ("swap@2", "takes no parameter"),
    ("checkpoint+L3", "use checkpoint+L2, or L3 alone"),
    ("sac+L2", "use sac or an ActNN level alone"),
    ("compile+L3", "use compile or an ActNN level alone"),
    ("swap+L3", "use L4"),
    ("save_on_cpu+L1", "use L4"),
    ("swap+checkpoint", "one strategy and one ActNN level"),
    ("bf16", "is a precision: --precision bf16"),
])
def test_refused_names_say_why_in_one_line(name: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_strategies(name)
    assert says in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(SpecError) as spec_info:
        CommandSpec(command="memory", model="resnet18", strategies=(name,), device="meta", **SMALL)
    assert spec_info.value.field == "strategies" and "\n" not in spec_info.value.as_option()


def test_bad_precision_is_one_line_on_the_command_line_and_in_specs() -> None:
    from actbench.cli import app

    with pytest.raises(SpecError, match="precision: must be one of fp32, bf16, fp16, got 'fp8'"):
        CommandSpec(command="memory", model="resnet18", strategies=("fp32",), device="cpu", precision="fp8", **SMALL)
    bad = CliRunner().invoke(app, ["memory", "resnet18", "--precision", "fp8", "--device", "meta", "--dry-run"])
    assert bad.exit_code == 2
    refused = CliRunner().invoke(app, ["memory", "resnet18", "--strategies", "compile+L3", "--device", "meta",
                                       "--dry-run"])
    assert refused.exit_code == 2 and "refused" in refused.output
    assert len([line for line in refused.output.splitlines() if line.strip()]) == 1, refused.output
    ok = CliRunner().invoke(app, ["memory", "resnet18", "--strategies", "sac,compile@0.5", "--precision", "bf16",
                                  "--device", "meta", "--batch", "2", "--image-size", "32", "--dry-run"])
    assert ok.exit_code == 0, ok.output
    assert "sac bf16" in ok.output and "compile@0.5 bf16" in ok.output


def test_every_new_strategy_runs_on_meta() -> None:
    for name in ("sac", "save_on_cpu", "compile", "compile@0.5", "checkpoint+L2"):
        assert strategies.get(name).not_on_meta is None, name
        CommandSpec(command="plan", model="resnet18", strategies=(name,), device="meta", budget="1GiB",
                    precision="fp16", batch="4", image_size=32, dim="batch")


# --- training: every strategy at every precision; exact ones match fp32's gradients ------------------
def _grads(strategy: str, seed: int = 0) -> tuple[float, dict[str, torch.Tensor]]:
    """One fp32 step's loss and gradients at batch 8, 64 px: at batch 2 and 32 px the last stage's
    BatchNorm normalises 2 values per channel and the gradients are too ill-conditioned to compare
    (a reordered sum moves them by 20%)."""
    torch.manual_seed(seed)
    model = build_model(ModelSpec("resnet18"), 64)
    step, _ = build_training_step(strategies.get(strategy), model, CPU)
    images, targets = synthetic_batch(8, 64, 1000, CPU, seed + 1)
    step.zero_grad()
    loss = step.forward_loss(images, targets)
    loss.backward()
    params = dict(step.model.named_parameters())
    return loss.item(), {name.replace("_orig_mod.", "").replace(".inner.", "."): p.grad.clone()
                         for name, p in params.items() if p.grad is not None}


def _max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)).item() for k in a)


@pytest.fixture(scope="module")
def fp32_grads() -> tuple[float, dict[str, torch.Tensor]]:
    return _grads("fp32")


#: Exact strategies, each gradient held to this fraction of its largest entry. sac and checkpoint replay
#: the same ops on the same inputs; swap copies tensors as they are: bitwise on cpu. save_on_cpu copies
#: each saved tensor into a fresh contiguous one (as torch's does), so kernels may see other strides and
#: sum in another order; compile runs inductor's decompositions (BatchNorm, convolution backward);
#: checkpoint+L0 keeps every tensor in full precision, and its BatchNorm twin's backward runs on the
#: normalised input (docs/design.md §3): all equal up to rounding (measured: 2.0e-6, 5.6e-6, 2.0e-6).
EXACT = {"sac": 0.0, "checkpoint": 0.0, "swap": 0.0, "save_on_cpu": 1e-5, "compile": 1e-4, "compile@0.5": 1e-4,
         "checkpoint+L0": 1e-5}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", sorted(EXACT))
def test_exact_strategies_give_fp32_gradients(strategy: str, fp32_grads) -> None:
    loss, grads = _grads(strategy)
    assert math.isfinite(loss) and abs(loss - fp32_grads[0]) <= 1e-5 * fp32_grads[0]
    assert _max_relative_difference(grads, fp32_grads[1]) <= EXACT[strategy]


#: every strategy at bf16; fp16 (slow on cpu: GradScaler halves its scale from 2^16 for a dozen steps at
#: batch 2) for the plain step, sac and an ActNN level with the heavy tests (the default run measures an
#: fp16 point in test_fp16_on_cpu_settles_the_loss_scale_before_measuring). compile trains in the
#: gradient test above.
TRAINED = [(s, "bf16") for s in ("fp32", "sac", "checkpoint", "save_on_cpu", "swap", "L3", "checkpoint+L2")]
TRAINED += [pytest.param(s, "fp16", marks=pytest.mark.heavy) for s in ("fp32", "sac", "L3")]


@pytest.mark.slow
@pytest.mark.parametrize("strategy, precision", TRAINED)
def test_every_strategy_trains_at_every_precision(strategy: str, precision: str) -> None:
    """Steps on one batch of 2: the first step taken lowers the loss, parameters move, the loss stays
    finite (autocast is lossy, so gradients are not held to fp32's). lr 0.01, not the measured 0.1:
    BatchNorm over two images makes gradients in the hundreds, and at lr 0.1 one step pushes fp16
    activations past 65504 (NaN) and SGD oscillates."""
    torch.manual_seed(0)
    model = build_model(ModelSpec("resnet18"), 32)
    step, _ = build_training_step(strategies.get(strategy), model, CPU, StrategyOptions(lr=0.01), precision=precision)
    images, targets = synthetic_batch(2, 32, 1000, CPU, 1)
    assert (step.scaler is not None) == (precision == "fp16")
    first = step.forward_loss(images, targets).item()
    before = [p.detach().clone() for p in step.model.parameters()]
    step(images, targets)
    step.settle_loss_scale(images, targets)  # fp16: GradScaler skips steps until its scale fits
    assert not step.last_step_skipped
    after = step.forward_loss(images, targets).item()
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, step.model.parameters()))
    assert math.isfinite(first) and after < first
    step(images, targets)
    assert math.isfinite(step.forward_loss(images, targets).item())


# --- memory: ordering on cpu, meta agreeing with cpu, the bf16 targets on meta -------------------------
def _point(strategy: str, device: str, precision: str = "fp32", model: str = "resnet18", batch: int = 2,
           image_size: int = 32) -> Point:
    return Point.resolve(PointConfig(ModelSpec(model), strategy, batch, image_size, device, warmup_steps=1,
                                     timed_steps=0, precision=precision))


@pytest.fixture(scope="module")
def cpu_rows() -> dict[str, Measurement]:
    from actbench.measure.point import measure_point

    return {s: measure_point(_point(s, "cpu")) for s in ("fp32", "checkpoint", "sac", "save_on_cpu", "compile@0.5")}


def test_sac_keeps_less_than_fp32_and_more_than_checkpoint_on_cpu(cpu_rows) -> None:
    act = {s: m.activation_bytes for s, m in cpu_rows.items()}
    assert all(m.status == "ok" for m in cpu_rows.values())
    assert act["checkpoint"] < act["sac"] < act["fp32"]
    assert act["compile@0.5"] < act["fp32"]
    assert "aot_eager_decomp_partition" in cpu_rows["compile@0.5"].strategy_note


def test_save_on_cpu_moves_saved_tensors_to_host_on_cpu(cpu_rows) -> None:
    on_cpu, fp32 = cpu_rows["save_on_cpu"], cpu_rows["fp32"]
    assert on_cpu.activation_bytes < 0.01 * fp32.activation_bytes
    # torch's save_on_cpu copies every saved tensor, parameters (conv/linear weights) too
    assert on_cpu.host_bytes > fp32.activation_bytes + fp32.param_bytes * 0.9


def test_meta_predicts_the_new_strategies_as_cpu_measures_them(cpu_rows) -> None:
    from actbench.measure.meta import MetaSessions

    sessions = MetaSessions()
    for strategy, measured in cpu_rows.items():
        predicted = sessions.measure_point(_point(strategy, "meta"))
        assert predicted.status == "ok", (strategy, predicted.message)
        for field in ("activation_bytes", "peak_alloc_bytes", "host_bytes"):
            a, b = getattr(predicted, field), getattr(measured, field)
            assert abs(a - b) <= 0.01 * max(b, 1) + 4096, (strategy, field, a, b)


def test_fp16_on_cpu_settles_the_loss_scale_before_measuring() -> None:
    from actbench.measure.point import measure_point

    row = measure_point(_point("fp32", "cpu", "fp16"))
    assert row.status == "ok" and "fp16 loss scale" in row.strategy_note
    assert row.optimizer_state_bytes == row.param_bytes  # a step was taken: SGD's momentum buffers exist


def test_bf16_targets_on_meta_resnet50_batch_64() -> None:
    """Targets: bf16 activations 0.45-0.55 of fp32's; bf16 + L3 at most 1.05x fp32 + L3.

    L3's stored bytes barely depend on the dtype (codes and bf16 metadata), so the peak shows whether
    ActNN's convolutions really run in bf16 under meta's (cpu) autocast: measured 1135 vs 1306 MB; it was
    equal while the conv twin convolved in fp32 there."""
    from actbench.measure.meta import MetaSessions

    sessions = MetaSessions()
    rows = {(s, p): sessions.measure_point(_point(s, "meta", p, "resnet50", 64, 224))
            for s in ("fp32", "L3") for p in ("fp32", "bf16")}
    act = {k: m.activation_bytes for k, m in rows.items()}
    assert 0.45 <= act["fp32", "bf16"] / act["fp32", "fp32"] <= 0.55
    assert act["L3", "bf16"] <= 1.05 * act["L3", "fp32"]
    assert rows["L3", "bf16"].peak_alloc_bytes < 0.95 * rows["L3", "fp32"].peak_alloc_bytes


# --- analysis: series are strategy x precision; the paper sees fp32 rows only ------------------------
def test_series_are_strategy_by_precision_and_only_fp32_meets_the_paper() -> None:
    from actbench.reporting.analysis import BatchGroup, Series, max_batch_table

    def row(strategy: str, precision: str, batch: int, status: str = "ok") -> ResultRow:
        point = PointConfig(ModelSpec("resnet50"), strategy, batch, 224, "meta", budget_bytes=16 << 30,
                            precision=precision)
        return ResultRow.build(point, Measurement(status, activation_bytes=batch, peak_alloc_bytes=batch), "r", "e")

    rows = (row("fp32", "fp32", 160), row("fp32", "fp32", 164, "over_budget"), row("fp32", "bf16", 300),
            row("L3", "bf16", 900), row("L3", "fp32", 880))
    group = BatchGroup("resnet50", InputSize(224, 224), 16 << 30, rows, ("r",))
    assert [s.name for s in group.series()] == ["fp32", "fp32 bf16", "L3", "L3 bf16"]
    assert group.label(Series("L3", "meta", "bf16")) == "L3 bf16 (predicted)"
    table = {e.label: e for e in max_batch_table(group)}
    assert table["fp32 bf16 (predicted)"].max_batch == 300
    assert table["fp32 bf16 (predicted)"].multiple_of_fp32 == pytest.approx(300 / 160)
    assert not Series("L3", "meta", "bf16").paper_comparable and Series("L3", "meta").paper_comparable


# --- trust at a precision: both sides under the same autocast, a file of its own ----------------------
def test_trust_at_bf16_compares_bf16_points_in_a_file_of_their_own(tmp_path) -> None:
    """meta agrees with cpu at bf16 as at fp32 (ActNN's conv and linear follow cpu autocast on both), and
    the points really ran under autocast: torch's layers keep a bf16 copy of each conv and linear weight
    (2 bytes per parameter, 23 MB for ResNet-18), far more than its fp32 activations at 32 px (0.9 MB)."""
    from actbench.cli import app
    from actbench.studies.trust import compare

    result = CliRunner().invoke(app, ["trust", "--models", "resnet18", "--strategies", "fp32,L3", "--precision",
                                      "bf16", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "meta_vs_cpu.csv").exists()
    lines = (tmp_path / "meta_vs_cpu_bf16.csv").read_text().splitlines()
    header = lines[0].split(",")
    before = ("model,strategy,batch_size,image_size,device,meta_status,measured_status,meta_activation_bytes,"
              "measured_activation_bytes,meta_peak_alloc_bytes,measured_peak_alloc_bytes,measured_reserved_bytes,"
              "message,activation_ratio,peak_ratio").split(",")
    assert header[:len(before)] == before and "precision" in header[len(before):]  # fp32's columns keep their places
    rows = [dict(zip(header, line.split(","))) for line in lines[1:]]
    assert [(r["strategy"], r["precision"]) for r in rows] == [("fp32", "bf16"), ("L3", "bf16")]
    for r in rows:
        assert r["meta_status"] == r["measured_status"] == "ok", r
        assert abs(float(r["activation_ratio"]) - 1) <= 0.05 and abs(float(r["peak_ratio"]) - 1) <= 0.05, r
    assert "L3 bf16" in result.output
    (fp32,) = compare("cpu", ("resnet18",), ("fp32",))
    bf16 = {r["strategy"]: int(r["measured_activation_bytes"]) for r in rows}["fp32"]
    params = sum(p.numel() for p in build_model(ModelSpec("resnet18"), 32).parameters())
    assert bf16 - fp32.measured_activation_bytes >= 0.95 * 2 * params


def test_trust_bad_precision_is_one_line(tmp_path) -> None:
    from actbench.cli import app

    bad = CliRunner().invoke(app, ["trust", "--precision", "fp8", "--out", str(tmp_path / "t")])
    assert bad.exit_code == 2 and "'fp8' is not one of 'fp32', 'bf16', 'fp16'" in bad.stderr
    assert not (tmp_path / "t").exists()
