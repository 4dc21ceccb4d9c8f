"""3-D max pool keeping an int8 argmax inside each window, as the 2-D twin does.

aten's ``max_pool3d_with_indices`` saves its whole input (its backward reads only the input's
sizes) and int64 indices into the input volume: 8 bytes per output where an offset inside a window
of at most 128 positions fits one. The compiled kernels are 2-D only, so this twin is plain
PyTorch: forward runs aten's pool and turns its indices into window offsets (int64 temporaries,
freed before the step goes on), backward turns the offsets back into indices for aten's backward,
so the gradient is aten's own, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from actbench.actnn.controller import LayerSlot
from actbench.actnn.functions import load_argmax, save_argmax

Triple = tuple[int, int, int]


@dataclass(frozen=True)
class Pool3dParams:
    kernel_size: Triple
    stride: Triple
    padding: Triple
    dilation: Triple
    ceil_mode: bool


def triple(value) -> Triple:
    """An int or a sequence of 1 or 3 ints -> (t, h, w)."""
    if isinstance(value, int):
        return (value, value, value)
    values = tuple(int(v) for v in value)
    return values * 3 if len(values) == 1 else values  # type: ignore[return-value]


def _window_starts(out_shape: torch.Size, p: Pool3dParams, device: torch.device) -> list[torch.Tensor]:
    """Per output axis (t, h, w): the input coordinate where each output's window starts,
    shaped to broadcast over the output's last three dims."""
    starts = []
    for axis in range(3):
        size = out_shape[-3 + axis]
        start = torch.arange(size, device=device) * p.stride[axis] - p.padding[axis]
        starts.append(start.view([size if a == axis else 1 for a in range(3)]))
    return starts


def window_offsets(indices: torch.Tensor, in_shape: torch.Size, p: Pool3dParams) -> torch.Tensor:
    """aten's flat int64 indices into each (D, H, W) volume -> int8 offsets inside the windows."""
    _, height, width = in_shape[-3:]
    coords = (indices // (height * width), (indices // width) % height, indices % width)
    offset = torch.zeros_like(indices)
    for axis, (coord, start) in enumerate(zip(coords, _window_starts(indices.shape, p, indices.device))):
        offset = offset * p.kernel_size[axis] + (coord - start) // p.dilation[axis]
    return offset.to(torch.int8)


def flat_indices(offsets: torch.Tensor, in_shape: torch.Size, p: Pool3dParams) -> torch.Tensor:
    """The inverse of :func:`window_offsets`: int8 window offsets -> aten's flat int64 indices."""
    _, height, width = in_shape[-3:]
    kt, kh, kw = p.kernel_size
    offset = offsets.to(torch.int64)
    steps = (offset // (kh * kw), (offset // kw) % kh, offset % kw)
    starts = _window_starts(offsets.shape, p, offsets.device)
    t, h, w = (start + step * p.dilation[axis] for axis, (step, start) in enumerate(zip(steps, starts)))
    return (t * height + h) * width + w


class MaxPool3dFunction(torch.autograd.Function):
    """3-D max pool (x [N, C, D, H, W] or [C, D, H, W]) keeping the int8 offset of each output's
    maximum inside its window (at most 128 positions) and the input's shape."""

    @staticmethod
    def forward(ctx, x, p: Pool3dParams, slot: LayerSlot):
        out, indices = F.max_pool3d(x, p.kernel_size, p.stride, p.padding, p.dilation, p.ceil_mode,
                                    return_indices=True)
        save_argmax(ctx, slot, window_offsets(indices, x.shape, p), x.shape, p)
        return out

    @staticmethod
    def backward(ctx, grad):
        p, offsets = ctx.p, load_argmax(ctx)
        like = torch.empty(ctx.spec.shape, dtype=grad.dtype, device=grad.device)
        gx = torch.ops.aten.max_pool3d_with_indices_backward(
            grad.contiguous(), like, list(p.kernel_size), list(p.stride), list(p.padding), list(p.dilation),
            p.ceil_mode, flat_indices(offsets, ctx.spec.shape, p))
        return gx, None, None
