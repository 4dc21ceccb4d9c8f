"""The Markdown report: the paper's claims beside this run's first, then the settings, environments last.

Built from the same derived tables as the figures (actbench.reporting.analysis), so a number in the text and
the bar it labels never disagree. The paper's numbers appear only where model, input size and (for
batch and throughput) budget match the paper's set-up; everything that still differs is listed.
Predicted throughput has its own columns, named with its device model, never the measured ones.

Every string that comes from a run is escaped on its way into the text (actbench.reporting.markdown).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from actbench.reporting import paper as paper_ref
from actbench.reporting.analysis import MULTIPLE_DEFINITIONS, BatchGroup, Series, batch_groups, max_batch_table, memory_table
from actbench.reporting.markdown import code as _code
from actbench.reporting.markdown import link as _link
from actbench.reporting.markdown import md as _md
from actbench.reporting.markdown import table as _table
from actbench.reporting.runs import Run, find_result_runs, read_json
from actbench.reporting.scale import ScaleGroup, scale_groups
from actbench.reporting.claims import claims_table
from actbench.reporting.speed import ACTNN_SERIES, actnn_series, device_models, predicted_series, trust_text
from actbench.schema import MEMORY_FAILURES, format_bytes
from actbench.core.devices import PROFILES
from actbench.store.outputs import atomic_write_text, check_output


@dataclass(frozen=True)
class ReportResult:
    path: Path
    figures: tuple[Path, ...]


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "–" if x is None else format(x, fmt)


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "–" if ours is None or not theirs else f"{ours / theirs:.2f}"


def _environment(runs: Sequence[Run]) -> list[str]:
    lines = ["## Environment", ""]
    envs: dict[str, tuple[Mapping[str, Any], list[str]]] = {}
    for run in runs:
        env_id = str(run.env.get("env_id", "unknown")) if run.env else "none recorded"
        envs.setdefault(env_id, (run.env, []))[1].append(run.name)
    for env_id, (env, names) in envs.items():
        lines.append(f"Environment {_code(env_id)} — runs: " + ", ".join(_code(n) for n in names))
        lines.append("")
        if env:
            lines += _table(("field", "value"), ((_md(k), "–" if v is None else _code(v)) for k, v in env.items()
                                                 if k != "env_id"))
        else:
            lines += ["(no env.json in these runs)", ""]
    return lines


def _differences(runs: Sequence[Run]) -> list[str]:
    """What differs from the paper's set-up, said plainly."""
    setting = paper_ref.SETTING
    gpus = sorted({_md(r.env.get("gpu_name")) for r in runs if r.env.get("gpu_name")})
    torches = sorted({_md(r.env.get("torch")) for r in runs if r.env.get("torch")})
    devices = sorted({row.device for r in runs for row in r.rows})
    strategies = {row.strategy for r in runs for row in r.rows}
    lines = ["## How this set-up differs from the paper's", "",
             f"Paper: {paper_ref.CITATION}; {setting.model}, {setting.image_size}², {setting.gpu}, "
             f"PyTorch {setting.torch_version}. Paper numbers are shown only where model, input size and budget "
             "(16 GiB) match; the activation-memory ratio needs model and input size only.", ""]
    lines.append(f"- **GPU**: {', '.join(gpus) if gpus else 'no GPU (rows measured on ' + _md(', '.join(devices)) + ')'}"
                 f" vs the paper's {setting.gpu}. A budget emulates the T4's memory, not its speed: "
                 "measured throughput ratios compare different hardware"
                 + ("; predicted throughput is priced on the device models under \"Speed predictions\"."
                    if device_models(row for r in runs for row in r.rows) else "."))
    lines.append(f"- **PyTorch**: {', '.join(torches) if torches else 'unknown'} vs {setting.torch_version}.")
    planned = sorted({row.gpu for r in runs for row in r.rows if getattr(row, "gpu", None)})
    if planned:
        lines.append(f"- **Planned for a GPU spec** ({_md(', '.join(planned))}; docs/design.md §10): meta rows whose "
                     "out-of-memory is decided on the reserved bytes of a caching-allocator model, within the "
                     "spec's usable memory (capacity less in-band ECC and an assumed CUDA context). The paper's "
                     f"{setting.gpu} is compared through the `{setting.gpu_spec}` spec. The paper's machine was "
                     f"an {setting.machine}: plan with `--host-budget {setting.host_memory_bytes >> 30}GiB` to bound "
                     "swap's and L4/L5's pinned host memory by it (an upper bound on what it could pin); host budgets "
                     f"of these rows: {_host_budgets(runs)}.")
    if "L5" in strategies:
        lines.append("- **L5 is a substitution**: the paper's forked PyTorch allocator (defragmentation) is not "
                     "available; actbench's L5 is L4 with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.")
    lines.append("- **Data**: synthetic random inputs and labels; no data loading in the timed region.")
    for device in devices:
        caveat = PROFILES[device].report_caveat if device in PROFILES else None
        if caveat is not None:
            lines.append(f"- {caveat}")
    lines.append("- Paper throughput points were read off the published plot (±1 images/s, ±4 batch); the "
                 "nearest paper point within ±4 batch is used.")
    return lines + [""]


