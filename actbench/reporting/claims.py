"""The report's opening table: the paper's claims beside this run's numbers, each labelled how it was had.

Each claim is one row: the paper's number, ours, ours ÷ the paper's, and the basis of ours: measured on
a device, or predicted (memory on meta, throughput by the step-time model on a named device model).
A prediction is never presented as a measurement. The numbers come from the same tables as the rest
of the report (:mod:`actbench.reporting.analysis`), so the opening table and the sections agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from actbench.core.devices import is_prediction
from actbench.reporting import paper as paper_ref
from actbench.reporting.analysis import BatchGroup, Series, batch_groups, max_batch_table, memory_table
from actbench.reporting.runs import Run
from actbench.reporting.scale import scale_groups
from actbench.reporting.speed import measured_rate, predicted_rate
from actbench.schema import DEFAULT_PRECISION, LEVEL_NAMES, ResultRow

#: Strategies whose throughput ÷ fp32's the table compares, in order.
SPEED_STRATEGIES: tuple[str, ...] = LEVEL_NAMES + ("swap", "checkpoint")


@dataclass(frozen=True)
class Claim:
    """One row of the claims table; ``basis`` says measured or predicted, on what, at which setting."""

    claim: str
    paper: str
    ours: str
    basis: str
    ratio: str = "–"


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "–" if ours is None or not theirs else f"{ours / theirs:.2f}"


def _setting(group: BatchGroup) -> str:
    where = f"{group.gpu} spec" if group.gpu else ("no budget" if group.budget_bytes is None else "budget")
    return f"{group.model}, {group.size.text()} px, {where}"


def _memory_basis(device: str, group: BatchGroup) -> str:
    return f"{'predicted on ' + device if is_prediction(device) else 'measured on ' + device} ({_setting(group)})"


def _preferred(groups: Sequence[BatchGroup]) -> list[BatchGroup]:
    """Measured groups first, then groups planned for the paper's GPU spec, then the rest."""
    return sorted(groups, key=lambda g: (not g.measured_devices, g.gpu != paper_ref.SETTING.gpu_spec))


def activation_claim(groups: Sequence[BatchGroup]) -> Claim | None:
    """fp32 ÷ L3 activation bytes at one batch (ResNet-50, 224²), measured where the run has it."""
    for group in _preferred([g for g in groups if paper_ref.matches_model(g.model, g.size)]):
        batch_size, entries = memory_table(group)
        by_series = {e.series: e for e in entries}
        for device in sorted({e.series.device for e in entries}, key=is_prediction):
            fp32, l3 = by_series.get(Series("fp32", device)), by_series.get(Series("L3", device))
            if fp32 and l3 and fp32.activation_bytes and l3.activation_bytes:
                ours = fp32.activation_bytes / l3.activation_bytes
                return Claim("activation memory, fp32 ÷ L3", f"{paper_ref.ACTIVATION_REDUCTION_L3:g}×", f"{ours:.2f}×",
                             _memory_basis(device, group) + f", batch {batch_size}",
                             _ratio(ours, paper_ref.ACTIVATION_REDUCTION_L3))
    return None


def max_batch_claims(groups: Sequence[BatchGroup]) -> list[Claim]:
    """Maximum batch × fp32's per strategy the paper reports, from the first group in its setting."""
    matching = [g for g in groups if g.model == g.base_model
                and paper_ref.matches(g.base_model, g.size, g.budget_bytes, gpu=g.gpu)]
    base = paper_ref.paper_max_batch("fp32")
    for group in _preferred(matching):
        claims = []
        for e in max_batch_table(group):
            theirs = paper_ref.paper_max_batch(e.series.strategy) if e.series.paper_comparable else None
            if theirs is None or e.series.strategy == "fp32" or e.multiple_text is None:
                continue
            bound = e.multiple_text[0] if e.multiple_text[0] in "≥≤" else ""
            ratio = _ratio(e.multiple_of_fp32, theirs / base)
            claims.append(Claim(f"maximum batch × fp32, {e.series.name}", f"{theirs / base:.2f}",
                                e.multiple_text, _memory_basis(e.series.device, group),
                                ratio if ratio == "–" else bound + ratio))
        if claims:
            return claims
    return []


