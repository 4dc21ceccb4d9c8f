"""Optical flow: torchvision's RAFT, trained on frame pairs as its reference trains it.

torchvision's ``references/optical_flow/train.py`` (RAFT, Teed & Deng, ECCV 2020): the model takes two
frames and returns one upsampled flow [B, 2, H, W] per update of its recurrent unit (12 in training);
the loss is the sequence loss of the reference's ``utils.py``: the L1 distance of every prediction to
the ground-truth flow, averaged over all pixels with invalid ones (and flows of norm >= 400) zeroed,
weighted gamma^(N-1-i) with gamma 0.8, so later updates count more. The default size is the
FlyingChairs crop, 368x496.

RAFT computes its features at 1/8 of the input and pools their correlation volume three times, so a
side must be a multiple of 8 and at least 128 (torchvision's own check fails later, inside forward).

Under ActNN the correlation lookup's coordinates stay exact: every update samples the pyramid with
``grid_sample`` at coordinates RAFT detaches, and its grid is a position (``actnn/saved_arguments.py``);
tests/test_task_optical_flow.py holds an L3 step's gradients to one that keeps every detached tensor
exact. Those grids (4 levels x 12 updates x B x H/8 x W/8 x (2r+1)^2 x 2 floats) are the largest
share of what L3 leaves uncompressed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actbench.schema import InputSize, ModelSpec
from actbench.training.tasks.registry import Task, register

if TYPE_CHECKING:
    import torch
    from torch import nn

#: ``torchvision.models.list_models(module=torchvision.models.optical_flow)`` of torchvision 0.29.1, sorted.
TORCHVISION_FLOW_MODELS: tuple[str, ...] = ("raft_large", "raft_small")
#: Updates of the recurrent unit per forward: the reference trains with 12 (``--num_flow_updates``).
NUM_FLOW_UPDATES = 12
#: Discount of the sequence loss over updates: prediction i of N weighs GAMMA^(N-1-i).
GAMMA = 0.8
#: Ground-truth flows of this norm or more are left out of the loss (extremely large displacements).
MAX_FLOW = 400.0
#: RAFT's features are 1/8 of the input: each side is a multiple of this.
STRIDE = 8
#: 1/8-resolution features pooled 3 times (4 pyramid levels) must keep 2 pixels: 8 * 2 * 2^3.
MIN_SIDE = 128
#: Share of target pixels marked valid: sparse ground truth (KITTI's) is what the mask is for.
VALID_SHARE = 0.9
#: Spread of the synthetic ground-truth flow, in pixels (FlyingChairs' flows are tens of pixels).
FLOW_SCALE = 10.0
#: The reference's optimizer for FlyingChairs (its README's command): AdamW, lr 4e-4, weight decay 1e-4.
#: SGD at the harness's lr 0.1 makes RAFT's loss diverge within a few steps; AdamW's two moment buffers
#: per parameter are part of the step's memory.
ADAMW_LR = 4e-4
ADAMW_WEIGHT_DECAY = 1e-4


def size_problem(size: InputSize) -> str | None:
    """Why RAFT cannot train at ``size`` (sides multiples of 8, at least 128), or None."""
    for name, value in (("height", size.height), ("width", size.width)):
        if value % STRIDE or value < MIN_SIDE:
            return (f"RAFT's image {name} must be a multiple of {STRIDE} and at least {MIN_SIDE} pixels "
                    f"(features at 1/8, a 4-level correlation pyramid), got {size.text()}")
    return None


def sequence_loss(predictions: list["torch.Tensor"], flow: "torch.Tensor", valid: "torch.Tensor",
                  gamma: float = GAMMA, max_flow: float = MAX_FLOW) -> "torch.Tensor":
    """RAFT's sequence loss as the reference computes it: sum over i of gamma^(N-1-i) times the mean
    over (B, 2, H, W) of |prediction_i - flow|, with pixels not ``valid`` or of flow norm >= ``max_flow``
    counted as 0 (they stay in the mean's denominator, as in the reference)."""
    import torch

    kept = (valid & (flow.square().sum(dim=1).sqrt() < max_flow))[:, None]
    stacked = torch.stack(predictions)  # [N, B, 2, H, W]
    per_update = ((stacked - flow).abs() * kept).mean(dim=(1, 2, 3, 4))
    n = stacked.shape[0]
    weights = gamma ** torch.arange(n - 1, -1, -1, device=flow.device)
    return (per_update * weights).sum()


def drop_correlation_pyramids(model: "nn.Module") -> None:
    """Let go of the correlation pyramid torchvision's ``CorrBlock`` keeps as an attribute after forward.

    Backward reads the pyramid from what autograd saved (grid_sample's input), never from the
    attribute, so dropping it changes no number. Kept, the attribute holds a full-precision copy of
    every level (B x (H/8 x W/8)^2 x 4/3 floats: 41 MiB a pair at 368x496) alive through backward
    beside the 2-bit copy the saved-tensor hook path packs under L1-L5 (raft_small at L3, 368x496:
    152 MiB of activations instead of 111 MiB), and from one step into the next under every strategy:
    a GPU's allocator would hold it, while the storages a cpu or meta step tracks do not include it.
    """
    from torchvision.models.optical_flow.raft import CorrBlock

    for module in model.modules():
        if isinstance(module, CorrBlock):
            module.corr_pyramid = []


@register
class OpticalFlow(Task):
    name = "optical_flow"
    description = ("frame pairs to a flow per pixel (RAFT, 12 updates); sequence loss: L1 per update, "
                   "weighted 0.8^(11-i)")
    sample = "frame pair"
    pinned_models = TORCHVISION_FLOW_MODELS
    #: the reference's FlyingChairs crop
    default_size = InputSize(368, 496)

    def installed_models(self) -> tuple[str, ...]:
        import torchvision

        return tuple(sorted(torchvision.models.list_models(module=torchvision.models.optical_flow)))

    def size_problem(self, model: str, size: InputSize) -> str | None:
        return size_problem(size)

    def optimizer(self, params: Any, lr: float, momentum: float) -> Any:
        """AdamW as the reference trains RAFT (the harness's SGD settings do not apply)."""
        import torch

        return torch.optim.AdamW(params, lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY)


    def build(self, spec: ModelSpec, size: InputSize) -> "nn.Module":
        import torchvision

        from actbench.training.model_names import check_growth

        check_growth(spec)
        self.require_size(spec.name, size)
        return torchvision.models.get_model(spec.name, weights=None)

    def batch(self, spec: ModelSpec, batch_size: int, size: InputSize, device: "torch.device",
              seed: int) -> tuple[Any, Any]:
        """Frames ((image1, image2), each [B, 3, H, W] float32) and targets (flow [B, 2, H, W] float32,
        valid [B, H, W] bool), made from ``seed`` on ``device``. image2 is image1 with noise (two frames
        of one scene); a tenth of the pixels is invalid."""
        import torch

        size = InputSize.of(size)
        self.require_size(spec.name, size)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        shape = (batch_size, 3, size.height, size.width)
        image1 = torch.randn(shape, generator=gen)
        image2 = image1 + 0.1 * torch.randn(shape, generator=gen)
        flow = FLOW_SCALE * torch.randn(batch_size, 2, size.height, size.width, generator=gen)
        valid = torch.rand(batch_size, size.height, size.width, generator=gen) < VALID_SHARE
        return (image1.to(device), image2.to(device)), (flow.to(device), valid.to(device))

    def forward(self, model: "nn.Module", inputs: Any, targets: Any) -> Any:
        """The flow predictions of :data:`NUM_FLOW_UPDATES` updates; the correlation pyramid is dropped
        from the model afterwards (:func:`drop_correlation_pyramids`)."""
        image1, image2 = inputs
        predictions = model(image1, image2, num_flow_updates=NUM_FLOW_UPDATES)
        drop_correlation_pyramids(model)
        return predictions

    def losses(self, output: Any, targets: Any) -> dict[str, "torch.Tensor"]:
        flow, valid = targets
        return {"sequence": sequence_loss(output, flow, valid)}
