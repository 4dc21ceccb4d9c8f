"""A loss under ActNN: the loss scope, the loss twins (loss_functions.py), and short rows packed whole.

Unbiasedness is checked as in test_actnn_unbiased.py: for an unbiased estimator the error of the mean
of K draws is about 1/sqrt(K) of one draw's RMS error (1/4 at K = 16); the bound is twice that, and a
negative control replaying one draw's noise must fail it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from actbench.actnn import convert, last_forward_census, level_config, loss_scope
from actbench.actnn.controller import Controller
from actbench.actnn.hooks import LOSS_OWNER, SKIP_LOSS
from actbench.actnn.loss_functions import AbsFunction, DenseCrossEntropyFunction

K = 16
RATIO_BOUND = 0.5
IGNORE = 255


def _map_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [2, 5, 8, 16] and labels with about a tenth of the pixels ignored."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 5, 8, 16, generator=gen)
    labels = torch.randint(0, 5, (2, 8, 16), generator=gen)
    labels[torch.rand(2, 8, 16, generator=gen) < 0.1] = IGNORE
    return logits, labels


def _slots(generator: torch.Generator) -> tuple:
    controller = Controller(level_config("L3"), generator=generator)
    return controller.dynamic_slot("ce", "act"), controller.dynamic_slot("ce_counted", "mask")


def _twin_gradient(logits: torch.Tensor, labels: torch.Tensor, slot, reduction: str = "mean"
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.clone().requires_grad_(True)
    loss = DenseCrossEntropyFunction.apply(x, labels, IGNORE, reduction, *slot)
    (3.0 * loss).backward()  # a weight on the term, as segmentation's 0.5 x aux
    return loss.detach(), x.grad


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_map_cross_entropy_gives_torchs_loss_and_an_unbiased_gradient(reduction) -> None:
    logits, labels = _map_batch()
    exact = logits.clone().requires_grad_(True)
    expected = F.cross_entropy(exact, labels, ignore_index=IGNORE, reduction=reduction)
    (3.0 * expected).backward()
    slot = _slots(torch.Generator().manual_seed(1))
    draws = []
    for _ in range(K):
        loss, grad = _twin_gradient(logits, labels, slot, reduction)
        assert torch.equal(loss, expected.detach())
        draws.append(grad)
    stack = torch.stack(draws)
    ignored = (labels == IGNORE).unsqueeze(1).expand_as(logits)
    assert (stack[:, ignored] == 0).all()  # an ignored pixel gets no gradient, rounded or not
    single = (stack - exact.grad).flatten(1).norm(dim=1).pow(2).mean().sqrt()
    assert single > 0  # the direction really is rounded (2 bits), not kept
    assert float((stack.mean(0) - exact.grad).norm() / single) < RATIO_BOUND


def test_the_unbiasedness_check_fails_a_replayed_draw() -> None:
    logits, labels = _map_batch()
    exact = logits.clone().requires_grad_(True)
    F.cross_entropy(exact, labels, ignore_index=IGNORE).mul(3.0).backward()
    gen = torch.Generator()
    slot = _slots(gen)
    draws = []
    for _ in range(K):
        gen.manual_seed(7)
        draws.append(_twin_gradient(logits, labels, slot)[1])
    stack = torch.stack(draws)
    single = (stack - exact.grad).flatten(1).norm(dim=1).pow(2).mean().sqrt()
    assert float((stack.mean(0) - exact.grad).norm() / single) > 0.9


def test_abs_keeps_one_bit_and_gives_torchs_gradient_off_zero() -> None:
    x = torch.tensor([[-2.0, -0.5, 0.0, 0.25, 3.0] * 8])
    grad = torch.arange(1.0, 41.0).reshape(1, 40)
    slot = Controller(level_config("L3")).dynamic_slot("abs", "mask")
    mine = x.clone().requires_grad_(True)
    out = AbsFunction.apply(mine, slot)
    torch.testing.assert_close(out, x.abs(), rtol=0, atol=0)
    out.backward(grad)
    torchs = x.clone().requires_grad_(True)
    torchs.abs().backward(grad)
    off_zero = x != 0
    assert torch.equal(mine.grad[off_zero], torchs.grad[off_zero])
    assert torch.equal(mine.grad[~off_zero], -grad[~off_zero])  # the subgradient -1 at exactly 0 (torch: 0)


class _Segmenter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 5, 1))

    def forward(self, x):
        return self.body(x)


def _census_of_loss(model: nn.Module, loss_of) -> dict[str, int]:
    """Bytes the loss saved after the model's forward, by category, in a loss scope."""
    with loss_scope(model):
        loss = loss_of(model)
    census = last_forward_census(model)
    loss.backward()
    out: dict[str, int] = {}
    for g in census.groups:
        if g.owner == LOSS_OWNER:
            out[g.category] = out.get(g.category, 0) + g.nbytes
    return out


