"""ActNN layers: L0 is exact, every layer kind matches its torch twin, eval/no-grad compress nothing."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torchvision.models.convnext import CNBlock, LayerNorm2d

from actbench.kernels import ops
from actbench.actnn import convert, level_config
from actbench.actnn import layers as L
from actbench.actnn import transformer_functions as TF
from actbench.actnn import transformer_layers as TL

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


def _grads(model, inputs, seed=0, loss_fn=None):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = model(*[t * 1 if t.is_floating_point() else t for t in inputs])  # not leaves: in-place ReLU ok
    loss = loss_fn(out) if loss_fn else (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    grads.update({f"input{i}": t.grad.clone() for i, t in enumerate(inputs) if t.grad is not None})
    return out.detach(), grads


def _assert_same_grads(a, b):
    """Equal up to float summation order: elementwise within 1e-4 relative + 1e-5 of the tensor's max."""
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].shape == b[k].shape, k
        atol = 1e-5 * float(b[k].abs().max()) + 1e-7
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=atol, msg=lambda m: f"{k}: {m}")


def test_l0_resnet18_gradients_equal_fp32(backend):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([3, 7])
    loss = lambda out: F.cross_entropy(out, y)  # noqa: E731
    ref_out, ref = _grads(copy.deepcopy(model), [x], loss_fn=loss)
    conv = convert(model, level_config("L0", backend=backend))
    out, got = _grads(conv.model, [x], loss_fn=loss)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)  # forward runs in full precision
    _assert_same_grads(got, ref)


def test_l0_mlp_gradients_equal_fp32(backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU6(), nn.Linear(32, 5))
    x = torch.randn(6, 12)
    _, ref = _grads(copy.deepcopy(model), [x])
    _, got = _grads(convert(model, level_config("L0", backend=backend)).model, [x])
    _assert_same_grads(got, ref)


LAYER_CASES = [
    ("conv1d", lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1), (2, 3, 9)),
    ("conv2d_same_reflect", lambda: nn.Conv2d(3, 4, 3, padding="same", padding_mode="reflect", bias=False), (2, 3, 7, 6)),
    ("conv2d_groups_dilation", lambda: nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2), (2, 4, 8, 8)),
    ("conv2d_unbatched", lambda: nn.Conv2d(3, 4, 3), (3, 7, 7)),
    ("conv3d", lambda: nn.Conv3d(2, 3, 3, padding=1), (2, 2, 4, 5, 5)),
    ("convtranspose1d", lambda: nn.ConvTranspose1d(3, 2, 3, stride=2, output_padding=1), (2, 3, 6)),
    ("convtranspose2d", lambda: nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, groups=1), (2, 3, 5, 5)),
    ("convtranspose3d", lambda: nn.ConvTranspose3d(2, 2, 2, stride=2), (2, 2, 3, 3, 3)),
    ("linear_3d_input", lambda: nn.Linear(5, 7), (3, 4, 5)),
    ("linear_1d_input", lambda: nn.Linear(5, 7), (5,)),
    ("bn1d", lambda: nn.BatchNorm1d(4), (6, 4)),
    ("bn1d_seq", lambda: nn.BatchNorm1d(4, affine=False), (3, 4, 5)),
    ("bn2d_cumulative", lambda: nn.BatchNorm2d(3, momentum=None), (2, 3, 4, 4)),
    ("bn3d", lambda: nn.BatchNorm3d(2), (2, 2, 3, 3, 3)),
    ("relu", lambda: nn.ReLU(inplace=True), (2, 3, 5)),
    ("relu6", lambda: nn.ReLU6(), (4, 9)),
    ("hardtanh", lambda: nn.Hardtanh(-0.5, 0.7), (4, 9)),
    ("maxpool_ceil_pad", lambda: nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True), (2, 3, 9, 10)),
    ("maxpool_default_stride", lambda: nn.MaxPool2d(2), (2, 3, 8, 8)),
    ("avgpool", lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False), (2, 3, 9, 10)),
    ("avgpool_divisor", lambda: nn.AvgPool2d(2, divisor_override=3), (2, 3, 8, 8)),
    # transformer and mobile layers
    ("layernorm", lambda: nn.LayerNorm(6), (2, 3, 6)),
    ("layernorm_2d_shape_no_affine", lambda: nn.LayerNorm((3, 6), elementwise_affine=False), (2, 3, 6)),
    ("layernorm2d_convnext", lambda: LayerNorm2d(4, eps=1e-6), (2, 4, 5, 5)),
    ("gelu", lambda: nn.GELU(), (2, 3, 7)),
    ("gelu_tanh", lambda: nn.GELU(approximate="tanh"), (2, 3, 7)),
    ("silu_inplace", lambda: nn.SiLU(inplace=True), (2, 3, 7)),
    ("hardswish", lambda: nn.Hardswish(), (2, 3, 7)),
    ("sigmoid", lambda: nn.Sigmoid(), (2, 3, 7)),
    ("tanh", lambda: nn.Tanh(), (2, 3, 7)),
    ("hardsigmoid", lambda: nn.Hardsigmoid(), (2, 3, 7)),
    ("softmax", lambda: nn.Softmax(dim=1), (2, 5, 7)),
    ("convnext_block_layer_scale", lambda: CNBlock(4, layer_scale=0.5, stochastic_depth_prob=0.0), (2, 4, 6, 6)),
]


