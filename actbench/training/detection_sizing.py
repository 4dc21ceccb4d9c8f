"""A detector's step on fake tensors: every data-dependent count fixed at its upper bound.

A detector's training step has counts that depend on values: how many proposals survive NMS, how many
anchors and RoIs are sampled, which FPN level each RoI pools from, the scalar checks on the targets.
Fake tensors (the ``meta`` device, actbench/measure/meta.py) hold no values, so these ops end a fake
step (``DataDependentOutputException``). :func:`upper_bound_shapes`, active only while a detector runs
on fake tensors (``Detection.forward``), answers each of them with the largest count the model's
configuration allows, so the predicted step holds at least the tensors of any real step:

- ``nms`` keeps every box, so the RPN keeps ``rpn_post_nms_top_n_train`` proposals per image (fewer
  only when the image has fewer anchors);
- ``torch.where``/``nonzero`` of a mask keeps every element, except a mask made by marking ``k``
  indices of a zero tensor (the positive/negative sampler's), which keeps those ``k``: the RPN samples
  ``rpn_batch_size_per_image`` anchors and the box head ``box_batch_size_per_image`` RoIs per image;
- positives: the union ``positive | negative`` of two sampler masks (torchvision's order) remembers
  its first part's count; what it indexes carries that count, and ``labels > 0`` of it keeps that
  many, so the box loss and the mask and keypoint heads see ``box_batch_size_per_image ×
  positive_fraction`` positives per image;
- the masks ``x == v`` made for the values ``v`` of one tensor partition it: the first keeps every
  element, the others none (each RoI pools from one FPN level; the total is what counts);
- ``unique`` finds one value (one NMS class: every box kept together);
- a scalar read (``.item()``, a tensor's truth value) is 0 / False: the transform's random choice of
  size takes the first (the only one configured), and no synthetic target box is degenerate;
- ``x[mask]`` indexes with the mask's integer indices (at the count above), so backward needs no count:
  autograd saves int64 indices where a measured step saves the bool mask (more bytes, never fewer).

Only the counts are fixed: every shape that follows from them is the model's own. Constants a module
keeps outside its parameters and buffers (the anchor generator's cell anchors) become fake as they
are met.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode

from actbench.core.compat import TorchDispatchMode, as_fake_like, data_dependent_ops, is_fake

_aten = torch.ops.aten
_SCALAR_READ, _UNIQUE = data_dependent_ops()
_ZEROS = {_aten.zeros_like, _aten.zeros, _aten.new_zeros}
_MARK = {_aten.index_put_, _aten.index_put}
_UNION = {_aten.bitwise_or, _aten.logical_or}


@contextlib.contextmanager
def upper_bound_shapes(like: torch.Tensor) -> Iterator[None]:
    """Run a detector's forward on fake tensors (``like`` is one of them) with every data-dependent
    count at its upper bound; what autograd saves for backward needs no count then."""
    with _MaskIndexAsIntegers(), UpperBoundShapes(like):
        yield


class _MaskIndexAsIntegers(TorchFunctionMode):
    """``x[mask]`` and ``x[mask] = v`` as ``x[mask.nonzero().unbind(1)]``: autograd then saves integer
    indices, so backward's ``index_put`` needs no count (it would read the mask again)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(_is_mask(i) for i in index):
                spliced = tuple(j for i in index for j in (i.nonzero().unbind(1) if _is_mask(i) else (i,)))
                args = (args[0], spliced, *args[2:])
        return func(*args, **kwargs)


