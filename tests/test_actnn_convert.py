"""convert(): weights and names kept, AvgPool kept, a report of what stays uncompressed, clear errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from actbench.actnn import LEVEL_NAMES, UnsupportedModuleError, convert, level_config, saved_tensor_census
from actbench.actnn.layers import ActNNModule

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


class FunctionalNet(nn.Module):
    """Uses F.relu and a residual add in forward, and an ELU (no twin)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.act = nn.ELU()
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        h = F.relu(self.conv(x))
        h = self.pool(h + 1)
        return self.fc(self.act(h).flatten(1))


class HookedNet(nn.Module):
    """Functional calls no module twin sees: F.gelu, x * sigmoid(x), torch.cat, einsum, an ELU."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.ELU()
        self.fc = nn.Linear(16 * 16 * 16, 3)

    def forward(self, x):
        h = self.conv(x)
        g = F.gelu(h)
        s = h * torch.sigmoid(h)
        c = torch.cat([g, self.act(s)], 1)  # [N, 16, 16, 16]
        mixed = torch.einsum("nchw,nchw->nchw", c, c.flip(1))
        return self.fc(mixed.flatten(1))


def test_state_dict_round_trips_and_weights_are_not_reinitialised(backend):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    conv = convert(model, level_config("L3", backend=backend)).model
    sd, csd = model.state_dict(), conv.state_dict()
    assert list(sd) == list(csd)
    for k in sd:
        assert torch.equal(sd[k], csd[k]), k
    fresh = torchvision.models.resnet18(num_classes=10)
    fresh.load_state_dict(csd)  # strict: same keys and shapes
    conv.load_state_dict(sd)
    assert dict(model.named_modules()).keys() == dict(conv.named_modules()).keys()
    assert not any(isinstance(m, ActNNModule) for m in model.modules())  # the original is untouched


def test_eval_outputs_identical_after_conversion(backend):
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2(num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    for level in ("L0", "L3"):
        conv = convert(model, level_config(level, backend=backend)).model.eval()
        assert torch.equal(conv(x), model(x))


def test_report_names_functional_and_unsupported_saved_tensors_without_hooks(backend):
    """With the hook path off (``saved_tensor_hooks=False``), what no twin handles stays fp32 and is named."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    conv = convert(FunctionalNet(), level_config("L3", backend=backend, saved_tensor_hooks=False), example_input=x)
    rep = conv.report
    assert [e.name for e in rep.converted] == ["conv", "pool", "fc"]
    assert [(e.name, e.torch_type) for e in rep.unsupported] == [("act", "ELU")] and not rep.hooked
    assert isinstance(conv.model.pool, nn.AvgPool2d)  # upstream turned AvgPool into MaxPool
    assert not any(g.owner == "pool" for g in rep.census.groups)  # keeps only a shape
    groups = {(g.owner, g.category): g for g in rep.uncompressed}
    relu = groups[("FunctionalNet", "functional")]
    assert "relu" in relu.saved_by and relu.nbytes == 2 * 4 * 8 * 8 * 4  # F.relu keeps its fp32 output
    assert groups[("act", "unconverted module")].nbytes == 2 * 4 * 4 * 4 * 4  # ELU keeps its input... and output
    assert rep.census.bytes_by_category()["compressed"] > 0
    assert "act (ELU)" in rep.summary() and "uncompressed" in rep.summary()


