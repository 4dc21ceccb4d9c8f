"""Semantic segmentation: torchvision's FCN, DeepLabV3 and LR-ASPP, trained as its reference does.

torchvision's ``references/segmentation/train.py``: ``aux_loss`` on for FCN and DeepLabV3 (LR-ASPP has
no auxiliary head), loss = cross-entropy on ``out`` + 0.5 × cross-entropy on ``aux``, ``ignore_index=255``,
21 classes (Pascal VOC).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actbench.schema import InputSize, ModelSpec
from actbench.training.tasks.registry import Task, register

if TYPE_CHECKING:
    import torch
    from torch import nn

#: ``torchvision.models.list_models(module=torchvision.models.segmentation)`` of torchvision 0.29.1, sorted.
TORCHVISION_SEGMENTERS: tuple[str, ...] = (
    "deeplabv3_mobilenet_v3_large", "deeplabv3_resnet101", "deeplabv3_resnet50", "fcn_resnet101", "fcn_resnet50",
    "lraspp_mobilenet_v3_large",
)
#: Pascal VOC's classes, background included: the reference's default data set.
VOC_CLASSES = 21
#: Label of pixels left out of the loss (VOC's object borders), as in the reference.
IGNORE_INDEX = 255
#: Weight of the auxiliary head's loss in the reference.
AUX_WEIGHT = 0.5
#: ModelSpec's default class count (ImageNet's); a segmentation model left at it predicts VOC's classes.
_SPEC_DEFAULT_CLASSES = ModelSpec("").num_classes


@register
class Segmentation(Task):
    name = "segmentation"
    description = "images to a label per pixel (Pascal VOC's 21); cross-entropy on out + 0.5 x on aux"
    pinned_models = TORCHVISION_SEGMENTERS
    #: the reference's training crop (random resize of the 520 px base, then a 480² crop)
    default_size = InputSize(480, 480)

    def installed_models(self) -> tuple[str, ...]:
        import torchvision

        return tuple(sorted(torchvision.models.list_models(module=torchvision.models.segmentation)))

    def num_classes(self, spec: ModelSpec) -> int:
        return VOC_CLASSES if spec.num_classes == _SPEC_DEFAULT_CLASSES else spec.num_classes

    def build(self, spec: ModelSpec, size: InputSize) -> "nn.Module":
        import torchvision

        from actbench.training.model_names import check_growth

        check_growth(spec)
        kwargs: dict[str, Any] = {} if spec.name.startswith("lraspp") else {"aux_loss": True}
        return torchvision.models.get_model(spec.name, weights=None, weights_backbone=None,
                                            num_classes=self.num_classes(spec), **kwargs)

    def batch(self, spec: ModelSpec, batch_size: int, size: InputSize, device: "torch.device",
              seed: int) -> tuple[Any, Any]:
        """Images [B, 3, H, W] float32 and label maps [B, H, W] int64 in [0, classes), on ``device``."""
        import torch

        gen = torch.Generator(device="cpu").manual_seed(seed)
        images = torch.randn(batch_size, 3, size.height, size.width, generator=gen).to(device)
        labels = torch.randint(0, self.num_classes(spec), (batch_size, size.height, size.width), generator=gen)
        return images, labels.to(device)

    def losses(self, output: Any, targets: Any) -> dict[str, "torch.Tensor"]:
        from torch import nn

        terms = {"out": nn.functional.cross_entropy(output["out"], targets, ignore_index=IGNORE_INDEX)}
        if "aux" in output:
            terms["aux"] = AUX_WEIGHT * nn.functional.cross_entropy(output["aux"], targets, ignore_index=IGNORE_INDEX)
        return terms
