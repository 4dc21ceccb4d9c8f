"""``actbench report`` escapes what run directories contain (rows, env.json, config.json, names).

A hostile run directory is written by hand from a committed cpu row: its model, message, env.json
values, config values, accuracy settings and its own directory name hold HTML, Markdown table
separators, backticks and newlines. The report must show them as text: no raw HTML, every table row
with its header's number of cells, no line that a string from the rows started.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from actbench.cli import app

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "results/quick/modern_baselines-quick/memory_resnet18_cpu_32px_f2b38499/rows.jsonl"
SCRIPT = "<script>alert(1)</script>"
HOSTILE = f"{SCRIPT}|x`y`\n# injected heading\n<img src=x onerror=alert(2)>"


def cpu_row(**changes: object) -> dict:
    """A real cpu row of the committed results, with ``changes``."""
    row = json.loads(TEMPLATE.read_text().splitlines()[0])
    return {**row, **changes}


def hostile_results(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    run_dir = results / "sweep-batch_<b onclick=x>|`x`_cpu"
    run_dir.mkdir(parents=True)
    rows = [cpu_row(key="a" * 16, model=f"resnet18{SCRIPT}|"),
            cpu_row(key="b" * 16, model=f"resnet18{SCRIPT}|", batch_size=4, status="error", message=HOSTILE,
                    samples_per_s_median=None)]
    (run_dir / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "env.json").write_text(json.dumps({"env_id": f"e|{SCRIPT}", "torch": HOSTILE,
                                                  f"field{SCRIPT}": "v|w"}))
    acc_dir = results / "accuracy_<i>x"
    acc_dir.mkdir()
    acc = {"key": "c" * 16, "run_id": "acc", "status": "ok", "message": "", "setting": f"fp32{SCRIPT}|",
           "target_bits": None, "mean_bits": None, "train_loss_final": 0.5, "train_accuracy_final": 0.8,
           "test_loss": 0.6, "test_accuracy": 0.7, "chance_accuracy": 0.1, "steps": 10, "batch_size": 8,
           "image_size": 16, "num_classes": 10, "model": f"vit{SCRIPT}", "seed": 0, "elapsed_s": 1.0,
           "finished_at": ""}
    (acc_dir / "accuracy.jsonl").write_text(json.dumps(acc) + "\n")
    (acc_dir / "config.json").write_text(json.dumps({"model": HOSTILE, f"k{SCRIPT}": 1}))
    (acc_dir / "env.json").write_text(json.dumps({"torch": HOSTILE, "python": "`", "cpu_model": "a|b"}))
    return results


def cells(line: str) -> int:
    """Cells of a Markdown table line: ``|`` not escaped by a backslash separates them."""
    return len(re.findall(r"(?<!\\)\|", line)) - 1


def test_report_escapes_html_tables_and_lines_from_rows(tmp_path: Path) -> None:
    results = hostile_results(tmp_path)
    out = tmp_path / "report.md"
    result = CliRunner().invoke(app, ["report", str(results), "--out", str(out), "--no-figures"])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "&lt;script&gt;" in text  # the hostile strings are shown, as text
    for raw in ("<script", "<img", "<b>", "<i>"):
        assert raw not in text, raw
    lines = text.splitlines()
    assert not [line for line in lines if line.startswith("# injected")]
    header_cells = None
    for line in lines:
        if not line.startswith("|"):
            header_cells = None
            continue
        if header_cells is None:
            header_cells = cells(line)
        assert cells(line) == header_cells, line


def test_figure_titles_with_dollar_signs_are_text(tmp_path: Path) -> None:
    """A model name with ``$`` is not taken for mathtext (which would fail to parse and stop ``plot``)."""
    results = tmp_path / "results"
    run_dir = results / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "rows.jsonl").write_text(json.dumps(cpu_row(model="r$\\frac{$")) + "\n")
    result = CliRunner().invoke(app, ["plot", str(results), "--out", str(tmp_path / "figs")])
    assert result.exit_code == 0, result.output
    assert list((tmp_path / "figs").glob("*.png"))