def scale_claims(runs: Sequence[Run]) -> list[Claim]:
    """The largest depth, width or resolution × fp32's per strategy, where the run searched them."""
    claims = []
    for group in scale_groups(runs):
        entries = [e for e in group.table() if e.series.strategy != "fp32" and e.multiple_text]
        if not entries:
            continue
        ours = ", ".join(f"{e.series.name} {e.multiple_text}" for e in entries)
        kind = "predicted on" if any(e.series.predicted for e in entries) else "measured on"
        claims.append(Claim(f"maximum {group.dim} × fp32", "– (not among actbench's reference numbers)", ours,
                            f"{kind} {', '.join(group.devices)} ({group.model}, batch {group.batch_size})"))
    return claims


def paper_speed_ratios(points: Sequence[paper_ref.PaperPoint]) -> dict[str, float]:
    """Each strategy's mean images/s on the paper's figure ÷ fp32's (fp32 120 at batch 160)."""
    means: dict[str, float] = {}
    for strategy in {p.strategy for p in points}:
        rates = [p.samples_per_s for p in points if p.strategy == strategy and p.ok and p.samples_per_s]
        if rates:
            means[strategy] = sum(rates) / len(rates)
    fp32 = means.get("fp32")
    return {s: v / fp32 for s, v in means.items()} if fp32 else {}


def _rates(rows: Sequence[ResultRow], device_model: str | None) -> dict[tuple[str, int], float]:
    """(strategy, batch) -> measured samples/s (``device_model`` None) or predicted on ``device_model``."""
    out: dict[tuple[str, int], float] = {}
    for row in rows:
        if not row.ok or row.precision != DEFAULT_PRECISION:
            continue
        found = predicted_rate(row)
        rate = measured_rate(row) if device_model is None else (found[0] if found and found[1] == device_model
                                                                 else None)
        if rate is not None:
            out.setdefault((row.strategy, row.batch_size), rate)
    return out


def _speed_rows(rates: dict[tuple[str, int], float], basis: str, paper: dict[str, float]) -> list[Claim]:
    fp32 = {b: v for (s, b), v in rates.items() if s == "fp32"}
    if not fp32:
        return []
    top = max(fp32)
    paper_fp32 = paper_ref.FP32_IMAGES_PER_S
    claims = [Claim("fp32 images/s", f"{paper_fp32:g}", f"{fp32[top]:.1f}", f"{basis}, batch {top}",
                    _ratio(fp32[top], paper_fp32))]
    for strategy in SPEED_STRATEGIES:
        common = [b for (s, b) in rates if s == strategy and b in fp32]
        if not common:
            continue
        batch = max(common)
        ours = rates[(strategy, batch)] / fp32[batch]
        claims.append(Claim(f"throughput ÷ fp32, {strategy}", _fmt(paper.get(strategy)), f"{ours:.2f}",
                            f"{basis}, batch {batch}", _ratio(ours, paper.get(strategy))))
    return claims


def speed_claims(groups: Sequence[BatchGroup], points: Sequence[paper_ref.PaperPoint] | None) -> list[Claim]:
    """fp32's images/s and each strategy's throughput ÷ fp32's at the same batch (the largest both fit),
    measured where rows measured it and predicted per device model where rows carry predictions."""
    paper = paper_speed_ratios(points or ())
    for group in _preferred([g for g in groups if paper_ref.matches_model(g.model, g.size)]):
        claims = []
        for device in group.measured_devices:
            mine = [r for r in group.rows if r.device == device]
            claims += _speed_rows(_rates(mine, None), f"measured on {device}", paper)
        models = sorted({found[1] for r in group.rows if (found := predicted_rate(r)) is not None})
        for model in models:
            claims += _speed_rows(_rates(group.rows, model), f"predicted on the {model} device model", paper)
        if claims:
            return claims
    return []


def claims_table(runs: Sequence[Run], points: Sequence[paper_ref.PaperPoint] | None) -> list[Claim]:
    """Every claim this run has a number for, in the paper's order: memory, batch, scale, speed."""
    groups = batch_groups(runs)
    activation = activation_claim(groups)
    return ([activation] if activation else []) + max_batch_claims(groups) + scale_claims(runs) \
        + speed_claims(groups, points)
