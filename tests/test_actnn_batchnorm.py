"""ActNN BatchNorm: its forward's memory peak, and torch's input checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from actbench.actnn import convert, level_config
from actbench.measure.tracker import LiveStorageTracker

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


def _forward_peak(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of storages alive at the forward's peak, beyond the input and the model's state."""
    tracker = LiveStorageTracker()
    tracker.adopt([x, *model.parameters(), *model.buffers()])
    with tracker:
        tracker.reset_peak()
        before = tracker.live_bytes
        out = model(x)
    assert out.shape == x.shape
    return tracker.peak_bytes - before


@pytest.mark.parametrize("level", ["L0", "L2", "L3", "L4"])
def test_batchnorm_forward_peak_is_output_plus_one_temporary(backend, level):
    """Before: x - mean and then x_norm were two full-size fp32 temporaries next to the output (on
    meta that spike, not the stored activations, set L2-L5's predicted maximum batch). Now the
    normalised input is built in one buffer: the peak is the output, one temporary, and the
    packed state (at most 4 bits a value here, plus per-group min/max and metadata)."""
    torch.manual_seed(0)
    model = convert(nn.Sequential(nn.BatchNorm2d(64)), level_config(level, backend=backend)).model.train()
    x = torch.randn(8, 64, 32, 32, requires_grad=True)  # 2 MiB: the small tensors are noise beside it
    size = x.numel() * x.element_size()
    peak = _forward_peak(model, x)
    packed_allowance = size // 4  # 4-bit codes are size / 8; metadata and min/max well under that
    print(f"{level}: BatchNorm forward peak {peak / size:.3f} x input")
    assert peak <= 2 * size + packed_allowance, (peak / size, level)


def test_batchnorm_saves_the_same_normalised_input():
    """The stored x_n = (x - mean) * invstd is unchanged by building it in place (L1 keeps it raw;
    at L0 torch's own batch norm runs, test_actnn_layers.py)."""
    torch.manual_seed(0)
    model = convert(nn.Sequential(nn.BatchNorm2d(6)), level_config("L1")).model.train()
    x = (torch.randn(4, 6, 5, 5) * 3 + 1).requires_grad_()
    out = model(x)
    mean = x.detach().mean((0, 2, 3), keepdim=True)
    var = x.detach().var((0, 2, 3), unbiased=False, keepdim=True)
    expected = (x.detach() - mean) / torch.sqrt(var + model[0].eps)
    assert type(out.grad_fn).__name__ == "BatchNormFunctionBackward"
    (x_norm,) = [t for t in out.grad_fn.saved_tensors if t.shape == x.shape]
    torch.testing.assert_close(x_norm, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 4), (1, 4, 1), (1, 4, 1, 1)])
def test_batchnorm_rejects_one_value_per_channel_like_torch(backend, shape):
    """Batch statistics of one value per channel have zero variance: torch raises, ActNN did not."""
    torch_bn = (nn.BatchNorm1d if len(shape) <= 3 else nn.BatchNorm2d)(4).train()
    x = torch.randn(*shape, requires_grad=True)
    with pytest.raises(ValueError) as expected:
        torch_bn(x)
    model = convert(nn.Sequential(torch_bn), level_config("L3", backend=backend)).model.train()
    with pytest.raises(ValueError) as got:
        model(x)
    assert "Expected more than 1 value per channel when training" in str(got.value)
    assert str(got.value) == str(expected.value)


def test_batchnorm_one_value_per_channel_is_fine_in_eval(backend):
    """Eval uses the running statistics, as in torch: a single sample is allowed there."""
    model = convert(nn.Sequential(nn.BatchNorm1d(4)), level_config("L3", backend=backend)).model.eval()
    x = torch.randn(1, 4, requires_grad=True)
    torch.testing.assert_close(model(x), nn.BatchNorm1d(4).eval()(x))
