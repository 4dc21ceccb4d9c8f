"""How far ``meta`` predictions are from measurements: the same points on meta and on cpu or cuda.

``python -m actbench.measure.trust --device cuda --out DIR`` writes ``meta_vs_<device>.csv`` (one
row per point: both byte counts and their ratio meta / measured); ``tests/test_meta.py`` holds the
cpu ratios within 5%. On cuda the ratio includes what the caching allocator and cuDNN workspaces
add, which meta does not model. Points are measured in this process (no child per point).
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from actbench.measure.meta import MetaSessions
from actbench.measure.point import PointConfig, measure_point
from actbench.models import ModelSpec

TRUST_MODELS = ("resnet18", "resnet50", "densenet121", "mobilenet_v2")
TRUST_STRATEGIES = ("fp32", "checkpoint", "L2", "L3")


@dataclass(frozen=True)
class Comparison:
    """One point on meta and on ``device``; ratios are meta / measured (None when not measured)."""

    model: str
    strategy: str
    batch_size: int
    image_size: int
    device: str
    meta_status: str
    measured_status: str
    meta_activation_bytes: int | None
    measured_activation_bytes: int | None
    meta_peak_alloc_bytes: int | None
    measured_peak_alloc_bytes: int | None
    measured_reserved_bytes: int | None
    message: str

    @property
    def activation_ratio(self) -> float | None:
        return _ratio(self.meta_activation_bytes, self.measured_activation_bytes)

    @property
    def peak_ratio(self) -> float | None:
        return _ratio(self.meta_peak_alloc_bytes, self.measured_peak_alloc_bytes)


def _ratio(a: int | None, b: int | None) -> float | None:
    return None if a is None or not b else a / b


def compare(device: str, models=TRUST_MODELS, strategies=TRUST_STRATEGIES, batch_size: int = 2,
            image_size: int = 32) -> list[Comparison]:
    """Measure every (model, strategy) on meta and on ``device`` (memory only, no timed steps)."""
    sessions = MetaSessions()
    out = []
    for model in models:
        for strategy in strategies:
            point = PointConfig(ModelSpec(model), strategy, batch_size, image_size, "meta", timed_steps=0)
            meta = measure_point(point, meta_sessions=sessions)
            real = measure_point(PointConfig(ModelSpec(model), strategy, batch_size, image_size, device,
                                             warmup_steps=1, timed_steps=0))
            out.append(Comparison(model, strategy, batch_size, image_size, device, meta.status, real.status,
                                  meta.activation_bytes, real.activation_bytes, meta.peak_alloc_bytes,
                                  real.peak_alloc_bytes, real.reserved_bytes, (meta.message or real.message)[:120]))
    return out


def write_csv(rows: list[Comparison], path: Path) -> None:
    names = list(Comparison.__dataclass_fields__) + ["activation_ratio", "peak_ratio"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        for r in rows:
            writer.writerow(["" if (v := getattr(r, n)) is None else (f"{v:.4f}" if isinstance(v, float) else v)
                             for n in names])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m actbench.measure.trust", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, required=True, help="folder for meta_vs_<device>.csv")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--models", default=",".join(TRUST_MODELS))
    args = parser.parse_args(argv)
    rows = compare(args.device, tuple(args.models.split(",")), batch_size=args.batch, image_size=args.image_size)
    path = args.out / f"meta_vs_{args.device}.csv"
    write_csv(rows, path)
    for r in rows:
        act = "-" if r.activation_ratio is None else f"{r.activation_ratio:.4f}"
        peak = "-" if r.peak_ratio is None else f"{r.peak_ratio:.4f}"
        print(f"{r.model:14s} {r.strategy:10s} activation {act} peak {peak} {r.meta_status}/{r.measured_status}")
    print(f"wrote {path}")
    return 0 if all(r.meta_status == "ok" and r.measured_status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
