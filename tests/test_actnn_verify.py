"""verify-grads: the statistics, the library function, and the CLI command (CliRunner)."""

from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

from actbench.actnn import level_config
from actbench.studies.gradients import compare_gradients, grad_statistics

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


def test_grad_statistics_separates_bias_from_noise():
    torch.manual_seed(0)
    g = {"w": torch.ones(1000, dtype=torch.float64)}
    unbiased = [{"w": g["w"] + 0.1 * torch.randn(1000, dtype=torch.float64)} for _ in range(16)]
    biased = [{"w": d["w"] + 0.2} for d in unbiased]
    (u,) = grad_statistics(g, unbiased)
    (b,) = grad_statistics(g, biased)
    assert 0.5 < u.bias_z < 1.5 and abs(u.rel_std - 0.1) < 0.01
    assert b.bias_z > 5 and abs(b.rel_bias - 0.2) < 0.01  # 0.2 / (0.1 / sqrt(16)) = 8


def test_compare_gradients_l0_is_exact_and_l2_unbiased(backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5),
                          nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    exact = compare_gradients(model, level_config("L0", backend=backend), x, y, seeds=2)
    # (a conv bias before BatchNorm has a zero gradient: only float noise, so compare absolutely)
    assert all((r.rel_bias < 1e-5 or r.rel_bias * r.fp32_norm < 1e-6) and r.rel_std == 0 for r in exact), exact
    rows = compare_gradients(model, level_config("L2", backend=backend), x, y, seeds=8)
    weights = [r for r in rows if r.parameter.endswith("weight")]
    assert all(0 < r.rel_std < 1 and r.bias_z < 4 for r in weights), rows


def test_cli_verify_grads_writes_csv(backend, tmp_path):
    import actbench.cli  # noqa: F401  (registers the commands)
    from actbench.cli.app import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [
        "verify-grads", "resnet18", "--level", "L2", "--batch", "2", "--seeds", "2",
        "--image-size", "32", "--backend", backend, "--out", str(tmp_path),
    ])
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("resnet18-L2-*.csv")
    rows = list(csv.DictReader(path.open()))
    assert rows[0]["parameter"] == "conv1.weight" and set(rows[0]) >= {"rel_bias", "rel_std", "bias_z"}
    assert "fc.weight" in result.output


def test_cli_rejects_bad_level_and_model(backend):
    import actbench.cli  # noqa: F401  (registers the commands)
    from actbench.cli.app import app
    from typer.testing import CliRunner

    bad_level = CliRunner().invoke(app, ["verify-grads", "resnet18", "--level", "L9"])
    assert bad_level.exit_code == 2 and "L9" in bad_level.output
    bad_model = CliRunner().invoke(app, ["verify-grads", "resnet1800"])
    assert bad_model.exit_code == 2 and "resnet1800" in bad_model.output
    assert bad_model.stderr.startswith("actbench: error:") and bad_model.stderr.count("\n") == 1
    bad_device = CliRunner().invoke(app, ["verify-grads", "resnet18", "--device", "tpu"])
    assert bad_device.exit_code == 2 and "'tpu' is not one of 'cpu', 'cuda'" in bad_device.stderr


def test_verify_grads_cuda_without_a_gpu_is_one_line(tmp_path, monkeypatch):
    import torch
    from typer.testing import CliRunner

    import actbench.cli  # noqa: F401  (registers the commands)
    from actbench.cli.app import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["verify-grads", "resnet18", "--device", "cuda", "--out", str(tmp_path / "v")])
    assert result.exit_code == 2 and "sees no CUDA GPU here; use --device cpu" in result.stderr
    assert not (tmp_path / "v").exists()


def test_compare_gradients_at_bf16_compares_with_the_uncompressed_bf16_gradient(backend):
    """At bf16 the reference is the unconverted model's bf16 gradient, so L0 is within bf16 rounding of it
    and noiseless, and L2 stays unbiased; ignoring the precision would give fp32's reference norms."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    fp32 = compare_gradients(model, level_config("L0", backend=backend), x, y, seeds=2)
    exact = compare_gradients(model, level_config("L0", backend=backend), x, y, seeds=2, precision="bf16")
    assert all(r.rel_std == 0 for r in exact)
    weights = {r.parameter: r for r in exact if r.parameter.endswith("weight")}
    assert all(r.rel_bias < 0.05 for r in weights.values()), exact
    assert all(abs(a.fp32_norm - b.fp32_norm) > 1e-6 * b.fp32_norm for a, b in zip(exact, fp32)
               if a.parameter in weights), (exact, fp32)  # a bf16 reference, not fp32's
    rows = compare_gradients(model, level_config("L2", backend=backend), x, y, seeds=8, precision="bf16")
    assert all(0 < r.rel_std < 1 and r.bias_z < 4 for r in rows if r.parameter.endswith("weight")), rows


def test_fp16_gradients_back_off_the_loss_scale_until_finite(backend):
    """Gradients that overflow fp16 at GradScaler's first scale (2^16): the scale halves until they are
    finite, and the unscaled gradients match fp32's to fp16 rounding. Without the back-off they are inf."""
    from actbench.studies.gradients import LossScale, _grads

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    with torch.no_grad():
        model[2].weight.mul_(200)  # input gradients of the last layer ~ 2^16 / batch * 200: past 65504
    x, y = torch.randn(8, 16), torch.arange(8) % 4
    scale = LossScale("fp16")
    got = _grads(model, x, y, "fp16", scale)
    ref = _grads(model, x, y)
    assert scale.value < 2.0**16
    for k in ref:
        assert torch.isfinite(got[k]).all(), k
        torch.testing.assert_close(got[k], ref[k], rtol=2e-2, atol=2e-2 * float(ref[k].abs().max()), msg=k)


