"""Record what the CUDA caching allocator did over one measured point, beside meta's model of it.

Why: the caching-allocator model (actbench/planning/allocator_model.py, docs/design.md §10) predicts
reserved bytes from the allocator's documented rules; this keeps the real allocator's segments and
history of one point so the model can be checked against them later (scripts/gpu_check.sh runs it).

Usage: python scripts/memory_snapshot.py OUT_DIR [STRATEGY] [BATCH]   (defaults: fp32, 64; ResNet-50,
224 px). The strategy's PYTORCH_CUDA_ALLOC_CONF must be set before CUDA starts, so this script sets
it and then measures in this process. Writes OUT_DIR/memory_snapshot.pickle (torch.cuda.memory's
snapshot: segments, blocks and the allocation trace, without stack traces) and
OUT_DIR/memory_snapshot.json (measured vs predicted bytes and the CUDA context).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else Path(".")
    strategy = argv[2] if len(argv) > 2 else "fp32"
    batch = int(argv[3]) if len(argv) > 3 else 64
    from actbench import strategies

    conf = strategies.cuda_alloc_conf(strategy)
    if conf is not None:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    import torch

    from actbench.measure.meta import MetaSessions
    from actbench.measure.point import measure_point
    from actbench.schema import ModelSpec, PointConfig
    from actbench.planning.point import Point

    if not torch.cuda.is_available():
        print("memory_snapshot: torch sees no CUDA GPU here; nothing to record", file=sys.stderr)
        return 2
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    context = total - free  # nothing allocated yet: the context and the driver's share
    out.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=200_000)
    point = Point.resolve(PointConfig(ModelSpec("resnet50"), strategy, batch, 224, "cuda", warmup_steps=3,
                                      timed_steps=0))
    measured = measure_point(point, conf)
    torch.cuda.memory._dump_snapshot(str(out / "memory_snapshot.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    predicted = MetaSessions().measure_point(Point.resolve(PointConfig(ModelSpec("resnet50"), strategy, batch, 224,
                                                                       "meta", warmup_steps=1, timed_steps=0)))
    summary = {
        "point": point.describe(), "alloc_conf": conf, "gpu": torch.cuda.get_device_name(),
        "total_bytes": total, "context_bytes_before_first_allocation": context,
        "measured": {k: getattr(measured, k) for k in ("status", "peak_alloc_bytes", "reserved_bytes", "message")},
        "predicted": {k: getattr(predicted, k) for k in ("status", "peak_alloc_bytes", "reserved_bytes", "message")},
    }
    if measured.reserved_bytes and predicted.reserved_bytes:
        summary["reserved_ratio_predicted_over_measured"] = predicted.reserved_bytes / measured.reserved_bytes
    (out / "memory_snapshot.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))
    return 0 if measured.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
