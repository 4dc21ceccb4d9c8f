"""Figures and the Markdown report, checked through their content (matplotlib artists, report text).

Fixture runs are written by hand from ResultRow, so these tests need no measurement and no GPU:
a ResNet-50 sweep in the paper's setting (cuda, 16 GiB, 224²) with oom rows, meta predictions of the
same setting, a ResNet-18 sweep without a budget (no paper overlay allowed), and two max-scale runs
(depth with config.json as the harness writes it; width without, so the dimension is inferred).
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from matplotlib.colors import to_hex
from typer.testing import CliRunner

from actbench.reporting import paper
from actbench.studies.accuracy import AccuracyRow, AccuracyStore
from actbench.reporting.analysis import BatchGroup, batch_groups, max_batch_table, memory_table
from actbench.reporting.runs import find_runs, infer_scale_dimension
from actbench.reporting.scale import scale_groups
from actbench.cli import app
from actbench.reporting.plots import (PALETTE, PREDICTED_HATCH, figures_for, plot_activation_vs_batch, plot_max_batch,
                            plot_max_scale, plot_memory, plot_throughput_vs_batch, write_figures)
from actbench.reporting.report import build_accuracy_report, build_report, write_report
from actbench.schema import InputSize, ResultRow

GIB = 1 << 30
MIB = 1 << 20
BUDGET = 16 * GIB
_counter = iter(range(10**6))


def row(strategy: str, batch: int, status: str = "ok", *, model: str = "resnet50", device: str = "cuda",
        budget: int | None = BUDGET, image: int = 224, ips: float | None = None, act: int | None = None,
        peak: int | None = None, model_bytes: int | None = 300 * MIB, extra: int = 0, width: int | None = None,
        depth: int | None = None, run: str = "run") -> ResultRow:
    ok = status == "ok"
    return ResultRow(
        key=f"k{next(_counter):06d}", run_id=run, env_id="env1", status=status,
        message="" if ok else f"{status} at batch {batch}", model=model, extra_blocks=extra, width_per_group=width,
        depth=depth, strategy=strategy, batch_size=batch, image_size=image, device=device, budget_bytes=budget,
        activation_bytes=act if ok else None, peak_alloc_bytes=peak if ok else None,
        model_bytes=model_bytes if ok else None, samples_per_s_median=ips if ok else None,
        samples_per_s_iqr=(ips * 0.02 if ips and ok else None), flops_per_sample=12.3e9 if ok else None)


def write_run(root: Path, name: str, rows: list[ResultRow], env: dict | None = None, config: dict | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "rows.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    (d / "env.json").write_text(json.dumps(env or {"env_id": "env1", "device": "cuda", "torch": "2.11.0+cu130",
                                                    "gpu_name": "NVIDIA H200"}))
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    return d


def act(batch: int, per_sample_mib: float) -> int:
    return int(batch * per_sample_mib * MIB)


def resnet50_rows() -> list[ResultRow]:
    rows = []
    for b in (32, 96, 160):
        rows.append(row("fp32", b, ips=120.0, act=act(b, 90), peak=act(b, 95) + GIB))
    rows.append(row("fp32", 192, "oom"))
    rows.append(row("fp32", 256, "oom"))  # a later failure: the × must sit at the first one
    for b in (160, 416, 608):
        rows.append(row("L3", b, ips=85.0, act=act(b, 7.5), peak=act(b, 9) + GIB))
    rows.append(row("L3", 640, "oom"))
    for b in (160, 480):
        rows.append(row("swap", b, ips=28.0, act=act(b, 1), peak=act(b, 2) + GIB))
    rows.append(row("swap", 512, "over_budget"))
    return rows


def meta_rows() -> list[ResultRow]:
    rows = [row("fp32", b, device="meta", act=act(b, 88), peak=act(b, 93) + GIB) for b in (32, 160)]
    rows += [row("L3", b, device="meta", act=act(b, 7.3), peak=act(b, 9) + GIB) for b in (160, 608)]
    rows.append(row("L3", 704, "over_budget", device="meta"))
    return rows


def depth_rows() -> list[ResultRow]:
    kw = dict(model="resnet152", device="cpu", budget=2 * GIB, image=64)
    rows = [row("fp32", 64, extra=e, depth=152 + 3 * e, ips=10.0 - e / 10, act=GIB, peak=GIB, **kw) for e in (0, 4)]
    rows.append(row("fp32", 64, "over_budget", extra=8, depth=176, **kw))
    rows += [row("L3", 64, extra=e, depth=152 + 3 * e, ips=7.0, act=GIB // 8, peak=GIB, **kw) for e in (0, 16, 40)]
    rows.append(row("L3", 64, "over_budget", extra=48, depth=296, **kw))
    return rows


def width_rows() -> list[ResultRow]:
    kw = dict(model="resnet152", device="cpu", budget=2 * GIB, image=64)
    return ([row("fp32", 64, width=w, ips=5.0, act=GIB, peak=GIB, **kw) for w in (64, 96)]
            + [row("L3", 64, width=w, ips=4.0, act=GIB // 8, peak=GIB, **kw) for w in (64, 128, 192)])


@pytest.fixture()
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    write_run(root, "sweep-batch_resnet50_cuda_224px_aaaa", resnet50_rows(), config={"command": "sweep-batch"})
    write_run(root, "sweep-batch_resnet50_meta_224px_bbbb", meta_rows(),
              env={"env_id": "env2", "device": "meta", "torch": "2.14.1"})
    write_run(root, "nested/sweep-batch_resnet18_cpu_32px_cccc",
              [row(s, b, model="resnet18", device="cpu", budget=None, image=32, ips=30.0 + b, act=act(b, 1),
                   peak=act(b, 2)) for s in ("fp32", "checkpoint") for b in (2, 4)],
              env={"env_id": "env3", "device": "cpu", "torch": "2.14.1"}, config={"command": "sweep-batch"})
    write_run(root, "max-scale-depth_resnet152_cpu_64px_dddd", depth_rows(),
              config={"command": "max-scale", "dim": "depth", "batch": 64})
    write_run(root, "max-scale-width_resnet152_cpu_64px_eeee", width_rows())  # no config.json: inferred
    return root


def group_of(results: Path, model: str) -> BatchGroup:
    return next(g for g in batch_groups(find_runs(results)) if g.model == model)


def lines_by_label(ax) -> dict:
    return {ln.get_label(): ln for ln in ax.get_lines()}


# --- discovery and derived tables ------------------------------------------------------------
def test_find_runs_recurses_and_accepts_a_single_run(results: Path) -> None:
    names = [r.name for r in find_runs(results)]
    assert "sweep-batch_resnet18_cpu_32px_cccc" in names and len(names) == 5
    one = find_runs(results / "sweep-batch_resnet50_cuda_224px_aaaa")
    assert [r.name for r in one] == ["sweep-batch_resnet50_cuda_224px_aaaa"]


@pytest.mark.parametrize("make", ["missing", "empty", "empty_rows"])
def test_find_runs_bad_input_raises_one_line(tmp_path: Path, make: str) -> None:
    target = tmp_path / "x"
    if make != "missing":
        target.mkdir()
    if make == "empty_rows":
        (target / "rows.jsonl").write_text("")
    with pytest.raises(ValueError) as info:
        find_runs(target)
    assert "\n" not in str(info.value) and str(target) in str(info.value)


def test_scale_dimension_from_config_and_inferred(results: Path) -> None:
    dims = {g.run_name: g.dim for g in scale_groups(find_runs(results))}
    assert dims == {"max-scale-depth_resnet152_cpu_64px_dddd": "depth",
                    "max-scale-width_resnet152_cpu_64px_eeee": "width"}
    # a batch sweep varies the batch, so it is not a max-scale run
    assert infer_scale_dimension(resnet50_rows()) is None


@pytest.mark.parametrize("dim, scale", [("depth", True), ("resolution", True), ("batch", False)])
def test_a_plan_over_a_scale_dimension_draws_its_maxima_not_a_chart_per_probe(tmp_path: Path, dim: str,
                                                                              scale: bool) -> None:
    """The planned twin of max-scale (``plan --dim depth``, on meta) is a scale group with one max figure;
    a batch plan stays a batch group."""
    rows = {"depth": depth_rows, "batch": resnet50_rows,
            "resolution": lambda: [row("fp32", 64, model="resnet152", image=v) for v in (224, 256)]}[dim]()
    write_run(tmp_path, f"plan-{dim}_x_meta_224px_ffff", rows, config={"command": "plan", "dim": dim, "batch": 64})
    runs = find_runs(tmp_path)
    assert [g.dim for g in scale_groups(runs)] == ([dim] if scale else [])
    names = [f.name for f in figures_for(runs)]
    assert [n for n in names if n.startswith(("max_depth_", "max_width_", "max_resolution_"))] == \
        ([f"max_{dim}_plan-{dim}_x_meta_224px_ffff"] if scale else [])
    assert any(n.startswith("memory__") for n in names) != scale


@pytest.mark.parametrize("field, values, dim", [("extra", (0, 8), "depth"), ("width", (64, 128), "width"),
                                                ("image", (224, 256), "resolution"), ("image", (224, 224), None)])
def test_infer_scale_dimension_from_the_varying_field(field: str, values: tuple, dim: str | None) -> None:
    rows = [row("fp32", 64, model="resnet152", **{field: v}) for v in values]
    assert infer_scale_dimension(rows) == dim


def test_max_batch_table_measured_and_predicted(results: Path) -> None:
    table = {(e.series.strategy, e.series.device): e for e in max_batch_table(group_of(results, "resnet50"))}
    assert table["fp32", "cuda"].max_batch == 160 and table["fp32", "cuda"].bounded
    assert table["L3", "cuda"].max_batch == 608 and table["L3", "cuda"].multiple_of_fp32 == pytest.approx(3.8)
    assert table["swap", "cuda"].max_batch == 480
    assert table["L3", "meta"].max_batch == 608 and table["L3", "meta"].label == "L3 (predicted)"
    assert table["L3", "meta"].multiple_of_fp32 == pytest.approx(608 / 160)


def test_memory_table_picks_the_batch_most_series_share(results: Path) -> None:
    batch, entries = memory_table(group_of(results, "resnet50"))
    assert batch == 160  # fp32, L3, swap measured and fp32, L3 predicted all have an ok row there
    assert len(entries) == 5


# --- figures -----------------------------------------------------------------------------------
def test_throughput_figure_series_failures_shading_and_title(results: Path) -> None:
    fig = plot_throughput_vs_batch(group_of(results, "resnet50"))
    ax = fig.axes[0]
    lines = lines_by_label(ax)
    assert len(lines["fp32"].get_xdata()) == 3 and len(lines["L3"].get_xdata()) == 3
    assert list(lines["swap"].get_xdata()) == [160, 480]
    assert not any(label.startswith("paper") for label in lines)  # no overlay unless asked
    fails = {ln.get_gid(): ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("fail:")}
    assert set(fails) == {"fail:fp32:cuda", "fail:L3:cuda", "fail:swap:cuda", "fail:L3:meta"}
    for gid, batch in (("fail:fp32:cuda", 192), ("fail:L3:cuda", 640), ("fail:swap:cuda", 512)):
        ln = fails[gid]
        assert ln.get_marker() == "x" and to_hex(ln.get_color()) == to_hex("red")
        assert list(ln.get_xdata()) == [batch]
    # fp32-feasible range shaded up to fp32's largest ok batch
    spans = [p for p in ax.patches if "fp32 fits" in p.get_label()]
    assert len(spans) == 1 and spans[0].get_x() + spans[0].get_width() == pytest.approx(160)
    assert "images/s" in ax.get_ylabel() and "batch" in ax.get_xlabel()
    title = ax.get_title()
    assert "resnet50" in title and "cuda" in title and "16 GiB" in title and "224" in title
    assert "meta (predicted)" in title


def test_paper_overlay_only_in_the_papers_setting(results: Path) -> None:
    points = paper.load_throughput()
    fig = plot_throughput_vs_batch(group_of(results, "resnet50"), points)
    labels = {ln.get_label() for ln in fig.axes[0].get_lines()}
    assert {"paper: L3", "paper: fp32", "paper: swap"} <= labels
    l3 = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == "paper: L3")
    assert list(l3.get_xdata()) == [448, 608]
    other = plot_throughput_vs_batch(group_of(results, "resnet18"), points)
    assert not any(ln.get_label().startswith("paper") for ln in other.axes[0].get_lines())
    assert "no budget" in other.axes[0].get_title()


@pytest.mark.parametrize("body, needle", [
    (b"L3,64,-100,ok", "line 2: ips must be a positive number"),
    (b"L3,64,inf,ok", "line 2: ips must be a positive number"),
    (b"L3,0,80,ok", "line 2: batch_size must be an integer in 1..1048576, got '0'"),
    (b"L3,64,80,weird", "line 2: status must be one of ok, oom, got 'weird'"),
    (b"../x,64,80,ok", "line 2: strategy must be a label"),
    (b"L3,64", "line 2: 2 cells, the header names 4"),
    (b"L3,64," + b"9" * 200_000 + b",ok", "line 2: not CSV"),
    (b"L3,64,80,ok\n\xfe\xff", "line 3: not UTF-8"),
    (b"# a note\nL3,64,80,ok\nL3,64,80,bad", "line 4: status must be one of"),
    (b"L3,64,80,bad\n\xfe\xff", "line 2: status must be one of"),
    (b"L3,64,80,ok\n\xfe\xff\nL3,64,80,bad", "line 3: not UTF-8"),
], ids=["ips-negative", "ips-inf", "batch", "status", "strategy", "columns", "field-limit",
        "utf8", "comment-counted", "row-first", "problem-first"])
def test_a_paper_csv_with_a_bad_line_is_one_line_naming_file_and_line(tmp_path: Path, body: bytes,
                                                                      needle: str) -> None:
    path = tmp_path / "paper.csv"
    path.write_bytes(b"strategy,batch_size,ips,status\n" + body + b"\n")
    with pytest.raises(ValueError) as caught:
        paper.load_throughput(path)
    assert needle in str(caught.value) and str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_a_paper_csv_passes_over_notes_and_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "paper.csv"
    path.write_bytes(b"\xef\xbb\xbf# a note\n\n  # another\nstrategy,batch_size,ips,status\n# mid\nL3,64,80,ok\n")
    assert paper.load_throughput(path) == (paper.PaperPoint("L3", 64, 80.0, "ok"),)
    path.write_bytes(b"# a note\nstrategy,batch,ips,status\nL3,64,80,ok\n")
    with pytest.raises(ValueError, match="paper throughput CSV .*paper.csv'.*missing column.*batch_size"):
        paper.load_throughput(path)
    with pytest.raises(ValueError, match="paper throughput CSV .*absent.csv' cannot be read"):
        paper.load_throughput(tmp_path / "absent.csv")
    path.write_bytes(b"# a note\nstrategy,batch_size,ips,status\n# no points yet\n")
    with pytest.raises(ValueError, match="paper throughput CSV .*paper.csv' has no points"):
        paper.load_throughput(path)
    path.write_bytes(b"# only a note\n\n")
    with pytest.raises(ValueError, match=r"paper.csv': missing column.* \(it has no line but notes and blank ones\)"):
        paper.load_throughput(path)


def test_predicted_rows_are_hollow_and_labelled(results: Path) -> None:
    fig = plot_activation_vs_batch(group_of(results, "resnet50"))
    ax = fig.axes[0]
    lines = lines_by_label(ax)
    assert lines["L3 (predicted)"].get_markerfacecolor() == "none"
    assert lines["L3"].get_markerfacecolor() != "none"
    assert to_hex(lines["L3 (predicted)"].get_color()) == to_hex(lines["L3"].get_color()) == PALETTE["L3"]
    assert "GiB" in ax.get_ylabel()
    assert list(lines["L3"].get_ydata()) == pytest.approx([b * 7.5 / 1024 for b in (160, 416, 608)])


def test_max_batch_bars_hatch_predictions_and_write_multiples(results: Path) -> None:
    fig = plot_max_batch(group_of(results, "resnet50"))
    ax = fig.axes[0]
    bars = {c.get_label(): c.patches[0] for c in ax.containers}
    assert bars["L3"].get_height() == 608 and bars["fp32"].get_height() == 160
    assert PREDICTED_HATCH and bars["L3 (predicted)"].get_hatch() == PREDICTED_HATCH and not bars["L3"].get_hatch()
    assert bars["L3 (predicted)"].get_facecolor()[3] == 0  # hollow: only the hatch and edge carry colour
    assert to_hex(bars["L3"].get_facecolor()) == PALETTE["L3"]
    texts = [t.get_text() for t in ax.texts]
    assert any("3.80× fp32" in t for t in texts)
    assert "images" in ax.get_ylabel() and "budget 16 GiB" in ax.get_title()


def test_memory_figure_groups_three_metrics(results: Path) -> None:
    fig = plot_memory(group_of(results, "resnet50"))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["activation", "peak allocated", "model"]
    assert len(ax.containers) == 5 and all(len(c.patches) == 3 for c in ax.containers)
    assert "GiB" in ax.get_ylabel() and "batch 160" in ax.get_title()
    fp32 = next(c for c in ax.containers if c.get_label() == "fp32")
    assert fp32.patches[0].get_height() == pytest.approx(160 * 90 / 1024)


def test_max_scale_figure_real_depth_and_throughput(results: Path) -> None:
    group = next(g for g in scale_groups(find_runs(results)) if g.dim == "depth")
    fig = plot_max_scale(group)
    ax_max, ax_ips = fig.axes
    heights = {c.get_label(): c.patches[0].get_height() for c in ax_max.containers}
    assert heights == {"fp32": 152 + 12, "L3": 152 + 120}
    assert "layers" in ax_max.get_ylabel() and "images/s" in ax_ips.get_ylabel()
    assert [c.patches[0].get_height() for c in ax_ips.containers] == pytest.approx([9.6, 7.0])
    title = fig.get_suptitle()
    assert "resnet152" in title and "cpu" in title and "budget 2 GiB" in title and "batch 64" in title


def test_a_max_scale_figure_of_predictions_has_no_throughput_panel(results: Path) -> None:
    """meta rows carry no throughput: their figure is the maxima alone, not an empty second panel."""
    group = next(g for g in scale_groups(find_runs(results)) if g.dim == "depth")
    predicted = replace(group, rows=tuple(replace(r, device="meta", samples_per_s_median=None) for r in group.rows))
    fig = plot_max_scale(predicted)
    assert len(fig.axes) == 1 and "layers" in fig.axes[0].get_ylabel()
    heights = {c.get_label(): c.patches[0].get_height() for c in fig.axes[0].containers}
    assert heights == {"fp32 (predicted)": 164, "L3 (predicted)": 272}


def test_write_figures_png_and_pdf_with_deterministic_names(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "figs"
    written = write_figures(results, out)
    names = sorted(p.name for p in written)
    assert "throughput_vs_batch__resnet50_224px_16GiB.png" in names
    assert "max_batch__resnet18_32px_nobudget.pdf" in names
    assert "max_depth_max-scale-depth_resnet152_cpu_64px_dddd.png" in names
    assert "max_width_max-scale-width_resnet152_cpu_64px_eeee.pdf" in names
    assert all(p.exists() and p.stat().st_size > 0 for p in written)
    assert len([n for n in names if n.endswith(".png")]) == len([n for n in names if n.endswith(".pdf")])
    same = [out / "memory__resnet50_224px_16GiB.png", out / "throughput_vs_batch__resnet50_224px_16GiB.pdf"]
    first = [p.read_bytes() for p in same]
    write_figures(results, out)
    assert [p.read_bytes() for p in same] == first  # same rows, same files (no timestamps embedded)


# --- report --------------------------------------------------------------------------------------
def test_report_tables_and_paper_ratios(results: Path, tmp_path: Path) -> None:
    text = build_report(find_runs(results), results, tmp_path, (), paper.load_throughput())
    assert "NVIDIA H200" in text and "2.11.0+cu130" in text
    assert "vs 1.7" in text and "synthetic" in text and "predictions" in text
    # max batch: ours, × fp32, images/s, paper, ratio, paper × fp32
    # the paper's maxima are on a 32-grid: a span, and ours ÷ paper against both of its ends
    assert "| L3 | 608 | 3.80 | 85.0 | 608–639 | 0.95–1.00 | 3.80 |" in text
    assert "| fp32 | 160 | 1.00 | 120.0 | 160–191 | 0.84–1.00 | 1.00 |" in text
    assert "| swap | 480 | 3.00 | 28.0 | 480–511 | 0.94–1.00 | 3.00 |" in text
    assert "all multiples of 32: each is a lower bound" in text
    # activation reduction at L3 beside the paper's 12x
    assert "| L3 | 1.17 GiB |" in text and "| 12.00× | 12× | 1.00 |" in text
    # throughput: the paper's nearest point within ±4 batch and the ratio
    assert "| L3 | 608 | ok | 85.0 | 1.7 | 86.1 (608) | 0.99 |" in text
    assert "| fp32 | 192 | oom: oom at batch 192 |" in text
    # resnet18 is not the paper's setting: its max-batch table has no paper columns
    r18 = text.split("## Setting: resnet18")[1].split("\n## ")[0]
    assert "| strategy | max batch | × fp32 | images/s at max |\n" in r18
    assert "Maximum depth" in text and "272 (+40 blocks)" in text
    # nothing was seen failing in the width run: both maxima are lower bounds, so there is no ratio
    assert "Maximum width" in text and "| L3 | ≥192 | – |" in text and "| fp32 | ≥96 | – |" in text
    assert "× fp32 = this maximum depth ÷ fp32's maximum depth, both in layers" in text


def test_report_memory_host_copies_and_no_predicted_throughput(results: Path, tmp_path: Path) -> None:
    text = build_report(find_runs(results), results, tmp_path, (), paper.load_throughput())
    r50 = text.split("## Setting: resnet50")[1].split("\n## ")[0]
    assert "(predicted) | 704 |" not in r50.split("### Throughput")[1]  # meta has no throughput to report
    assert "host copies" not in r50  # nothing went to the host in these runs: no empty column
    kw = dict(model="resnet18", device="cpu", budget=None, image=32)
    rows = [row("fp32", 4, act=64 * MIB, peak=70 * MIB, **kw),
            replace(row("swap", 4, act=4, peak=10 * MIB, **kw), host_bytes=64 * MIB),
            row("L3", 4, act=5 * MIB, peak=12 * MIB, **kw)]
    write_run(tmp_path / "h", "sweep-batch_resnet18_cpu_32px_ffff", rows, config={"command": "sweep-batch"})
    text = build_report(find_runs(tmp_path / "h"), tmp_path / "h", tmp_path, ())
    assert "| strategy | activation | peak allocated | model (params+grads+optimizer) | host copies |" in text
    assert "| swap | 4 B | 10.00 MiB | 300.00 MiB | 64.00 MiB | >1000× |" in text  # not 16777216.00×
    assert "| L3 | 5.00 MiB | 12.00 MiB | 300.00 MiB | – | 12.80× |" in text


def test_report_links_figures_relatively(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "doc" / "report.md"
    res = write_report(results, out, tmp_path / "figs")
    text = out.read_text()
    assert res.path == out and res.figures
    assert "](../figs/throughput_vs_batch__resnet50_224px_16GiB.png)" in text
    assert "](../figs/max_depth_max-scale-depth_resnet152_cpu_64px_dddd.png)" in text


# --- CLI -----------------------------------------------------------------------------------------
def invoke(args: list[str]):
    return CliRunner().invoke(app, args, catch_exceptions=False)


def test_cli_plot_writes_and_prints(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli-figs"
    res = invoke(["plot", str(results), "--out", str(out), "--paper"])
    assert res.exit_code == 0, res.output
    assert "overlaid nothing" not in res.stderr
    printed = res.stdout.split()
    assert str(out / "throughput_vs_batch__resnet50_224px_16GiB.png") in printed
    assert all(Path(p).exists() for p in printed)


def test_cli_plot_default_out_under_results(results: Path) -> None:
    run = results / "nested" / "sweep-batch_resnet18_cpu_32px_cccc"
    res = invoke(["plot", str(run), "--paper"])
    assert res.exit_code == 0
    assert "overlaid nothing" in res.stderr  # resnet18 at 32 px without a budget is not the paper's setting
    assert (run / "figures" / "throughput_vs_batch__resnet18_32px_nobudget.pdf").exists()


@pytest.mark.parametrize("command", ["plot", "report"])
def test_cli_bad_results_dir_exits_with_one_line(tmp_path: Path, command: str) -> None:
    for target in (tmp_path / "missing", tmp_path):
        res = invoke([command, str(target)])
        assert res.exit_code == 2
        assert res.stderr.strip().count("\n") == 0 and res.stderr.startswith("actbench: error:")


def test_cli_plot_paper_csv_missing(results: Path, tmp_path: Path) -> None:
    res = invoke(["plot", str(results), "--paper", "--paper-csv", str(tmp_path / "nope.csv")])
    assert res.exit_code == 2 and "nope.csv" in res.stderr


def test_cli_report(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    res = invoke(["report", str(results), "--out", str(out), "--no-figures"])
    assert res.exit_code == 0 and res.stdout.strip() == str(out)
    text = out.read_text()
    assert "## Environment" in text and "### Maximum batch per strategy" in text and "### Figures" not in text


def acc_row(setting: str, bits: float | None, test_acc: float, status: str = "ok") -> AccuracyRow:
    return AccuracyRow(key=f"a{next(_counter):06d}", run_id="acc", status=status, message="", setting=setting,
                       target_bits=bits, mean_bits=bits, train_loss_final=1.0 - test_acc, train_accuracy_final=test_acc,
                       test_loss=1.1 - test_acc, test_accuracy=test_acc, chance_accuracy=0.1, steps=100, batch_size=64,
                       image_size=24, num_classes=10, model="resnet8", seed=0, elapsed_s=9.0)


def write_accuracy_run(root: Path, name: str = "accuracy_resnet8_24px_eeee") -> Path:
    store = AccuracyStore(root / name)
    for r in (acc_row("fp32", None, 0.785), acc_row("4 bits", 4.0, 0.781), acc_row("2 bits", 2.0, 0.779)):
        store.append(r)
    return store.run_dir


def test_cli_plot_and_report_on_accuracy_runs_alone(tmp_path: Path) -> None:
    run = write_accuracy_run(tmp_path / "acc")
    res = invoke(["plot", str(tmp_path / "acc")])
    assert res.exit_code == 0, res.output
    assert res.stdout.split() == [str(tmp_path / "acc" / "figures" / f"accuracy_vs_bits__{run.name}.{f}")
                                  for f in ("png", "pdf")]
    res = invoke(["report", str(tmp_path / "acc"), "--out", str(tmp_path / "acc.md")])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "acc.md").read_text()
    assert text.startswith("# actbench report — accuracy vs activation bits")
    assert "| 2 bits | ok | 2.00 |" in text and "| -0.6 |" in text  # 0.779 - 0.785 in points
    assert f"](acc/figures/accuracy_vs_bits__{run.name}.png)" in text


def test_report_puts_harness_and_accuracy_runs_in_one_file(results: Path) -> None:
    write_accuracy_run(results)
    res = write_report(results)
    text = res.path.read_text()
    assert text.startswith("# actbench report\n") and text.count("\n# ") == 0  # one title
    assert text.index("### Maximum batch per strategy") < text.index("## Accuracy vs activation bits")
    assert "### Run `accuracy_resnet8_24px_eeee`" in text
    names = {p.name for p in res.figures}
    assert {"throughput_vs_batch__resnet50_224px_16GiB.png", "accuracy_vs_bits__accuracy_resnet8_24px_eeee.pdf"} <= names


def test_cli_empty_folder_names_both_row_files(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "accuracy.jsonl").write_text("")
    res = invoke(["plot", str(tmp_path)])
    assert res.exit_code == 2 and "no rows.jsonl or accuracy.jsonl" in res.stderr


def test_paper_reference_numbers() -> None:
    assert paper.MAX_BATCH["L5"] / paper.MAX_BATCH["fp32"] == pytest.approx(6.6)
    assert paper.matches("resnet50", InputSize(224, 224), 16 * GIB) and paper.matches("resnet50", InputSize(224, 224), 16 * 10**9)
    # rows planned for a GPU spec match through the paper GPU's spec, whatever their budget
    assert paper.matches("resnet50", InputSize(224, 224), 1, gpu="t4") and not paper.matches("resnet50", InputSize(224, 224), 16 * GIB, gpu="a10")
    assert paper.paper_batch_range("L5") == (1056, 1087) and paper.SETTING.host_memory_bytes == 64 * GIB
    assert not paper.matches("resnet50", InputSize(224, 224), None) and not paper.matches("resnet50", InputSize(128, 128), 16 * GIB)
    assert not paper.matches("resnet152", InputSize(224, 224), 16 * GIB)
    pts = paper.load_throughput()
    assert paper.paper_throughput_at(pts, "swap", 478).samples_per_s == 27.5
    assert paper.paper_throughput_at(pts, "swap", 300) is None


# --- figures agree with tables -------------------------------------------------
def test_throughput_figure_draws_the_spread_as_error_bars(results: Path) -> None:
    fig = plot_throughput_vs_batch(group_of(results, "resnet50"))
    ax = fig.axes[0]
    bars = {c.get_label(): c for c in ax.containers if c.get_label().startswith("_iqr:")}
    assert {"_iqr:fp32:cuda", "_iqr:L3:cuda", "_iqr:swap:cuda"} <= set(bars)
    # ± half the IQR around the median: the fixture's IQR is 2% of 120 images/s
    (segments,) = [c for c in bars["_iqr:fp32:cuda"].lines[2]]
    (lo, hi) = segments.get_segments()[0][:, 1]
    assert hi - lo == pytest.approx(120 * 0.02)
    assert "IQR" in ax.get_ylabel()


def test_lower_bounds_read_ge_in_figures_and_the_multiple_is_defined(results: Path) -> None:
    group = next(g for g in scale_groups(find_runs(results)) if g.dim == "width")
    fig = plot_max_scale(group)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any(t.startswith("≥192") for t in texts) and any(t.startswith("≥96") for t in texts)
    assert not any("× fp32" in t for t in texts)  # two lower bounds: no ratio
    assert "≥: a lower bound" in fig.get_supxlabel() and "width_per_group" in fig.get_supxlabel()
    depth = next(g for g in scale_groups(find_runs(results)) if g.dim == "depth")
    fig = plot_max_scale(depth)
    texts = [t.get_text() for t in fig.axes[0].texts]
    # L3: 272 layers, fp32 164 layers, both bounded by an over_budget row: 272 / 164 = 1.66
    assert "272\n(+40 blocks)\n1.66× fp32" in texts  # one short line each: neighbouring labels stay apart
    assert "in layers" in fig.get_supxlabel()
    entry = next(e for e in depth.table() if e.series.strategy == "L3")
    assert entry.multiple_text == "1.66" and entry.bounded


def test_paper_maxima_are_markers_on_the_max_batch_figure(results: Path) -> None:
    fig = plot_max_batch(group_of(results, "resnet50"), with_paper=True)
    (marks,) = [ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "paper-max"]
    assert sorted(marks.get_ydata()) == [160, 160, 480, 608, 608]  # fp32, L3 (and their predictions), swap
    assert "paper" in marks.get_label()
    assert not [ln for ln in plot_max_batch(group_of(results, "resnet50")).axes[0].get_lines()
                if ln.get_gid() == "paper-max"]  # only when asked
    other = plot_max_batch(group_of(results, "resnet18"), with_paper=True)
    assert not [ln for ln in other.axes[0].get_lines() if ln.get_gid() == "paper-max"]  # not the paper's setting


def test_memory_figure_shows_host_copies_beside_device_bytes(tmp_path: Path) -> None:
    kw = dict(model="resnet18", device="cpu", budget=None, image=32)
    rows = [row("fp32", 4, act=64 * MIB, peak=70 * MIB, **kw),
            replace(row("swap", 4, act=4, peak=10 * MIB, **kw), host_bytes=64 * MIB)]
    write_run(tmp_path / "h", "sweep-batch_resnet18_cpu_32px_ffff", rows, config={"command": "sweep-batch"})
    fig = plot_memory(group_of(tmp_path / "h", "resnet18"))
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[:3] == ["activation", "peak allocated", "model"] and labels[3].startswith("host copies")
    swap = next(c for c in ax.containers if c.get_label() == "swap")
    assert swap.patches[3].get_height() == pytest.approx(64)  # MiB: the copies are visible, not a zero bar
    assert swap.patches[0].get_height() == pytest.approx(4 / MIB)


def test_cli_plot_draws_each_folder_on_its_own_and_says_where(results: Path) -> None:
    res = invoke(["plot", str(results)])
    assert res.exit_code == 0, res.output
    top, nested = results / "figures", results / "nested" / "figures"
    assert (top / "max_batch__resnet50_224px_16GiB.png").exists()
    assert (nested / "max_batch__resnet18_32px_nobudget.png").exists()
    assert not (top / "max_batch__resnet18_32px_nobudget.png").exists()  # the nested folder is not pooled in
    summary = res.stderr.strip().splitlines()[-1]
    n = len(res.stdout.split()) // 2
    assert summary.startswith(f"drew {n} figures (PNG and PDF) from 2 folders of runs: ")
    assert f"{top} (" in summary and f"{nested} (" in summary


def test_report_names_the_folders_it_pools(results: Path, tmp_path: Path) -> None:
    text = build_report(find_runs(results), results, tmp_path, ())
    assert "Runs from 2 folders, pooled by setting: `.`, `nested`." in text


def test_report_averages_runs_that_differ_only_in_their_seed(tmp_path: Path) -> None:
    """Three seeds of one configuration get a mean table (Δ of the means and the worst seed's Δ);
    a run of another configuration, alone, gets none."""
    import json

    accs = {0: (0.60, 0.59), 1: (0.62, 0.64), 2: (0.70, 0.69)}  # seed: (fp32, 2 bits)
    for seed, (fp32, two) in accs.items():
        store = AccuracyStore(tmp_path / "acc" / f"accuracy_vit3x64p6_24px_s{seed}")
        for row in (acc_row("fp32", None, fp32), acc_row("2 bits", 2.0, two)):
            store.append(replace(row, model="small_vit3x64p6", steps=300, seed=seed))
        (store.run_dir / "config.json").write_text(json.dumps(
            {"command": "accuracy", "model": "vit", "model_depth": 3, "width": 64, "patch_size": 6, "steps": 300,
             "seed": seed, "bits": [2.0], "include_fp32": True}))
    other = write_accuracy_run(tmp_path / "acc")
    (other / "config.json").write_text(json.dumps({"command": "accuracy", "model_depth": 8, "steps": 100, "seed": 0}))
    text = build_accuracy_report(
        [(d, AccuracyStore(d).read_rows()) for d in sorted((tmp_path / "acc").iterdir())], tmp_path)
    assert text.count("Mean over seeds") == 1
    assert "\n## Mean over seeds: small_vit3x64p6, 300 steps (seeds 0, 1, 2)\n" in text
    assert "| fp32 | 3 | 0.640 | 0.600 / 0.620 / 0.700 | – | – |" in text
    # 2 bits: mean 0.640 against fp32's 0.640 -> +0.0 (never -0.0); worst seed 0.69 - 0.70 -> -1.0
    assert "| 2 bits | 3 | 0.640 | 0.590 / 0.640 / 0.690 | +0.0 | -1.0 |" in text


def test_one_byte_formatter_serves_tables_labels_and_folder_names() -> None:
    from actbench.schema import format_bytes

    assert format_bytes(int(1.172 * GIB)) == "1.17 GiB" and format_bytes(300 * MIB) == "300.00 MiB"
    assert format_bytes(3 * 1024) == "3.00 KiB" and format_bytes(4) == "4 B" and format_bytes(0) == "0 B"
    assert format_bytes(None) == "-" and format_bytes(None, missing="–") == "–"
    assert format_bytes(16 * GIB, decimals=None) == "16 GiB" and format_bytes(int(14.5 * GIB), decimals=None) == "14.5 GiB"
    assert format_bytes(136 * MIB, decimals=None, sep="") == "136MiB"
