"""ActNN on a CUDA device: exactness at L0, swap (L4) on real streams, device bytes moved to the host.

Skipped without a GPU (this project's CI has none); run on a lent GPU machine.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import torchvision

from actbench.actnn import convert, level_config, saved_tensor_census

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _grads(model, x, y):
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _model():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10).cuda()


@pytest.fixture
def exact_fp32():
    """cuDNN convolutions (and matmuls) in plain fp32: with TF32, the default for cuDNN on Ampere and
    later, a twin's gradient that differs from torch's in the last bit of a float is rounded to 10
    bits of mantissa in the next layer, and the difference grows to percents over a ResNet-18."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32 = True, False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_l0_gradients_equal_fp32_on_cuda(exact_fp32):
    model = _model()
    x, y = torch.randn(4, 3, 64, 64, device="cuda"), torch.tensor([1, 2, 3, 4], device="cuda")
    ref = _grads(copy.deepcopy(model), x, y)
    got = _grads(convert(model, "L0").model, x, y)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()) + 1e-7)


@pytest.mark.parametrize("scope", ["codes", "all"])
def test_l4_swap_matches_l3_and_moves_what_its_scope_names(exact_fp32, scope):
    """L4 trains as L3 does; with swap_scope "all" only BatchNorm's statistics stay on the device, with
    "codes" (the default, as the original ActNN) the 1-bit masks and int8 max-pool argmax stay too."""
    model = _model()
    x, y = torch.randn(4, 3, 64, 64, device="cuda"), torch.tensor([1, 2, 3, 4], device="cuda")
    grads = {}
    for level in ("L3", "L4"):
        config = level_config(level, swap_scope=scope) if level == "L4" else level_config(level)
        conv = convert(copy.deepcopy(model), config, generator=torch.Generator().manual_seed(5))
        for _ in range(3):
            grads[level] = _grads(conv.model, x, y)
        torch.cuda.synchronize()
        if level == "L4":
            assert conv.controller.offloader.stats.prefetch_hits > 0
            by_device = saved_tensor_census(conv.model, x).bytes_by_device()
            if scope == "all":  # BatchNorm's fp32 inverse standard deviations only (19,200 bytes here)
                statistics = sum(4 * m.num_features for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
                assert by_device.get("cuda", 0) == statistics, by_device
            else:
                # ResNet-18 at 64 px: 2-bit codes of every conv/BN input on the host; 1 bit per ReLU
                # output and 1 byte per max-pool output on the device, about half the codes' bytes
                assert 0.2 * by_device["cpu"] < by_device["cuda"] < 0.8 * by_device["cpu"], by_device
    for a, b in zip(grads["L3"], grads["L4"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_two_levels_on_cuda_do_not_interfere():
    model = _model()
    x, y = torch.randn(2, 3, 32, 32, device="cuda"), torch.tensor([1, 2], device="cuda")
    a, b = convert(model, "L2"), convert(model, level_config("L5"))
    for _ in range(2):
        _grads(a.model, x, y)
        _grads(b.model, x, y)
    assert a.controller.allocation() == {} and b.controller.network_mean_bits() <= 2.0


def test_attention_twin_on_cuda_packs_q_k_and_v_apart_and_trains():
    """ViT's attention on the GPU at L3: the forward equals torch's (it runs in full precision), Q/K and
    V are packed on the device, and backward through the reassembled qkv gives finite gradients."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).cuda()
    x = torch.randn(4, 17, 64, device="cuda", requires_grad=True)
    ref = mha(x, x, x, need_weights=False)[0]
    model = convert(copy.deepcopy(mha), "L3").model
    out = model(x, x, x, need_weights=False)[0]
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    out.square().mean().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_the_map_cross_entropy_twin_on_cuda_gives_torchs_loss_and_zero_on_ignored_pixels():
    """The loss twin (actnn/loss_functions.py) on cuda: torch's loss value, and an ignored pixel's
    gradient exactly 0 after the 2-bit direction is unpacked with its 1-bit mask."""
    from actbench.actnn.controller import Controller
    from actbench.actnn.loss_functions import DenseCrossEntropyFunction

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 16, 32, generator=gen).cuda().requires_grad_(True)
    labels = torch.randint(0, 5, (2, 16, 32), generator=gen)
    labels[:, :4] = 255
    labels = labels.cuda()
    controller = Controller(level_config("L3"), generator=torch.Generator().manual_seed(1))
    loss = DenseCrossEntropyFunction.apply(logits, labels, 255, "mean", controller.dynamic_slot("ce", "act"),
                                           controller.dynamic_slot("ce_counted", "mask"))
    torch.testing.assert_close(loss, F.cross_entropy(logits.detach(), labels, ignore_index=255))
    loss.backward()
    assert (logits.grad[:, :, :4] == 0).all() and (logits.grad[:, :, 4:] != 0).any()
