"""Train torchvision's Faster R-CNN (MobileNetV3-Large 320 FPN) with ActNN in an ordinary loop.

Why: a detector in train mode returns a dict of losses and runs roi_align on box coordinates, which
ActNN keeps exact (actbench/actnn/saved_arguments.py); this shows such a model in a loop of your
own (README, "ActNN in your own training loop"): ``convert`` once, then the sum of torchvision's
loss dict, backward and step as usual. The data are synthetic: each image holds one brighter
rectangle, its box and label (1 or 2) the target. It prints each step's loss and at the end what
the last training forward saved.

Usage: python scripts/own_loop_detector.py [--steps 5] [--size 64] [--batch 2] [--level L3] [--device cpu]
"""

from __future__ import annotations

import argparse
import os

import torch
from torchvision.models import detection

from actbench.actnn import LEVEL_NAMES, convert, last_forward_census, level_config

CLASSES = 3  # background and two rectangle classes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps")
    parser.add_argument("--size", type=int, default=64, help="image side, pixels (also the model's min/max size)")
    parser.add_argument("--batch", type=int, default=2, help="images per step")
    parser.add_argument("--level", default="L3", choices=LEVEL_NAMES, help="ActNN level")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    return parser.parse_args(argv)


def synthetic_batch(batch: int, size: int, device: str) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Images ([3, size, size] float32 in 0..1) and targets (``boxes`` [1, 4] as x1, y1, x2, y2 in
    pixels, float32; ``labels`` [1], int64), as torchvision's detectors take them."""
    images, targets = [], []
    for n in range(batch):
        side = size // 2
        x0, y0 = torch.randint(0, size - side, (2,)).tolist()
        image = 0.3 * torch.rand(3, size, size)
        image[:, y0:y0 + side, x0:x0 + side] += 0.6
        box = torch.tensor([[x0, y0, x0 + side, y0 + side]], dtype=torch.float32)
        images.append(image.to(device))
        targets.append({"boxes": box.to(device), "labels": torch.tensor([1 + n % 2], device=device)})
    return images, targets


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    alloc_conf = level_config(args.level).cuda_alloc_conf  # L5's allocator setting: read when CUDA starts
    if alloc_conf is not None and args.device.startswith("cuda"):
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", alloc_conf)
    torch.manual_seed(0)
    net = detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=CLASSES,
                                                          min_size=args.size, max_size=args.size)
    model = convert(net, args.level).model.to(args.device)  # a converted copy; train it, not the original
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
    images, targets = synthetic_batch(args.batch, args.size, args.device)

    model.train()
    for step in range(1, args.steps + 1):
        losses = model(images, targets)  # train mode: {"loss_classifier": ..., "loss_box_reg": ..., ...}
        loss = sum(losses.values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")
    print(f"census: {last_forward_census(model).describe_uncompressed()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
