"""RAFT's correlation lookup keeping its sampling centres instead of its sampling grids.

torchvision's ``CorrBlock.index_pyramid`` samples every correlation level at a (2r+1)^2 square around
each pixel's centre: ``grid_sample`` then saves a grid of (2r+1)^2 x 2 floats per pixel (648 bytes at
radius 4), per level and per update. A grid is a position, so the hook path keeps it exact
(``saved_arguments.py``); at L3 those grids were 46% of raft_small's saved bytes at 368x496. The grid
is the centre plus a constant square, so :class:`SampleAroundFunction` keeps the centre (8 bytes a
pixel) and rebuilds the same grid, with the same float operations, in backward. The correlation
level itself is saved as before, through the hook path (once per level: its packing is shared by
every update). Nothing is rounded that was not before; at L0 the gradients are torch's, bit for bit.
"""

from __future__ import annotations

import torch
from torchvision.models.optical_flow.raft import CorrBlock

from actbench.actnn.controller import SAVED_ROLE
from actbench.actnn.hooks import SKIP_POSITION


def sampling_grid(centres: torch.Tensor, radius: int, height: int, width: int) -> torch.Tensor:
    """The normalised grid torchvision's ``CorrBlock`` samples a level of ``height`` x ``width`` at:
    ``centres`` [P, 1, 1, 2] (x, y in pixels) plus the square of offsets -radius..radius, as
    ``optical_flow._utils.grid_sample`` normalises it (same operations, same order: same bits)."""
    side = 2 * radius + 1
    di = torch.linspace(-radius, radius, side)
    dj = torch.linspace(-radius, radius, side)
    delta = torch.stack(torch.meshgrid(di, dj, indexing="ij"), dim=-1).to(centres.device).view(1, side, side, 2)
    xgrid, ygrid = (centres + delta).split([1, 1], dim=-1)
    xgrid = 2 * xgrid / (width - 1) - 1
    if height > 1:
        ygrid = 2 * ygrid / (height - 1) - 1
    return torch.cat([xgrid, ygrid], dim=-1)


class SampleAroundFunction(torch.autograd.Function):
    """Bilinear samples of ``volume`` [P, C, H, W] around ``centres`` [P, 1, 1, 2] (aligned corners,
    zero padding), keeping the centres instead of the grid."""

    @staticmethod
    def forward(ctx, volume, centres, radius: int):
        height, width = volume.shape[-2:]
        grid = sampling_grid(centres, radius, height, width)
        out = torch.nn.functional.grid_sample(volume, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
        kept = centres.detach()
        setattr(kept, SAVED_ROLE, SKIP_POSITION)  # exact: the hook path passes it through, filed as a position
        ctx.save_for_backward(volume, kept)
        ctx.radius = radius
        return out

    @staticmethod
    def backward(ctx, grad):
        volume, centres = ctx.saved_tensors
        needs_volume, needs_centres = ctx.needs_input_grad[:2]
        with torch.enable_grad():
            volume = volume.detach().requires_grad_(needs_volume)
            centres = centres.detach().requires_grad_(needs_centres)
            grid = sampling_grid(centres, ctx.radius, *volume.shape[-2:])
            out = torch.nn.functional.grid_sample(volume, grid, mode="bilinear", padding_mode="zeros",
                                                  align_corners=True)
            wanted = [t for t, needed in ((volume, needs_volume), (centres, needs_centres)) if needed]
            found = iter(torch.autograd.grad(out, wanted, grad))
        return (next(found) if needs_volume else None), (next(found) if needs_centres else None), None


class QCorrBlock(CorrBlock):
    """``CorrBlock`` whose lookup keeps centres, not grids (see the module doc); the pyramid, its
    building and the output are torchvision's."""

    def index_pyramid(self, centroids_coords):
        batch_size, _, h, w = centroids_coords.shape
        centres = centroids_coords.permute(0, 2, 3, 1).reshape(batch_size * h * w, 1, 1, 2)
        indexed = []
        for corr_volume in self.corr_pyramid:
            indexed.append(SampleAroundFunction.apply(corr_volume, centres, self.radius).view(batch_size, h, w, -1))
            centres = centres / 2
        corr_features = torch.cat(indexed, dim=-1).permute(0, 3, 1, 2).contiguous()
        expected = (batch_size, self.out_channels, h, w)
        if corr_features.shape != expected:
            raise ValueError(f"QCorrBlock: correlation features of shape {tuple(corr_features.shape)}, "
                             f"expected {expected}")
        return corr_features
