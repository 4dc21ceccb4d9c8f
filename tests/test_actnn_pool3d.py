"""MaxPool3d keeps an int8 offset inside each window instead of its input and int64 indices.

The offsets are exact (a lossless re-encoding of aten's indices), so output and input gradient must
equal torch's bit for bit, at every level; what the pool saves is one byte per output.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from actbench.actnn import convert, level_config, saved_tensor_census
from actbench.actnn.layers import ActNNModule

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


class Clip(nn.Module):
    """A video stem: conv, then a 3-D max pool (S3D's pools: (1,3,3)/(1,2,2) and 3³ with padding)."""

    def __init__(self, pool: nn.MaxPool3d) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 4, 1)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.conv(x))


POOLS = [
    dict(kernel_size=(1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
    dict(kernel_size=3, stride=1, padding=1),
    dict(kernel_size=(2, 2, 2), stride=2, ceil_mode=True),
    dict(kernel_size=(3, 2, 3), stride=(2, 1, 2), padding=(1, 0, 1), dilation=(1, 2, 1), ceil_mode=True),
]


@pytest.mark.parametrize("kwargs", POOLS, ids=lambda k: ",".join(f"{a}={v}" for a, v in k.items()))
def test_maxpool3d_matches_torch_bit_for_bit(backend, kwargs):
    """Output and input gradient of the L3 model's pool equal torch's (the offsets lose nothing)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 13, 11, generator=gen)
    plain = Clip(nn.MaxPool3d(**kwargs))
    conv = convert(Clip(nn.MaxPool3d(**kwargs)), level_config("L3", backend=backend))
    conv.model.load_state_dict(plain.state_dict())
    assert isinstance(conv.model.pool, ActNNModule)  # the twin runs, not torch's pool
    feats = []
    for model in (plain, conv.model):
        model.pool.register_forward_hook(lambda m, i, o: feats.append((i[0], o)))
    out_plain, out_l3 = plain(x), conv.model(x)
    assert torch.equal(out_plain, out_l3)
    grad = torch.randn(out_plain.shape, generator=gen)
    (g_plain,) = torch.autograd.grad(feats[0][1], feats[0][0], grad)
    (g_l3,) = torch.autograd.grad(feats[1][1], feats[1][0], grad)
    assert torch.equal(g_plain, g_l3)


def test_maxpool3d_saves_one_byte_per_output(backend):
    """At L0 (nothing quantized) the pool keeps int8 offsets only: no int64 indices, no input."""
    conv = convert(Clip(nn.MaxPool3d(3, stride=1, padding=1)), level_config("L0", backend=backend))
    x = torch.randn(2, 3, 4, 8, 8, requires_grad=True)
    census = saved_tensor_census(conv.model, x)
    pool = [g for g in census.groups if g.owner == "pool"]
    assert [(g.category, g.nbytes) for g in pool] == [("compressed", 2 * 4 * 4 * 8 * 8)], census.groups
    assert "integer or bool" not in census.bytes_by_category(), census.groups
