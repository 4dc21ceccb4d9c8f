"""Experiment files (experiments/*.toml), ``actbench run`` end to end, and the accuracy-vs-bits module.

The end-to-end test runs a tiny experiment written here (one ResNet-18 memory point at 16 px in a
worker child, and an accuracy step of a few SGD steps) because the shipped ``--quick`` versions take
minutes on a shared 2-core CPU; the shipped files are checked by validation (full and quick).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from actbench.studies.accuracy import AccuracyConfig, AccuracyStore, make_gratings, run_accuracy
from actbench.cli import app
from actbench.experiments import (EXPERIMENTS_DIR, AccuracyStep, ExperimentError, HarnessStep, experiment_paths,
                                  load_experiment, resolve_experiment)
from actbench.reporting.report import write_report

PAPER_EXPERIMENTS = {"resnet50_throughput_vs_batch", "memory_per_level", "max_batch", "max_scale_resnet152",
                     "accuracy_vs_bits"}


def invoke(args: list[str]):
    return CliRunner().invoke(app, args, catch_exceptions=False)


# --- the shipped files ---------------------------------------------------------------------------
def test_every_paper_experiment_is_shipped() -> None:
    assert PAPER_EXPERIMENTS <= {p.stem for p in experiment_paths()}


def _refuses_64(model: str) -> bool:
    from actbench.schema import SizeError
    from actbench.training.tasks import input_size_for

    try:
        input_size_for(model, 64)
    except SizeError:
        return True
    return False


@pytest.mark.parametrize("path", experiment_paths(), ids=lambda p: p.stem)
def test_experiment_file_validates_full_and_quick(path: Path) -> None:
    full = load_experiment(path)
    quick = load_experiment(path, quick=True)
    assert full.name == path.stem and full.description and len(full.steps) == len(quick.steps)
    assert quick.folder(Path("r")) == Path("r") / f"{path.stem}-quick"
    for step in quick.steps:
        if isinstance(step, HarnessStep):
            # a quick version must be a small CPU run (or a prediction), not the GPU experiment again: at most
            # 64 px a side, or the smallest size a model of the step takes (RAFT 128, S3D 13 frames of 209)
            assert step.device in ("cpu", "meta") and len(step.strategies) <= 4, step.describe()
            size = step.input_size()
            assert max(size.height, size.width) <= 64 or any(map(_refuses_64, step.models)), step.describe()
        else:
            assert step.config.steps <= 200 and step.config.train_size <= 4096


def test_quick_overrides_apply_per_step() -> None:
    quick = load_experiment(EXPERIMENTS_DIR / "max_scale_resnet152.toml", quick=True)
    assert [(s.dim, s.low, s.high) for s in quick.steps] == [("depth", 0, 8), ("width", 64, 80),
                                                            ("resolution", 32, 64)]
    full = load_experiment(EXPERIMENTS_DIR / "max_scale_resnet152.toml")
    assert all(s.device == "cuda" and s.budget == "16GiB" for s in full.steps)


def test_device_override_reaches_measuring_steps_only(tmp_path: Path) -> None:
    path = _write(tmp_path, TINY)
    exp = load_experiment(path, quick=True, device="meta")
    kinds = {type(s): s for s in exp.steps}
    assert kinds[HarnessStep].device == "meta"
    assert isinstance(kinds[AccuracyStep].config, AccuracyConfig)  # accuracy trains on cpu regardless


def test_list_names_every_experiment() -> None:
    res = invoke(["run", "--list"])
    assert res.exit_code == 0, res.output
    for name in PAPER_EXPERIMENTS:
        line = next(ln for ln in res.stdout.splitlines() if ln.startswith(name + " "))
        assert len(line.split(maxsplit=1)) == 2  # name, then a description


# --- bad files -----------------------------------------------------------------------------------
GOOD_HEAD = 'name = "t"\ndescription = "a test"\n'
GOOD_STEP = '[[steps]]\ncommand = "memory"\nmodels = ["resnet18"]\nstrategies = ["fp32"]\n'


@pytest.mark.parametrize("text, needle", [
    (GOOD_HEAD + "[[steps]\n", "bad TOML"),
    (GOOD_HEAD + "colour = 1\n" + GOOD_STEP, "unknown top-level key(s) colour"),
    (GOOD_HEAD + GOOD_STEP + "batchsize = 4\n", "unknown key(s) batchsize"),
    (GOOD_HEAD + GOOD_STEP + "image_size = \"big\"\n", "image_size: must be N or HxW (e.g. 224 or 512x1024), got 'big'"),
    (GOOD_HEAD + GOOD_STEP.replace('"fp32"', '"fp16"'), "unknown strategy 'fp16'"),
    (GOOD_HEAD + GOOD_STEP.replace('"resnet18"', '"resnet19"'), "unknown model 'resnet19'"),
    (GOOD_HEAD + GOOD_STEP.replace('"memory"', '"train"'), "command: must be one of"),
    (GOOD_HEAD + GOOD_STEP + 'dim = "depth"\n', "apply to max-scale and plan only"),
    (GOOD_HEAD + GOOD_STEP.replace('"memory"', '"max-scale"') + 'dim = "height"\n', "got 'height'"),
    (GOOD_HEAD + GOOD_STEP.replace('"memory"', '"max-scale"').replace('"resnet18"', '"resnet152"')
     + 'dim = "width"\nlow = 96\nhigh = 64\n', "bad search range"),
    (GOOD_HEAD + GOOD_STEP + "[quick]\nimage_sise = 32\n", "unknown key(s) image_sise"),  # typo caught without --quick
    (GOOD_HEAD + GOOD_STEP + "[quick]\nbits = [2]\n", "unknown key(s) bits"),  # no accuracy step here
    (GOOD_HEAD + GOOD_STEP + "[steps.quick]\nstrategies = [\"L9\"]\n", "unknown strategy 'L9'"),
    (GOOD_HEAD, "at least one [[steps]]"),
    ('description = "x"\n' + GOOD_STEP, "'name' must be a non-empty string"),
    (GOOD_HEAD + '[[steps]]\ncommand = "accuracy"\nbits = [0.5]\n', "bits must lie in 1..8"),
])
def test_bad_file_is_one_line_error(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ExperimentError) as info:
        load_experiment(path)
    assert needle in str(info.value) and "\n" not in str(info.value)
    res = invoke(["run", str(path)])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and needle in res.stderr and res.stdout == ""


def test_unknown_experiment_name_lists_the_known_ones() -> None:
    with pytest.raises(ExperimentError, match="unknown experiment 'nope'.*max_batch"):
        resolve_experiment("nope")
    res = invoke(["run", "nope"])
    assert res.exit_code == 2 and "unknown experiment 'nope'" in res.stderr
    res = invoke(["run", "missing.toml"])
    assert res.exit_code == 2 and "does not exist" in res.stderr


# --- end to end ------------------------------------------------------------------------------------
TINY = GOOD_HEAD + """
[[steps]]
command = "memory"
models = ["resnet18"]
strategies = ["fp32"]
batch = "64"
image_size = 224
device = "cuda"
timeout_s = 300
[steps.quick]
batch = "2"
image_size = 16