class UpperBoundShapes(TorchDispatchMode):
    """Dispatch mode (on top of a fake tensor mode) giving data-dependent ops their upper-bound counts."""

    def __init__(self, like: torch.Tensor) -> None:
        super().__init__()
        #: a fake tensor of the step: real constants an op meets become fake tensors of its mode
        self._like = like
        #: id(tensor) -> (a weak reference to it, how many of its elements may be nonzero)
        self._counts: dict[int, tuple[weakref.ref, int]] = {}
        #: id(tensor) -> (a weak reference to it, how many positives it holds or selects): a sampler
        #: union's positive part, followed through the indices and labels it selects
        self._positives: dict[int, tuple[weakref.ref, int]] = {}
        #: id(tensor) -> a weak reference to it, for tensors a mask ``x == v`` has already been made of
        self._partitioned: dict[int, weakref.ref] = {}

    def _count(self, t: torch.Tensor, table: dict | None = None) -> int | None:
        entry = (self._counts if table is None else table).get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def _set_count(self, t: torch.Tensor, count: int, table: dict | None = None) -> None:
        (self._counts if table is None else table)[id(t)] = (weakref.ref(t), min(count, t.numel()))

    def _nonzero(self, mask: torch.Tensor) -> torch.Tensor:
        count = self._count(mask)
        rows = mask.numel() if count is None else count
        out = torch.zeros((rows, mask.dim()), dtype=torch.int64, device=mask.device)
        positives = self._count(mask, self._positives)
        if positives is not None:
            self._set_count(out, positives, self._positives)
        return out

    def _first_partition(self, source: torch.Tensor) -> bool:
        ref = self._partitioned.get(id(source))
        if ref is not None and ref() is source:
            return False
        self._partitioned[id(source)] = weakref.ref(source)
        return True

    def _integer_indices(self, indices: list) -> list:
        """Boolean mask indices as the integer indices :meth:`_nonzero` gives them (a k-dimensional mask:
        k index tensors, one per dimension it spans)."""
        out: list = []
        for index in indices:
            if _is_mask(index):
                out.extend(self._nonzero(index).unbind(1))
            else:
                out.append(index)
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet is _SCALAR_READ:
            return False if args[0].dtype == torch.bool else 0
        if packet is _aten.nonzero:
            return self._nonzero(args[0])
        if packet is _UNIQUE:
            x = args[0]
            inverse = args[2] if len(args) > 2 else kwargs.get("return_inverse", False)
            counts = args[3] if len(args) > 3 else kwargs.get("return_counts", False)
            return (torch.zeros(1, dtype=x.dtype, device=x.device),
                    torch.zeros(x.shape if inverse else (0,), dtype=torch.int64, device=x.device),
                    torch.full((1,) if counts else (0,), x.numel(), dtype=torch.int64, device=x.device))
        if packet is torch.ops.torchvision.nms:
            return torch.arange(args[0].shape[0], device=args[0].device)
        if packet in (_aten.index, *_MARK) and any(_is_mask(i) for i in args[1]):
            args = (args[0], self._integer_indices(list(args[1])), *args[2:])
        args = _all_fake(args, self._like)
        out = func(*args, **kwargs)
        if packet in _ZEROS:
            self._set_count(out, 0)
        elif packet in _MARK:
            before, indices = self._count(args[0]), [i for i in args[1] if i is not None]
            if before is not None and len(indices) == 1:
                self._set_count(out, before + indices[0].numel())
        elif packet is _aten.cat:
            for table in (None, self._positives):
                counts = [self._count(t, table) for t in args[0]]
                if counts and all(c is not None for c in counts):
                    self._set_count(out, sum(counts), table)
        elif packet in _UNION:
            counts = [self._count(t) for t in args[:2] if isinstance(t, torch.Tensor)]
            if len(counts) == 2 and all(c is not None for c in counts):
                self._set_count(out, sum(counts))
                self._set_count(out, counts[0], self._positives)
        elif packet is _aten.unbind:
            positives = self._count(args[0], self._positives)
            if positives is not None:
                for part in out:
                    self._set_count(part, positives, self._positives)
        elif packet is _aten.index:
            indices = [i for i in args[1] if i is not None]
            positives = self._count(indices[0], self._positives) if len(indices) == 1 else None
            if positives is not None:
                self._set_count(out, positives, self._positives)
        elif packet is _aten.gt and not isinstance(args[1], torch.Tensor) and args[1] == 0:
            positives = self._count(args[0], self._positives)
            if positives is not None:
                self._set_count(out, positives)
        elif packet is _aten.eq and isinstance(args[0], torch.Tensor) and not isinstance(args[1], torch.Tensor):
            if not self._first_partition(args[0]):
                self._set_count(out, 0)
        return out


def _all_fake(args: tuple, fake: torch.Tensor) -> tuple:
    """``args`` with real tensors (at the top level or in a list) made fake like ``fake``: constants a
    module keeps outside its parameters and buffers (the anchor generator's cell anchors)."""
    flat = [a for arg in args for a in (arg if isinstance(arg, (list, tuple)) else (arg,))]
    if all(is_fake(a) for a in flat if isinstance(a, torch.Tensor)):
        return args

    def convert(a):
        return as_fake_like(a, fake) if isinstance(a, torch.Tensor) and not is_fake(a) else a

    return tuple(type(arg)(convert(a) for a in arg) if isinstance(arg, (list, tuple)) else convert(arg)
                 for arg in args)


def _is_mask(index: object) -> bool:
    """A boolean (or byte) mask used as an index: its count of selected elements is data."""
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)