# At L0 a conv, linear or batch-norm twin runs torch's own layer (ActNNModule._runs_as_torch); with
# every saved tensor swapped ("all"), still exact, its autograd function runs, so its arithmetic is
# held here too.
TWIN_FUNCTION_CASES = [c for c in LAYER_CASES if c[0].startswith(("conv", "linear", "bn"))]


@pytest.mark.parametrize(
    "name,make,shape,swap",
    [(*c, False) for c in LAYER_CASES] + [(*c, True) for c in TWIN_FUNCTION_CASES],
    ids=[c[0] for c in LAYER_CASES] + [f"{c[0]}-function" for c in TWIN_FUNCTION_CASES],
)
def test_layer_matches_torch_twin_at_l0(backend, name, make, shape, swap):
    torch.manual_seed(0)
    module = make().train()
    x = torch.randn(shape) * 3
    ref_module = copy.deepcopy(module)
    ref_out, ref = _grads(ref_module, [x])
    level = level_config("L0", backend=backend)
    conv = convert(module, level.replace(swap=True, swap_scope="all") if swap else level)
    assert isinstance(conv.model, L.ActNNModule)
    out, got = _grads(conv.model, [x])
    torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-6)
    _assert_same_grads(got, ref)
    for (k, a), b in zip(ref_module.state_dict().items(), conv.model.state_dict().values()):
        torch.testing.assert_close(a, b, msg=lambda m: f"state {k}: {m}")  # running stats updated alike


def test_l0_conv_and_linear_run_torchs_own_layer_with_their_input_marked_full_precision(backend):
    from actbench.actnn.controller import ROLE_FULL_PRECISION, saved_role

    def grad_fns(level, autocast=False):
        model = convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(64, 2)), level).model
        x = torch.randn(2, 3, 6, 6, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            h = model[0](x)
            out = model[2](model[1](h))
        return type(h.grad_fn).__name__, type(out.grad_fn).__name__, saved_role(x)

    l0 = level_config("L0", backend=backend)
    # nothing to compress: torch's autograd keeps the same tensors, without the twin's Python
    assert grad_fns(l0) == ("ConvolutionBackward0", "AddmmBackward0", ROLE_FULL_PRECISION)
    # compressing, swapping, or under autocast (its cast copy would escape the mark): the twin's function
    assert grad_fns(level_config("L1", backend=backend))[:2] == ("ConvFunctionBackward", "LinearFunctionBackward")
    assert grad_fns(l0.replace(swap=True))[:2] == ("ConvFunctionBackward", "LinearFunctionBackward")
    assert grad_fns(l0, autocast=True)[0] == "ConvFunctionBackward"
    # on the meta device, which autocast does not know (asking it raises), torch's layer runs too
    model = convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), l0).model.to("meta")
    x = torch.randn(2, 3, 6, 6, device="meta", requires_grad=True)
    h = model[0](x)
    model[1](h).sum().backward()
    assert type(h.grad_fn).__name__ == "ConvolutionBackward0" and x.grad.shape == x.shape


