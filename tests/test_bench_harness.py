"""bench-harness: the harness's own cost, measured by running actbench as a user does."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from typer.testing import CliRunner

from actbench.cli import app


@pytest.mark.parametrize("args,message", [
    (["--only", "sweep,fast"], "--only must list sweep, plan, got 'sweep,fast'"),
    (["--jobs", "1"], "--jobs must be >= 2 (it is compared with --jobs 1), got 1"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["bench-harness", *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()


@pytest.mark.heavy  # runs actbench five times in fresh processes: about a minute on 2 cores
def test_quick_benchmarks_run_and_write_their_ratios(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench-harness", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (csv_path,) = tmp_path.glob("bench-harness_*/harness.csv")
    rows = {r["benchmark"]: r for r in csv.DictReader(csv_path.open())}
    sweep, plan = rows["sweep_overhead"], rows["plan_jobs"]
    # a whole command cannot take less than the training steps it ran; 4 points of fp32 and L3 at 2, 4
    assert float(sweep["ratio"]) >= 1.0 and float(sweep["wall_s"]) > float(sweep["reference_s"]) > 0
    assert sweep["points"] == "4" and "training steps in 4 points" in sweep["detail"]
    assert plan["detail"].startswith("same maxima: yes"), plan["detail"]
    assert float(plan["ratio"]) == pytest.approx(float(plan["reference_s"]) / float(plan["wall_s"]), rel=0.01)
