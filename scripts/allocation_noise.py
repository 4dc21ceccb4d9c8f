"""Gradient noise of ActNN's bit allocation against SGD's own noise (docs/design.md §2, cost model).

Trains the accuracy experiment's network (``experiments/accuracy_vs_bits.toml``: the ResNet-8 or the
small ViT) at fp32 for ``--pre-steps`` SGD steps, then measures, on one batch of 64:

* the SGD variance: sum over parameters of the variance of batch-64 gradients around the gradient
  of ``--sgd-images`` training images (2048);
* the compression variance: sum over parameters of the variance of the compressed gradient across
  ``--draws`` rounding draws of the same batch, at L3 (mixed precision, 2 bits average; Q and K at
  4) and at uniform 2 bits.

It prints each variance divided by the SGD variance. Usage::

    python scripts/allocation_noise.py --model vit      # about 1 minute on one core
    python scripts/allocation_noise.py --model resnet
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from actbench.studies.accuracy import AccuracyConfig, _level, make_data
from actbench.studies.gradients import compare_gradients

CONFIGS = {
    "vit": AccuracyConfig(model="vit", model_depth=3, width=64, heads=4, patch_size=6, mlp_dim=128, num_classes=10,
                          image_size=24, noise_std=0.8, steps=300, lr=0.1),
    "resnet": AccuracyConfig(model_depth=8, width=16, num_classes=10, image_size=24, noise_std=0.8, steps=400, lr=0.05),
}


def _gradient(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])


def compression_variance(model: torch.nn.Module, level, x: torch.Tensor, y: torch.Tensor, draws: int) -> float:
    """Sum over parameters of the compressed gradient's variance across rounding draws: verify-grads'
    per-parameter spread (``rel_std`` times the fp32 gradient's norm), squared and summed."""
    rows = compare_gradients(model, level, x, y, draws)
    return sum((r.rel_std * r.fp32_norm) ** 2 for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(CONFIGS), default="vit")
    parser.add_argument("--pre-steps", type=int, default=150, help="fp32 SGD steps before measuring")
    parser.add_argument("--draws", type=int, default=12, help="rounding draws per level")
    parser.add_argument("--sgd-images", type=int, default=2048,
                        help="training images whose gradient the batch-64 gradients vary around (a multiple of 64)")
    args = parser.parse_args()
    cfg = CONFIGS[args.model]
    if args.sgd_images < 128 or args.sgd_images % 64 or args.sgd_images > cfg.train_size:
        parser.error(f"--sgd-images must be a multiple of 64 from 128 (two batches) to {cfg.train_size} (the "
                     f"training set), got {args.sgd_images}")
    torch.set_num_threads(1)
    data = make_data(cfg)
    model = cfg.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr * 0.5, momentum=0.9)
    order = torch.Generator().manual_seed(5)
    for _ in range(args.pre_steps):
        idx = torch.randint(0, data.train_x.shape[0], (64,), generator=order)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
        opt.step()
    n = args.sgd_images
    full = _gradient(model, data.train_x[:n], data.train_y[:n])
    batches = [_gradient(model, data.train_x[i:i + 64], data.train_y[i:i + 64]) for i in range(0, n, 64)]
    sgd = float(sum(((g - full) ** 2).sum() for g in batches) / len(batches))
    x, y = data.train_x[:64], data.train_y[:64]
    l3 = _level(cfg, 2.0)
    print(f"{cfg.row_model()} after {args.pre_steps} fp32 steps: SGD variance (batch 64, around {n} images) {sgd:.4g}")
    for name, level in (("L3 (2 bits average)", l3), ("uniform 2 bits", l3.replace(mixed_precision=False))):
        var = compression_variance(model, level, x, y, args.draws)
        print(f"  {name:20s} compression variance {var:.4g} = {var / sgd:.3f} x SGD")


if __name__ == "__main__":
    main()
