"""Tables that ``trust`` keeps and ``repredict`` reads, and outputs that must not land on another run's files.

``trust`` adds its points to the table earlier runs wrote (a point measured again replaces its own
row); ``repredict`` skips each line that is not a measured point with one warning naming file, line and
field, and writes nothing when no row is left; no output option replaces a run folder's own file.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from actbench.cli import app
from actbench.planning.device_models import DEVICE_MODEL_ENV, gpu_speed_model, save_device_model
from actbench.studies import trust
from actbench.studies.trust import Comparison, SpeedComparison

REPO = Path(__file__).resolve().parent.parent
#: a committed run folder (rows.jsonl, table.csv, config.json, env.json, summary.json)
RUN = REPO / "results/quick/planned_max_batch-quick/plan-batch_resnet18_meta_32px_4683f89b"
SPEED_HEADER = ("model,strategy,batch_size,image_size,device,device_model,predicted_status,measured_status,"
                "predicted_step_s,measured_step_s,measured_spread,message,precision")
GOOD = "resnet18,fp32,2,32,cpu,old-model,ok,ok,0.1,0.5,0.02,,fp32"


def invoke(args: list[str]):
    return CliRunner(env={DEVICE_MODEL_ENV: None}).invoke(app, args)


def _table(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _comparison(model: str, strategy: str, ratio_bytes: int = 10, batch: int = 2) -> Comparison:
    return Comparison(model, strategy, batch, 32, "cpu", "ok", "ok", ratio_bytes, 10, 20, 20, None, "")


def _fake_compare(measured: list[Comparison]):
    """``trust.compare`` answering with ``measured``'s bytes for each point it is asked for."""
    by_point = {(c.model, c.strategy): c for c in measured}

    def compare(device, models, strategies, batch_size=2, image_size=32, on_point=None, precision="fp32"):
        rows = []
        for model in models:
            for strategy in strategies:
                rows.append(by_point[(model, strategy)])
                on_point(rows[-1])
        return rows

    return compare