def _host_budgets(runs: Sequence[Run]) -> str:
    budgets = sorted({row.host_budget_bytes for r in runs for row in r.rows
                      if getattr(row, "gpu", None) and getattr(row, "host_budget_bytes", None)})
    return ", ".join(format_bytes(b) for b in budgets) if budgets else "none (host memory unbounded)"


def _max_batch_section(group: BatchGroup, paper_ok: bool) -> list[str]:
    entries = max_batch_table(group)
    header = ["strategy", "max batch", "× fp32", "images/s at max"]
    predicted = any(e.predicted_samples_per_s is not None for e in entries)
    header += ["predicted images/s at max (device model)"] if predicted else []
    if paper_ok:
        header += ["paper max batch", "ours ÷ paper", "paper × fp32"]
    rows = []
    for e in entries:
        row = [_md(e.label), e.max_text, e.multiple_text or "–", _num(e.samples_per_s)]
        row += [_predicted_cell(e.predicted_samples_per_s, e.device_model)] if predicted else []
        if paper_ok:
            span = paper_ref.paper_batch_range(e.series.strategy) if e.series.paper_comparable else None
            fp = paper_ref.paper_max_batch("fp32")
            row += ["–" if span is None else f"{span[0]}–{span[1]}", _ratio_span(e.max_batch, span),
                    "–" if span is None or not fp else f"{span[0] / fp:.2f}"]
        rows.append(row)
    lines = ["### Maximum batch per strategy", "",
             "Largest batch with status ok; \"≥\" = no larger batch was seen failing, so the true maximum may be "
             f"higher, and a ratio involving it is a bound too. {MULTIPLE_DEFINITIONS['batch']}.", ""]
    if paper_ok:
        grid = paper_ref.SETTING.batch_grid
        lines += [f"The paper's maxima are all multiples of {grid}: each is a lower bound, its true limit lies "
                  f"in the span shown (up to the next multiple of {grid}, exclusive), and ours ÷ paper is given "
                  "against both ends.", ""]
    return lines + _table(header, rows)


def _predicted_cell(rate: float | None, device_model: str | None) -> str:
    """``103.3 (t4)``: a predicted throughput always names the device model it was priced on."""
    return "–" if rate is None or device_model is None else f"{rate:.1f} ({_md(device_model)})"


def _ratio_span(ours: float | None, span: tuple[int, int] | None) -> str:
    """ours ÷ the paper's span: ``0.95–1.00`` (against its upper and its lower end)."""
    if ours is None or span is None:
        return "–"
    return f"{ours / span[1]:.2f}–{ours / span[0]:.2f}"


#: above this, "fp32 ÷ this" says only ">1000×": the device keeps next to nothing (swap), and the exact
#: quotient of two tiny-vs-huge byte counts would read as a precision it does not have
REDUCTION_SHOWN_UP_TO = 1000.0


def _reduction(red: float | None) -> str:
    if red is None:
        return "–"
    return f">{REDUCTION_SHOWN_UP_TO:g}×" if red > REDUCTION_SHOWN_UP_TO else f"{red:.2f}×"


