"""Host round trips of an L3 training step: at most one per step (actbench/actnn/controller.py).

A read of tensor data on the host (``int(t)``, ``t.item()``, ``t.tolist()``, ``t.numpy()``) is a
device synchronisation on a GPU: the host waits for every queued kernel. On the CPU the same reads
happen, so counting them here counts the syncs a GPU step would make. ``int``/``item`` reach ATen as
``aten._local_scalar_dense`` (seen by a dispatch mode); ``tolist``/``numpy`` read memory without an
ATen op, so the test wraps them. Reads made with dispatch modes switched off are host bookkeeping
on CPU tensors (the Philox seed drawn from a CPU generator, the greedy allocator's output), not
device reads, and are not counted.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from actbench.actnn import convert, level_config

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


class HostReads(TorchDispatchMode):
    """Counts host reads of tensor data while active (see the module docstring)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        self.reads: list[str] = []
        self.inside = False
        for name in ("tolist", "numpy"):
            original = getattr(torch.Tensor, name)

            def wrapped(t, *args, _original=original, _name=name, **kwargs):
                # Under a TorchFunctionMode (ActNN's functional rerouting) the C method calls the
                # patched attribute again: count the outermost call only.
                if _get_current_dispatch_mode() is self and not self.inside:
                    self.reads.append(f"Tensor.{_name} {tuple(t.shape)}")
                outer, self.inside = self.inside, True
                try:
                    return _original(t, *args, **kwargs)
                finally:
                    self.inside = outer

            monkeypatch.setattr(torch.Tensor, name, wrapped)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads.append(f"{func} {tuple(args[0].shape)}")
        return func(*args, **(kwargs or {}))


def test_l3_resnet18_step_reads_the_host_at_most_once(backend, monkeypatch):
    """Before: every mixed-precision layer read its per-sample bits back (min, max, sum) — 6-9 reads
    a ResNet-18 step; the controller's allocation is the only read left, once per step."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    conv = convert(model, level_config("L3", backend=backend), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(conv.model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(8, 3, 32, 32)
    x[:2] *= 10  # samples of different ranges: the allocation is genuinely per-sample
    y = torch.randint(0, 10, (8,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(conv.model(x), y)
        loss.backward()
        opt.step()

    step()  # first step: uniform allocation (no statistics yet)
    reads, counts = HostReads(monkeypatch), []
    for _ in range(2):  # adaptive steps: per-sample widths differ (tensors of bits)
        reads.reads = []
        with reads:
            step()
        counts.append(reads.reads)
    print("host reads per adaptive step:", [len(r) for r in counts])
    assert any(len(set(a.bits_desc)) > 1 for a in conv.controller.allocation().values())  # mixed widths ran
    assert all(len(r) <= 1 for r in counts), counts


@pytest.mark.parametrize("level", ["L0", "L3"])
def test_twins_run_their_own_calls_outside_the_rerouting_mode(monkeypatch, level):
    """The functional-rerouting mode sees only calls made outside twins (torchvision's ``torch.flatten``,
    a residual add), not each twin's and its controller's own torch calls: every call a mode sees
    costs the host a Python round trip, thousands a step, which on a GPU the device waits for."""
    from actbench.actnn import hooks

    seen: list[str] = []
    original = hooks._FunctionalTwins.__torch_function__

    def counting(self, func, types, args=(), kwargs=None):
        seen.append(getattr(func, "__name__", "?"))
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(hooks._FunctionalTwins, "__torch_function__", counting)
    torch.manual_seed(0)
    model = convert(torchvision.models.resnet18(num_classes=4), level).model
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    for _ in range(2):
        F.cross_entropy(model(x), y).backward()
    twins = sum(1 for m in model.modules() if m is not model and not any(True for _ in m.children()))
    assert 0 < len(seen) < twins, (len(seen), twins, seen[:20])
