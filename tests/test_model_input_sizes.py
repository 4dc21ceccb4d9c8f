"""A size a model cannot train at is refused before anything runs, in one line, by every command.

Each task says what its models take (``Task.size_problem``) and ``input_size_for`` asks it for every
command. Classifiers: the smallest side of those whose windows outgrow a small input
(``classification.MIN_SIDES``, found on meta), ViT's patch and MaxViT's partitions. Here the CLI's
refusals, the table against meta training steps, and the rules against torchvision's own arithmetic.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from actbench.cli import app
from actbench.measure.meta import MetaSessions
from actbench.planning.point import Point
from actbench.schema import MIN_IMAGE_SIZE, InputSize, ModelSpec, PointConfig
from actbench.training.tasks import input_size_for
from actbench.training.tasks.classification import MIN_SIDES, TORCHVISION_CLASSIFIERS, size_problem

META = ["--device", "meta", "--batch", "2", "--strategies", "fp32", "--no-baseline"]
ALEXNET = "alexnet needs image sides of at least 63 px"


@pytest.mark.parametrize("args, needle", [
    (["fastest", "raft_small", "--gpu", "t4", "--batch", "2", "--image-size", "36", "--strategies", "fp32"],
     "RAFT's image height must be a multiple of 8 and at least 128 pixels"),
    (["fastest", "alexnet", "--gpu", "t4", "--batch", "2", "--image-size", "16", "--strategies", "fp32"],
     f"{ALEXNET} (a smaller input leaves a pooling or convolution window larger than its feature map), got 16"),
    (["fastest", "inception_v3", "--gpu", "t4", "--batch", "2", "--image-size", "32", "--strategies", "fp32"],
     "inception_v3 needs image sides of at least 299 px"),
    (["fastest", "resnet18", "--gpu", "t4", "--batch", "2", "--image-size", "8", "--strategies", "fp32"],
     "--image-size height must be in 16..16384 pixels, got 8"),
    (["memory", "alexnet", *META, "--image-size", "32"], f"{ALEXNET}"),
    (["memory", "alexnet", *META, "--image-size", "62x224"], f"{ALEXNET}"),
    (["plan", "alexnet", "--image-size", "16", "--budget", "1GiB"], ALEXNET),
    (["plan", "alexnet", "--budget", "1GiB", "--dim", "resolution", "--low", "16"], f"{ALEXNET}"),
    (["plan", "resnet18", "--budget", "1GiB", "--dim", "resolution", "--low", "1"],
     "--low is the smallest side searched: height must be in 16..16384 pixels, got 1"),
    (["trust", "--models", "alexnet", "--strategies", "fp32", "--image-size", "32"], ALEXNET),
    (["verify-grads", "alexnet", "--image-size", "16", "--batch", "2", "--seeds", "2"], ALEXNET),
    (["memory", "vit_b_16", *META, "--image-size", "20"],
     "vit_b_16 takes square images whose side is a multiple of 16"),
    (["memory", "maxvit_t", *META, "--image-size", "225"],
     "maxvit_t takes sides whose feature maps stay multiples of 7"),
])
def test_a_size_the_model_cannot_take_is_one_line_before_running(tmp_path: Path, args: list[str],
                                                                  needle: str) -> None:
    started = time.perf_counter()
    out = [] if args[0] == "fastest" else ["--out", str(tmp_path / "out")]  # fastest writes nothing
    result = CliRunner().invoke(app, [*args, *out])
    assert time.perf_counter() - started < 60
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert "predicting" not in result.output and not (tmp_path / "out").exists()


def _trains(name: str, height: int, width: int | None = None) -> bool:
    """Whether a meta training step of ``name`` at batch 2 runs at ``height`` x ``width`` (default square)."""
    size = InputSize(height, height if width is None else width)
    point = Point.resolve(PointConfig(ModelSpec(name), "fp32", 2, warmup_steps=1, timed_steps=0, device="meta",
                                      **size.point_fields()))
    try:
        return MetaSessions().measure_point(point).status == "ok"
    except RuntimeError:
        return False


def _smallest_side(name: str) -> int:
    return next(side for side in range(MIN_IMAGE_SIZE, 1024) if size_problem(name, InputSize(side, side)) is None)


@pytest.mark.parametrize("name", ["alexnet", "squeezenet1_1"])
def test_a_minimum_is_the_smallest_side_that_trains(name: str) -> None:
    side = MIN_SIDES[name]
    assert _trains(name, side) and not _trains(name, side - 1)


def test_a_minimum_holds_for_either_side_of_an_input() -> None:
    assert _trains("alexnet", 63, 200) and _trains("alexnet", 200, 63)
    assert not _trains("alexnet", 62, 200) and not _trains("alexnet", 200, 62)
    assert size_problem("alexnet", InputSize(200, 62)) is not None
    assert size_problem("alexnet", InputSize(63, 200)) is None


def test_a_model_that_cannot_take_its_task_s_default_side_defaults_to_its_smallest() -> None:
    """Without --image-size every command trains at the task's default side (224), except where the model
    refuses it: inception_v3 then defaults to 299 instead of refusing every command that leaves it out."""
    assert size_problem("inception_v3", InputSize(224, 224)) is not None
    assert input_size_for("inception_v3") == InputSize(299, 299)
    assert input_size_for("resnet18") == InputSize(224, 224)
    assert all(size_problem(name, input_size_for(name)) is None for name in TORCHVISION_CLASSIFIERS)
    result = CliRunner().invoke(app, ["fastest", "inception_v3", "--gpu", "t4", "--batch", "2", "--strategies", "fp32"])
    assert result.exit_code == 0, result.output
    assert "299" in result.output


@pytest.mark.heavy  # a meta step each; every classifier trains at its smallest side in test_model_zoo.py
@pytest.mark.parametrize("name", sorted(set(MIN_SIDES) - {"alexnet", "squeezenet1_1"}))  # those two: above
def test_no_classifier_trains_a_pixel_below_its_listed_minimum(name: str) -> None:
    side = MIN_SIDES[name]
    assert _smallest_side(name) == side and not _trains(name, side - 1), name


def test_maxvit_rule_is_torchvision_s_own_arithmetic() -> None:
    """Every side MaxViT's builder accepts (its block input shapes divisible by the partition) and no other."""
    from torchvision.models.maxvit import _make_block_input_shapes

    from actbench.training.tasks.classification import MAXVIT_PARTITION, MAXVIT_STAGES

    for side in range(MIN_IMAGE_SIZE, 1000):
        shapes = _make_block_input_shapes((side, side), MAXVIT_STAGES)
        builds = all(h % MAXVIT_PARTITION == 0 for h, _ in shapes)
        assert builds == (size_problem("maxvit_t", InputSize(side, side)) is None), side


