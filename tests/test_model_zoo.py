"""Every torchvision classifier on the meta device, and ActNN across families.

Constructors that read data (``trunc_normal_``'s rejection sampling in ViT, Swin, ConvNeXt, MaxViT
and GoogLeNet; RegNet's widths computed with ``.tolist()``) used to end meta points with
``DataDependentOutputException``; meta now builds outside fake mode with parameters on the
``meta`` device and turns them into fake tensors (``actbench.measure.meta._build_fake_model``).
The fast test covers one model per family at a small size; the slow one every model.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from actbench.core import compat
from actbench.measure.meta import MetaSessions
from actbench.planning.point import Point
from actbench.training.model_names import list_model_names
from actbench.training.models import FAMILY_REPRESENTATIVES, build_model, model_family
from actbench.schema import LEVEL_NAMES, MIN_IMAGE_SIZE, InputSize, ModelSpec, PointConfig
from actbench.training.tasks.classification import size_problem

#: The smallest input each model accepts in training where 32 px is too small.
SMALL_SIZE = {"maxvit_t": 224, "inception_v3": 299, "vit_h_14": 28, "alexnet": 64}


def small_size(name: str) -> int:
    return SMALL_SIZE.get(name, 32)


def meta_point(name: str, strategy: str, batch: int = 2, size: int | None = None) -> Point:
    return Point.resolve(PointConfig(ModelSpec(name), strategy, batch, size or small_size(name), "meta",
                                     warmup_steps=1, timed_steps=0))


def test_family_representatives_cover_every_family():
    families = {model_family(n) for n in list_model_names()}
    assert sorted(model_family(n) for n in FAMILY_REPRESENTATIVES) == sorted(families)


def test_meta_build_keeps_the_storages_of_a_fake_build():
    """Same parameter and buffer shapes, strides and dtypes as a model built inside fake mode."""
    from actbench.measure.meta import META_FAKE_DEVICE, _build_fake_model

    point = meta_point("resnet18", "fp32")
    mode = compat.fake_tensor_mode()
    with mode, META_FAKE_DEVICE:
        old = build_model(point.model, point.image_size)
    new = _build_fake_model(point, compat.fake_tensor_mode())

    def layout(model):
        return [(n, t.shape, t.stride(), t.dtype, t.requires_grad, compat.is_fake(t), t.device.type)
                for n, t in list(model.named_parameters()) + list(model.named_buffers())]

    assert layout(new) == layout(old)
    assert all(isinstance(p, torch.nn.Parameter) or compat.is_fake(p) for p in new.parameters())


@pytest.mark.parametrize("name", FAMILY_REPRESENTATIVES)
def test_every_family_trains_on_fake_tensors(name):
    """The meta build of one model per family, then a training forward and backward on fake tensors."""
    from actbench.measure.meta import META_FAKE_DEVICE, _build_fake_model

    mode = compat.fake_tensor_mode()
    model = _build_fake_model(meta_point(name, "fp32"), mode)
    size = small_size(name)
    with mode, META_FAKE_DEVICE:
        out = model(torch.randn(2, 3, size, size))
        logits = out if isinstance(out, torch.Tensor) else out[0]
        logits.sum().backward()
        assert logits.shape == (2, 1000) and compat.is_fake(logits)
        assert next(model.parameters()).grad is not None  # the stem (aux heads are not in this loss)


@pytest.mark.parametrize("name", ["vit_b_16", "convnext_tiny", "regnet_y_800mf"])
def test_models_that_failed_on_meta_measure_fp32_and_l3(name):
    sessions = MetaSessions()
    rows = {s: sessions.measure_point(meta_point(name, s)) for s in ("fp32", "L3")}
    for strategy, row in rows.items():
        assert row.status == "ok", (strategy, row.message)
        assert row.activation_bytes > 0 and row.peak_alloc_bytes > row.model_bytes > 0
    assert rows["L3"].activation_bytes < rows["fp32"].activation_bytes


def _meta_points_ok(name: str, strategies: tuple[str, ...], size: int | None = None) -> None:
    sessions = MetaSessions()
    for strategy in strategies:
        row = sessions.measure_point(meta_point(name, strategy, size=size))
        assert row.status == "ok", (name, strategy, row.message)
        assert row.activation_bytes > 0 and row.peak_alloc_bytes > row.model_bytes > 0


def smallest_side(name: str) -> int:
    """The smallest side ``name``'s task accepts (classification.MIN_SIDES, ViT's patch, MaxViT's partitions)."""
    return next(side for side in range(MIN_IMAGE_SIZE, 1024) if size_problem(name, InputSize(side, side)) is None)


@pytest.mark.heavy  # 80 models on fake tensors, 22 of them at every level: many minutes on 2 cores
@pytest.mark.parametrize("name", list_model_names())
def test_every_model_runs_on_meta_at_its_smallest_side(name):
    """Every model in `actbench models` at the smallest side its task accepts: fp32 and L3 (the build is
    what used to fail), and every level for a family's representative. That each trains there is the
    other half of the size rules (tests/test_model_input_sizes.py checks that none trains a pixel below)."""
    levels = LEVEL_NAMES if name in FAMILY_REPRESENTATIVES else ("L3",)
    _meta_points_ok(name, ("fp32", *levels), smallest_side(name))


# --- ActNN on every family -----------------------------------------------------

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