def _memory_section(group: BatchGroup, paper_model_ok: bool) -> list[str]:
    batch_size, entries = memory_table(group)
    if not entries:
        return []
    fp32 = {e.series.device: e for e in entries if e.series == Series("fp32", e.series.device)}
    with_host = any(e.host_bytes for e in entries)
    header = ["strategy", "activation", "peak allocated", "model (params+grads+optimizer)"]
    header += ["host copies"] if with_host else []
    header += ["activation: fp32 ÷ this"]
    if paper_model_ok:
        header += ["paper fp32 ÷ this", "ours ÷ paper"]
    rows = []
    for e in entries:
        base = fp32.get(e.series.device)
        red = (base.activation_bytes / e.activation_bytes
               if base is not None and base.activation_bytes and e.activation_bytes else None)
        row = [_md(e.label), format_bytes(e.activation_bytes, missing="–"), format_bytes(e.peak_alloc_bytes, missing="–"),
               format_bytes(e.model_bytes, missing="–")]
        row += [format_bytes(e.host_bytes, missing="–") if e.host_bytes else "–"] if with_host else []
        row += [_reduction(red)]
        if paper_model_ok:
            theirs = paper_ref.ACTIVATION_REDUCTION_L3 if e.series == Series("L3", e.series.device) else None
            row += ["–" if theirs is None else f"{theirs:g}×", _ratio(red, theirs)]
        rows.append(row)
    note = ["Activation = bytes kept on the device for backward; swap's and L4/L5's copies in CPU memory are "
            "the host column, counted in no device column.", ""] if with_host else []
    return [f"### Memory per strategy at batch {batch_size}", ""] + note + _table(header, rows)


def _throughput_section(group: BatchGroup, paper_points: Sequence[paper_ref.PaperPoint] | None) -> list[str]:
    header = ["strategy", "batch", "status", "images/s (median)", "IQR"]
    if paper_points:
        header += ["paper images/s (batch)", "ours ÷ paper"]
    rows = []
    for s in group.series():
        for r in group.rows_of(s):
            if s.predicted:
                continue  # meta measures nothing: its predicted throughput is the next section's
            status = r.status if r.ok or not r.message else f"{r.status}: {r.message}"
            row = [_md(group.label(s)), str(r.batch_size), _md(status), _num(r.samples_per_s_median),
                   _num(r.samples_per_s_iqr)]
            if paper_points:
                p = (paper_ref.paper_throughput_at(tuple(paper_points), s.strategy, r.batch_size)
                     if r.ok and s.paper_comparable else None)
                row += ["–" if p is None else f"{p.samples_per_s:.1f} ({p.batch_size})",
                        _ratio(r.samples_per_s_median, p.samples_per_s if p else None)]
            rows.append(row)
    if not rows:
        return []
    return ["### Throughput (measured)", ""] + _table(header, rows)


def _predicted_section(group: BatchGroup) -> list[str]:
    """Predicted images/s per batch and strategy, one table per device model, with the derived ActNN
    column (the fastest fitting level); "does not fit" where the row is oom or over budget."""
    lines: list[str] = []
    for model in device_models(group.rows):
        series = [rs for rs in predicted_series(group) if rs.device_model == model]
        actnn = [rs for rs in actnn_series(group) if rs.device_model == model]
        cells = {(rs.name, rs.device, p.batch_size): f"{p.samples_per_s:.1f}" for rs in series for p in rs.points}
        cells.update({(ACTNN_SERIES, rs.device, p.batch_size): f"{p.samples_per_s:.1f} ({p.strategy})"
                      for rs in actnn for p in rs.points})
        columns = [(rs.name, rs.device) for rs in series] + [(ACTNN_SERIES, rs.device) for rs in actnn]
        failed = {(r.strategy, r.device, r.batch_size) for r in group.rows if r.status in MEMORY_FAILURES}
        batches = sorted({b for (_, _, b) in cells})
        rows = [[str(b)] + [cells.get((n, d, b), "does not fit" if (n, d, b) in failed else "–") for n, d in columns]
                for b in batches]
        header = ["batch"] + [_md(n) for n, _ in columns]
        lines += [f"### Throughput predicted on the {_md(model)} device model (images/s; not measured)", "",
                  f"The step-time model's price of each traced step (docs/design.md §11). {ACTNN_SERIES}: at each "
                  "batch, the fastest ActNN level that fits (its level in brackets). Trust: "
                  f"{_md(trust_text(model))}.", ""] + _table(header, rows)
    return lines