def test_cli_verify_grads_at_bf16_names_its_csv_and_table(backend, tmp_path):
    import actbench.cli  # noqa: F401  (registers the commands)
    from actbench.cli.app import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [
        "verify-grads", "resnet18", "--level", "L2", "--batch", "2", "--seeds", "2", "--image-size", "32",
        "--backend", backend, "--precision", "bf16", "--out", str(tmp_path),
    ])
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("resnet18-L2-bf16-b2-k2-*.csv")
    assert list(csv.DictReader(path.open()))[0]["parameter"] == "conv1.weight"
    assert "at L2 bf16: compressed vs uncompressed bf16 gradients" in " ".join(result.output.split())
    bad = CliRunner().invoke(app, ["verify-grads", "resnet18", "--precision", "fp8", "--out", str(tmp_path / "v")])
    assert bad.exit_code == 2 and "'fp8' is not one of 'fp32', 'bf16', 'fp16'" in bad.stderr
    assert not (tmp_path / "v").exists()


def test_running_statistics_match_the_stacked_formula_and_call_rounding_exact():
    """Welford over draws gives the stacked mean/variance; a gradient that never varies is exact (z 0)
    within float rounding of fp32's, and infinitely biased beyond it (it was inf for 1e-7 of rounding)."""
    from actbench.studies.gradients import EXACT_RELATIVE

    torch.manual_seed(1)
    g = {"w": torch.randn(500, dtype=torch.float64), "b": torch.randn(7, dtype=torch.float64)}
    draws = [{n: t + 0.3 * torch.randn_like(t) for n, t in g.items()} for _ in range(6)]
    rows = {r.parameter: r for r in grad_statistics(g, draws)}
    for name, ref in g.items():
        stack = torch.stack([d[name] for d in draws])
        std = float((stack - stack.mean(0)).pow(2).sum().div(5).sqrt())
        assert rows[name].rel_std == pytest.approx(std / float(ref.norm()), rel=1e-9)
        assert rows[name].rel_bias == pytest.approx(float((stack.mean(0) - ref).norm() / ref.norm()), rel=1e-9)
    rounding = [{"w": g["w"] * (1 + 0.1 * EXACT_RELATIVE)}] * 3
    (exact,) = grad_statistics({"w": g["w"]}, rounding)
    assert exact.rel_std == 0 and exact.bias_z == 0
    (biased,) = grad_statistics({"w": g["w"]}, [{"w": g["w"] * (1 + 10 * EXACT_RELATIVE)}] * 3)
    assert biased.bias_z == float("inf")


def test_a_parameter_without_a_compressed_gradient_is_an_error():
    from actbench.studies.gradients import RunningGrads

    running = RunningGrads({"a": torch.zeros(3), "b": torch.zeros(3)})
    with pytest.raises(ValueError, match="no gradient for 1 parameter.*first b"):
        running.add({"a": torch.ones(3)})


def test_stochastic_depth_is_off_and_a_zero_head_gets_weights():
    """ViT's zero-initialised head would give every other layer a zero gradient (rel_bias NaN before);
    stochastic depth in training mode would draw other masks in each model than in the reference."""
    from torchvision.models import VisionTransformer
    from torchvision.ops import StochasticDepth

    from actbench.studies.gradients import _eval_dropout, _init_zero_weights

    vit = VisionTransformer(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=8,
                            num_classes=3)
    assert _init_zero_weights(vit, 0) == ["heads.head.weight"] and vit.heads.head.weight.abs().max() > 0
    assert not vit.class_token.any()  # a zero input, not a weight: gradients still flow, left as built
    model = nn.Sequential(nn.Linear(4, 4), StochasticDepth(0.5, "row"), nn.Dropout(0.2)).train()
    _eval_dropout(model)
    assert [m.training for m in model] == [True, False, False]