def _no_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Dropout and stochastic depth off: fp32 and ActNN draw their random masks differently."""
    from torchvision.ops import StochasticDepth

    for m in model.modules():
        if isinstance(m, (torch.nn.Dropout, StochasticDepth)):
            m.p = 0.0
    return model


def _logits(out):
    return out if isinstance(out, torch.Tensor) else out[0]


def _step_grads(model, x, y):
    import torch.nn.functional as F

    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    out = _logits(model(x))
    F.cross_entropy(out, y).backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


#: Run in the heavy set (CI runs it; a laptop's default run leaves it out): large inputs (MaxViT 224 px,
#: Inception 299 px) or big members of families whose layers the default run already covers (ResNet-18
#: at L0 is in test_actnn_layers). VGG-16 alone takes 6 GB: the model, its converted copy and both
#: sets of gradients.
_HEAVY_L0 = ("maxvit_t", "inception_v3", "vgg16", "wide_resnet50_2", "resnext50_32x4d", "resnet50",
            "efficientnet_v2_s", "densenet121")
#: GB held at most (tests/conftest.py: parallel workers keep the sum within a budget): VGG-16's 6 among
#: the heavy ones; the default run's largest, measured (the rest stay under the unmarked default)
_L0_GB = {"vgg16": 6.0, "wide_resnet50_2": 2.5, "maxvit_t": 2.3, "vit_b_16": 2.9, "alexnet": 2.9, "swin_t": 2.2,
          "swin_v2_t": 2.0}
#: At 32 px these end in 1x1 maps, where BatchNorm over 2 values makes fp32's own gradients chaotic
#: (scales of 1e6-1e9): 64 px keeps every family's gradients well conditioned.
_L0_SIZE = {"mobilenet_v2": 64, "mobilenet_v3_large": 64, "efficientnet_b0": 64, "efficientnet_v2_s": 64,
            "mnasnet1_0": 64, "shufflenet_v2_x1_0": 64, "densenet121": 64}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[*([pytest.mark.heavy] if n in _HEAVY_L0 else []),
                                                          *([pytest.mark.memory_gb(_L0_GB[n])] if n in _L0_GB else [])])
                                  for n in FAMILY_REPRESENTATIVES])
def test_l0_gives_fp32_outputs_and_gradients_on_every_family(backend, name):
    """L0 keeps everything exact (full precision, lossless masks and argmax; the hook path packs nothing):
    the same outputs and gradients as the unconverted model, up to float summation order.

    Tolerance: test_actnn_layers' (1e-4 relative + 1e-5 of the tensor's largest value), plus 1e-6 of
    the model's largest gradient: some gradients are zero analytically (a BatchNorm bias before
    another BatchNorm) and hold only rounding noise of the model's scale, which no per-tensor bound fits.
    """
    import copy

    from actbench.actnn import convert, level_config

    size = _L0_SIZE.get(name, small_size(name))
    torch.manual_seed(0)
    model = _no_dropout(build_model(ModelSpec(name, num_classes=10), size))
    x, y = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(2)), torch.tensor([3, 7])
    ref_out, ref = _step_grads(copy.deepcopy(model), x, y)
    conv = convert(model, level_config("L0", backend=backend))
    out, got = _step_grads(conv.model, x, y)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5 * float(ref_out.abs().max()) + 1e-7)
    assert got.keys() == ref.keys()
    scale = max(float(g.abs().max()) for g in ref.values())
    for k in ref:
        atol = 1e-5 * float(ref[k].abs().max()) + 1e-6 * scale + 1e-7
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=atol, msg=lambda m: f"{name} {k}: {m}")


def test_meta_memory_row_says_what_stays_uncompressed():
    """An ActNN row's note gives the share of saved bytes left uncompressed, by category and owner."""
    sessions = MetaSessions()
    row = sessions.measure_point(meta_point("mobilenet_v3_large", "L3", size=64))
    assert row.status == "ok", row.message
    note = row.strategy_note
    assert note.startswith("ActNN L3:") and "uncompressed " in note and "% of " in note and "MiB saved" in note, note
    fp32 = sessions.measure_point(meta_point("mobilenet_v3_large", "fp32", size=64))
    assert "uncompressed" not in (fp32.strategy_note or "")


def test_cpu_memory_row_carries_the_census_meta_predicts():
    """A measured (cpu) ActNN row's note says what its memory step left uncompressed: the census of
    the meta prediction, word for word but for the shares. The same forward saves the same tensors on
    both devices; only L3's allocation differs (meta has no statistics and splits each target evenly,
    docs/design.md §4), which moves the compressed total and so each share by a little."""
    import re

    from actbench.measure.point import measure_point

    point = meta_point("mobilenet_v3_large", "L3", size=64)
    cpu = measure_point(Point.resolve(dataclasses.replace(point.config, device="cpu")))
    meta = MetaSessions().measure_point(point)
    assert cpu.status == "ok", cpu.message
    assert "uncompressed " in cpu.strategy_note and "% of " in cpu.strategy_note, cpu.strategy_note
    share = re.compile(r"\d+\.\d%")
    assert share.sub("x%", cpu.strategy_note) == share.sub("x%", meta.strategy_note)
    for a, b in zip(share.findall(cpu.strategy_note), share.findall(meta.strategy_note), strict=True):
        assert abs(float(a[:-1]) - float(b[:-1])) <= 0.15, (cpu.strategy_note, meta.strategy_note)  # one rounding step
    assert abs(cpu.activation_bytes - meta.activation_bytes) <= 0.005 * meta.activation_bytes


def test_meta_warm_up_gives_no_momentum_to_parameters_outside_the_loss():
    """GoogLeNet's auxiliary heads are not in the loss: a real warm-up leaves them without momentum
    (meta's peak was 24% above cpu's before); every parameter of ResNet-18 gets momentum."""
    sessions = MetaSessions()
    row = sessions.measure_point(meta_point("googlenet", "fp32"))
    assert row.status == "ok" and 0 < row.optimizer_state_bytes < 0.7 * row.param_bytes, row
    row = MetaSessions().measure_point(meta_point("resnet18", "fp32"))
    assert row.optimizer_state_bytes == row.param_bytes
