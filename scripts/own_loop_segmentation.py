"""Train torchvision's DeepLabV3 (MobileNetV3-Large backbone) with ActNN in an ordinary loop.

Why: segmentation keeps large activations at every scale and returns a dict (``out``, ``aux``);
this shows ActNN in such a loop of your own (README, "ActNN in your own training loop"):
``convert`` once, then per-pixel cross-entropy on ``out`` plus 0.5 x that on ``aux``, backward and
step as usual. The data are synthetic: each image holds one brighter rectangle whose pixels carry
class 1 or 2 in the label map (0 elsewhere). It prints each step's loss and at the end what the
last training forward saved.

Usage: python scripts/own_loop_segmentation.py [--steps 5] [--size 64] [--batch 2] [--level L3] [--device cpu]
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torchvision.models import segmentation

from actbench.actnn import LEVEL_NAMES, convert, last_forward_census, level_config, loss_scope

CLASSES = 3  # background and two rectangle classes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps")
    parser.add_argument("--size", type=int, default=64, help="image side, pixels")
    parser.add_argument("--batch", type=int, default=2, help="images per step (BatchNorm needs 2 or more)")
    parser.add_argument("--level", default="L3", choices=LEVEL_NAMES, help="ActNN level")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    return parser.parse_args(argv)


def synthetic_batch(batch: int, size: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Images [batch, 3, size, size] (float32) and label maps [batch, size, size] (int64)."""
    images = torch.randn(batch, 3, size, size)
    labels = torch.zeros(batch, size, size, dtype=torch.int64)
    for n in range(batch):
        x0, y0 = torch.randint(0, size // 2, (2,)).tolist()
        labels[n, y0:y0 + size // 2, x0:x0 + size // 2] = 1 + n % 2
    images += 2.0 * (labels > 0).unsqueeze(1)
    return images.to(device), labels.to(device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    alloc_conf = level_config(args.level).cuda_alloc_conf  # L5's allocator setting: read when CUDA starts
    if alloc_conf is not None and args.device.startswith("cuda"):
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", alloc_conf)
    torch.manual_seed(0)
    net = segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=CLASSES,
                                                    aux_loss=True)
    model = convert(net, args.level).model.to(args.device)  # a converted copy; train it, not the original
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    images, labels = synthetic_batch(args.batch, args.size, args.device)

    model.train()
    for step in range(1, args.steps + 1):
        with loss_scope(model):  # the cross-entropy over the label map is compressed too
            out = model(images)  # {"out": [N, C, H, W], "aux": [N, C, H, W]}, upsampled to the input
            loss = F.cross_entropy(out["out"], labels) + 0.5 * F.cross_entropy(out["aux"], labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")
    print(f"census: {last_forward_census(model).describe_uncompressed()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
