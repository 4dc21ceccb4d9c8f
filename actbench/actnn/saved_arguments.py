"""Saved tensors whose treatment is fixed by the op argument they were passed as.

**Positions** (boxes, sampling grids, offsets, box regression targets) are kept exact. An op that
reads a tensor as coordinates uses it in backward to decide *where* a gradient goes, not how large
it is (a regression loss's target decides where its prediction is pulled). Quantizing
it is not zero-mean noise on a gradient: boxes move by pixels, a 2-bit batch index of a batch of 2
can dequantize to 30 or 40 (an out-of-bounds write in roi_align's backward), and a grid samples
elsewhere. Every floating argument in :data:`PROTECTED_POSITIONS` is kept as it is by the
saved-tensor hook path, at every level; the census files it as ``positions: kept exact``. Integer
and boolean indices (``index``, ``gather``, ``scatter``, ``index_select``, ``embedding``, max-pool
argmax) need no entry: no path ever quantizes a tensor that is not floating. No twin keeps a
position either (twins save layer inputs, masks, derivatives and argmax), and ``interpolate`` and
``affine_grid`` save no tensor at all (their backward needs only sizes).

**Queries and keys** of functional attention (:data:`QUERY_KEY_ARGUMENTS`) are packed at
``LevelConfig.qk_bits``, as the attention twin packs them: backward recomputes the softmax from
them, so their rounding biases the gradient instead of only adding variance.

The op is recognised by the function the rerouting ``TorchFunctionMode`` of ``hooks.py`` sees being
called (torchvision's ops arrive as ``torch.ops.torchvision.*``, ``F.grid_sample`` as itself), and
a saved tensor takes an argument's role when it shares that argument's storage while the call
runs. Details: docs/design.md §3 ("Positions are never quantized").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from actbench.core import compat

ROLE_POSITION = "position"
ROLE_QUERY_KEY = "query/key"


@dataclass(frozen=True)
class SavedArgument:
    """One argument with a fixed role: ``op`` as ``"ns::name"`` (torch.ops, and for ``aten`` also
    ``torch.<name>``) or a Python function's dotted path; ``index``/``argument`` locate it."""

    op: str
    index: int
    argument: str
    role: str
    reason: str


_ROIS = "rows of (batch index, x1, y1, x2, y2): backward writes each row's gradient into that box of that image"
_GRID = "normalised (x, y[, z]) sampling points: backward scatters the gradient to the pixels around each"
_BOX_TARGET = ("a regression target (a detector's encoded box): backward's gradient is the prediction's distance "
               "to it, so a rounded target moves where the box is pulled")


def _position(op: str, index: int, argument: str, reason: str) -> SavedArgument:
    return SavedArgument(op, index, argument, ROLE_POSITION, reason)


#: Every (op, argument) whose saved tensor is a position, each with why: never quantized.
PROTECTED_POSITIONS: tuple[SavedArgument, ...] = (
    _position("torchvision::roi_align", 1, "rois", _ROIS),
    _position("torchvision::roi_pool", 1, "rois", _ROIS),
    _position("torchvision::ps_roi_align", 1, "rois", _ROIS),
    _position("torchvision::ps_roi_pool", 1, "rois", _ROIS),
    _position("torchvision::deform_conv2d", 2, "offset", "per-tap sampling offsets: where each kernel tap reads"),
    _position("torch.nn.functional.grid_sample", 1, "grid", _GRID),
    _position("aten::grid_sampler", 1, "grid", _GRID),
    _position("aten::grid_sampler_2d", 1, "grid", _GRID),
    _position("aten::grid_sampler_3d", 1, "grid", _GRID),
    _position("aten::cudnn_grid_sampler", 1, "grid", _GRID),
    _position("torch.nn.functional.smooth_l1_loss", 1, "target", _BOX_TARGET),
    _position("aten::smooth_l1_loss", 1, "target", _BOX_TARGET),
    _position("torch.nn.functional.l1_loss", 1, "target", _BOX_TARGET),
    _position("aten::l1_loss", 1, "target", _BOX_TARGET),
)

_QK = "the softmax is recomputed from it in backward: rounding through exp biases the gradient"

#: Attention's queries and keys passed to functional attention: packed at ``qk_bits``.
QUERY_KEY_ARGUMENTS: tuple[SavedArgument, ...] = (
    SavedArgument("torch.nn.functional.scaled_dot_product_attention", 0, "query", ROLE_QUERY_KEY, _QK),
    SavedArgument("torch.nn.functional.scaled_dot_product_attention", 1, "key", ROLE_QUERY_KEY, _QK),
    SavedArgument("aten::scaled_dot_product_attention", 0, "query", ROLE_QUERY_KEY, _QK),
    SavedArgument("aten::scaled_dot_product_attention", 1, "key", ROLE_QUERY_KEY, _QK),
)