def _scale_section(group: ScaleGroup) -> list[str]:
    name = {"depth": "depth", "width": "width", "resolution": "resolution"}[group.dim]
    entries = group.table()
    predicted = any(e.predicted_samples_per_s is not None for e in entries)
    rows = [[_md(e.label), _md(e.max_label), e.multiple_text or "–", _num(e.samples_per_s)]
            + ([_predicted_cell(e.predicted_samples_per_s, e.device_model)] if predicted else [])
            + [_num(None if e.flops_per_sample is None else e.flops_per_sample / 1e9, ".2f")]
            for e in entries]
    header = ["strategy", f"maximum {name} ({group.unit()})", "× fp32", "images/s at max"] \
        + (["predicted images/s at max (device model)"] if predicted else []) + ["GFLOP/sample at max"]
    note = f"Run {_code(group.run_name)}. {group.definition()}."
    if any(not e.bounded for e in entries):
        note += " \"≥\" = nothing larger was seen failing: a lower bound."
    return [f"## {_md(group.title('Maximum ' + name))}", "", note, ""] + _table(header, rows)


def _figure_links(figures: Sequence[Path], stems: Iterable[str], report_dir: Path) -> list[str]:
    wanted = set(stems)
    lines = []
    for f in figures:
        if f.suffix == ".png" and f.stem in wanted:
            rel = Path(os.path.relpath(f, report_dir)).as_posix()
            pdf = Path(rel).with_suffix(".pdf").as_posix()
            lines.append(f"![{_md(f.stem)}]({_link(rel)}) ([pdf]({_link(pdf)}))")
            lines.append("")
    return (["### Figures", ""] + lines) if lines else []


def build_report(runs: Sequence[Run], results_dir: Path, report_dir: Path, figures: Sequence[Path] = (),
                 paper_points: Sequence[paper_ref.PaperPoint] | None = None) -> str:
    """The report's Markdown text; figure links are relative to ``report_dir``."""
    n_rows = sum(len(r.rows) for r in runs)
    lines = ["# actbench report", "",
             f"Results: {_code(results_dir)} — {len(runs)} run(s), {n_rows} row(s). "
             "Measured rows are `cuda` (ground truth) or `cpu`; `meta` rows are predictions.", ""]
    folders = sorted({Path(os.path.relpath(r.path.parent, results_dir)).as_posix() for r in runs
                      if r.path != results_dir})
    if len(folders) > 1:  # runs of several folders share this report's tables: say so
        lines += [f"Runs from {len(folders)} folders, pooled by setting: " + ", ".join(_code(f) for f in folders)
                  + ".", ""]
    lines += _claims_section(runs, paper_points)
    lines += _speed_models_section(runs)
    lines += _differences(runs)
    lines += _settings(runs, report_dir, figures, paper_points)
    lines += _environment(runs)
    return "\n".join(lines).rstrip() + "\n"


def _settings(runs: Sequence[Run], report_dir: Path, figures: Sequence[Path],
              paper_points: Sequence[paper_ref.PaperPoint] | None) -> list[str]:
    """One section per setting (tables, then its figures), then one per max-scale run."""
    lines: list[str] = []
    kinds = ("throughput_vs_batch", "max_batch", "memory", "activation_vs_batch")
    for group in batch_groups(runs):
        paper_ok = paper_ref.matches(group.model, group.size, group.budget_bytes, gpu=group.gpu)
        lines += [f"## {_md(group.title('Setting'))}", "", "Runs: " + ", ".join(_code(n) for n in group.run_names), ""]
        if paper_ok:
            how = (f"the {group.gpu} spec" if group.gpu is not None else "16 GiB")
            lines += [f"Setting matches the paper (ResNet-50, 224², {how}): paper numbers and ratios shown.", ""]
        lines += _max_batch_section(group, paper_ok)
        lines += _memory_section(group, paper_ref.matches_model(group.model, group.size))
        lines += _throughput_section(group, paper_points if paper_ok else None)
        lines += _predicted_section(group)
        lines += _figure_links(figures, (f"{k}__{group.slug()}" for k in kinds), report_dir)
    for sgroup in scale_groups(runs):
        lines += _scale_section(sgroup)
        lines += _figure_links(figures, [f"max_{sgroup.slug()}"], report_dir)
    return lines


def _claims_section(runs: Sequence[Run], paper_points: Sequence[paper_ref.PaperPoint] | None) -> list[str]:
    """The opening table: each of the paper's claims this run has a number for, labelled how it was had."""
    claims = claims_table(runs, paper_points)
    lines = ["## The paper's claims beside this run's", ""]
    if not claims:
        return lines + ["No row of this run is in the paper's setting (ResNet-50, 224²): there is nothing to set "
                        "beside the paper's claims.", ""]
    lines += ["Basis: *measured* on a device, or *predicted* (memory on meta; throughput by the step-time model "
              "on the named device model, never a measurement). Throughput ÷ fp32 is taken at the largest batch "
              "both fit; the paper's is each curve's mean ÷ fp32's 120 images/s. \"≥\"/\"≤\": a bound.", ""]
    return lines + _table(("claim", "paper", "this run", "this run ÷ paper", "basis"),
                          ((_md(c.claim), _md(c.paper), _md(c.ours), c.ratio, _md(c.basis)) for c in claims))


