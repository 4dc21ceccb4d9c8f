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
    return {n: p.grad.clone() for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1}


def error_ratios(model, config, x, y, generator=None, reuse_noise=False):
    """Per layer: ||mean of K draws - g_fp32|| / RMS_k ||draw_k - g_fp32||."""
    ref = _weight_grads(copy.deepcopy(model), x, y, seed=0)
    conv = convert(model, config, generator=generator)
    _weight_grads(conv.model, x, y, seed=12345)  # one warm-up step: L3 then runs its adaptive allocation
    draws = []
    for k in range(K):
        if reuse_noise:
            generator.manual_seed(7)
        draws.append(_weight_grads(conv.model, x, y, seed=100 + k))
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
