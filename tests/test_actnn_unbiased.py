"""Compressed gradients are unbiased: the mean over K seeds approaches the fp32 gradient like 1/sqrt(K).

Tolerance and why it is honest: for an unbiased estimator with per-draw error covariance Sigma,
E||mean_K - g||^2 = tr(Sigma)/K, so the error of the K=16 mean is about 1/4 of the RMS error of
one draw. Each layer's gradient has hundreds to thousands of entries, so these squared norms are
sums of many terms and concentrate; we demand a ratio below 0.5 (twice the expected 0.25), per layer.
A biased estimator (or one that reuses its noise) keeps its error as K grows and fails: the negative
control below replays the same rounding noise in every draw and must fail the same check. The one
place ActNN is not exactly unbiased is BatchNorm's backward (it is quadratic in the dequantized input),
a bias far below the noise at these sizes; the conv net with BatchNorm runs against the same bound.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from actbench.actnn import convert, level_config

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops

K = 16
RATIO_BOUND = 0.5


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 96), nn.ReLU(), nn.Linear(96, 10))


def _convnet():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, 10),
    )


def _weight_grads(model, x, y, seed):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    F.cross_entropy(model(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()
            if (n.endswith("weight") and p.dim() > 1) or n.endswith("layer_scale")}


def error_ratios(model, config, x, y, generator=None, reuse_noise=False, same_masks=False):
    """Per layer: ||mean of K draws - g_fp32|| / RMS_k ||draw_k - g_fp32||.

    ``same_masks``: every draw runs with the reference's global seed, so random masks (stochastic
    depth) are the reference's and only the quantizer's noise (from ``generator``) differs."""
    ref = _weight_grads(copy.deepcopy(model), x, y, seed=0)
    conv = convert(model, config, generator=generator)
    _weight_grads(conv.model, x, y, seed=12345)  # one warm-up step: L3 then runs its adaptive allocation
    draws = []
    for k in range(K):
        if reuse_noise:
            generator.manual_seed(7)
        draws.append(_weight_grads(conv.model, x, y, seed=0 if same_masks else 100 + k))
    ratios = {}
    for name, g in ref.items():
        stack = torch.stack([d[name] for d in draws])
        single = (stack - g).flatten(1).norm(dim=1).pow(2).mean().sqrt()
        ratios[name] = float((stack.mean(0) - g).norm() / single)
    return ratios


@pytest.mark.parametrize("level", ["L1", "L2", "L3"])
def test_mlp_gradient_mean_converges(backend, level):
    torch.manual_seed(1)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    ratios = error_ratios(_mlp(), level_config(level, backend=backend), x, y)
    assert all(r < RATIO_BOUND for r in ratios.values()), ratios


@pytest.mark.parametrize("level", ["L2", "L3"])
def test_convnet_with_batchnorm_gradient_mean_converges(backend, level):
    torch.manual_seed(2)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    ratios = error_ratios(_convnet(), level_config(level, backend=backend), x, y)
    assert all(r < RATIO_BOUND for r in ratios.values()), ratios


def test_negative_control_reused_noise_fails_the_check(backend):
    """Same noise in every draw: the mean does not improve, so the check must reject it."""
    torch.manual_seed(1)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    gen = torch.Generator().manual_seed(7)
    ratios = error_ratios(_mlp(), level_config("L2", backend=backend), x, y, generator=gen, reuse_noise=True)
    assert all(r > 0.9 for r in ratios.values()), ratios


# --- Twins of transformer and mobile layers, and the saved-tensor hook path ---
#
# What is exactly unbiased and what is not, so that the bounds below are honest:
# * linear in what is kept, hence unbiased: conv/linear/layer-scale inputs (weight gradients), the
#   derivative kept by GELU/SiLU/Sigmoid/Hardswish (grad * f'(x) with f'(x) quantized), masks
#   (lossless), and the hook path wherever the saving op is linear in the saved tensor (matmul, mul,
#   einsum);
# * second-order biased (like BatchNorm above): LayerNorm's backward (quadratic in x_n), softmax's
#   (y * (g - <g, y>)), attention recomputed from quantized Q and K, and a nonlinear functional op
#   whose input the hook path packs. Their bias is O(quantization variance), far below one draw's
#   noise at these sizes; the same 0.5 bound applies, and the negative control shows it can fail.


class _Block(nn.Module):
    """A pre-norm transformer block with a classifier: LayerNorm, self-attention, GELU MLP (ViT's)."""

    def __init__(self, dim=64, heads=4, tokens=16):
        super().__init__()
        self.embed = nn.Linear(12, dim)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim * tokens, 10)

    def forward(self, x):
        h = self.embed(x)
        a = self.ln1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.mlp(self.ln2(h))
        return self.head(h.flatten(1))