def _speed_models_section(runs: Sequence[Run]) -> list[str]:
    """Which device models priced the predicted throughput, and how far each has been checked."""
    rows = [row for run in runs for row in run.rows]
    models = device_models(rows)
    if not models:
        return []
    lines = ["## Speed predictions", "",
             "Predicted samples/s come from the step-time model over each point's traced step (docs/design.md §11), "
             "priced on these device models; they sit in their own columns and dashed series, never in the "
             "measured ones.", ""]
    counts = {m: sum(1 for r in rows if r.device_model == m and r.predicted_samples_per_s is not None) for m in models}
    return lines + _table(("device model", "predicted rows", "how good it is (predicted ÷ reference)"),
                          ((_code(m), str(counts[m]), _md(trust_text(m))) for m in models))


def build_accuracy_report(accuracy_runs: Sequence[tuple[Path, Sequence[Any]]], report_dir: Path,
                          figures: Sequence[Path] = (), standalone: bool = True) -> str:
    """Markdown for accuracy runs: one table per run, fp32 and each bit target.

    ``standalone``: a report of its own (a ``#`` title); otherwise a ``##`` section appended to the
    harness report of the same folder.
    """
    head = "#" if standalone else "##"
    title = "actbench report — accuracy vs activation bits" if standalone else "Accuracy vs activation bits"
    lines = [f"{head} {title}", "",
             "Claim checked (ActNN paper): 2-bit activations lose almost no accuracy, and 1.25 bits still "
             "converges. Each setting trains the same network from the same initial weights on the same "
             "batches (fixed seeds), on a procedural oriented-grating task (no download); bits are the "
             "target average of ActNN's per-sample and per-layer mixed precision (L3 with another target); "
             "`mean bits` is what the controller actually allocated over the last 10% of steps.", ""]
    for run_dir, rows in accuracy_runs:
        cfg = read_json(run_dir / "config.json")
        env = read_json(run_dir / "env.json")
        lines += [f"{head}# Run {_code(run_dir.name)}", ""]
        if cfg:
            lines += ["Configuration: " + ", ".join(f"{_md(k)} = {_code(v)}" for k, v in cfg.items() if k != "command"),
                      ""]
        if env:
            lines += [f"Environment: torch {_code(env.get('torch'))}, Python {_code(env.get('python'))}, "
                      f"CPU {_code(env.get('cpu_model'))} ({_md(env.get('torch_num_threads'))} threads).", ""]
        fp32 = next((r for r in rows if r.ok and r.target_bits is None), None)
        table = []
        for r in sorted(rows, key=lambda r: (r.target_bits is not None, -(r.target_bits or 0))):
            delta = ("–" if fp32 is None or r.test_accuracy is None or r is fp32
                     else f"{100 * (r.test_accuracy - fp32.test_accuracy):+.1f}")
            table.append((_md(r.setting), _md(r.status), _num(r.mean_bits, ".2f"), _num(r.train_loss_final, ".4f"),
                          _num(r.train_accuracy_final, ".3f"), _num(r.test_loss, ".4f"), _num(r.test_accuracy, ".3f"),
                          delta, f"{r.chance_accuracy:.3f}", _num(r.elapsed_s, ".0f")))
        lines += _table(("setting", "status", "mean bits", "final train loss", "final train acc", "test loss",
                         "test accuracy", "Δ vs fp32 (points)", "chance", "time (s)"), table)
        for p in figures:
            if p.suffix == ".png" and p.stem == f"accuracy_vs_bits__{run_dir.name}":
                lines += [f"![accuracy vs bits]({_link(Path(os.path.relpath(p, report_dir)).as_posix())})", ""]
    lines += _accuracy_over_seeds(accuracy_runs, head)
    return "\n".join(lines).rstrip() + "\n"


def _points(fraction: float) -> str:
    """An accuracy difference in points, signed, one decimal (never "-0.0")."""
    text = f"{100 * fraction:+.1f}"
    return "+0.0" if text == "-0.0" else text


