"""torchvision's feature pyramid (FPN) with its top-down temporaries freed as they are used.

Under ActNN a detector's peak is no longer its saved activations but what its forward holds at once.
Faster R-CNN at 800x1333 and L3 peaks inside ``FeaturePyramidNetwork.forward``, at the finest
level's output conv: torchvision's loop keeps that level's lateral output and its upsampled top-down
input alive as locals beside their sum (two 256-channel maps at 1/4 of the image, 68 MB a sample),
though nothing reads them again. :class:`QFeaturePyramidNetwork` adds the upsampled map into the
lateral one in place and drops both names at once: the same operations on the same values, so the
same bits, without the two extra maps. Neither is saved for backward (a convolution keeps its input;
nearest upsampling and the sum keep nothing), so autograd is unchanged. An fp32 step peaks at the end
of its forward, where these temporaries are gone already: only a converted model's peak moves.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch.nn import functional as F
from torchvision.ops.feature_pyramid_network import FeaturePyramidNetwork


class QFeaturePyramidNetwork(FeaturePyramidNetwork):
    """``FeaturePyramidNetwork`` whose forward frees each level's temporaries (see the module doc)."""

    def forward(self, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        names = list(x.keys())
        features = list(x.values())
        last_inner = self.get_result_from_inner_blocks(features[-1], -1)
        results = [self.get_result_from_layer_blocks(last_inner, -1)]
        for idx in range(len(features) - 2, -1, -1):
            lateral = self.get_result_from_inner_blocks(features[idx], idx)
            last_inner = lateral.add_(F.interpolate(last_inner, size=lateral.shape[-2:], mode="nearest"))
            del lateral
            results.insert(0, self.get_result_from_layer_blocks(last_inner, idx))
        if self.extra_blocks is not None:
            results, names = self.extra_blocks(results, features, names)
        return OrderedDict(zip(names, results))