def test_l0_batchnorm_runs_torchs_own_layer_where_its_statistics_stay_exact(backend):
    """torch's batch norm keeps its batch mean and invstd besides the input; the hook path would
    quantize them at L1's act_bits (the 2048-channel layers of a ResNet-50 reach hook_min_elements),
    so there the twin runs, and without hooks torch's layer runs at L1 too."""
    from actbench.actnn.controller import ROLE_FULL_PRECISION, saved_role

    def grad_fn(level, channels=4):
        model = convert(nn.Sequential(nn.BatchNorm2d(channels)), level).model.train()
        x = torch.randn(2, channels, 3, 3, requires_grad=True)
        return type(model(x).grad_fn).__name__, saved_role(x)

    l0 = level_config("L0", backend=backend)
    assert grad_fn(l0) == ("NativeBatchNormBackward0", ROLE_FULL_PRECISION)
    assert grad_fn(level_config("L1", backend=backend))[0] == "BatchNormFunctionBackward"
    assert grad_fn(level_config("L1", backend=backend, saved_tensor_hooks=False))[0] == "NativeBatchNormBackward0"
    assert grad_fn(l0.replace(swap=True))[0] == "BatchNormFunctionBackward"
    assert grad_fn(level_config("L2", backend=backend))[0] == "BatchNormFunctionBackward"


def test_conv_transpose_output_size(backend):
    torch.manual_seed(0)
    module = nn.ConvTranspose2d(3, 2, 3, stride=2)
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    conv = convert(module, level_config("L2", backend=backend)).model
    out = conv(x, output_size=[10, 10])
    assert out.shape == (2, 2, 10, 10)
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_linear_3d_input_gradient_keeps_shape(backend):
    lin = convert(nn.Linear(5, 7), level_config("L2", backend=backend)).model
    x = torch.randn(3, 4, 5, requires_grad=True)
    lin(x).sum().backward()
    assert x.grad.shape == (3, 4, 5)


def test_dropout_keeps_mask_and_scales(backend):
    torch.manual_seed(0)
    drop = convert(nn.Dropout(0.3), level_config("L3", backend=backend)).model
    x = torch.rand(4, 100) + 0.5  # no zeros: a zero output means dropped
    x.requires_grad_(True)
    out = drop(x)
    keep = out != 0
    assert 0.5 < keep.float().mean() < 0.9
    torch.testing.assert_close(out[keep], x.detach()[keep] / 0.7)
    g = torch.randn(out.shape)
    out.backward(g)
    torch.testing.assert_close(x.grad, g * keep / 0.7)
    drop.eval()
    assert torch.equal(drop(x), x)


def test_eval_and_no_grad_compress_nothing(backend, monkeypatch):
    calls = []
    real = ops.quantize
    monkeypatch.setattr(ops, "quantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    x = torch.randn(2, 3, 32, 32)
    conv = convert(model, level_config("L2", backend=backend)).model
    model.eval(), conv.eval()
    assert torch.equal(conv(x), model(x))  # eval: identical outputs, bit for bit
    with torch.no_grad():
        conv.train()(x)
    assert calls == []
    conv.train()(x).sum().backward()
    assert len(calls) > 0


def test_directly_built_layer_is_an_error_in_training_and_plain_torch_otherwise(backend):
    """Same constructor as the torch twin, but no level: training with it used to create a private
    L2 controller silently (outside the model's budget and swap); now it names the layer and says
    to convert. Eval and no-grad forwards compress nothing and need no controller."""
    layer = L.QConv2d(3, 4, 3, padding=1)
    assert set(layer.state_dict()) == {"weight", "bias"}
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    with pytest.raises(L.NotConvertedError, match=r"QConv2d \(3, 4, kernel_size=\(3, 3\).*actbench\.actnn\.convert"):
        layer(x)
    torch.testing.assert_close(layer.eval()(x), F.conv2d(x, layer.weight, layer.bias, padding=1))
    with torch.no_grad():
        layer.train()(x)
    relu = nn.ReLU()
    relu.__class__ = L.QReLU  # re-classed by hand, never attached
    with pytest.raises(L.NotConvertedError, match="QReLU"):
        relu(x)

def test_multihead_attention_twin_matches_torch_and_keeps_only_qkv(backend):
    """ViT's self-attention: L0 equals torch's; at L3 the layer keeps the packed qkv projection and the
    in/out projections' packed inputs, nothing in full precision (backward recomputes attention)."""
    from actbench.actnn import saved_tensor_census

    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(2, 5, 16)

    def run(m, inp):
        m.zero_grad(set_to_none=True)
        inp = inp.detach().clone().requires_grad_(True)
        out = m(inp, inp, inp, need_weights=False)[0]
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters()}
        grads["input"] = inp.grad
        return out.detach(), grads

    ref_out, ref = run(copy.deepcopy(mha), x)
    conv = convert(mha, level_config("L0", backend=backend))
    assert isinstance(conv.model, TL.QMultiheadAttention)
    assert [e.name for e in conv.report.kept] == ["out_proj"]  # used by the twin itself
    out, got = run(conv.model, x)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    _assert_same_grads(got, ref)

    class SelfAttention(nn.Module):
        def __init__(self, attn):
            super().__init__()
            self.attn = attn

        def forward(self, h):
            return self.attn(h, h, h, need_weights=False)[0]

    census = saved_tensor_census(convert(SelfAttention(mha), level_config("L3", backend=backend)).model,
                                 x.clone().requires_grad_(True))
    assert set(census.bytes_by_category()) == {"compressed"}, census.groups
    assert {g.owner_type for g in census.groups} == {"QMultiheadAttention"}
    l3 = convert(mha, level_config("L3", backend=backend))
    out = l3.model(x, x, x, need_weights=False)[0]
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)  # forward in full precision
    # need_weights=True (or masks) runs torch's own path: same result, the hook path compresses.
    with_weights, attn = l3.model(x, x, x)
    torch.testing.assert_close(with_weights, ref_out, rtol=1e-5, atol=1e-6)
    assert attn.shape == (2, 5, 5)


