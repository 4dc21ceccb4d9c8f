"""The only module of actbench that touches private PyTorch APIs.

Private names move between PyTorch releases; keeping every use here means a torch upgrade breaks one
file, and its tests say which name moved. Public APIs (FlopCounterMode, saved_tensors_hooks,
checkpoint) are imported where they are used.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch

# TorchDispatchMode sees every ATen op with its real output tensors: the live-storage tracker builds
# on it because it counts real storages (views dedup to their base) rather than estimating.
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

__all__ = ["TorchDispatchMode", "tree_flatten", "dispatch_modes_disabled", "memtracker_class", "tensor_version",
           "fake_tensor_mode", "fake_copy_mode", "is_fake", "storage_identity"]


def tensor_version(tensor: "torch.Tensor") -> int:
    """In-place modification counter of a tensor's data (``Tensor._version``, no public equivalent)."""
    return tensor._version


@contextlib.contextmanager
def dispatch_modes_disabled() -> Iterator[None]:
    """Run a block with every active dispatch mode switched off (bookkeeping inside a mode)."""
    with _disable_current_modes():
        yield


def memtracker_class() -> type:
    """PyTorch's own MemTracker (torch.distributed._tools), for cross-checks; not used to measure.

    actbench measures with its own tracker because MemTracker's category split (it files gradients
    created inside backward as temporaries) does not match docs/design.md's columns.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    return MemTracker


# --- the meta device: fake tensors ---------------------------------------------------------------
# FakeTensorMode runs every ATen op through its meta kernel (the extension's through the fake kernels
# in actbench.ops) on tensors that have a device, shape and dtype but no data: a training step is
# sized without compute or memory. It is private API (torch._subclasses), hence here.


def fake_tensor_mode() -> "contextlib.AbstractContextManager":
    """A fresh FakeTensorMode; tensors created inside it (parameters included) are fake."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def fake_copy_mode(mode: object) -> "contextlib.AbstractContextManager":
    """Makes ``copy.deepcopy`` of modules with fake parameters work (ActNN's convert copies the model)."""
    from torch._subclasses.fake_tensor import FakeCopyMode

    return FakeCopyMode(mode)


def is_fake(tensor: object) -> bool:
    """True for a fake tensor (no data: reading values back is impossible)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


def storage_identity(tensor: "torch.Tensor") -> int:
    """An id of the storage behind ``tensor``, equal for views, distinct per live storage.

    ``data_ptr()`` would do on real tensors, but every fake tensor's storage reports 0; the address
    of the C++ StorageImpl (``_cdata``) is unique on both.
    """
    return tensor.untyped_storage()._cdata
