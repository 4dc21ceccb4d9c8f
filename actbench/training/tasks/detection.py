"""Object detection (boxes, masks, keypoints): torchvision's detectors, trained as its reference does.

torchvision's ``references/detection/train.py``: COCO's 91 classes (Keypoint R-CNN: person and
background, 17 keypoints), every backbone layer trainable (no pretrained backbone), the model's own
loss dict summed, images resized to an 800 px short side, at most 1333 px long.

The point's H×W is what the model trains at. A detector resizes every image inside its forward
(``GeneralizedRCNNTransform``); built with ``min_size = min(H, W)`` and ``max_size = max(H, W)`` its
resize scale is exactly 1, so an H×W image stays H×W (the R-CNNs, RetinaNet and FCOS then pad the
batch to a multiple of 32, as torchvision always does). SSD and SSDlite resize to a fixed size of
their own (300², 320²) whatever their options say; their transform's fixed size is set to the
point's H×W instead, so they train at the requested size too (their anchors are relative to the
image, so any size works from SSD300-VGG16's :data:`SSD300_MIN_SIDE` up).

The batch is synthetic and seeded: :data:`BOXES_PER_IMAGE` boxes per image, each at least
:data:`MIN_BOX_SIDE` px a side, inside the image; Mask R-CNN's masks fill each box, Keypoint R-CNN's
17 keypoints lie inside it, all visible.

On ``meta`` (fake tensors) a detector's data-dependent counts (proposals after NMS, sampled anchors
and RoIs, positive RoIs; a one-stage detector's anchors all count as positive) are fixed at the upper
bounds its configuration allows (actbench/training/detection_sizing.py): a prediction is an upper
bound of the step's memory, and its row's note says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actbench.schema import InputSize, ModelSpec
from actbench.training.tasks.registry import Task, register

if TYPE_CHECKING:
    import torch
    from torch import nn

#: ``torchvision.models.list_models(module=torchvision.models.detection)`` of torchvision 0.29.1, sorted.
TORCHVISION_DETECTORS: tuple[str, ...] = (
    "fasterrcnn_mobilenet_v3_large_320_fpn", "fasterrcnn_mobilenet_v3_large_fpn", "fasterrcnn_resnet50_fpn",
    "fasterrcnn_resnet50_fpn_v2", "fcos_resnet50_fpn", "keypointrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn",
    "maskrcnn_resnet50_fpn_v2", "retinanet_resnet50_fpn", "retinanet_resnet50_fpn_v2", "ssd300_vgg16",
    "ssdlite320_mobilenet_v3_large",
)
#: COCO's classes as torchvision numbers them (background and 90 category ids, some unused).
COCO_CLASSES = 91
#: Keypoint R-CNN's classes (background, person) and COCO's keypoints per person.
KEYPOINT_CLASSES = 2
COCO_KEYPOINTS = 17
#: Ground-truth boxes in every synthetic image: a fixed count, so every step sees the same work.
BOXES_PER_IMAGE = 8
#: Smallest side of a synthetic box, pixels: a box no wider than this is degenerate for the box coder.
MIN_BOX_SIDE = 8
#: SSD300-VGG16's smallest image side: its last two extra layers are unpadded 3×3 convolutions on the
#: stride-64 map, which must be at least 5 px: 268 px through its pools and stride-2 layers.
SSD300_MIN_SIDE = 268
#: ModelSpec's default class count (ImageNet's); a detector left at it predicts COCO's classes.
_SPEC_DEFAULT_CLASSES = ModelSpec("").num_classes


def kind_of(name: str) -> str:
    """What a detector's targets hold besides boxes and labels: ``masks``, ``keypoints`` or ``boxes``."""
    if name.startswith("maskrcnn"):
        return "masks"
    if name.startswith("keypointrcnn"):
        return "keypoints"
    return "boxes"


def fixed_size_model(name: str) -> bool:
    """SSD and SSDlite: models whose transform resizes every image to one fixed size."""
    return name.startswith("ssd")