@pytest.mark.parametrize("make,p", [(lambda: torchvision.ops.StochasticDepth(0.4, "row"), 0.4),
                                    (lambda: torchvision.ops.StochasticDepth(0.4, "batch"), 0.4)])
def test_stochastic_depth_keeps_a_one_bit_mask_and_scales(backend, make, p):
    torch.manual_seed(0)
    sd = convert(make(), level_config("L3", backend=backend)).model
    assert isinstance(sd, L.QStochasticDepth)
    x = (torch.rand(64, 3, 4) + 0.5).requires_grad_(True)
    out = sd(x)
    keep = (out != 0).all(dim=(1, 2)) if sd.mode == "row" else (out != 0).all().expand(64)
    assert sd.mode == "batch" or 0.3 < keep.float().mean() < 0.9
    torch.testing.assert_close(out[keep], x.detach()[keep] / (1 - p))
    g = torch.randn(out.shape)
    out.backward(g)
    torch.testing.assert_close(x.grad, g * keep[:, None, None] / (1 - p))


def test_activation_twins_keep_the_derivative(backend):
    """GELU/SiLU/Sigmoid keep f'(x) (unbiased when quantized): at L0 it is exactly torch's gradient."""
    for make, f in [(nn.GELU, F.gelu), (nn.SiLU, F.silu), (nn.Sigmoid, torch.sigmoid), (nn.Hardswish, F.hardswish)]:
        act = convert(make(), level_config("L0", backend=backend)).model
        x = torch.randn(3, 50, requires_grad=True)
        g = torch.randn(3, 50)
        act(x).backward(g)
        x2 = x.detach().clone().requires_grad_(True)
        f(x2).backward(g)
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-6, atol=1e-7)


def test_attention_keeps_q_and_k_at_qk_bits_and_v_at_act_bits():
    """Backward recomputes softmax(q k^T) from the saved Q and K: their error is not averaged out by
    stochastic rounding, so they get ``qk_bits`` (L3: 4) while V, which enters linearly, gets
    ``act_bits`` (2). Packed sizes say which: [N, L, 2E] at 4 bits and [N, L, E] at 2 bits."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(64, 4, batch_first=True)
    x = torch.randn(2, 8, 64, requires_grad=True)
    level = level_config("L3", mixed_precision=False)
    assert (level.qk_bits, level.act_bits) == (4, 2)
    model = convert(mha, level).model
    seen = []
    real = TF.AttentionFunction.forward

    def spy(ctx, qkv, heads, mask, causal, qk_slot, v_slot):
        out = real(ctx, qkv, heads, mask, causal, qk_slot, v_slot)
        seen.append(tuple((spec.kind, tuple(spec.shape), spec.bits) for spec in ctx.specs))
        return out

    TF.AttentionFunction.forward = staticmethod(spy)
    try:
        out = model(x, x, x, need_weights=False)[0]
    finally:
        TF.AttentionFunction.forward = staticmethod(real)
    assert seen == [(("packed", (2, 8, 128), 4), ("packed", (2, 8, 64), 2))]
    out.sum().backward()  # backward reassembles qkv from the two packs
    assert x.grad is not None and torch.isfinite(x.grad).all()
    # L0 keeps both in full precision: no qk_bits there
    assert level_config("L0").qk_bits is None
