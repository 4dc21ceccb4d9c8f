"""The accuracy study's task: procedural gratings (no download) and the small ResNet and ViT trained on
them (docs/design.md §3, "Checking compressed training")."""

from __future__ import annotations

import math

import torch
from torch import nn


# --- the procedural data set ---------------------------------------------------------------------
def make_gratings(n: int, num_classes: int, image_size: int, seed: int, noise_std: float = 0.6
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Oriented-grating images and labels.

    Returns ``images`` float32 [n, 3, image_size, image_size] (roughly zero-mean, unit scale) and
    ``labels`` int64 [n] with every class exactly ``n // num_classes`` or one more times.
    """
    if n <= 0 or num_classes < 2 or image_size < 4:
        raise ValueError(f"make_gratings: need n > 0, num_classes >= 2, image_size >= 4; got {n}, {num_classes}, {image_size}")
    g = torch.Generator().manual_seed(seed)
    labels = (torch.arange(n) % num_classes)[torch.randperm(n, generator=g)]
    theta = labels.double() * math.pi / num_classes + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * (
        math.pi / num_classes) * 0.3  # jitter: 30% of the gap between neighbouring classes
    freq = 0.08 + 0.17 * torch.rand(n, generator=g, dtype=torch.float64)  # cycles per pixel
    phase = 2 * math.pi * torch.rand(n, generator=g, dtype=torch.float64)
    contrast = 0.4 + 0.6 * torch.rand(n, generator=g, dtype=torch.float64)
    colour = torch.rand(n, 3, generator=g, dtype=torch.float64) * 2 - 1
    coords = torch.arange(image_size, dtype=torch.float64) - (image_size - 1) / 2
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    proj = xx[None] * torch.cos(theta)[:, None, None] + yy[None] * torch.sin(theta)[:, None, None]
    wave = torch.sin(2 * math.pi * freq[:, None, None] * proj + phase[:, None, None]) * contrast[:, None, None]
    images = wave[:, None] * colour[:, :, None, None]
    images = images + noise_std * torch.randn(images.shape, generator=g, dtype=torch.float64)
    return images.float(), labels


# --- the model -----------------------------------------------------------------------------------
class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu2 = nn.ReLU()
        self.shortcut = nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        return self.relu2(self.bn2(self.conv2(out)) + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for small images: stem, 3 stages of ``n`` BasicBlocks (16/32/64·width), pool, fc.

    Every layer is a module (no functional ReLU) so ActNN conversion compresses all of it.
    """

    def __init__(self, blocks_per_stage: int = 1, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers: list[nn.Module] = []
        c_in = width
        for stage, c_out in enumerate((width, 2 * width, 4 * width)):
            for i in range(blocks_per_stage):
                layers.append(_BasicBlock(c_in, c_out, 2 if stage > 0 and i == 0 else 1))
                c_in = c_out
        self.stages = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


#: Networks the accuracy experiment trains (``AccuracyConfig.model``).
MODELS: tuple[str, ...] = ("resnet", "vit")
#: Fields that only a ViT reads: left out of a ResNet's identity, so its run and keys stay as they were.
VIT_FIELDS: tuple[str, ...] = ("heads", "patch_size", "mlp_dim")


def build_small_vit(layers: int, num_classes: int, width: int, heads: int, patch_size: int, mlp_dim: int,
                    image_size: int, seed: int) -> nn.Module:
    """torchvision's ViT with ``layers`` encoder blocks of ``width`` channels, from ``seed`` (global RNG untouched)."""
    from torchvision.models import VisionTransformer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return VisionTransformer(image_size=image_size, patch_size=patch_size, num_layers=layers, num_heads=heads,
                                 hidden_dim=width, mlp_dim=mlp_dim, num_classes=num_classes)


def build_cifar_resnet(depth: int, num_classes: int, width: int, seed: int) -> CifarResNet:
    """ResNet-``depth`` (depth = 6n+2: 8, 14, 20, ...) initialised from ``seed`` without touching torch's global RNG."""
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"accuracy: model depth must be 6n+2 (8, 14, 20, ...), got {depth}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CifarResNet((depth - 2) // 6, num_classes, width)


# --- configuration and rows ----------------------------------------------------------------------
