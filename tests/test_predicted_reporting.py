"""Predicted throughput in figures, reports and the CLI's tables, kept apart from measured throughput.

Rows are written by hand (no measurement, no GPU): meta rows priced on the ``t4`` device model, as
``sweep-batch --device meta --gpu t4`` writes them, beside cuda rows that measured their throughput.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from actbench.cli.tables import render_maxima
from actbench.planning.search import SearchOutcome
from actbench.reporting import paper
from actbench.reporting.analysis import BatchGroup, batch_groups
from actbench.reporting.report import build_report
from actbench.reporting.runs import find_runs
from actbench.reporting.speed import actnn_series
from actbench.reporting.throughput_figure import plot_throughput_vs_batch
from actbench.schema import InputSize, ResultRow

GIB = 1 << 30
T4_USABLE = 15569256448
_keys = iter(range(10**6))


def row(strategy: str, batch: int, status: str = "ok", *, device: str = "meta", measured: float | None = None,
        predicted: float | None = None, act: int | None = None) -> ResultRow:
    """A ResNet-50 224 px row: planned for the t4 spec on meta, or measured under 16 GiB on cuda."""
    meta = device == "meta"
    return ResultRow(key=f"p{next(_keys):06d}", run_id="run", env_id="env", status=status, message="",
                     model="resnet50", extra_blocks=0, width_per_group=None, depth=50, strategy=strategy,
                     batch_size=batch, image_size=224, device=device,
                     budget_bytes=T4_USABLE if meta else 16 * GIB, gpu="t4" if meta else None,
                     activation_bytes=act, samples_per_s_median=measured,
                     predicted_samples_per_s=predicted, predicted_step_s=batch / predicted if predicted else None,
                     device_model="t4" if predicted else None)


def levels_rows() -> list[ResultRow]:
    """At 64 L0 is fastest; at 256 L0 does not fit (its row still holds a number, which must not count)
    and L1 is; at 608 only L3 fits."""
    return [row("L0", 64, predicted=120.0), row("L1", 64, predicted=110.0), row("L3", 64, predicted=90.0, act=64 * 7 << 20),
            row("L0", 256, "over_budget", predicted=200.0), row("L1", 256, predicted=105.0),
            row("L3", 256, predicted=88.0), row("L1", 608, "over_budget"), row("L3", 608, predicted=86.0),
            row("fp32", 64, predicted=130.0, act=64 * 80 << 20), row("fp32", 160, predicted=131.0),
            row("fp32", 192, "over_budget"), row("L3", 704, "over_budget")]


def group(rows: list[ResultRow]) -> BatchGroup:
    return BatchGroup(model="resnet50", size=InputSize(224, 224), budget_bytes=T4_USABLE, rows=tuple(rows), run_names=("run",))


def test_derived_actnn_series_picks_the_fastest_level_that_fits() -> None:
    (series,) = actnn_series(group(levels_rows()))
    assert series.predicted and series.device_model == "t4"
    assert [(p.batch_size, p.strategy, p.samples_per_s) for p in series.points] == [
        (64, "L0", 120.0), (256, "L1", 105.0), (608, "L3", 86.0)]


def test_predicted_series_are_dashed_labelled_and_never_mixed_with_measured() -> None:
    cuda = [row("L3", 64, device="cuda", measured=50.0), row("L3", 256, device="cuda", measured=52.0)]
    rows = levels_rows() + cuda
    fig = plot_throughput_vs_batch(BatchGroup("resnet50", InputSize(224, 224), None, tuple(rows), ("run",)))
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    predicted = lines["L3 (predicted, t4)"]
    assert predicted.get_linestyle() == "--"
    assert list(predicted.get_xdata()) == [64, 256, 608] and list(predicted.get_ydata()) == [90.0, 88.0, 86.0]
    measured = lines["L3"]  # the cuda rows' measurements alone, solid
    assert measured.get_linestyle() == "-" and list(measured.get_ydata()) == [50.0, 52.0]
    actnn = lines["ActNN (predicted, t4)"]
    assert actnn.get_linestyle() == "--" and list(actnn.get_ydata()) == [120.0, 105.0, 86.0]
    # meta rows measure nothing: no series of theirs but the predicted ones; one measured level has no
    # "ActNN" curve of its own (nothing to choose from)
    assert {label for label in lines if "L3" in label or "ActNN" in label} == {
        "L3 (predicted, t4)", "L3", "ActNN (predicted, t4)"}
    assert "dashed: predicted" in fig.get_supxlabel() and "not measured" in fig.get_supxlabel()


def test_meta_rows_without_predictions_draw_no_throughput() -> None:
    rows = [row("fp32", 64), row("L3", 64), row("L3", 256)]
    assert plot_throughput_vs_batch(group(rows)) is None


def _write_run(root: Path, name: str, rows: list[ResultRow], env: dict) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    (folder / "env.json").write_text(json.dumps(env))


def test_report_opens_with_the_claims_table_and_ends_with_the_environment(tmp_path: Path) -> None:
    rows = levels_rows()
    _write_run(tmp_path, "sweep-batch_resnet50_meta_224px_aaaa", rows,
               {"env_id": "env", "device": "meta", "torch": "2.14.1", "python": "3.11.7"})
    text = build_report(find_runs(tmp_path), tmp_path, tmp_path, paper_points=paper.load_throughput())
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[0] == "## The paper's claims beside this run's"
    assert headings[1] == "## Speed predictions"
    assert headings[-1] == "## Environment"
    claims = text[text.index(headings[0]):text.index(headings[1])]
    first_table = [line for line in claims.splitlines() if line.startswith("|")]
    assert first_table[0].startswith("| claim | paper | this run |")
    l3 = next(line for line in first_table if "throughput ÷ fp32, L3" in line)
    # L3 has 64 and 256, fp32 64 and 160: the largest batch both fit is 64 (90 ÷ 130)
    assert "| 0.69 |" in l3 and "predicted on the t4 device model, batch 64" in l3
    assert "measured" not in l3
    assert "activation memory, fp32 ÷ L3" in claims and "predicted on meta" in claims
    speed = text[text.index(headings[1]):text.index(headings[2])]
    assert "`t4`" in speed and "1.14" in speed  # the t4 model's trust figure against the paper's fp32


def test_maxima_table_shows_predicted_samples_per_s_beside_measured(capsys: pytest.CaptureFixture) -> None:
    fits, fails = row("L3", 608, predicted=86.4), row("L3", 640, "over_budget")
    outcome = SearchOutcome(rows=[fits, fails], maxima={"L3": 608}, best_rows={"L3": fits}, dim="batch")
    render_maxima(outcome, "batch")
    out = capsys.readouterr().out
    assert "predicted samples/s" in out and "86.4 (t4)" in out
    assert "not a measurement" in out
    unpriced = row("L3", 608)
    render_maxima(SearchOutcome(rows=[unpriced], maxima={"L3": 608}, best_rows={"L3": unpriced}), "batch")
    assert "predicted" not in capsys.readouterr().out


@pytest.mark.parametrize("newer_first", [False, True])
def test_pooled_duplicate_keeps_the_latest_row(tmp_path: Path, newer_first: bool) -> None:
    """A plan's probe written before predictions existed and a sweep's newer row of the same point: the
    newer one is pooled, whichever run folder sorts first."""
    old = ResultRow(**{**asdict(row("L3", 608)), "finished_at": "2026-12-02T21:54:01+00:00"})
    new = ResultRow(**{**asdict(old), "predicted_samples_per_s": 86.0, "device_model": "t4",
                       "finished_at": "2026-12-04T18:55:00+00:00"})
    env = {"env_id": "env", "device": "meta"}
    _write_run(tmp_path, "a_run", [new if newer_first else old], env)
    _write_run(tmp_path, "b_run", [old if newer_first else new], env)
    (pooled,) = batch_groups(find_runs(tmp_path))
    assert [r.predicted_samples_per_s for r in pooled.rows] == [86.0]
