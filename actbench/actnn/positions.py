"""Saved tensors that are positions (boxes, sampling grids, offsets) are kept exact.

An op that reads a tensor as coordinates uses it in backward to decide *where* a gradient goes, not
how large it is. Quantizing it is not zero-mean noise on a gradient: boxes move by pixels, a 2-bit
batch index of a batch of 2 dequantizes to 30 or 40 (an out-of-bounds write in roi_align's
backward), and a grid samples elsewhere. So every floating argument listed in
:data:`PROTECTED_POSITIONS` is kept as it is by the saved-tensor hook path, at every level; the
census files it as ``positions: kept exact``. Integer and boolean indices (``index``, ``gather``,
``scatter``, ``index_select``, ``embedding``, max-pool argmax) need no entry: no path ever
quantizes a tensor that is not floating. No twin keeps a position either: twins save layer inputs,
masks, derivatives and argmax. ``interpolate`` and ``affine_grid`` save no tensor at all (their
backward needs only sizes).

The op is recognised by the function the rerouting ``TorchFunctionMode`` of ``hooks.py`` sees being
called (torchvision's ops arrive as ``torch.ops.torchvision.*``, ``F.grid_sample`` as itself), and
a saved tensor is a position when it shares the storage of such an argument while that call runs.
Details: docs/design.md §3 ("Positions").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from actbench.core import compat


@dataclass(frozen=True)
class Position:
    """One protected argument: ``op`` as ``"ns::name"`` (torch.ops, and for ``aten`` also
    ``torch.<name>``) or a Python function's dotted path; ``index``/``argument`` locate it."""

    op: str
    index: int
    argument: str
    reason: str


_ROIS = "rows of (batch index, x1, y1, x2, y2): backward writes each row's gradient into that box of that image"
_GRID = "normalised (x, y[, z]) sampling points: backward scatters the gradient to the pixels around each"

#: Every (op, argument) whose saved tensor is a position, each with why.
PROTECTED_POSITIONS: tuple[Position, ...] = (
    Position("torchvision::roi_align", 1, "rois", _ROIS),
    Position("torchvision::roi_pool", 1, "rois", _ROIS),
    Position("torchvision::ps_roi_align", 1, "rois", _ROIS),
    Position("torchvision::ps_roi_pool", 1, "rois", _ROIS),
    Position("torchvision::deform_conv2d", 2, "offset", "per-tap sampling offsets: where each kernel tap reads"),
    Position("torch.nn.functional.grid_sample", 1, "grid", _GRID),
    Position("aten::grid_sampler", 1, "grid", _GRID),
    Position("aten::grid_sampler_2d", 1, "grid", _GRID),
    Position("aten::grid_sampler_3d", 1, "grid", _GRID),
    Position("aten::cudnn_grid_sampler", 1, "grid", _GRID),
)

#: argument locations of a callable's positions: ((index, name), ...)
Locations = tuple[tuple[int, str], ...]


def position_ops(table: tuple[Position, ...] = PROTECTED_POSITIONS) -> dict[Callable, Locations]:
    """callable -> where its position arguments are, for the ops of ``table`` that are loaded now
    (a fresh dict: each packer builds its own at every training forward, so a library loaded after
    conversion is covered)."""
    out: dict[Callable, Locations] = {}
    for entry in table:
        for func in compat.torch_callables(entry.op):
            out[func] = (*out.get(func, ()), (entry.index, entry.argument))
    return out


def position_storages(args: tuple, kwargs: dict, locations: Locations) -> list[int]:
    """Storage identities of the tensors a call passes at ``locations`` (positional or by name)."""
    keys = []
    for index, name in locations:
        value = args[index] if len(args) > index else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            keys.append(compat.storage_identity(value))
    return keys