[[steps]]
command = "accuracy"
bits = [2]
steps = 400
[steps.quick]
steps = 4
batch_size = 16
train_size = 64
test_size = 32
image_size = 16
num_classes = 4

[quick]
device = "cpu"
"""


@pytest.mark.memory_gb(2.0)  # 1.90 GB measured, children included
@pytest.mark.slow
def test_run_quick_end_to_end_writes_rows_figures_report(tmp_path: Path) -> None:
    path = _write(tmp_path, TINY)
    out = tmp_path / "results"
    res = invoke(["run", str(path), "--quick", "--out", str(out)])
    assert res.exit_code == 0, res.output
    folder = out / "t-quick"
    rows = [json.loads(line) for line in next(folder.rglob("rows.jsonl")).read_text().splitlines()]
    assert [(r["model"], r["strategy"], r["batch_size"], r["image_size"], r["device"], r["status"]) for r in rows] == [
        ("resnet18", "fp32", 2, 16, "cpu", "ok")], rows
    assert rows[0]["activation_bytes"] > 0
    acc = AccuracyStore(next(folder.rglob("accuracy.jsonl")).parent).read_rows()
    assert [r.setting for r in acc] == ["fp32", "2 bits"] and all(r.ok for r in acc)
    figures = {p.name for p in (folder / "figures").iterdir()}
    assert {"memory__resnet18_16px_nobudget.png", "memory__resnet18_16px_nobudget.pdf"} <= figures, figures
    assert any(f.startswith("accuracy_vs_bits__") and f.endswith(".pdf") for f in figures)
    report = (folder / "report.md").read_text()  # one report: the harness sections, then accuracy vs bits
    assert report.startswith("# actbench report\n") and "## Accuracy vs activation bits" in report
    assert report.index("memory__resnet18_16px_nobudget.png") < report.index("| 2 bits | ok |")
    assert not (folder / "accuracy_report.md").exists()
    assert f"report: {folder / 'report.md'}" in res.stdout
    # the same command again resumes every row instead of measuring anew
    again = invoke(["run", str(path), "--quick", "--out", str(out), "--no-report"])
    assert again.exit_code == 0 and again.stderr.count("(resumed)") == 3, again.stderr


# --- the procedural data set and the accuracy runner ------------------------------------------
def test_gratings_are_deterministic_and_class_balanced() -> None:
    x1, y1 = make_gratings(203, 7, 16, seed=5)
    x2, y2 = make_gratings(203, 7, 16, seed=5)
    x3, y3 = make_gratings(203, 7, 16, seed=6)
    assert x1.shape == (203, 3, 16, 16) and x1.dtype == torch.float32 and y1.dtype == torch.int64
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)
    counts = torch.bincount(y1, minlength=7)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 203  # 203 = 7 * 29: exactly 29 each
    assert set(counts.tolist()) == {29}
    assert not torch.equal(y1[:7], torch.arange(7))  # shuffled, not in class order


def test_gratings_reject_bad_sizes() -> None:
    with pytest.raises(ValueError, match="num_classes >= 2"):
        make_gratings(10, 1, 16, seed=0)


def test_accuracy_fp32_and_2_bits_give_finite_rows(tmp_path: Path) -> None:
    cfg = AccuracyConfig(bits=(2,), steps=5, batch_size=16, train_size=96, test_size=48, image_size=16,
                         num_classes=4, seed=3)
    run_dir, rows = run_accuracy(cfg, tmp_path)
    assert [r.setting for r in rows] == ["fp32", "2 bits"]
    for r in rows:
        assert r.ok and math.isfinite(r.train_loss_final) and math.isfinite(r.test_loss)
        assert 0 <= r.test_accuracy <= 1 and r.chance_accuracy == 0.25
    assert rows[0].mean_bits is None
    # per-sample mixed precision at a 2-bit target allocates exactly 2 bits on average (docs/design.md §2)
    assert rows[1].mean_bits == pytest.approx(2.0, abs=0.05)
    assert (run_dir / "accuracy.csv").read_text().count("\n") == 3
    written = write_report(tmp_path)  # a folder holding only accuracy runs: that section is the report
    assert sorted(p.suffix for p in written.figures) == [".pdf", ".png"]
    text = written.path.read_text()
    assert text.startswith("# actbench report — accuracy vs activation bits")
    assert "| fp32 | ok |" in text and "| 2 bits | ok |" in text
    assert f"](figures/accuracy_vs_bits__{run_dir.name}.png)" in text


def _write(folder: Path, text: str) -> Path:
    path = folder / "exp.toml"
    path.write_text(text)
    return path


# --- every shipped experiment runs on cpu and on meta ---------------------------------------------
@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("path", experiment_paths(), ids=lambda p: p.stem)
def test_every_experiment_plans_with_quick_on_each_device(path: Path, device: str) -> None:
    """`actbench run NAME --quick --device {meta,cpu}` is a documented combination: it must load and plan."""
    exp = load_experiment(path, quick=True, device=device)
    for step in exp.steps:
        if isinstance(step, HarnessStep):
            assert step.plans(), step.describe()
            assert step.device == device or step.command == "plan", step.describe()


#: quick experiments whose meta run takes a minute or more on 2 cores (ResNet-152 and friends): heavy
HEAVY_ON_META = ("memory_per_level", "max_scale_resnet152", "max_scale_resnet152_meta", "model_zoo", "paper_t4",
                 "modern_baselines",  # its strategies' meta paths are also in tests/test_baselines.py
                 # 5-10 s each: the default run keeps planned_max_batch's (a plan and figures) for the path
                 "max_batch", "resnet50_throughput_vs_batch",
                 # twelve steps over four tasks (a detector's and RAFT's meta steps take seconds each): 2 minutes
                 "dense_tasks")


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.heavy) if p.stem in HEAVY_ON_META else p
                                  for p in experiment_paths() if p.stem != "accuracy_vs_bits"],
                         ids=lambda p: p.stem)
def test_every_measuring_experiment_runs_quick_on_meta(tmp_path: Path, path: Path) -> None:
    """Each harness experiment end to end on meta (seconds): rows, figures and a report, exit 0.

    accuracy_vs_bits trains on cpu whatever the device (its quick run is a CPU test of its own)."""
    res = invoke(["run", path.stem, "--quick", "--device", "meta", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    folder = tmp_path / f"{path.stem}-quick"
    runs = [p for p in folder.iterdir() if (p / "rows.jsonl").exists()]
    assert runs and (folder / "report.md").is_file()
