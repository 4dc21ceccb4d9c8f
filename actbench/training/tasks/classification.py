"""Image classification: every torchvision classifier, cross-entropy on its logits (the ActNN paper's task)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actbench.schema import InputSize, ModelSpec
from actbench.training.tasks.registry import Task, register

if TYPE_CHECKING:
    import torch
    from torch import nn

#: ``torchvision.models.list_models(module=torchvision.models)`` of torchvision 0.29.1, sorted.
TORCHVISION_CLASSIFIERS: tuple[str, ...] = (
    "alexnet", "convnext_base", "convnext_large", "convnext_small", "convnext_tiny", "densenet121",
    "densenet161", "densenet169", "densenet201", "efficientnet_b0", "efficientnet_b1", "efficientnet_b2",
    "efficientnet_b3", "efficientnet_b4", "efficientnet_b5", "efficientnet_b6", "efficientnet_b7",
    "efficientnet_v2_l", "efficientnet_v2_m", "efficientnet_v2_s", "googlenet", "inception_v3", "maxvit_t",
    "mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3", "mobilenet_v2", "mobilenet_v3_large",
    "mobilenet_v3_small", "regnet_x_16gf", "regnet_x_1_6gf", "regnet_x_32gf", "regnet_x_3_2gf",
    "regnet_x_400mf", "regnet_x_800mf", "regnet_x_8gf", "regnet_y_128gf", "regnet_y_16gf", "regnet_y_1_6gf",
    "regnet_y_32gf", "regnet_y_3_2gf", "regnet_y_400mf", "regnet_y_800mf", "regnet_y_8gf", "resnet101",
    "resnet152", "resnet18", "resnet34", "resnet50", "resnext101_32x8d", "resnext101_64x4d", "resnext50_32x4d",
    "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0", "squeezenet1_0",
    "squeezenet1_1", "swin_b", "swin_s", "swin_t", "swin_v2_b", "swin_v2_s", "swin_v2_t", "vgg11", "vgg11_bn",
    "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn", "vit_b_16", "vit_b_32", "vit_h_14",
    "vit_l_16", "vit_l_32", "wide_resnet101_2", "wide_resnet50_2",
)

#: The smallest side, in pixels, each classifier trains at where :data:`~actbench.schema.MIN_IMAGE_SIZE`
#: is too small: below it a pooling or convolution window outgrows the feature map it slides over
#: (inception_v3: its auxiliary head's 5x5 convolution, which trains). Found by trying every side on
#: meta (a training step at batch 2) with torchvision 0.29.1; tests/test_model_input_sizes.py tries
#: each side and the one below it again. A side's minimum holds for either side of an HxW input.
MIN_SIDES: dict[str, int] = {
    "alexnet": 63, "inception_v3": 299, "squeezenet1_0": 21, "squeezenet1_1": 17,
    **dict.fromkeys(("convnext_base", "convnext_large", "convnext_small", "convnext_tiny"), 32),
    **dict.fromkeys(("densenet121", "densenet161", "densenet169", "densenet201"), 29),
    **dict.fromkeys(("vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn"), 32),
}
#: MaxViT's attention partitions (7x7 windows and grids) tile the feature map after its stem and after
#: each of its 4 stages' first, strided, convolution: each of those sides is a multiple of 7.
MAXVIT_PARTITION, MAXVIT_STAGES = 7, 4


def size_problem(model: str, size: InputSize) -> str | None:
    """Why classifier ``model`` cannot train at ``size`` (one line naming both and what it takes), or None."""
    if model in MIN_SIDES and min(size.height, size.width) < MIN_SIDES[model]:
        return (f"{model} needs image sides of at least {MIN_SIDES[model]} px (a smaller input leaves a pooling or "
                f"convolution window larger than its feature map), got {size.text()}")
    if model.startswith("vit_"):
        patch = int(model.rsplit("_", 1)[1])
        if not size.square or size.height % patch:
            return (f"{model} takes square images whose side is a multiple of {patch} (its patch; one position "
                    f"embedding per patch), got {size.text()}")
    if model.startswith("maxvit"):
        for side in (size.height, size.width):
            maps = [side]
            for _ in range(MAXVIT_STAGES + 1):  # the stem's stride-2 convolution, then each stage's
                maps.append((maps[-1] + 1) // 2)
            if any(m % MAXVIT_PARTITION for m in maps[2:]):
                return (f"{model} takes sides whose feature maps stay multiples of {MAXVIT_PARTITION} (its "
                        f"{MAXVIT_PARTITION}x{MAXVIT_PARTITION} attention partitions) at each of its "
                        f"{MAXVIT_STAGES} stages, e.g. 224 or 448, got {size.text()}")
    return None


@register
class Classification(Task):
    name = "classification"
    description = "images to one of num_classes labels (ImageNet's 1000); cross-entropy on the logits"
    pinned_models = TORCHVISION_CLASSIFIERS

    def installed_models(self) -> tuple[str, ...]:
        import torchvision

        return tuple(sorted(torchvision.models.list_models(module=torchvision.models)))

    def size_problem(self, model: str, size: InputSize) -> str | None:
        return size_problem(model, size)

    def build(self, spec: ModelSpec, size: InputSize) -> "nn.Module":
        from actbench.training.models import build_model

        return build_model(spec, size)

    def batch(self, spec: ModelSpec, batch_size: int, size: InputSize, device: "torch.device",
              seed: int) -> tuple[Any, Any]:
        from actbench.training.step import synthetic_batch

        return synthetic_batch(batch_size, size, self.num_classes(spec), device, seed)

    def losses(self, output: Any, targets: Any) -> dict[str, "torch.Tensor"]:
        from torch import nn

        from actbench.training.models import logits_of

        return {"cross_entropy": nn.functional.cross_entropy(logits_of(output), targets)}