class _MobileBlock(nn.Module):
    """Conv, BN, SiLU/Hardswish, squeeze-excitation with Sigmoid/Hardsigmoid (MobileNetV3, EfficientNet)."""

    def __init__(self, hard: bool):
        super().__init__()
        act, gate = (nn.Hardswish, nn.Hardsigmoid) if hard else (nn.SiLU, nn.Sigmoid)
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), act())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(16, 4, 1), act(), nn.Conv2d(4, 16, 1), gate())
        self.head = nn.Sequential(nn.Conv2d(16, 8, 1), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))

    def forward(self, x):
        h = self.stem(x)
        return self.head(h * self.se(h))


class _ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: depthwise conv, channels-last LayerNorm, GELU MLP, layer scale; LayerNorm2d."""

    def __init__(self):
        super().__init__()
        from torchvision.models.convnext import CNBlock, LayerNorm2d

        self.stem = nn.Sequential(nn.Conv2d(3, 16, 2, stride=2), LayerNorm2d(16))
        self.block = CNBlock(16, layer_scale=0.5, stochastic_depth_prob=0.0)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 4 * 4, 10))

    def forward(self, x):
        return self.head(self.block(self.stem(x)))


class _Functional(nn.Module):
    """Only the hook path and functional rerouting see these: F.gelu, x * torch.sigmoid(x), einsum, softmax."""

    def __init__(self):
        super().__init__()
        self.in_weight = nn.Parameter(torch.randn(48, 64) / 8)
        self.out_weight = nn.Parameter(torch.randn(64, 10) / 8)

    def forward(self, x):
        h = torch.einsum("ni,ij->nj", x, self.in_weight)
        h = F.gelu(h) + h * torch.sigmoid(h)
        attn = F.softmax(h @ h.t() / 8, dim=-1)
        return (attn @ h) @ self.out_weight


def _tokens(n=16, tokens=16):
    torch.manual_seed(3)
    return torch.randn(n, tokens, 12), torch.randint(0, 10, (n,))


@pytest.mark.parametrize("level", ["L2", "L3"])
def test_transformer_block_gradient_mean_converges(backend, level):
    torch.manual_seed(0)
    x, y = _tokens()
    ratios = error_ratios(_Block(), level_config(level, backend=backend), x, y)
    assert all(r < RATIO_BOUND for r in ratios.values()), ratios


@pytest.mark.parametrize("hard", [False, True])
def test_mobile_block_with_squeeze_excitation_gradient_mean_converges(backend, hard):
    torch.manual_seed(0)
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))
    ratios = error_ratios(_MobileBlock(hard), level_config("L3", backend=backend), x, y)
    assert all(r < RATIO_BOUND for r in ratios.values()), ratios


def test_convnext_block_gradient_mean_converges(backend):
    torch.manual_seed(0)
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))
    ratios = error_ratios(_ConvNeXtBlock(), level_config("L3", backend=backend), x, y)
    assert all(r < RATIO_BOUND for r in ratios.values()), ratios


def test_hook_path_gradient_mean_converges(backend):
    torch.manual_seed(0)
    x, y = torch.randn(64, 48), torch.randint(0, 10, (64,))
    model = _Functional()
    ratios = error_ratios(model, level_config("L3", backend=backend, hook_min_elements=256), x, y)
    assert all(r < RATIO_BOUND for r in ratios.values()), ratios


def test_negative_control_reused_noise_fails_on_the_new_paths(backend):
    """The transformer block and the hook path with the same noise in every draw must fail the check."""
    torch.manual_seed(0)
    x, y = _tokens()
    gen = torch.Generator().manual_seed(7)
    ratios = error_ratios(_Block(), level_config("L3", backend=backend), x, y, generator=gen, reuse_noise=True)
    assert all(r > 0.9 for r in ratios.values()), ratios
    torch.manual_seed(0)
    x, y = torch.randn(64, 48), torch.randint(0, 10, (64,))
    gen = torch.Generator().manual_seed(7)
    ratios = error_ratios(_Functional(), level_config("L3", backend=backend, hook_min_elements=256), x, y,
                          generator=gen, reuse_noise=True)
    assert all(r > 0.9 for r in ratios.values()), ratios


# --- Twins and rerouted calls the blocks above do not reach: Tanh, Softmax, F.silu, F.hardswish,
# StochasticDepth, and F.scaled_dot_product_attention (torch's fused attention through the hook path).


class _TanhSoftmax(nn.Module):
    """nn.Tanh (derivative kept), nn.Softmax (output kept), F.silu and F.hardswish (rerouted to the
    derivative twin), and a hook-packed matmul between them."""

    def __init__(self, dim=32, tokens=16):
        super().__init__()
        self.embed, self.q, self.k = nn.Linear(12, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.tanh, self.softmax = nn.Tanh(), nn.Softmax(dim=-1)
        self.head = nn.Linear(dim * tokens, 10)
        self.scale = dim ** -0.5

    def forward(self, x):
        h = self.tanh(self.embed(x))
        h = F.silu(h) + F.hardswish(2 * h)
        a = self.softmax(self.q(h) @ self.k(h).transpose(1, 2) * self.scale)
        return self.head((a @ h).flatten(1))


class _StochasticDepth(nn.Module):
    """torchvision's StochasticDepth (a 1-bit keep mask) on a residual branch, row and batch mode."""

    def __init__(self):
        super().__init__()
        from torchvision.ops import StochasticDepth

        self.embed, self.branch = nn.Linear(48, 64), nn.Sequential(nn.Linear(64, 64), nn.GELU())
        self.row, self.batch = StochasticDepth(0.5, "row"), StochasticDepth(0.3, "batch")
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        h = self.embed(x)
        h = h + self.row(self.branch(h))
        return self.head(h + self.batch(self.branch(h)))


