"""Saved tensors whose treatment follows from the op argument they were passed as.

Positions (roi boxes, sampling grids) are never quantized: backward reads them as coordinates. A
quantized box moves by pixels and a quantized batch index points past the batch, so the gradient
lands in the wrong place (or out of bounds) instead of carrying zero-mean noise. The input
gradients checked below depend only on the positions and on exact parameters, so with positions
kept exact L3 reproduces the unconverted model's gradient bit for bit; any rounding of a position
changes it. Functional attention's queries and keys are packed at ``qk_bits``, as the twin's are.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import roi_align

from actbench.actnn import convert, level_config, saved_tensor_census
from actbench.actnn.hooks import SKIP_POSITION, packer_of
from actbench.actnn.saved_arguments import PROTECTED_POSITIONS, argument_roles
from actbench.core.compat import torch_callables

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops

ROOT = Path(__file__).resolve().parents[1]
POSITIONS = "positions: kept exact"


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


class RoiHead(nn.Module):
    """A feature map scaled by a parameter, pooled over boxes, weighted by a fixed buffer."""

    def __init__(self, rois: int, channels: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.register_buffer("w", torch.randn(rois, channels, 7, 7, generator=torch.Generator().manual_seed(1)))

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        out = roi_align(x * self.scale, rois, 7, spatial_scale=0.5, sampling_ratio=2, aligned=True)
        return (out * self.w).sum()


class GridHead(nn.Module):
    """A feature map scaled by a parameter, sampled at ``exp(-|g|)`` (exp also saves the grid, its output;
    tanh would not do: it is rerouted to the derivative twin, which keeps 1 - tanh² instead)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.register_buffer("w", torch.randn(shape, generator=torch.Generator().manual_seed(1)))

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        out = F.grid_sample(x * self.scale, torch.exp(-g.abs()), align_corners=False)
        return (out * self.w).sum()


def _rois(k: int, size: float, batch: int) -> torch.Tensor:
    """``k`` boxes (batch index, x1, y1, x2, y2) inside a ``size`` px image: k*5 values above the hook floor."""
    gen = torch.Generator().manual_seed(0)
    corner = torch.rand(k, 2, generator=gen) * size / 2
    extent = 4 + torch.rand(k, 2, generator=gen) * size / 2
    index = torch.randint(0, batch, (k, 1), generator=gen).float()
    return torch.cat([index, corner, corner + extent], 1)


def _input_grad(model: nn.Module, x: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_()
    model(x, second).backward()
    return x.grad


def test_every_protected_op_resolves():
    """Each table entry names an op that exists (a misspelt one would protect nothing)."""
    for entry in PROTECTED_POSITIONS:
        assert torch_callables(entry.op), entry
    found = argument_roles()
    assert found[F.grid_sample] == ((1, "grid", "position"),)
    assert found[torch.ops.torchvision.roi_align] == ((1, "rois", "position"),)


def test_roi_align_rois_stay_exact_and_input_gradient_matches(backend):
    """L3 keeps roi_align's rois as they are: the feature map's gradient equals the unconverted one."""
    x = torch.randn(2, 4, 32, 32, generator=torch.Generator().manual_seed(2))
    rois = _rois(512, 64.0, 2)
    expected = _input_grad(RoiHead(512, 4), x, rois)
    conv = convert(RoiHead(512, 4), level_config("L3", backend=backend))
    seen = []
    packer_of(conv.model).observer = lambda t, packed, reason, owner: seen.append((t, packed, reason))
    got = _input_grad(conv.model, x, rois)
    assert torch.equal(got, expected), (got - expected).abs().max()
    kept = [(packed, reason) for t, packed, reason in seen if t is rois]
    assert kept == [(None, SKIP_POSITION)], [(tuple(t.shape), reason) for t, _, reason in seen]
    assert any(packed is not None for _, packed, _ in seen)  # the feature map itself is packed


def test_grid_sample_grid_stays_exact_and_input_gradient_matches(backend):
    """L3 keeps grid_sample's grid exact, even though exp saved (and packed) the same storage first."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 32, 32, generator=gen)
    g = torch.randn(2, 24, 24, 2, generator=gen, requires_grad=True)
    expected = _input_grad(GridHead((2, 4, 24, 24)), x, g)
    conv = convert(GridHead((2, 4, 24, 24)), level_config("L3", backend=backend))
    seen = []
    packer_of(conv.model).observer = lambda t, packed, reason, owner: seen.append((tuple(t.shape), packed, reason))
    got = _input_grad(conv.model, x, g)
    assert torch.equal(got, expected), (got - expected).abs().max()
    grids = [(packed is None, reason) for shape, packed, reason in seen if shape == (2, 24, 24, 2)]
    assert grids == [(False, None), (True, SKIP_POSITION)], grids  # exp's output packed, grid_sample's exact


def test_census_files_positions_apart(backend):
    """The census and the running census report rois and grids as positions, never as compressed."""
    rois = _rois(512, 64.0, 2)
    conv = convert(RoiHead(512, 4), level_config("L3", backend=backend))
    x = torch.randn(2, 4, 32, 32, requires_grad=True)
    census = saved_tensor_census(conv.model, (x, rois))
    by_category = census.bytes_by_category()
    assert by_category.get(POSITIONS) == rois.untyped_storage().nbytes(), by_category
    assert POSITIONS in census.uncompressed_by_category()
    assert POSITIONS in census.describe_uncompressed()
    conv.model(x, rois).backward()
    running = {category for (_, _, category) in packer_of(conv.model).saved}
    assert POSITIONS in running, running


_DETECTION_STEP = textwrap.dedent("""
    import torch, torchvision
    from actbench.actnn import convert, saved_tensor_census
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=5, min_size=128, max_size=128)
    model = convert(model, "L3").model.train()
    images = [torch.rand(3, 128, 128) for _ in range(2)]
    targets = [{"boxes": torch.tensor([[8., 8., 60., 70.], [50., 40., 120., 110.]]),
                "labels": torch.tensor([1, 3])} for _ in range(2)]
    loss = sum(model(images, targets).values())
    loss.backward()
    print("LOSS", float(loss))
    census = saved_tensor_census(model, (images, targets))
    print("POSITIONS", census.bytes_by_category().get("positions: kept exact", 0))
