"""L3 mixed precision and L4/L5 swapping: the controller's allocation and the offloader's logic."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from actbench.actnn import convert, level_config
from actbench.actnn.controller import uniform_bits

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * 8 * 8, 10),
    )


def _step(model, x, y):
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return float(loss.detach())


def test_uniform_bits_meets_target_exactly():
    assert uniform_bits(4, 2.0) == [2, 2, 2, 2]
    assert uniform_bits(4, 2.5) == [3, 3, 2, 2]
    assert uniform_bits(3, 0.5) == [1, 1, 1]  # at least one bit a sample: max(N, floor(t N))


def test_l3_first_step_uniform_then_adaptive_with_network_mean_at_target(backend):
    torch.manual_seed(0)
    x = torch.randn(8, 3, 8, 8)
    x[:2] *= 10  # two samples with a much wider range: they should get more bits
    y = torch.randint(0, 10, (8,))
    conv = convert(_net(), level_config("L3", backend=backend))
    c = conv.controller
    _step(conv.model, x, y)
    assert c.allocation() == {}  # first step: uniform 2 bits (no degenerate all-zero costs)
    _step(conv.model, x, y)
    alloc = c.allocation()
    assert set(alloc) == {"0", "1", "3", "4", "7"}
    mean = c.network_mean_bits()
    assert 1.9 <= mean <= 2.0, mean  # the weighted greedy stops at the budget, at most a bit under
    per_layer = {k: a.mean_bits for k, a in alloc.items()}
    assert max(per_layer.values()) > min(per_layer.values()), per_layer  # layers differ
    assert any(len(set(a.bits_desc)) > 1 for a in alloc.values())  # samples differ


class _Recurrent(nn.Module):
    """A convolution applied three times in one forward (a recurrent unit's, as RAFT's update block), then a head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.cell = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        h = self.stem(x)
        for _ in range(3):
            h = torch.tanh(self.cell(h))
        return self.head(h.flatten(1))


def test_l3_weighs_a_layer_by_all_its_calls_in_a_step(backend):
    """The cell saves three inputs a step: it weighs three calls' elements in the shared budget (weighed as
    one, the split spent other than the target on the bytes a step really packs), and the mean over what a
    step packs stays at the target."""
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    conv = convert(_Recurrent(), level_config("L3", backend=backend))
    _step(conv.model, x, y)
    _step(conv.model, x, y)
    alloc = conv.controller.allocation()
    assert alloc["cell"].elements_per_sample == 3 * 8 * 8 * 8, alloc["cell"]
    assert alloc["stem"].elements_per_sample == 3 * 8 * 8 and alloc["head"].elements_per_sample == 8 * 8 * 8
    assert 1.9 <= conv.controller.network_mean_bits() <= 2.0