def test_a_loss_scope_compresses_a_maps_cross_entropy_and_keeps_a_classifiers() -> None:
    """Inside the scope a map's cross-entropy keeps 2-bit codes, not fp32 log-probabilities; a
    classifier's [N, C] logits keep torch's exact saving, so its logits' gradient is torch's."""
    x = torch.randn(2, 3, 16, 32)
    labels = torch.randint(0, 5, (2, 16, 32))
    seg = convert(_Segmenter(), "L3").model
    by_category = _census_of_loss(seg, lambda m: F.cross_entropy(m(x), labels))
    fp32_log_probs = 2 * 5 * 16 * 32 * 4
    assert set(by_category) == {"compressed"} and by_category["compressed"] < fp32_log_probs / 8, by_category

    classifier = convert(nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 32, 1000)), "L3").model
    targets = torch.randint(0, 1000, (2,))
    logits_grads = []

    def loss_of(m):
        logits = m(x)
        logits.register_hook(logits_grads.append)
        return F.cross_entropy(logits, targets)
    by_category = _census_of_loss(classifier, loss_of)
    # the fp32 log-probabilities, and nll_loss's int64 targets and total weight
    assert set(by_category) == {SKIP_LOSS} and by_category[SKIP_LOSS] == 2 * 1000 * 4 + 2 * 8 + 4, by_category
    with torch.no_grad():
        logits = classifier(x)
    exact = logits.clone().requires_grad_(True)
    F.cross_entropy(exact, targets).backward()
    assert torch.equal(logits_grads[0], exact.grad)


def test_without_the_scope_the_loss_saves_nothing_compressed() -> None:
    """The scope is what compresses the loss: outside it a map's log-probabilities stay fp32 and the
    census of the model's forward has no loss entry."""
    x = torch.randn(2, 3, 16, 32)
    seg = convert(_Segmenter(), "L3").model
    F.cross_entropy(seg(x), torch.randint(0, 5, (2, 16, 32))).backward()
    assert not [g for g in last_forward_census(seg).groups if g.owner == LOSS_OWNER]


class _Detector(nn.Module):
    """A head whose forward computes its own cross-entropy on [K, 91] logits, as torchvision's R-CNNs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(64, 91)

    def forward(self, features, labels):
        return F.cross_entropy(self.head(features), labels)


def test_a_cross_entropy_inside_a_model_keeps_its_direction_in_whole_rows() -> None:
    """Inside a model the hook path would round [K, 91] log-probabilities (and pad each 91-value row to
    a 256-value group): the twin keeps the direction instead, packed as one row (2 bits a value)."""
    model = convert(_Detector(), "L3").model
    features, labels = torch.randn(512, 64), torch.randint(0, 91, (512,))
    loss = model(features, labels)
    census = last_forward_census(model)
    loss.backward()
    controller_names = [layer.name for layer in model.head.actnn_slot.controller.layers]
    assert any(":cross_entropy:" in name for name in controller_names), controller_names
    root = sum(g.nbytes for g in census.groups if g.owner == "_Detector" and g.category == "compressed")
    two_bits, counted = 512 * 91 // 4, 512 // 8  # the direction's codes, the 1-bit mask
    assert two_bits + counted <= root < 1.1 * two_bits, (root, two_bits)


def test_short_rows_are_packed_as_one_row_and_restored_to_their_shape() -> None:
    """A hook-packed [K, 91] tensor costs about 2 bits a value (not 256 values' codes a row), and
    backward sees its shape: the gradient equals the one of an exact step up to the rounding."""

    class Scores(nn.Module):
        def forward(self, a, b):
            return (a * b).sum()

    model = convert(Scores(), "L3").model
    a = torch.randn(2000, 91, requires_grad=True)
    b = torch.randn(2000, 91, requires_grad=True)
    model(a, b).backward()
    census = last_forward_census(model)
    packed = sum(g.nbytes for g in census.groups if g.category == "compressed")
    assert packed < 2 * 2000 * 91 // 4 * 1.1, packed
    assert a.grad.shape == (2000, 91)
    # b rounded to 2 bits in whole groups (relative error about 0.8), not restored in another order (about 1.4)
    assert 0 < float((a.grad - b.detach()).norm() / b.detach().norm()) < 1.0