#: Attention written as ``q @ k.transpose(-2, -1)`` (Swin3D's ``q.matmul``, MViT's ``torch.matmul``): a
#: batched matmul whose right operand is its last two dims transposed; or as an einsum of the same
#: product, ``"...id,...jd->...ij"`` (MaxViT's ``"B G H I D, B G H J D -> B G H I J"``). What it saves (its operands, or
#: the copies its batched form makes of them) are the queries and the keys: packed at ``qk_bits``, as
#: the same attention written with ``F.scaled_dot_product_attention`` keeps them. (Here the softmax's
#: output is saved on its own, so backward reads Q and K only linearly: at ``act_bits`` they would add
#: variance, not bias; ``qk_bits`` keeps the two ways of writing attention at the same bits.)
QUERY_KEY_PRODUCTS: tuple[str, ...] = ("torch.matmul", "torch.Tensor.matmul", "torch.einsum")

#: where a callable's role arguments are: ((index, name, role), ...)
Locations = tuple[tuple[int, str, str], ...]


def argument_roles(table: tuple[SavedArgument, ...] = PROTECTED_POSITIONS + QUERY_KEY_ARGUMENTS,
                   ) -> dict[Callable, Locations]:
    """callable -> where its role arguments are, for the ops of ``table`` that are loaded now (a fresh
    dict: each packer builds its own at every training forward, so a library loaded after
    conversion is covered)."""
    out: dict[Callable, Locations] = {}
    for entry in table:
        for func in compat.torch_callables(entry.op):
            out[func] = (*out.get(func, ()), (entry.index, entry.argument, entry.role))
    return out


#: a marked argument: (storage identity, view or None, role); positions match any view of the
#: storage (whatever an op saves from a position stays exact), queries and keys only their own view
#: (a value that is a view of the same qkv projection is not a key); a storage of None marks
#: everything the call saves (a query-key product: :func:`query_key_product_marks`)
Mark = tuple[int | None, tuple | None, str]


def query_key_product_marks(func: Callable, args: tuple, kwargs: dict,
                            products: tuple[Callable, ...]) -> list[Mark] | None:
    """The mark of a call of one of ``products`` (:func:`query_key_products`) that multiplies by a
    transposed key (both operands batched, the key no parameter), or None for any other call."""
    if func not in products or len(args) < 2 or kwargs:
        return None
    scores = None
    if isinstance(args[0], str):  # einsum(equation, q, k) or einsum(equation, [q, k]): the equation says it
        operands = args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]
        if len(operands) != 2 or not is_score_equation(args[0]):
            return None
        args, scores = tuple(operands), True
    query, key = args[0], args[1]
    if not (isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor)) or min(query.dim(), key.dim()) < 3:
        return None
    if isinstance(key, torch.nn.Parameter) or not (query.is_floating_point() and key.is_floating_point()):
        return None
    if scores is None:  # matmul: the right operand is a key when it is its last two dims transposed
        scores = key.stride(-2) == 1 and key.stride(-1) != 1 and key.shape[-1] > 1
    return [(None, None, ROLE_QUERY_KEY)] if scores else None


def is_score_equation(equation: str) -> bool:
    """Whether an einsum equation is attention's scores: two operands with the same leading indices,
    contracted over their last index, giving their second-to-last indices in order (``bhid,bhjd->bhij``)."""
    eq = equation.replace(" ", "")
    if eq.count("->") != 1 or "." in eq:
        return False
    inputs, out = eq.split("->")
    parts = inputs.split(",")
    if len(parts) != 2:
        return False
    a, b = parts
    return (len(a) == len(b) == len(out) >= 3 and a[-1] == b[-1] and a[-1] not in out and a[-2] != b[-2]
            and a[:-2] == b[:-2] == out[:-2] and out[-2:] == a[-2] + b[-2])


def query_key_products() -> tuple[Callable, ...]:
    """The callables of :data:`QUERY_KEY_PRODUCTS`."""
    return tuple(f for op in QUERY_KEY_PRODUCTS for f in compat.torch_callables(op))


def view_of(t: torch.Tensor) -> tuple:
    """Which view of its storage ``t`` is: (offset, shape, stride)."""
    return (t.storage_offset(), tuple(t.shape), tuple(t.stride()))


def marks(args: tuple, kwargs: dict, locations: Locations) -> list[Mark]:
    """The marks of the tensors a call passes at ``locations`` (positional or by name)."""
    out = []
    for index, name, role in locations:
        value = args[index] if len(args) > index else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            out.append((compat.storage_identity(value), None if role == ROLE_POSITION else view_of(value), role))
    return out


def role_of(t: torch.Tensor, marked: list[Mark]) -> str | None:
    """The role of saved tensor ``t`` under the calls running now (innermost first), or None."""
    storage = compat.storage_identity(t)
    for key, view, role in reversed(marked):
        if key is None or (key == storage and (view is None or view == view_of(t))):
            return role
    return None