@register
class Detection(Task):
    name = "detection"
    description = ("images to boxes, labels and masks or keypoints (COCO's 91 classes); torchvision's "
                   "loss dict, summed")
    pinned_models = TORCHVISION_DETECTORS
    #: the reference's resize: 800 px short side, at most 1333 px long side
    default_size = InputSize(800, 1333)

    def installed_models(self) -> tuple[str, ...]:
        import torchvision

        return tuple(sorted(torchvision.models.list_models(module=torchvision.models.detection)))

    def num_classes(self, spec: ModelSpec) -> int:
        if spec.num_classes != _SPEC_DEFAULT_CLASSES:
            return spec.num_classes
        return KEYPOINT_CLASSES if kind_of(spec.name) == "keypoints" else COCO_CLASSES

    def size_problem(self, model: str, size: InputSize) -> str | None:
        if model == "ssd300_vgg16" and min(size.height, size.width) < SSD300_MIN_SIDE:
            return f"ssd300_vgg16 needs image sides of at least {SSD300_MIN_SIDE} px, got {size.text()}"
        return None

    def build(self, spec: ModelSpec, size: InputSize | int) -> "nn.Module":
        """torchvision's builder, random weights, resizing to exactly ``size`` (see the module doc)."""
        import contextlib

        import torch
        import torchvision

        from actbench.core.devices import holds_data
        from actbench.training.model_names import check_growth

        check_growth(spec)
        size = InputSize.of(size)
        self.require_size(spec.name, size)
        kwargs: dict[str, Any] = {}
        if not fixed_size_model(spec.name):
            kwargs = {"min_size": min(size.height, size.width), "max_size": max(size.height, size.width)}
        if kind_of(spec.name) == "keypoints":
            kwargs["num_keypoints"] = COCO_KEYPOINTS
        # SSDlite's builder runs its backbone on an image to size its head. The meta build makes
        # parameters on "meta" and buffers real (compat.parameters_on_meta), and that forward would mix
        # the two: there the whole model is built on "meta" (meta needs only shapes).
        on_meta = spec.name.startswith("ssdlite") and not holds_data(torch.nn.Linear(1, 1).weight)
        with torch.device("meta") if on_meta else contextlib.nullcontext():
            model = torchvision.models.get_model(spec.name, weights=None, weights_backbone=None,
                                                 num_classes=self.num_classes(spec), **kwargs)
        if fixed_size_model(spec.name):
            model.transform.fixed_size = (size.width, size.height)  # (W, H): GeneralizedRCNNTransform's order
            model.transform.min_size = (min(size.height, size.width),)
            model.transform.max_size = max(size.height, size.width)
        return model

    def batch(self, spec: ModelSpec, batch_size: int, size: InputSize | int, device: "torch.device",
              seed: int) -> tuple[Any, Any]:
        """A list of B images [3, H, W] float32 in 0..1 and a list of B target dicts: ``boxes``
        [N, 4] float32 (x1, y1, x2, y2 in pixels), ``labels`` [N] int64 in [1, classes), and for
        Mask R-CNN ``masks`` [N, H, W] uint8, for Keypoint R-CNN ``keypoints`` [N, 17, 3] float32
        (x, y, visibility 2); N = :data:`BOXES_PER_IMAGE`."""
        import torch

        size = InputSize.of(size)
        h, w = size.height, size.width
        if min(h, w) < 2 * MIN_BOX_SIDE:
            raise ValueError(f"detection images need sides of at least {2 * MIN_BOX_SIDE} px, got {size.text()}")
        gen = torch.Generator(device="cpu").manual_seed(seed)
        kind, classes, n = kind_of(spec.name), self.num_classes(spec), BOXES_PER_IMAGE
        images, targets = [], []
        for _ in range(batch_size):
            images.append(torch.rand(3, h, w, generator=gen).to(device))
            scale = torch.tensor([w, h], dtype=torch.float32)
            start = (torch.rand(n, 2, generator=gen) * (scale - MIN_BOX_SIDE)).floor()
            extent = (MIN_BOX_SIDE + torch.rand(n, 2, generator=gen) * (scale - MIN_BOX_SIDE - start)).floor()
            boxes = torch.cat([start, start + extent], dim=1)
            target = {"boxes": boxes.to(device),
                      "labels": torch.randint(1, classes, (n,), generator=gen).to(device)}
            if kind == "masks":
                ys, xs = torch.arange(h)[None, :, None], torch.arange(w)[None, None, :]
                inside = ((xs >= boxes[:, 0, None, None]) & (xs < boxes[:, 2, None, None])
                          & (ys >= boxes[:, 1, None, None]) & (ys < boxes[:, 3, None, None]))
                target["masks"] = inside.to(torch.uint8).to(device)
            elif kind == "keypoints":
                where = torch.rand(n, COCO_KEYPOINTS, 2, generator=gen)
                xy = boxes[:, None, :2] + where * (boxes[:, None, 2:] - boxes[:, None, :2])
                visible = torch.full((n, COCO_KEYPOINTS, 1), 2.0)
                target["keypoints"] = torch.cat([xy, visible], dim=2).to(device)
            targets.append(target)
        return images, targets

    def meta_note(self, model: "nn.Module") -> str | None:
        """A meta step fixes the data-dependent counts at their upper bounds (detection_sizing.py)."""
        rpn, heads = getattr(model, "rpn", None), getattr(model, "roi_heads", None)
        if rpn is not None and heads is not None:
            rois, fraction = heads.fg_bg_sampler.batch_size_per_image, heads.fg_bg_sampler.positive_fraction
            counts = (f"{rpn.post_nms_top_n()} proposals, {rpn.fg_bg_sampler.batch_size_per_image} anchors and "
                      f"{rois} RoIs sampled per image, {int(rois * fraction)} of them positive")
        else:
            counts = "every anchor positive"
        return (f"predicted at the upper bounds of its data-dependent counts ({counts}): "
                f"an upper bound of the step's memory and FLOPs")

    def forward(self, model: "nn.Module", inputs: Any, targets: Any) -> Any:
        """A detector in training mode takes the targets and returns its loss dict. On fake tensors
        (``meta``) its data-dependent counts are fixed at their upper bounds
        (actbench/training/detection_sizing.py)."""
        from actbench.core import compat

        if not compat.is_fake(inputs[0]):
            return model(inputs, targets)
        from actbench.training.detection_sizing import upper_bound_shapes

        with upper_bound_shapes(like=inputs[0]):
            return model(inputs, targets)

    def losses(self, output: Any, targets: Any) -> dict[str, "torch.Tensor"]:
        """torchvision's own terms (``loss_classifier``, ``loss_box_reg``, ``loss_objectness``, ...),
        weighted as torchvision weighs them."""
        return dict(output)
