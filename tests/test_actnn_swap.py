"""L4/L5 swap scope: what moves to the host (LevelConfig.swap_scope, actbench/actnn/levels.py).

On the CPU the offloader's "host" copies are plain tensors made inside its host scope (the hook the
harness uses to file them as host memory, actbench/actnn/offload.py); a dispatch mode that notes
every storage created inside that scope tells host copies from device tensors here.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode

from actbench.actnn import LevelConfig, convert, level_config, set_host_scope
from actbench.actnn import layers as L
from actbench.actnn.hooks import packer_of

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


class HostFiling(TorchDispatchMode):
    """Notes the storages created inside :meth:`scope` (the offloader's host scope)."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.host: list[torch.Tensor] = []

    @contextlib.contextmanager
    def scope(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.depth:
            self.host += [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return out

    def is_host(self, t: torch.Tensor) -> bool:
        ptr = t.untyped_storage().data_ptr()
        return any(h.untyped_storage().data_ptr() == ptr for h in self.host)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 4 * 4, 10),
    )


def _saved_by_layer(conv, x, filing: HostFiling) -> dict[str, list[tuple[torch.Tensor, bool]]]:
    """One training forward: each converted layer's saved tensors, in order, and whether on the host."""
    owner: list[str] = []
    names = {m: n for n, m in conv.model.named_modules()}
    handles = []
    for m in conv.model.modules():
        if isinstance(m, L.ActNNModule):
            handles.append(m.register_forward_pre_hook(lambda mod, a: owner.append(names[mod])))
            handles.append(m.register_forward_hook(lambda mod, a, o: owner.pop() and None))
    saved: dict[str, list[torch.Tensor]] = {}

    def pack(t):
        if owner:
            saved.setdefault(owner[-1], []).append(t)
        return t

    # The converted model's own saved-tensor hooks are innermost: it reports every saved tensor to
    # its observer (an outer hook of ours would see nothing).
    packer = packer_of(conv.model)
    packer.observer = lambda t, packed, reason, owner_name: pack(t)
    try:
        with filing:
            out = conv.model(x)
    finally:
        packer.observer = None
        for h in handles:
            h.remove()
    out.sum().backward()
    return {k: [(t, filing.is_host(t)) for t in v] for k, v in saved.items()}


def _step(model, x, y):
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()


def _mixed_l4(scope, backend):
    """An L4 model two steps in, so per-sample bit widths (a uint8 tensor of metadata) are saved too."""
    conv = convert(_net(), level_config("L4", backend=backend, swap_scope=scope), generator=torch.Generator().manual_seed(0))
    x = torch.randn(8, 3, 8, 8)
    x[:2] *= 20
    y = torch.randint(0, 10, (8,))
    _step(conv.model, x, y)
    _step(conv.model, x, y)
    assert any(len(set(a.bits_desc)) > 1 for a in conv.controller.allocation().values())
    return conv, x


def test_swap_scope_defaults_to_codes_and_is_checked():
    assert level_config("L4").swap_scope == "codes" and level_config("L5").swap_scope == "codes"
    assert LevelConfig(swap=True, swap_scope="all").swap_scope == "all"
    with pytest.raises(ValueError, match="swap_scope"):
        LevelConfig(swap=True, swap_scope="masks")


def test_codes_scope_moves_only_packed_codes(backend):
    """The original ActNN moved only packed codes: metadata, bit widths, masks and argmax stay."""
    conv, x = _mixed_l4("codes", backend)
    filing = HostFiling()
    conv.controller.offloader.host_scope = filing.scope
    saved = _saved_by_layer(conv, x.requires_grad_(), filing)
    assert set(saved) == {"0", "1", "2", "3", "4", "6"}
    for name in ("0", "1", "4", "6"):  # conv, BN, conv, linear: codes, lo, scale, [bits], weight, ...
        (codes, host), *rest = saved[name]
        assert codes.dtype == torch.uint8 and host, name
        assert not any(h for _, h in rest), (name, [(t.dtype, tuple(t.shape), h) for t, h in rest])
        assert any(t.dtype == torch.bfloat16 for t, _ in rest)  # lo, scale: on the device
    assert any(t.dtype == torch.uint8 and t.shape == (8,) for name in ("0", "4", "6") for t, _ in saved[name][1:])
    assert [h for _, h in saved["2"]] == [False]  # ReLU mask
    assert [(t.dtype, h) for t, h in saved["3"]] == [(torch.int8, False)]  # MaxPool argmax
    assert conv.controller.offloader.stats.offloaded >= 4


def test_all_scope_moves_every_saved_tensor(backend):
    """"all": masks, argmax and metadata go to the host too; only parameters and BN's 1/std stay."""
    conv, x = _mixed_l4("all", backend)
    filing = HostFiling()
    conv.controller.offloader.host_scope = filing.scope
    saved = _saved_by_layer(conv, x.requires_grad_(), filing)
    params = {p.untyped_storage().data_ptr() for p in conv.model.parameters()}
    for name, tensors in saved.items():
        for t, host in tensors:
            is_state = t.untyped_storage().data_ptr() in params or (name == "1" and t.dtype == torch.float32)
            assert host != is_state, (name, t.dtype, tuple(t.shape), host)


@pytest.mark.parametrize("scope", ["codes", "all"])
def test_both_scopes_give_l3_gradients(backend, scope):
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    grads = {}
    for level in ("L3", "L4"):
        cfg = level_config(level, backend=backend, swap_scope=scope)
        conv = convert(_net(), cfg, generator=torch.Generator().manual_seed(3))
        for _ in range(3):
            _step(conv.model, x, y)
        grads[level] = [p.grad.clone() for p in conv.model.parameters()]
    for a, b in zip(grads["L3"], grads["L4"]):
        assert torch.equal(a, b)


def test_set_host_scope_points_every_offloader_at_the_scope(backend):
    """The harness's way to file L4/L5 host copies (was a reach into each layer's __dict__)."""
    conv = convert(_net(), level_config("L4", backend=backend))
    filing = HostFiling()
    assert set_host_scope(conv.model, filing.scope) == 1  # one controller, one offloader
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    saved = _saved_by_layer(conv, x, filing)
    assert saved["0"][0][1] and filing.host  # the first conv's codes were made in the scope
    assert set_host_scope(conv.model, None) == 1
    filing = HostFiling()
    saved = _saved_by_layer(conv, x, filing)
    assert not filing.host  # default again: no scope
    assert set_host_scope(convert(_net(), level_config("L3", backend=backend)).model, filing.scope) == 0
    assert set_host_scope(_net(), filing.scope) == 0