class _RowsNotBatch(nn.Module):
    """A head applied to [batch x 16, 64] rows: its saved inputs have 16 times the batch's samples."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.bn, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Linear(64, 10)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x))).reshape(-1, 64)
        return self.fc(h).reshape(x.shape[0], -1, 10).mean(1)


def test_l3_allocates_layers_whose_samples_are_not_the_batch(backend):
    """Layers of one budget with different sample counts (6 images, 96 rows): each gets one width per
    sample of its own, and the shared budget still holds (the allocation takes the per-layer means one
    layer at a time there, all at once where every layer has the batch's samples)."""
    x, y = torch.randn(6, 3, 8, 8), torch.randint(0, 10, (6,))
    conv = convert(_RowsNotBatch(), level_config("L3", backend=backend))
    for _ in range(3):
        _step(conv.model, x, y)
    alloc = conv.controller.allocation()
    assert {k: len(a.bits_desc) for k, a in alloc.items()} == {"conv": 6, "bn": 6, "fc": 96}
    assert all(list(a.bits_desc) == sorted(a.bits_desc, reverse=True) for a in alloc.values())
    assert 1.9 <= conv.controller.network_mean_bits() <= 2.0


def test_l3_an_overflowed_statistic_does_not_fail_the_step(backend):
    """A diverging run (RAFT under SGD at lr 0.1 reaches activations whose squared ranges overflow fp32)
    leaves an infinite range statistic: the allocation counts it 0 instead of raising in allocate_bits."""
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    conv = convert(_net(), level_config("L3", backend=backend))
    c = conv.controller
    _step(conv.model, x, y)
    c._range_sq[0] = torch.full_like(c._range_sq[0], math.inf)
    c._grad_sq[3] = (torch.zeros_like(c._grad_sq[3][0]), c._grad_sq[3][1])
    c._range_sq[3] = torch.full_like(c._range_sq[3], math.inf)  # 0 x inf
    assert math.isfinite(_step(conv.model, x, y))
    assert 1.9 <= c.network_mean_bits() <= 2.0


def test_l3_rank_match_gives_wide_samples_more_bits(backend):
    x = torch.randn(8, 3, 8, 8)
    x[5] *= 50
    y = torch.randint(0, 10, (8,))
    conv = convert(_net(), level_config("L3", backend=backend))
    _step(conv.model, x, y)
    _step(conv.model, x, y)
    c = conv.controller
    bits = c.sample_bits(0, x)  # layer 0 = the first conv, fed x itself
    assert isinstance(bits, torch.Tensor)
    assert int(bits[5]) == int(bits.max())


def test_two_models_at_different_levels_do_not_interfere(backend):
    """Upstream kept the level in class attributes: converting a second model changed the first."""
    torch.manual_seed(0)
    base = _net()
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    ref = copy.deepcopy(base)
    _step(ref, x, y)
    a = convert(base, level_config("L0", backend=backend))
    b = convert(base, level_config("L3", backend=backend))
    for _ in range(2):
        _step(b.model, x, y)
        _step(a.model, x, y)
        _step(b.model, x, y)
    assert a.controller is not b.controller
    assert a.model[0].actnn_slot.config.name == "L0" and b.model[0].actnn_slot.config.name == "L3"
    # a is still exact (L0) after b adapted its allocation in between.
    a.model.zero_grad()
    base_copy = copy.deepcopy(base)
    base_copy.load_state_dict(a.model.state_dict())
    _step(a.model, x, y)
    _step(base_copy, x, y)
    for (n, p), q in zip(a.model.named_parameters(), base_copy.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{n}: {m}")
    assert a.controller.allocation() == {} and b.controller.allocation() != {}


def test_l4_swap_gives_the_same_gradients_as_l3_and_prefetches(backend):
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    grads = {}
    for level in ("L3", "L4"):
        conv = convert(_net(), level_config(level, backend=backend), generator=torch.Generator().manual_seed(3))
        for _ in range(3):
            _step(conv.model, x, y)
        grads[level] = [p.grad.clone() for p in conv.model.parameters()]
        if level == "L4":
            stats = conv.controller.offloader.stats
            assert stats.offloaded == 3 * 5  # conv, bn, conv, bn, linear codes each step (masks stay: "codes")
            assert stats.prefetch_hits > 0 and stats.prefetch_hits + stats.fetched_on_demand == stats.offloaded
    for a, b in zip(grads["L3"], grads["L4"]):
        assert torch.equal(a, b)


def test_l4_saved_tensors_are_separate_copies(backend):
    # Without the model's own saved-tensor hooks, so that this test's outer hook sees what layers save.
    conv = convert(_net(), level_config("L4", backend=backend, saved_tensor_hooks=False))
    x = torch.randn(2, 3, 8, 8)
    seen = []

    def pack(t):
        seen.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = conv.model(x)
    packed = [t for t in seen if t.dtype == torch.uint8]
    assert packed and conv.controller.offloader.stats.offloaded == 5  # the packed codes of 5 layers
    out.sum().backward()


def test_l5_config_substitutes_expandable_segments():
    cfg = level_config("L5")
    assert cfg.swap and cfg.mixed_precision and cfg.cuda_alloc_conf == "expandable_segments:True"
    assert level_config("L4").cuda_alloc_conf is None and level_config("L3").swap is False


@pytest.mark.parametrize("level", ["L2", "L3", "L4"])
def test_levels_run_under_fake_tensor_mode(backend, level):
    """The harness sizes steps on fake tensors (docs/design.md §4): the quantizer's seed draw and the L3
    allocator must not need tensor data there (both failed with a data-dependent int() before)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if backend == "oracle":
        pytest.skip("the oracle quantizer loops over sample data: it has no fake kernel")
    conv = convert(_net(), level_config(level, backend=backend))
    with FakeTensorMode(allow_non_fake_inputs=True):
        x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
        for _ in range(3):
            F.cross_entropy(conv.model(x), y).backward()  # no float(loss): there is no data
    assert conv.controller.step == 3


def _cost_factors(model, x, backend):
    """Each converted conv/linear layer's cost factor after one L3 training step on ``x``."""
    conv = convert(model, level_config("L3", backend=backend))
    conv.model(x.requires_grad_()).sum().backward()
    c = conv.controller
    return {info.name: c._cost_factor(i) for i, info in enumerate(c.layers)}


def test_cost_factor_divides_conv_by_groups(backend):
    """A grouped conv's output reads C_in / groups channels: a 32-group 3x3 conv is charged 9/32 per
    position, not 9 (ignoring groups gave depthwise layers bits they cannot use)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(32, 32, 3, padding=1),
        nn.Conv2d(32, 32, 3, padding=1, groups=32),  # depthwise
        nn.Conv2d(32, 32, 3, padding=1, groups=4),
        nn.ConvTranspose2d(32, 32, 3, padding=1, groups=8),
    )
    f = _cost_factors(model, torch.randn(2, 32, 8, 8), backend)
    spatial = 8 * 8
    assert f["0"] == pytest.approx(9 / spatial)
    assert f["1"] == pytest.approx(f["0"] / 32) and f["1"] < f["0"]
    assert f["2"] == pytest.approx(f["0"] / 4)
    assert f["3"] == pytest.approx(f["0"] / 8)


@pytest.mark.parametrize("tokens", [(), (5,), (3, 5)])
def test_cost_factor_divides_nd_linear_by_tokens(backend, tokens):
    """An N-D linear input [N, *tokens, in] reuses each weight at every token: its cost per unit of
    ||g||^2 * range^2 is 1 / tokens (a 2-D input: 1)."""
    torch.manual_seed(0)
    f = _cost_factors(nn.Sequential(nn.Linear(16, 4)), torch.randn(2, *tokens, 16), backend)
    assert f["0"] == pytest.approx(1 / math.prod(tokens))


def _weighted_step(model, x, y, w):
    """One step of a per-sample weighted loss: sample n's gradient is scaled by w[n]."""
    model.zero_grad(set_to_none=True)
    (F.cross_entropy(model(x), y, reduction="none") * w).sum().backward()
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])