class _SDPA(nn.Module):
    """Multi-head self-attention written with F.scaled_dot_product_attention (no twin: the hook path
    keeps what torch's kernel saves)."""

    def __init__(self, dim=32, heads=4, tokens=16):
        super().__init__()
        self.embed, self.qkv, self.out = nn.Linear(12, dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.heads = heads
        self.head = nn.Linear(dim * tokens, 10)

    def forward(self, x):
        h = self.embed(x)
        n, t, d = h.shape
        q, k, v = self.qkv(h).view(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, t, d)
        return self.head((h + self.out(a)).flatten(1))


def test_tanh_softmax_and_rerouted_silu_hardswish_gradient_mean_converges(backend):
    torch.manual_seed(0)
    x, y = _tokens()
    ratios = error_ratios(_TanhSoftmax(), level_config("L3", backend=backend, hook_min_elements=256), x, y)
    assert all(r < RATIO_BOUND for r in ratios.values()), ratios


def test_stochastic_depth_mask_is_lossless_and_the_rest_unbiased(backend):
    """At L0 the twin's gradient is torchvision's exactly for the same global seed: the same keep mask,
    kept losslessly (another draw or a lossy mask fails there). At L3, with those masks, only rounding
    noise is left and the mean converges."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 48), torch.randint(0, 10, (32,))
    gen = torch.Generator().manual_seed(5)
    ratios = error_ratios(_StochasticDepth(), level_config("L3", backend=backend), x, y, generator=gen,
                          same_masks=True)
    assert all(r < RATIO_BOUND for r in ratios.values()), ratios
    ref = _weight_grads(_StochasticDepth(), x, y, seed=0)  # masks alone (L0): fp32's gradient, exactly
    got = _weight_grads(convert(_StochasticDepth(), level_config("L0", backend=backend)).model, x, y, seed=0)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-6, atol=1e-7, msg=name)


def test_scaled_dot_product_attention_through_the_hook_path_gradient_mean_converges(backend):
    torch.manual_seed(0)
    x, y = _tokens()
    ratios = error_ratios(_SDPA(), level_config("L3", backend=backend, hook_min_elements=256), x, y)
    assert all(r < RATIO_BOUND for r in ratios.values()), ratios


class _CosineAttention(nn.Module):
    """Swin V2's cosine attention: F.normalize on q and k (rerouted: output and per-row denominator
    kept), with padded tokens whose keys are exactly 0 (their norm is clamped to eps)."""

    def __init__(self, dim=32, tokens=16, padded=4):
        super().__init__()
        self.embed, self.q, self.v = nn.Linear(12, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim, bias=False)  # Swin V2 zeroes the key bias
        self.head = nn.Linear(dim * tokens, 10)
        self.padded = padded

    def forward(self, x):
        h = self.embed(x)
        h = torch.cat([h[:, :-self.padded], torch.zeros_like(h[:, -self.padded:])], 1)  # window padding
        attn = F.normalize(self.q(h), dim=-1) @ F.normalize(self.k(h), dim=-1).transpose(1, 2)
        return self.head((torch.softmax(attn * 10, -1) @ self.v(h)).flatten(1))


def test_normalize_with_zero_rows_gradient_mean_converges(backend):
    """Through the plain hook path the quantized keys over their clamped norm (1e-12) gave NaN."""
    torch.manual_seed(0)
    x, y = _tokens()
    ratios = error_ratios(_CosineAttention(), level_config("L3", backend=backend, hook_min_elements=256), x, y)
    assert all(r < RATIO_BOUND for r in ratios.values()), ratios


class _GatedCell(nn.Module):
    """A GRU-style update written with functions (RAFT's ConvGRU): torch.tanh and torch.sigmoid."""

    def __init__(self, dim=32, tokens=16):
        super().__init__()
        self.embed, self.z, self.q = nn.Linear(12, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.head = nn.Linear(dim * tokens, 10)

    def forward(self, x):
        h = self.embed(x)
        z = torch.sigmoid(self.z(h))
        h = (1 - z) * h + z * torch.tanh(self.q(h))
        return self.head(h.flatten(1))


def test_functional_tanh_keeps_its_derivative_and_the_gradient_mean_converges(backend):
    """torch.tanh is rerouted to the derivative twin (1 - tanh² at 2 bits, linear in backward) instead of
    the hook path's 2-bit output, which tanh's backward squares (biased)."""
    torch.manual_seed(0)
    x, y = _tokens()
    config = level_config("L3", backend=backend, hook_min_elements=256)
    conv = convert(_GatedCell(), config)
    F.cross_entropy(conv.model(x), y).backward()
    names = [layer.name for layer in conv.controller.layers]
    assert any(":tanh:" in n for n in names) and any(":sigmoid:" in n for n in names), names
    ratios = error_ratios(_GatedCell(), config, x, y)
    assert all(r < RATIO_BOUND for r in ratios.values()), ratios