@pytest.mark.parametrize("name, side", [("vit_b_16", 16), ("vit_b_16", 20), ("vit_b_32", 48), ("vit_h_14", 28)])
def test_vit_rule_is_torchvision_s_own_check(name: str, side: int) -> None:
    import torchvision

    refused = size_problem(name, InputSize(side, side)) is not None
    with torch.device("meta"):
        try:
            torchvision.models.get_model(name, weights=None, image_size=side)
            built = True
        except AssertionError:  # "Input shape indivisible by patch size!"
            built = False
    assert built != refused


def test_every_command_asks_the_same_function() -> None:
    """input_size_for is where a command's size meets the model's rule (other tasks' rules too)."""
    with pytest.raises(ValueError, match=ALEXNET):
        input_size_for("alexnet", 32)
    assert input_size_for("alexnet", "63x64") == InputSize(63, 64)
    with pytest.raises(ValueError, match="RAFT's image height"):
        input_size_for("raft_small", 36)


def test_a_point_that_fails_at_run_time_logs_no_traceback(monkeypatch) -> None:
    """A meta step whose kernel fails becomes one error line; torch's fake-tensor logger adds no traceback."""
    from torch._subclasses import fake_tensor

    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append
    fake_tensor.log.addHandler(handler)
    monkeypatch.delitem(MIN_SIDES, "alexnet")  # a size that fails inside the step, as a new model's might
    try:
        assert not _trains("alexnet", 32)
    finally:
        fake_tensor.log.removeHandler(handler)
    assert not [r for r in seen if "failed while attempting" in str(r.msg)]


def test_fastest_turns_a_failed_prediction_into_its_row(monkeypatch) -> None:
    def fails(self, point, fault=None):
        raise RuntimeError("Output size is too small")

    monkeypatch.setattr(MetaSessions, "measure_point", fails)
    result = CliRunner().invoke(app, ["fastest", "resnet18", "--gpu", "t4", "--batch", "2", "--image-size", "32",
                                      "--strategies", "fp32"], env={"COLUMNS": "250"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "RuntimeError: Output size is too small" in result.stdout and "Traceback" not in result.output


def test_a_vit_resolution_search_on_meta_probes_multiples_of_its_patch(tmp_path: Path) -> None:
    """Sides 224..300 every 10 px: the search moves along vit_b_16's multiples of 16 instead, so no probe
    is an error row and the maximum is a side it takes."""
    import json

    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["max-scale", "vit_b_16", "--dim", "resolution", "--device", "meta",
                                      "--budget", "1080MB", "--batch", "2", "--strategies", "fp32", "--low", "224",
                                      "--high", "300", "--step", "10", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    rows = [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]
    assert rows and all(r["image_size"] % 16 == 0 and r["status"] in ("ok", "over_budget") for r in rows), rows
    best = json.loads((run_dir / "summary.json").read_text())["max"]["fp32"]["max"]
    assert best is not None and best % 16 == 0 and 224 <= best <= 300