# --- trust: rows accumulate ------------------------------------------------------------------------
def test_trust_keeps_the_rows_of_earlier_runs_and_replaces_a_point_measured_again(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    out = tmp_path / "trust"
    monkeypatch.setattr(trust, "compare", _fake_compare([_comparison("resnet18", "fp32", 10),
                                                         _comparison("resnet18", "L3", 10)]))
    first = invoke(["trust", "--models", "resnet18", "--strategies", "fp32,L3", "--out", str(out)])
    assert first.exit_code == 0, first.output
    monkeypatch.setattr(trust, "compare", _fake_compare([_comparison("resnet18", "L3", 15),
                                                         _comparison("resnet34", "fp32", 10)]))
    for models, strategy in (("resnet18", "L3"), ("resnet34", "fp32")):
        again = invoke(["trust", "--models", models, "--strategies", strategy, "--out", str(out)])
        assert again.exit_code == 0, again.output
    rows = _table(out / "meta_vs_cpu.csv")
    assert [(r["model"], r["strategy"], r["activation_ratio"]) for r in rows] == [
        ("resnet18", "fp32", "1.0000"), ("resnet18", "L3", "1.5000"), ("resnet34", "fp32", "1.0000")]
    assert [p.name for p in out.iterdir()] == ["meta_vs_cpu.csv"]  # written through a temporary file


def test_two_runs_adding_to_one_table_at_once_keep_each_others_rows(tmp_path: Path) -> None:
    """Each write reads the table again: run A's second write keeps the row run B wrote between A's two."""
    path = tmp_path / "trust" / "meta_vs_cpu.csv"
    first = [_comparison("resnet18", "fp32")]
    trust.add_to_table(path, first, trust.write_csv)
    trust.add_to_table(path, [_comparison("resnet34", "fp32")], trust.write_csv)  # run B, meanwhile
    trust.add_to_table(path, first + [_comparison("resnet18", "L3", 15)], trust.write_csv)
    assert [(r["model"], r["strategy"]) for r in _table(path)] == [
        ("resnet34", "fp32"), ("resnet18", "fp32"), ("resnet18", "L3")]
    assert [p.name for p in path.parent.iterdir()] == ["meta_vs_cpu.csv"]


def test_trust_for_speed_keeps_the_rows_of_earlier_runs(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "trust"
    out.mkdir()
    old = SpeedComparison("resnet50", "fp32", 2, 32, "cpu", "m", "ok", "ok", 0.1, 0.2, 0.01, "")
    trust.write_speed_csv([old], out / "speed_vs_cpu.csv")
    model = tmp_path / "t4.json"
    save_device_model(gpu_speed_model("t4"), model)

    def compare_speed(device, speed_model, models, strategies, batch_size, image_size, on_point=None,
                      precision="fp32"):
        rows = [SpeedComparison(m, s, batch_size, 32, device, speed_model.name, "ok", "ok", 0.3, 0.3, 0.0, "")
                for m in models for s in strategies]
        for row in rows:
            on_point(row)
        return rows

    monkeypatch.setattr(trust, "compare_speed", compare_speed)
    result = invoke(["trust", "--models", "resnet18", "--strategies", "fp32", "--device-model", str(model),
                     "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert [(r["model"], r["device_model"]) for r in _table(out / "speed_vs_cpu.csv")] == [("resnet50", "m"),
                                                                                           ("resnet18", "t4")]


@pytest.mark.memory_gb(2.1)  # 2.04 GB measured, children included
def test_a_failing_point_is_one_line_and_keeps_the_earlier_rows(tmp_path: Path) -> None:
    """A point that fails while it is measured (the test hook's injected error, on meta and on the cpu)
    is an error row with a one-line message, no traceback, and the table keeps its earlier rows."""
    out = tmp_path / "trust"
    out.mkdir()
    trust.write_csv([_comparison("resnet18", "fp32")], out / "meta_vs_cpu.csv")
    done = subprocess.run([sys.executable, "-m", "actbench", "trust", "--models", "resnet34", "--strategies", "fp32",
                           "--image-size", "16", "--out", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "80", "ACTBENCH_TEST_FAULT": "error@strategy=fp32"})
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stderr.strip().splitlines() == ["comparing 1 points, each predicted on meta and measured on cpu ..."]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("resnet34")]
    assert "error/error RuntimeError: injected error (test hook)" in line
    rows = _table(out / "meta_vs_cpu.csv")
    assert [(r["model"], r["meta_status"]) for r in rows] == [("resnet18", "ok"), ("resnet34", "error")]


def test_a_trust_table_with_a_line_that_is_not_a_row_is_refused_before_anything_is_measured(tmp_path: Path) -> None:
    out = tmp_path / "trust"
    out.mkdir()
    table = out / "meta_vs_cpu.csv"
    trust.write_csv([_comparison("resnet18", "fp32")], table)
    table.write_bytes(table.read_bytes() + b"caf\xe9,fp32\n")
    before = table.read_bytes()
    result = invoke(["trust", "--models", "resnet18", "--strategies", "fp32", "--out", str(out)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"actbench: error: {table}:3: not UTF-8 (byte 4): this table's rows are kept when points are added to it; "
        "repair or move it aside, or choose another --out"]
    assert table.read_bytes() == before


def test_trust_measures_a_model_named_twice_once(tmp_path: Path, monkeypatch) -> None:
    asked = []

    def compare(device, models, strategies, **kwargs):
        asked.append(tuple(models))
        return []

    monkeypatch.setattr(trust, "compare", compare)
    result = invoke(["trust", "--models", "resnet18,resnet18", "--strategies", "fp32", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert asked == [("resnet18",)]


@pytest.mark.parametrize("batch", ["1", "1048577", "100000000"])
def test_trust_refuses_a_batch_outside_what_every_command_takes(tmp_path: Path, batch: str) -> None:
    result = invoke(["trust", "--models", "resnet18", "--strategies", "fp32", "--batch", batch,
                     "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"actbench: error: --batch must be between 2 and 1048576, got {batch} "
        "(BatchNorm in train mode needs two samples)"]
    assert not (tmp_path / "out").exists()


# --- repredict: bad rows skipped, nothing written without a row -------------------------------------
@pytest.fixture()
def device_model(tmp_path: Path) -> Path:
    path = tmp_path / "t4.json"
    save_device_model(gpu_speed_model("t4"), path)
    return path


@pytest.mark.parametrize("row, needle", [
    ("resnet99,fp32,2,32,cpu,m,ok,ok,0.1,0.5,0.02,,fp32", "field 'model': unknown model 'resnet99'"),
    ("resnet18,fp99,2,32,cpu,m,ok,ok,0.1,0.5,0.02,,fp32", "field 'strategy': unknown strategy 'fp99'"),
    ("resnet18,fp32,2,32,cpu,m,ok,ok,0.1,0.5,0.02,,fp8",
     "field 'precision' is 'fp8' (expected one of fp32, bf16, fp16)"),
    ("resnet18,fp32,-2,32,cpu,m,ok,ok,0.1,0.5,0.02,,fp32",
     "field 'batch_size' is '-2' (expected a whole number from 2 to 1048576)"),
    ("resnet18,fp32,+2,32,cpu,m,ok,ok,0.1,0.5,0.02,,fp32",
     "field 'batch_size' is '+2' (expected a whole number from 2 to 1048576)"),
    ("resnet18,fp32,1_0,32,cpu,m,ok,ok,0.1,0.5,0.02,,fp32",
     "field 'batch_size' is '1_0' (expected a whole number from 2 to 1048576)"),
    ("resnet18,fp32,\u0662,32,cpu,m,ok,ok,0.1,0.5,0.02,,fp32",
     "field 'batch_size' is '\u0662' (expected a whole number from 2 to 1048576)"),
    ("resnet18,fp32,100000000,32,cpu,m,ok,ok,0.1,0.5,0.02,,fp32",
     "field 'batch_size' is '100000000' (expected a whole number from 2 to 1048576)"),
    ("resnet18,fp32,2,99999,cpu,m,ok,ok,0.1,0.5,0.02,,fp32",
     "field 'image_size' is '99999' (expected a whole number from 16 to 16384)"),
    ("resnet18,fp32,2,32,tpu,m,ok,ok,0.1,0.5,0.02,,fp32", "field 'device' is 'tpu' (expected one of cpu, cuda)"),
    ("resnet18,fp32,2,32,cpu,m,ok,fine,0.1,0.5,0.02,,fp32", "field 'measured_status' is 'fine' (expected one of ok,"),
    ("resnet18,fp32,2,32,cpu,m,ok,ok,0.1,nan,0.02,,fp32",
     "field 'measured_step_s' is 'nan' (expected a finite number above 0, or empty)"),
    ("resnet18,fp32,2,32,cpu,m,ok,ok,0.1,-1,0.02,,fp32",
     "field 'measured_step_s' is '-1' (expected a finite number above 0, or empty)"),
    ("resnet18,fp32,2,32,cpu,m,ok,ok,0.1,0.5,inf,,fp32",
     "field 'measured_spread' is 'inf' (expected a finite number at least 0, or empty)"),
    ("resnet18,fp32,2,32,cpu", "5 cells, the header names 13"),
    ("x" * 200 + ",fp32,2,32,cpu,m,ok,ok,0.1,0.5,0.02,,fp32", "field 'model' is 200 characters long"),
    ("resnet18,fp32,2,32,cpu," + "m" * 200 + ",ok,ok,0.1,0.5,0.02,,fp32", "field 'device_model' is 200 characters long"),
])
def test_repredict_skips_a_bad_row_with_one_warning_and_writes_nothing_without_a_row(
        tmp_path: Path, device_model: Path, caplog, row: str, needle: str) -> None:
    rows = tmp_path / "speed_vs_cpu.csv"
    rows.write_text(f"{SPEED_HEADER}\n{row}\n")
    out = tmp_path / "again.csv"
    out.write_text("the previous table\n")
    result = invoke(["repredict", str(rows), "--device-model", str(device_model), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        f"actbench: error: '{rows}': no row to re-predict: each of its 1 line(s) after the header was skipped "
        "(see the warnings above)"]
    (warning,) = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert warning.startswith(f"{rows}:2: skipped: ") and needle in warning, warning
    assert out.read_text() == "the previous table\n"


def test_repredict_re_predicts_the_good_rows_beside_a_huge_line_and_one_not_utf8(tmp_path: Path, device_model: Path,
                                                                                 caplog) -> None:
    rows = tmp_path / "speed_vs_cpu.csv"
    with rows.open("wb") as fh:
        fh.write(f"{SPEED_HEADER}\n".encode())
        fh.write(b"resnet18,fp32,2,32,cpu,m,ok,ok,0.1,0.5,0.02," + b"x" * (30 << 20) + b",fp32\n")
        fh.write(b"resnet18,fp32,2,32,cpu,m,ok,ok,0.1,0.5,0.02,caf\xe9,fp32\n")
        fh.write(f"{GOOD}\n".encode())
    out = tmp_path / "again.csv"
    result = invoke(["repredict", str(rows), "--device-model", str(device_model), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert [r["model"] for r in _table(out)] == ["resnet18"]
    warnings = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    huge = len(b"resnet18,fp32,2,32,cpu,m,ok,ok,0.1,0.5,0.02,") + (30 << 20) + len(b",fp32\n")
    assert warnings == [f"{rows}:2: skipped: a line of {huge} bytes (at most 1048576)",
                        f"{rows}:3: skipped: not UTF-8 (byte 48)"]


@pytest.mark.parametrize("content, needle", [
    (f"{SPEED_HEADER}\n".encode(), "no row to re-predict: it holds a header and no rows"),
    (b"mod\xe9l," + SPEED_HEADER.encode() + b"\n" + GOOD.encode() + b"\n",
     "its header line is unreadable (not UTF-8 (byte 4))"),
    (b"", "missing column(s) model, strategy"),
])
def test_repredict_refuses_a_csv_without_rows_naming_it_and_leaves_out_alone(tmp_path: Path, device_model: Path,
                                                                            content: bytes, needle: str) -> None:
    rows = tmp_path / "speed_vs_cpu.csv"
    rows.write_bytes(content)
    out = tmp_path / "again.csv"
    out.write_text("the previous table\n")
    result = invoke(["repredict", str(rows), "--device-model", str(device_model), "--out", str(out)])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"actbench: error: '{rows}': ") and needle in line, line
    assert out.read_text() == "the previous table\n"


def test_repredict_skips_a_row_at_a_size_its_model_cannot_take(tmp_path: Path, device_model: Path, caplog) -> None:
    rows = tmp_path / "speed_vs_cpu.csv"
    rows.write_text(f"{SPEED_HEADER}\nalexnet,fp32,2,16,cpu,m,ok,ok,0.1,0.5,0.02,,fp32\n{GOOD}\n")
    out = tmp_path / "again.csv"
    result = invoke(["repredict", str(rows), "--device-model", str(device_model), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert [(r["model"], r["predicted_status"]) for r in _table(out)] == [("resnet18", "ok")]
    assert any(f"{rows}:2: skipped" in r.getMessage() and "alexnet needs image sides of at least 63 px" in r.getMessage()
               for r in caplog.records)


# --- no output replaces another run's own files ---------------------------------------------------
@pytest.fixture()
def other_run(tmp_path: Path) -> Path:
    run = tmp_path / "other_run"
    shutil.copytree(RUN, run)
    return run


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir())}


@pytest.mark.parametrize("name", ["rows.jsonl", "table.csv", "config.json", "env.json", "summary.json",
                                  "env_0123abcd.json"])
@pytest.mark.parametrize("command", ["report", "repredict", "calibrate"])
def test_an_output_naming_another_runs_file_is_refused_in_one_line(tmp_path: Path, other_run: Path,
                                                                   device_model: Path, command: str,
                                                                   name: str) -> None:
    rows = tmp_path / "speed_vs_cpu.csv"
    rows.write_text(f"{SPEED_HEADER}\n{GOOD}\n")
    target = other_run / name
    args = {"report": ["report", str(RUN), "--no-figures", "--out", str(target)],
            "repredict": ["repredict", str(rows), "--device-model", str(device_model), "--out", str(target)],
            "calibrate": ["calibrate", "--quick", "--out", str(target)]}[command]
    before = _files(other_run)
    result = invoke(args)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"actbench: error: --out '{target}' would overwrite {name} of the run folder "
                           f"'{other_run}' (a run's own files: rows.jsonl, "), line
    assert _files(other_run) == before


def test_a_run_file_name_outside_a_run_folder_is_an_ordinary_output(tmp_path: Path, device_model: Path) -> None:
    rows = tmp_path / "speed_vs_cpu.csv"
    rows.write_text(f"{SPEED_HEADER}\n{GOOD}\n")
    result = invoke(["repredict", str(rows), "--device-model", str(device_model), "--out",
                     str(tmp_path / "elsewhere" / "table.csv")])
    assert result.exit_code == 0, result.output


def test_a_report_figures_folder_inside_another_run_is_refused(tmp_path: Path, other_run: Path) -> None:
    target = other_run / "logs"
    result = invoke(["report", str(RUN), "--figures", str(target), "--out", str(tmp_path / "report.md")])
    assert result.exit_code == 2
    assert f"--figures '{target}' would overwrite logs of the run folder '{other_run}'" in result.output
    assert not target.exists() and not (tmp_path / "report.md").exists()


def test_a_measuring_commands_out_inside_another_run_is_refused(tmp_path: Path, other_run: Path) -> None:
    result = invoke(["trust", "--models", "resnet18", "--strategies", "fp32", "--out", str(other_run / "logs")])
    assert result.exit_code == 2
    assert f"--out '{other_run / 'logs'}' would overwrite logs of the run folder" in result.output
    assert not (other_run / "logs").exists()


def test_calibrate_refuses_a_name_with_a_control_character(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    result = invoke(["calibrate", "--quick", "--name", "evil\nname", "--out", str(out)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "actbench: error: --name must be a name of printable characters (no new line, tab, escape or other "
        "control character), got 'evil\\nname'"]
    assert not out.exists()