""")


@pytest.mark.heavy  # a ResNet-50 FPN detector step: about 30 s on 2 cores
def test_fasterrcnn_l3_step_is_finite():
    """A detector converted at L3 trains one step (a quantized batch index used to crash roi_align's
    backward): finite loss, and the census names its rois as positions. In a child, so a crash fails
    this test instead of ending the run."""
    done = subprocess.run([sys.executable, "-c", _DETECTION_STEP], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("LOSS", "POSITIONS")))
    assert torch.isfinite(torch.tensor(float(lines["LOSS"]))), done.stdout
    assert int(lines["POSITIONS"]) > 0, done.stdout


class FunctionalAttention(nn.Module):
    """Self-attention written with functions: q, k and v are views of one projection (timm's layout)."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, dim = x.shape
        qkv = self.qkv(x).reshape(n, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        return self.attend(q, k, v).sum()

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


def test_functional_attention_packs_query_and_key_at_qk_bits(backend):
    """F.scaled_dot_product_attention's query and key get ``qk_bits`` (4 at L3), as the attention twin
    gives them; its value, a view of the same projection, stays at the 2-bit target."""
    conv = convert(FunctionalAttention(), level_config("L3", backend=backend))
    seen = []
    packer_of(conv.model).observer = lambda t, packed, reason, owner: seen.append((t, packed))
    x = torch.randn(2, 64, 64, requires_grad=True)
    conv.model(x).backward()
    found = {}
    for t, packed in seen:
        if packed is not None and t.stride() == (64 * 192, 16, 192, 1):  # views of the projection
            found[t.storage_offset()] = (packed.slot.info.kind, packed.spec.bits)
    head = 64 // 4
    assert found == {0: ("qk", 4), head * 4: ("qk", 4), 2 * head * 4: ("hook", 2)}, found
    assert x.grad is not None and torch.isfinite(x.grad).all()


class EinsumAttention(FunctionalAttention):
    """The same attention with its products written as einsums (MaxViT's way)."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.einsum("b h i d, b h j d -> b h i j", q, k * q.shape[-1] ** -0.5)
        return torch.einsum("bhij,bhjd->bhid", F.softmax(scores, dim=-1), v)


def test_einsum_attention_packs_what_its_score_product_saves_at_qk_bits(backend):
    """What the score einsum saves (its query and key) is packed at ``qk_bits``; what the value einsum
    saves (the softmax output, the value) stays at the 2-bit target. Without the einsum entry both
    would be 2 bits (this test can fail)."""
    conv = convert(EinsumAttention(), level_config("L3", backend=backend))
    seen = []
    packer_of(conv.model).observer = lambda t, packed, reason, owner: seen.append(packed)
    x = torch.randn(2, 64, 64, requires_grad=True)
    conv.model(x).backward()
    kinds = sorted((p.slot.info.kind, p.spec.bits) for p in {id(p): p for p in seen if p is not None}.values())
    # query and key at 4 bits; the softmax output (its own saving, and the value einsum's view of it) and the
    # value at 2
    assert kinds == [("hook", 2)] * 3 + [("qk", 4)] * 2, kinds
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("equation, scores", [
    ("b h i d, b h j d -> b h i j", True), ("bhid,bhjd->bhij", True), ("BGHID,BGHJD->BGHIJ", True),
    ("bhij,bhjd->bhid", False), ("bid,bjd->bji", False), ("bythwc,hkc->bythwk", False), ("...id,...jd->...ij", False),
    ("bhid,bhjd,bhjd->bhij", False), ("bhid,bhjd", False),
])
def test_an_einsum_is_attentions_scores_only_in_its_one_form(equation, scores):
    from actbench.actnn.saved_arguments import is_score_equation
    assert is_score_equation(equation) is scores


def test_model_state_is_read_at_each_training_forward(backend):
    """What the hook path keeps exact as the model's state is read from each module's parameters and
    buffers when a training forward starts, so a buffer replaced between steps is still state, and
    a tensor made from it in the forward (not state) is packed."""

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.rand(4096) + 0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.fresh = self.scale + 0  # each mul keeps its other operand for x's gradient
            return x * self.scale * self.fresh

    model = convert(nn.Sequential(Scaled()), level_config("L3", backend=backend)).model.train()
    packer = packer_of(model)
    seen: list[tuple[int, str | None]] = []
    packer.observer = lambda t, packed, reason, owner: seen.append((t.data_ptr(), reason))
    x = torch.randn(2, 4096, requires_grad=True)
    for _ in range(2):
        seen.clear()
        model(x).sum().backward()
        reasons = dict(seen)
        assert reasons[model[0].scale.data_ptr()] == "model state"
        assert reasons[model[0].fresh.data_ptr()] is None  # packed
        model[0].scale = torch.rand(4096) + 0.5  # a new tensor in the same buffer