def _gradient_variance(level, x, y, w, draws: int = 24) -> float:
    """Sum over parameters of the gradient's variance across rounding draws (same batch, same weights)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    conv = convert(model, level, generator=torch.Generator().manual_seed(1))
    _weighted_step(conv.model, x, y, w)  # L3 allocates from the second step on
    grads = torch.stack([_weighted_step(conv.model, x, y, w) for _ in range(draws)])
    return float(grads.var(0).sum())


def test_l3_splits_bits_across_samples_by_range_not_by_other_samples_gradients(backend):
    """A sample's bits are set in forward, before its gradient exists; last step's per-sample gradient
    norms belong to other samples. Here the samples with the widest ranges have the smallest
    gradients (weights 1 down to 1e-3): an allocation spread by last step's per-sample norms, handed
    out by range, starves the samples that matter: its gradient noise was 8.6x uniform 2 bits'
    (checked). With the layer's mean norm the split follows the range alone, and the noise is about
    uniform 2 bits' (1.08x here; 24 draws give a variance to within about 30%)."""
    g = torch.Generator().manual_seed(0)
    n = 32
    x = torch.randn(n, 64, generator=g) * torch.linspace(1.0, 1.3, n)[:, None]  # range grows with n
    y = torch.randint(0, 10, (n,), generator=g)
    w = torch.logspace(0, -3, n)  # ... and the gradient shrinks with n
    l3 = level_config("L3", backend=backend)
    mixed = _gradient_variance(l3, x, y, w)
    uniform = _gradient_variance(l3.replace(mixed_precision=False), x, y, w)
    assert mixed <= 1.3 * uniform, (mixed, uniform)


def test_allocation_noise_script_runs():
    """scripts/allocation_noise.py, which measured docs/design.md §2's table, still runs (a few steps)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "allocation_noise.py"
    res = subprocess.run([sys.executable, str(script), "--model", "resnet", "--pre-steps", "2", "--draws", "2",
                          "--sgd-images", "256"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert lines[0].startswith("cifar_resnet8 after 2 fp32 steps: SGD variance (batch 64, around 256 images)")
    ratios = [float(line.rsplit("=", 1)[1].split("x")[0]) for line in lines[1:]]
    assert len(ratios) == 2 and all(math.isfinite(r) and r > 0 for r in ratios), lines


def test_range_statistic_from_packed_scales_takes_one_temporary_and_torchs_values():
    """record_packed_ranges: per sample, the sum of ((2^b - 1) / scale)^2 over groups (non-finite -> 0), the
    values of torch's ``levels / scale`` bit for bit, from one fp32 copy of the scales: the out-of-place form
    held two [N, groups] temporaries at once, which raised ResNet-50's peak on meta (docs/design.md §2)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from actbench.actnn.controller import Controller
    from actbench.kernels import ops

    class Outputs(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.full_size = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func._schema.is_mutable and isinstance(out, torch.Tensor) and out.shape == scale.shape:
                self.full_size += 1
            return out

    x = torch.randn(4, 6000, generator=torch.Generator().manual_seed(0))
    x[1, 10] = float("inf")  # a non-finite group: its scale gives no range
    packed = ops.quantize(x, 2)
    scale = packed.scale
    before = scale.clone()
    controller = Controller(level_config("L3"))
    with Outputs() as outputs:
        controller.record_packed_ranges(0, packed)
    expected = torch.nan_to_num((3.0 / scale.float()).square(), nan=0.0, posinf=0.0).sum(1)
    assert torch.equal(controller._range_sq[0], expected)
    assert torch.equal(scale.view(torch.int16), before.view(torch.int16))  # bit for bit: the inf group's scale is NaN
    assert outputs.full_size == 1
