"""Train torchvision's ResNet-18 with ActNN in an ordinary PyTorch loop, on random images.

Why: the harness measures ActNN point by point; this is the same conversion in a loop of your own
(README, "ActNN in your own training loop"). ``convert`` is called once; the loop is plain PyTorch,
with nothing ActNN-specific per step. It prints each step's loss (and, from the second step, the
mean bits the L3 controller allocated) and at the end what the last training forward saved.

Usage: python scripts/own_loop_classifier.py [--steps 5] [--size 64] [--batch 4] [--level L3] [--device cpu]
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
import torchvision

from actbench.actnn import LEVEL_NAMES, convert, last_forward_census, level_config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps")
    parser.add_argument("--size", type=int, default=64, help="image side, pixels")
    parser.add_argument("--batch", type=int, default=4, help="images per step")
    parser.add_argument("--level", default="L3", choices=LEVEL_NAMES, help="ActNN level")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    alloc_conf = level_config(args.level).cuda_alloc_conf  # L5's allocator setting: read when CUDA starts
    if alloc_conf is not None and args.device.startswith("cuda"):
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", alloc_conf)
    torch.manual_seed(0)
    conversion = convert(torchvision.models.resnet18(num_classes=10), args.level)
    model = conversion.model.to(args.device)  # a converted copy; train it, not the original
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    images = torch.randn(args.batch, 3, args.size, args.size, device=args.device)
    labels = torch.randint(0, 10, (args.batch,), device=args.device)

    model.train()
    for step in range(1, args.steps + 1):
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        bits = conversion.controller.network_mean_bits()  # None until L3 has gradient statistics
        print(f"step {step} loss {loss.item():.4f}" + (f" mean_bits {bits:.2f}" if bits is not None else ""))
    print(f"census: {last_forward_census(model).describe_uncompressed()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