def _accuracy_over_seeds(accuracy_runs: Sequence[tuple[Path, Sequence[Any]]], head: str) -> list[str]:
    """Runs that differ only in their seed, averaged: one seed's test accuracy moves by a few points
    between settings (a thousand test images, another training trajectory), so a claim of "within a
    point of fp32" is read on the mean."""
    groups: dict[str, list[tuple[int, Sequence[Any]]]] = {}
    for run_dir, rows in accuracy_runs:
        cfg = dict(read_json(run_dir / "config.json") or {})
        if "seed" not in cfg:
            continue
        seed = cfg.pop("seed")
        for name in ("bits", "include_fp32"):  # the settings a run holds; its rows carry them
            cfg.pop(name, None)
        groups.setdefault(json.dumps(cfg, sort_keys=True), []).append((seed, rows))
    lines: list[str] = []
    for members in groups.values():
        if len(members) < 2 or not any(rows for _, rows in members):
            continue
        members.sort(key=lambda m: m[0])
        seeds = [m[0] for m in members]
        by_setting: dict[str, dict[int, float]] = {}
        order: dict[str, tuple] = {}
        for seed, rows in members:
            for r in rows:
                if r.ok and r.test_accuracy is not None:
                    by_setting.setdefault(r.setting, {})[seed] = r.test_accuracy
                    order[r.setting] = (r.target_bits is not None, -(r.target_bits or 0))
        fp32 = by_setting.get("fp32", {})
        first = next(rows[0] for _, rows in members if rows)  # the model column and steps every seed shares
        lines += [f"{head}# Mean over seeds: {_md(first.model)}, {first.steps} steps "
                  f"(seeds {_md(', '.join(map(str, seeds)))})", "",
                  "A setting's mean counts only the seeds where it and fp32 both finished; Δ is against fp32's "
                  "mean over the same seeds.", ""]
        table = []
        for setting in sorted(by_setting, key=order.__getitem__):
            acc = by_setting[setting]
            common = [s for s in seeds if s in acc and (s in fp32 or setting == "fp32")]
            if not common:
                continue
            mean = sum(acc[s] for s in common) / len(common)
            if setting == "fp32":
                delta = worst = "–"
            else:
                delta = _points(mean - sum(fp32[s] for s in common) / len(common))
                worst = _points(min(acc[s] - fp32[s] for s in common))
            table.append((_md(setting), str(len(common)), f"{mean:.3f}", " / ".join(f"{acc[s]:.3f}" for s in common),
                          delta, worst))
        lines += _table(("setting", "seeds", "mean test accuracy", "per seed", "Δ of the means vs fp32 (points)",
                         "worst seed's Δ (points)"), table)
    return lines


def write_report(results_dir: Path, out_file: Path | None = None, figures_dir: Path | None = None,
                 draw_figures: bool = True, paper_csv: Path | None = None) -> ReportResult:
    """Write the Markdown report (default ``RESULTS_DIR/report.md``), drawing the figures it links first.

    One file for the whole folder: the harness runs' sections, then accuracy vs bits when the folder
    holds accuracy runs (alone, that section is the report). Raises ValueError with one line for a
    bad results folder, a ``paper_csv`` given that cannot be read, or an unwritable output.
    """
    found = find_result_runs(results_dir)
    out_file = results_dir / "report.md" if out_file is None else out_file
    inputs = paper_ref.input_files(found, paper_csv)
    try:
        points: tuple[paper_ref.PaperPoint, ...] | None = paper_ref.load_checked(paper_csv)
    except ValueError:
        if paper_csv is not None:  # asked for by name: refused in one line before anything is made, as plot does
            raise
        points = None  # the report still gives max-batch and memory ratios; throughput column omitted
    check_output(out_file, inputs)
    figures: tuple[Path, ...] = ()
    if draw_figures:
        from actbench.reporting.plots import default_figures, write_figures  # matplotlib: only when figures are drawn

        check_output(default_figures(results_dir) if figures_dir is None else figures_dir, inputs, directory=True)
        figures = write_figures(results_dir, figures_dir, with_paper=points is not None, paper_csv=paper_csv)
    parts = []
    if found.harness:
        parts.append(build_report(found.harness, results_dir, out_file.parent, figures, points))
    if found.accuracy:
        parts.append(build_accuracy_report(found.accuracy, out_file.parent, figures, standalone=not found.harness))
    atomic_write_text(out_file, "\n".join(parts), "report")
    return ReportResult(path=out_file, figures=figures)
