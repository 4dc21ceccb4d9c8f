"""One task's point measured on cpu and predicted on meta, and the checks every task's tests share:
L3 keeps several times fewer activation bytes than fp32, and meta predicts cpu's bytes."""

from __future__ import annotations

from typing import Callable

from actbench.measure.meta import MetaSessions
from actbench.measure.point import measure_point
from actbench.planning.point import Point

Rows = dict[tuple[str, str], object]


def cpu_and_meta_rows(point: Callable[[str, str], Point], strategies: tuple[str, ...] = ("fp32", "L3")) -> Rows:
    """``point(strategy, device)`` measured on cpu and predicted on meta, by (strategy, device)."""
    sessions = MetaSessions()
    rows: Rows = {}
    for strategy in strategies:
        rows[strategy, "cpu"] = measure_point(point(strategy, "cpu"))
        rows[strategy, "meta"] = sessions.measure_point(point(strategy, "meta"))
    return rows


def assert_l3_keeps_less(rows: Rows, device: str, times: float) -> object:
    """L3's activation bytes are ``times`` fewer than fp32's, its peak lower, FLOPs and model bytes equal;
    returns L3's row for checks of the task's own."""
    fp32, l3 = rows["fp32", device], rows["L3", device]
    assert fp32.status == "ok" and l3.status == "ok", (fp32.message, l3.message)
    assert times * l3.activation_bytes < fp32.activation_bytes, (l3.activation_bytes, fp32.activation_bytes)
    assert l3.peak_alloc_bytes < fp32.peak_alloc_bytes
    assert fp32.flops_per_sample > 0 and l3.flops_per_sample == fp32.flops_per_sample
    assert fp32.model_bytes == l3.model_bytes > 0
    return l3


def assert_meta_predicts_cpu(rows: Rows, strategy: str, tolerance: float = 0.01) -> None:
    """meta's activation and peak bytes within ``tolerance`` of cpu's; FLOPs and model bytes equal."""
    cpu, meta = rows[strategy, "cpu"], rows[strategy, "meta"]
    assert abs(meta.activation_bytes / cpu.activation_bytes - 1) <= tolerance, (meta.activation_bytes,
                                                                                cpu.activation_bytes)
    assert abs(meta.peak_alloc_bytes / cpu.peak_alloc_bytes - 1) <= tolerance, (meta.peak_alloc_bytes,
                                                                                cpu.peak_alloc_bytes)
    assert meta.flops_per_sample == cpu.flops_per_sample and meta.model_bytes == cpu.model_bytes