def test_hook_path_compresses_functional_calls_and_unconverted_modules(backend):
    """The general path (docs/design.md §3): F.relu becomes a 1-bit mask; F.gelu, x * sigmoid(x),
    cat, einsum and an ELU keep their floating tensors packed; the report says what stays as is."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    plain = saved_tensor_census(HookedNet(), x)
    assert plain.bytes_by_category().keys() == {"unconverted module", "functional"}
    conv = convert(HookedNet(), level_config("L3", backend=backend), example_input=x)
    rep = conv.report
    assert [e.name for e in rep.hooked] == ["act"] and not rep.unsupported
    by_cat = rep.census.bytes_by_category()
    assert set(by_cat) <= {"compressed", "small", "layer statistics"}, by_cat
    assert rep.census.uncompressed_share < 0.01, rep.census.describe_uncompressed()
    assert rep.census.total_bytes < plain.total_bytes / 8, (rep.census.total_bytes, plain.total_bytes)
    hooked = [g for g in rep.census.groups if g.saved_by.startswith("hook:")]
    assert {g.owner for g in hooked} >= {"HookedNet", "act"}  # functional calls, and the ELU's own tensors
    assert "uncompressed" in rep.summary() and "through the saved-tensor hook path" in rep.summary()
    # It trains, and parameters (also saved by F.linear / conv) are never packed.
    out = conv.model(x)
    F.cross_entropy(out, torch.tensor([0, 2])).backward()
    assert all(p.grad is not None for p in conv.model.parameters())


def test_hook_path_leaves_integers_parameters_and_small_tensors(backend):
    """Integer/bool tensors, parameters (and views of them) and tensors under the size floor are never packed."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(64, 64))
            self.emb = nn.Parameter(torch.randn(10, 4096))

        def forward(self, x, idx):
            y = x @ self.w.t()  # saves x (packed) and a view of w (left as is)
            small = torch.tanh(x[:4, :8])  # 32 values: below hook_min_elements
            picked = self.emb[idx]  # saves the int64 index
            return y.sum() + small.sum() + picked.sum()

    from actbench.actnn.hooks import packer_of
    conv = convert(Net(), level_config("L3", backend=backend))
    seen = []
    packer_of(conv.model).observer = lambda t, packed, reason, owner: seen.append((tuple(t.shape), t.dtype, reason,
                                                                                   packed is not None))
    x = torch.randn(2048, 64, requires_grad=True)
    conv.model(x, torch.tensor([1, 3])).backward()
    packed = [s for s in seen if s[3]]
    assert packed == [((2048, 64), torch.float32, None, True)], seen
    reasons = {s[2] for s in seen if not s[3]}
    assert {"model state", "small", "integer or bool"} <= reasons, seen
    assert conv.model.w.grad is not None and x.grad is not None


def test_strict_conversion_rejects_unsupported_modules():
    with pytest.raises(UnsupportedModuleError, match=r"act \(ELU\)"):
        convert(FunctionalNet(), level_config("L2", saved_tensor_hooks=False), strict=True)
    convert(FunctionalNet(), "L2", strict=True)  # with the hook path nothing is unsupported


def test_bad_level_name_lists_allowed_levels():
    with pytest.raises(ValueError, match="L0, L1, L2, L3, L4, L5"):
        convert(nn.Linear(2, 2), "L6")
    with pytest.raises(ValueError, match="unknown ActNN level 'fp32'"):
        level_config("fp32")
    assert LEVEL_NAMES == ("L0", "L1", "L2", "L3", "L4", "L5")


def test_custom_config_validation():
    with pytest.raises(ValueError, match="must be 1, 2, 4 or 8"):
        level_config("L2", conv_bits=3)
    cfg = level_config("L3", conv_bits=3, bn_bits=None, backend="oracle")  # mixed: any target in 1..8
    assert cfg.conv_bits == 3 and cfg.bn_bits is None
    with pytest.raises(ValueError, match="backend"):
        level_config("L1", backend="cuda")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.conv_bits = 4  # configs are values: no layer can change a level behind others' backs


def test_converting_twice_is_an_error():
    conv = convert(nn.Sequential(nn.Linear(2, 2)), "L2").model
    with pytest.raises(ValueError, match="already converted"):
        convert(conv, "L3")


def test_convnet_with_dropout_and_maxpool_trains(backend):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4),
    )
    conv = convert(model, level_config("L3", backend=backend)).model
    x = torch.randn(32, 3, 16, 16)
    y = (x[:, 0].mean((1, 2)) > 0).long() + 2 * (x[:, 1].mean((1, 2)) > 0).long()
    opt = torch.optim.SGD(conv.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = F.cross_entropy(conv(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses


TORCHVISION_MODELS = ["resnet18", "wide_resnet50_2", "densenet121", "mobilenet_v2", "vgg11_bn", "squeezenet1_1",
                      "shufflenet_v2_x0_5", "mnasnet0_5", "efficientnet_b0", "regnet_x_400mf"]


@pytest.mark.memory_gb(2.6)  # 2.35-2.48 GB measured, children included
@pytest.mark.slow
@pytest.mark.parametrize("name", TORCHVISION_MODELS)
def test_torchvision_models_convert_and_train_one_step(backend, name):
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, num_classes=10)
    x = torch.randn(2, 3, 64, 64)
    conv = convert(model, level_config("L3", backend=backend), example_input=x)
    assert conv.report.converted
    out = conv.model(x)
    F.cross_entropy(out, torch.tensor([1, 2])).backward()
    assert all(p.grad is not None for p in conv.model.parameters() if p.requires_grad)
    census = conv.report.census
    assert census.bytes_by_category().get("compressed", 0) > 0
    if name in ("resnet18", "wide_resnet50_2", "vgg11_bn", "mobilenet_v2"):
        assert not conv.report.unsupported
