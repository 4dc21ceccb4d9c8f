"""ActNN's conv and linear twins under autocast compute and keep what torch's layers would.

cpu autocast (which meta's fake tensors use too) lowers ``aten.conv2d`` and ``F.linear`` but not the
``aten.convolution`` the conv twin calls, so without an explicit cast the twin convolved and stored in
fp32 where torch's conv runs in bf16, and the linear twin kept its input in fp32 (docs/design.md §1).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from actbench.actnn import convert, level_config

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


CASES = [
    ("conv1d", lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1), (2, 3, 9)),
    ("conv2d", lambda: nn.Conv2d(3, 4, 3, padding=1), (2, 3, 7, 6)),
    ("conv2d_no_bias_groups", lambda: nn.Conv2d(4, 6, 3, groups=2, bias=False), (2, 4, 8, 8)),
    ("conv3d", lambda: nn.Conv3d(2, 3, 3, padding=1), (2, 2, 4, 5, 5)),
    ("convtranspose2d", lambda: nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1), (2, 3, 5, 5)),
    ("linear", lambda: nn.Linear(5, 7), (6, 5)),
    ("linear_3d_input", lambda: nn.Linear(5, 7), (3, 4, 5)),
]


def _step(module: nn.Module, x: torch.Tensor, dtype: torch.dtype):
    """Forward under cpu autocast at ``dtype``, a fixed linear loss, backward: (output, grads)."""
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=dtype):
        out = module(x * 1)
    (out.float() * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    grads = {n: p.grad for n, p in module.named_parameters()} | {"input": x.grad}
    return out, grads


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name,make,shape", CASES, ids=[c[0] for c in CASES])
def test_twin_under_cpu_autocast_computes_and_keeps_autocast_dtype(backend, name, make, shape, dtype):
    torch.manual_seed(0)
    plain = make().train()
    twin = convert(copy.deepcopy(plain), level_config("L0", backend=backend)).model
    x = torch.randn(shape)
    ref_out, ref = _step(plain, x, dtype)
    out, got = _step(twin, x, dtype)
    assert out.dtype == ref_out.dtype == dtype
    torch.testing.assert_close(out, ref_out, rtol=1e-2, atol=1e-2)
    for k in ref:
        assert got[k].dtype == ref[k].dtype == torch.float32, k  # autograd casts the grads back
        torch.testing.assert_close(got[k], ref[k], rtol=2e-2, atol=2e-2 * float(ref[k].abs().max()), msg=k)
    # L0 keeps the input itself: in the autocast dtype (as torch's layer saves its cast input), next to
    # the fp32 parameter (not a cast copy of it)
    with torch.autocast("cpu", dtype=dtype):
        out = twin(x.detach().clone().requires_grad_(True))
    kept, weight = out.grad_fn.saved_tensors[0], out.grad_fn.saved_tensors[-1]
    assert kept.dtype == dtype and weight.dtype == torch.float32 and weight.data_ptr() == twin.weight.data_ptr()


def test_twin_outside_autocast_and_float64_are_untouched(backend):
    torch.manual_seed(0)
    twin = convert(nn.Conv2d(3, 4, 3), level_config("L0", backend=backend)).model
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    assert twin(x).dtype == torch.float32
    twin64 = copy.deepcopy(twin).double()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast leaves float64 alone, as for torch's conv
        assert twin64(x.double()).dtype == nn.Conv2d(3, 4, 3).double()(x.double()).dtype == torch.float64


@pytest.mark.parametrize("level", ["L0", "L3"])
def test_resnet_trains_under_bf16_autocast_with_torch_dtypes(backend, level):
    """The conv twin's bf16 output reaches the BatchNorm twin, whose backward gets a bf16 input with fp32
    weight and statistics (torch's mixed-type call); at L0 the logits equal torch's and the gradients are
    within bf16 rounding of torch's bf16 gradients (measured 2.5%, while bf16 vs fp32 differs by 49%)."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    x, y = torch.randn(8, 3, 64, 64), torch.arange(8)

    def grads(m):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = m(x)
            loss = F.cross_entropy(logits, y)
        loss.backward()
        return logits, {n: p.grad for n, p in m.named_parameters()}

    ref_logits, ref = grads(copy.deepcopy(model))
    logits, got = grads(convert(model, level_config(level, backend=backend)).model)
    assert logits.dtype == ref_logits.dtype == torch.bfloat16
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in got.values())
    if level == "L0":
        torch.testing.assert_close(logits, ref_logits, rtol=0, atol=0)
        assert max(float((got[k] - ref[k]).norm() / ref[k].norm()) for k in ref) < 0.1


def test_meta_bf16_l0_keeps_half_of_fp32_l0() -> None:
    """At L0 the twins keep their inputs uncompressed, so bf16 halves them as it halves torch's; with the
    conv twin convolving in fp32 on meta the ratio was about 1 (cpu autocast, which fake tensors use)."""
    from actbench.measure.meta import MetaSessions
    from actbench.planning.point import Point
    from actbench.schema import ModelSpec, PointConfig

    sessions = MetaSessions()
    act = {p: sessions.measure_point(Point.resolve(PointConfig(ModelSpec("resnet18"), "L0", 8, 64, "meta",
                                                               warmup_steps=1, timed_steps=0,
                                                               precision=p))).activation_bytes
           for p in ("fp32", "bf16")}
    assert 0.45 <= act["bf16"] / act["fp32"] <= 0.55, act


@pytest.mark.parametrize("name,make,shape", [
    ("batchnorm", lambda: nn.BatchNorm2d(4), (2, 4, 5, 5)),
    ("layernorm", lambda: nn.LayerNorm(6), (2, 3, 6)),
], ids=["batchnorm", "layernorm"])
def test_normalisation_twins_keep_fp32_statistics_and_a_16_bit_x_norm_real_or_fake(backend, name, make, shape):
    """A bf16 input: cpu's kernels return fp32 statistics, torch's fake kernels bf16 ones, so meta predicted
    half the statistics bytes cpu kept (ResNet-18 L3 bf16 at batch 2: meta / cpu activation 0.90); and
    LayerNorm's x_n, promoted by fp32 statistics, was kept in fp32 at L0 on cpu but in bf16 on meta."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(0)
    # L1 keeps x_n uncompressed; at L0 torch's own batch norm runs (ActNNModule._runs_as_torch)
    twin = convert(make(), level_config("L1", backend=backend)).model
    x = torch.randn(shape, dtype=torch.bfloat16, requires_grad=True)
    # Outputs held while their saved tensors are read: torch 2.11 frees a custom function's saved
    # tensors with its last output, so reading them through a dropped output raises there.
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_out = twin(mode.from_tensor(x))
        fake = fake_out.grad_fn.saved_tensors
    real_out = twin(x)
    real = real_out.grad_fn.saved_tensors
    for kept in (real, fake):
        assert kept[-1].dtype == torch.float32  # invstd / rstd
        assert kept[0].dtype == torch.bfloat16  # x_n, uncompressed at L1
