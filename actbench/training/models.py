"""Classifiers: every torchvision classification model by name, and ResNet-152 grown in depth/width.

Models are always built with ``weights=None``: the harness measures memory and speed, and random
weights give the same tensors' sizes without a download.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from actbench.training.model_names import check_growth
from actbench.schema import GROWABLE_MODEL, InputSize, ModelSpec

#: ResNet-152's bottleneck stages; docs/design.md §5 grows stage 2 and 3 in upstream's 8:36 split.
RESNET152_LAYERS: tuple[int, int, int, int] = (3, 8, 36, 3)


#: Family of each torchvision classifier, by name prefix (longest first wins); see model_family().
_FAMILY_PREFIXES: tuple[str, ...] = (
    "alexnet", "convnext", "densenet", "efficientnet_v2", "efficientnet", "googlenet", "inception",
    "maxvit", "mnasnet", "mobilenet_v2", "mobilenet_v3", "regnet_x", "regnet_y", "resnext", "resnet",
    "shufflenet", "squeezenet", "swin_v2", "swin", "vgg", "vit", "wide_resnet",
)

#: One model per family (the model_zoo experiment; inception_v3 at 299 px).
FAMILY_REPRESENTATIVES: tuple[str, ...] = (
    "alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s", "googlenet",
    "inception_v3", "maxvit_t", "mnasnet1_0", "mobilenet_v2", "mobilenet_v3_large", "regnet_x_400mf",
    "regnet_y_800mf", "resnet50", "resnext50_32x4d", "shufflenet_v2_x1_0", "squeezenet1_1", "swin_t",
    "swin_v2_t", "vgg16", "vit_b_16", "wide_resnet50_2",
)


def model_family(name: str) -> str:
    """The family of a torchvision classifier name ("vit_b_16" -> "vit", "swin_v2_t" -> "swin_v2")."""
    matches = [p for p in _FAMILY_PREFIXES if name.startswith(p)]
    if not matches:
        raise ValueError(f"no known family for model '{name}'")
    return max(matches, key=len)


def grown_resnet152_layers(extra_blocks: int) -> tuple[int, int, int, int]:
    """Stage sizes after adding ``extra_blocks`` blocks, split 8:36 between stage 2 and stage 3."""
    to_stage2 = round(extra_blocks * 8 / 44)
    to_stage3 = extra_blocks - to_stage2
    a, b, c, d = RESNET152_LAYERS
    return (a, b + to_stage2, c + to_stage3, d)


def _builder_kwargs(name: str, size: InputSize) -> dict[str, Any]:
    """Per-family arguments so a model accepts the requested input resolution."""
    if name.startswith("vit_"):
        if not size.square:
            raise ValueError(f"{name} takes square images (its position embedding is built for one side), "
                             f"got {size.text()}")
        return {"image_size": size.height}
    if name.startswith("maxvit"):
        return {"input_size": (size.height, size.width)}
    if name in ("googlenet", "inception_v3"):
        return {"init_weights": True}  # silences the weights=None init warning; same shapes
    return {}


def build_model(spec: ModelSpec, size: InputSize | int) -> nn.Module:
    """Build the classifier ``spec`` with random weights on CPU, ready for inputs of ``size`` (an int: a
    square side); the classification task's builder, other tasks build their own."""
    import torchvision
    from torchvision.models.resnet import Bottleneck, ResNet

    check_growth(spec)
    if spec.name == GROWABLE_MODEL and (spec.extra_blocks or spec.width_per_group is not None):
        layers = list(grown_resnet152_layers(spec.extra_blocks))
        return ResNet(
            Bottleneck, layers, num_classes=spec.num_classes, width_per_group=spec.width_per_group or 64
        )
    kwargs = _builder_kwargs(spec.name, InputSize.of(size))
    return torchvision.models.get_model(spec.name, weights=None, num_classes=spec.num_classes, **kwargs)


def real_depth(model: nn.Module) -> int | None:
    """Weighted layers on the main path of a torchvision ResNet, counted from the built model.

    3 convs per bottleneck block (2 per basic block) + the stem conv + fc; downsample convs are
    shortcuts and do not count. ``None`` for other families, where "depth" has no agreed meaning.
    """
    from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

    if not isinstance(model, ResNet):
        return None
    blocks = sum(3 if isinstance(m, Bottleneck) else 2 for m in model.modules()
                 if isinstance(m, (Bottleneck, BasicBlock)))
    return blocks + 2


def logits_of(output: Any) -> torch.Tensor:
    """Main logits from a model output (GoogLeNet/Inception return named tuples in training)."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    return output[0]
