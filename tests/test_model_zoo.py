"""Every torchvision classifier on the meta device (issue 13, item 1), and ActNN across families.

Constructors that read data (``trunc_normal_``'s rejection sampling in ViT, Swin, ConvNeXt, MaxViT
and GoogLeNet; RegNet's widths computed with ``.tolist()``) used to end meta points with
``DataDependentOutputException``; meta now builds outside fake mode with parameters on the
``meta`` device and turns them into fake tensors (``actbench.measure.meta._build_fake_model``).
The fast test covers one model per family at a small size; the slow one every model.
"""

from __future__ import annotations

import pytest
import torch

from actbench import compat
from actbench.measure.meta import MetaSessions
from actbench.models import FAMILY_REPRESENTATIVES, build_model, list_model_names, model_family
from actbench.schema import LEVEL_NAMES, ModelSpec, PointConfig

#: The smallest input each model accepts in training where 32 px is too small.
SMALL_SIZE = {"maxvit_t": 224, "inception_v3": 299, "vit_h_14": 28, "alexnet": 64}


def small_size(name: str) -> int:
    return SMALL_SIZE.get(name, 32)


def meta_point(name: str, strategy: str, batch: int = 2, size: int | None = None) -> PointConfig:
    return PointConfig(ModelSpec(name), strategy, batch, size or small_size(name), "meta", warmup_steps=1,
                       timed_steps=0)


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


def _meta_points_ok(name: str, strategies: tuple[str, ...]) -> None:
    sessions = MetaSessions()
    for strategy in strategies:
        row = sessions.measure_point(meta_point(name, strategy))
        assert row.status == "ok", (name, strategy, row.message)
        assert row.activation_bytes > 0 and row.peak_alloc_bytes > row.model_bytes > 0


@pytest.mark.heavy  # every torchvision classifier: many minutes on 2 cores (CI runs it with -m heavy)
@pytest.mark.slow
@pytest.mark.parametrize("name", list_model_names())
def test_every_model_runs_on_meta(name):
    """Every model in `actbench models`, fp32 and L3 (the build is what used to fail)."""
    _meta_points_ok(name, ("fp32", "L3"))


@pytest.mark.heavy  # every family at every level: many minutes on 2 cores (CI runs it with -m heavy)
@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILY_REPRESENTATIVES)
def test_every_family_runs_on_meta_at_every_level(name):
    _meta_points_ok(name, ("fp32", *LEVEL_NAMES))
