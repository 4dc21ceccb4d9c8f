"""Video classification: torchvision's video models, cross-entropy on the logits of a clip.

torchvision's ``references/video_classification/train.py``: Kinetics-400 (400 classes), clips of 16
frames at 112² for the ResNet-3D family (r3d_18, mc3_18, r2plus1d_18). A clip is [3, T, H, W]
(channels before time, as the models take it). Models whose builder fixes an input size are built
for the point's: MViT takes ``spatial_size``/``temporal_size`` (its positional encoding and token
grid are sized from them); Swin3D pads to its patches and shrinks its windows to any input; S3D's
final ``AvgPool3d((2, 7, 7))`` is fixed by its builder, so S3D takes only clips that reach it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actbench.schema import InputSize, ModelSpec
from actbench.training.tasks.registry import Task, register

if TYPE_CHECKING:
    import torch
    from torch import nn

#: ``torchvision.models.list_models(module=torchvision.models.video)`` of torchvision 0.29.1, sorted.
TORCHVISION_VIDEO_MODELS: tuple[str, ...] = (
    "mc3_18", "mvit_v1_b", "mvit_v2_s", "r2plus1d_18", "r3d_18", "s3d", "swin3d_b", "swin3d_s", "swin3d_t",
)
#: Kinetics-400's classes: the reference's data set.
KINETICS_CLASSES = 400
#: ModelSpec's default class count (ImageNet's); a video model left at it predicts Kinetics' classes.
_SPEC_DEFAULT_CLASSES = ModelSpec("").num_classes
#: S3D's smallest clip: five poolings shrink 209 px to 7 and 13 frames to 2, its fixed AvgPool3d((2, 7, 7)).
S3D_MIN_FRAMES, S3D_MIN_SIDE = 13, 209
#: MViT's patch stride (T, H, W): its token grid is the clip's size divided by it, exactly.
MVIT_PATCH_STRIDE = (2, 4, 4)
#: mvit_v2_s sizes its relative positions from the larger side / 32 (its key/value pooling): >= 1.
MVIT_V2_MIN_LONGER_SIDE = 32


def clip_size(size: InputSize | int, default: InputSize) -> tuple[int, int, int]:
    """(frames, height, width) of ``size``; frames from ``default`` when ``size`` has none (an int side)."""
    size = InputSize.of(size)
    frames = size.frames if size.frames is not None else default.frames
    assert frames is not None
    return frames, size.height, size.width


@register
class VideoClassification(Task):
    name = "video"
    description = "clips to one of num_classes labels (Kinetics-400's 400); cross-entropy on the logits"
    sample = "clip"
    pinned_models = TORCHVISION_VIDEO_MODELS
    #: the reference's ResNet-3D training: 16 frames at 112²
    default_size = InputSize(112, 112, frames=16)

    def installed_models(self) -> tuple[str, ...]:
        import torchvision

        return tuple(sorted(torchvision.models.list_models(module=torchvision.models.video)))

    def num_classes(self, spec: ModelSpec) -> int:
        return KINETICS_CLASSES if spec.num_classes == _SPEC_DEFAULT_CLASSES else spec.num_classes

    def size_problem(self, model: str, size: InputSize | int) -> str | None:
        """Why ``model`` cannot be built for ``size`` (one line naming both and what it takes), or None."""
        frames, height, width = clip_size(size, self.default_size)
        shown = f"{frames}x{InputSize(height, width).text()}"
        if model == "s3d" and (frames < S3D_MIN_FRAMES or min(height, width) < S3D_MIN_SIDE):
            return (f"s3d takes clips of at least {S3D_MIN_FRAMES} frames at {S3D_MIN_SIDE} px a side (its "
                    f"AvgPool3d((2, 7, 7)) is fixed), got {shown}")
        if model.startswith("mvit"):
            if any(n % s for n, s in zip((frames, height, width), MVIT_PATCH_STRIDE)):
                return (f"{model} takes an even number of frames and sides that are multiples of 4 (its patch "
                        f"stride), got {shown}")
            if model == "mvit_v2_s" and max(height, width) < MVIT_V2_MIN_LONGER_SIDE:
                return f"mvit_v2_s takes a longer side of at least {MVIT_V2_MIN_LONGER_SIDE} px, got {shown}"
        return None

    def build(self, spec: ModelSpec, size: InputSize) -> "nn.Module":
        import torchvision

        from actbench.training.model_names import check_growth

        check_growth(spec)
        self.require_size(spec.name, size)
        classes = self.num_classes(spec)
        if spec.name.startswith("mvit"):
            return _sized_mvit(spec.name, classes, clip_size(size, self.default_size))
        return torchvision.models.get_model(spec.name, weights=None, num_classes=classes)

    def batch(self, spec: ModelSpec, batch_size: int, size: InputSize, device: "torch.device",
              seed: int) -> tuple[Any, Any]:
        """Clips [B, 3, T, H, W] float32 and labels [B] int64 in [0, classes), on ``device``."""
        import torch

        frames, height, width = clip_size(size, self.default_size)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        clips = torch.randn(batch_size, 3, frames, height, width, generator=gen).to(device)
        labels = torch.randint(0, self.num_classes(spec), (batch_size,), generator=gen)
        return clips, labels.to(device)

    def losses(self, output: Any, targets: Any) -> dict[str, "torch.Tensor"]:
        from torch import nn

        return {"cross_entropy": nn.functional.cross_entropy(output, targets)}


def _sized_mvit(name: str, classes: int, clip: tuple[int, int, int]) -> "nn.Module":
    """``name`` built for clips of ``clip`` (T, H, W). Its builder passes 224² and 16 frames to
    ``torchvision.models.video.mvit._mvit`` itself, so the size is put into that call, the builder's
    block settings unchanged (the builder's own ``spatial_size`` keyword would collide)."""
    from unittest import mock

    import torchvision
    from torchvision.models.video import mvit

    frames, height, width = clip
    build = mvit._mvit

    def sized(**kwargs: Any) -> "nn.Module":
        return build(**{**kwargs, "spatial_size": (height, width), "temporal_size": frames})

    with mock.patch.object(mvit, "_mvit", sized):
        return torchvision.models.get_model(name, weights=None, num_classes=classes)
