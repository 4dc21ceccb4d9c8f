"""Checking a model name without importing torch (docs/design.md §7).

Every command checks its model first. Importing torch and torchvision for it cost 3.8 s of a 30 s
cpu sweep in the command's own process, which otherwise only waits for its workers, and made every
one-line input error wait as long. The classifiers of the pinned torchvision (0.29.1, pyproject.toml)
are listed here, and a test holds the list equal to ``torchvision.models.list_models``; a name not
listed is looked up in the installed torchvision, so another version's models are still accepted.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools

from actbench.schema import GROWABLE_MODEL, ModelSpec

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


@functools.cache
def list_model_names(pattern: str | None = None) -> tuple[str, ...]:
    """Torchvision classification model names, optionally filtered by a glob such as ``resnet*``."""
    import torchvision

    names = sorted(torchvision.models.list_models(module=torchvision.models))
    if pattern:
        names = [n for n in names if fnmatch.fnmatch(n, pattern)]
    return tuple(names)


def validate_model_spec(spec: ModelSpec) -> None:
    """Raise ValueError naming the bad value and what is allowed."""
    if spec.name not in TORCHVISION_CLASSIFIERS:
        names = list_model_names()  # the installed torchvision decides
        if spec.name not in names:
            close = difflib.get_close_matches(spec.name, names, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"unknown model '{spec.name}'{hint} (`actbench models` lists all {len(names)})")
    if (spec.extra_blocks or spec.width_per_group is not None) and spec.name != GROWABLE_MODEL:
        raise ValueError(
            f"extra blocks / width_per_group apply to {GROWABLE_MODEL} only, got model '{spec.name}'"
        )
    if spec.extra_blocks < 0:
        raise ValueError(f"extra blocks must be >= 0, got {spec.extra_blocks}")
    if spec.width_per_group is not None and spec.width_per_group <= 0:
        raise ValueError(f"width_per_group must be > 0, got {spec.width_per_group}")
