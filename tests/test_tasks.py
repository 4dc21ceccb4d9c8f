"""The task seam (docs/design.md §7): what is trained is a registry entry, resolved once with the point.

Segmentation is measured at 64 px, batch 2 (DeepLabV3's ASPP pooling needs two samples in training):
L3 keeps several times fewer activation bytes than fp32, and meta predicts cpu's bytes.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from actbench.cli import app
from task_points import assert_l3_keeps_less, assert_meta_predicts_cpu, cpu_and_meta_rows
from actbench.core.devices import profile
from actbench.planning.point import Point
from actbench.planning.settings import MeasureSettings
from actbench.schema import InputSize, ModelSpec, PointConfig
from actbench.strategies import get
from actbench.training.tasks import CLASSIFICATION, TASK_NAMES, model_names, registered, task_of
from actbench.training.tasks.segmentation import AUX_WEIGHT, IGNORE_INDEX, VOC_CLASSES

CPU = torch.device("cpu")
SMALL_SEGMENTER = "lraspp_mobilenet_v3_large"


# --- the registry ------------------------------------------------------------------------------
def test_every_task_lists_its_models_and_they_are_the_installed_torchvisions() -> None:
    assert TASK_NAMES[0] == "classification" and "segmentation" in TASK_NAMES
    seen: set[str] = set()
    for name, task in registered().items():
        assert task.name == name and task.description and task.sample, name
        assert task.pinned_models and list(task.pinned_models) == sorted(task.pinned_models), name
        assert task.pinned_models == task.installed_models(), f"regenerate {name}'s pinned list"
        assert not seen & set(task.pinned_models), f"{name} shares models with another task"
        seen |= set(task.pinned_models)
    assert registered()["segmentation"].pinned_models == (
        "deeplabv3_mobilenet_v3_large", "deeplabv3_resnet101", "deeplabv3_resnet50", "fcn_resnet101", "fcn_resnet50",
        "lraspp_mobilenet_v3_large")
    assert model_names() == tuple(sorted(seen))


def test_a_classifier_and_a_segmenter_resolve_to_their_tasks() -> None:
    assert task_of("resnet50") is CLASSIFICATION
    assert task_of("fcn_resnet50").name == "segmentation"
    assert model_names("fcn_*") == ("fcn_resnet101", "fcn_resnet50")
    assert model_names("*resnet50", task="segmentation") == ("deeplabv3_resnet50", "fcn_resnet50")


def test_an_unknown_model_is_the_one_line_error_with_close_names() -> None:
    with pytest.raises(ValueError, match=r"^unknown model 'fcn_resnet5'; did you mean fcn_resnet50.*`actbench "
                                         r"models` lists all \d+\)$"):
        task_of("fcn_resnet5")
    with pytest.raises(ValueError, match="resnet152 only"):
        task_of("fcn_resnet50").build(ModelSpec("fcn_resnet50", extra_blocks=2), InputSize(64, 64))


def test_resolving_a_segmentation_name_imports_no_torch() -> None:
    code = ("import sys\nfrom actbench.training.model_names import validate_model_spec\n"
            "from actbench.schema import ModelSpec\nvalidate_model_spec(ModelSpec('deeplabv3_resnet50'))\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_models_command_filters_by_task() -> None:
    result = CliRunner().invoke(app, ["models", "--task", "segmentation"])
    assert result.exit_code == 0, result.output
    assert result.output.split() == list(registered()["segmentation"].pinned_models)
    result = CliRunner().invoke(app, ["models", "resnet50", "--task", "segmentation"])
    assert result.exit_code != 0 and "among segmentation models" in result.output


def test_a_point_carries_the_task_of_its_model() -> None:
    config = PointConfig(ModelSpec("fcn_resnet50"), "L3", 2, 64, "meta")
    assert Point.resolve(config).task.name == "segmentation"
    settings = MeasureSettings(device=profile("meta"))
    assert settings.point(ModelSpec("fcn_resnet50"), get("L3"), 2, InputSize(64, 64)).task.name == "segmentation"
    assert settings.point(ModelSpec("resnet18"), get("L3"), 2, InputSize(64, 64)).task is CLASSIFICATION


# --- segmentation's batch and loss ---------------------------------------------------------------
def test_segmentation_batch_is_seeded_images_and_label_maps() -> None:
    task, spec = task_of(SMALL_SEGMENTER), ModelSpec(SMALL_SEGMENTER)
    images, labels = task.batch(spec, 3, InputSize(32, 32), CPU, seed=5)
    assert images.shape == (3, 3, 32, 32) and images.dtype == torch.float32
    assert labels.shape == (3, 32, 32) and labels.dtype == torch.int64
    assert 0 <= int(labels.min()) and int(labels.max()) < VOC_CLASSES
    again = task.batch(spec, 3, InputSize(32, 32), CPU, seed=5)
    assert torch.equal(images, again[0]) and torch.equal(labels, again[1])
    assert task.num_classes(ModelSpec(SMALL_SEGMENTER, num_classes=7)) == 7


def test_deeplab_trains_out_plus_half_aux_and_lraspp_out_alone() -> None:
    torch.manual_seed(0)
    for name, terms in (("deeplabv3_mobilenet_v3_large", {"out", "aux"}), (SMALL_SEGMENTER, {"out"})):
        task, spec = task_of(name), ModelSpec(name)
        model = task.build(spec, InputSize(64, 64))
        images, labels = task.batch(spec, 2, InputSize(64, 64), CPU, seed=0)
        labels[:, :32] = IGNORE_INDEX  # left out of the loss, as VOC's borders are
        with torch.no_grad():
            torch.manual_seed(1)  # the same dropout masks (DeepLabV3's ASPP) in both forwards
            output = task.forward(model, images, labels)
            assert output["out"].shape == (2, VOC_CLASSES, 64, 64), name
            losses = task.losses(output, labels)
            assert set(losses) == terms, name
            expected = nn.functional.cross_entropy(output["out"][:, :, 32:], labels[:, 32:])
            torch.testing.assert_close(losses["out"], expected)
            if "aux" in terms:
                aux = nn.functional.cross_entropy(output["aux"][:, :, 32:], labels[:, 32:])
                torch.testing.assert_close(losses["aux"], AUX_WEIGHT * aux)
            torch.manual_seed(1)
            torch.testing.assert_close(task.loss(model, images, labels), sum(losses.values()))


# --- measured and predicted ----------------------------------------------------------------------
def _segmentation_point(strategy: str, device: str) -> Point:
    return Point.resolve(PointConfig(ModelSpec(SMALL_SEGMENTER), strategy, 2, 64, device, warmup_steps=1,
                                     timed_steps=0))


@pytest.fixture(scope="module")
def segmentation_rows() -> dict[tuple[str, str], object]:
    return cpu_and_meta_rows(_segmentation_point)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_segmentation_memory_point_at_L3_keeps_several_times_less(segmentation_rows, device) -> None:
    assert_l3_keeps_less(segmentation_rows, device, 3)


@pytest.mark.parametrize("strategy", ["fp32", "L3"])
def test_segmentation_meta_predicts_cpu_bytes(segmentation_rows, strategy) -> None:
    """Within 1 %: meta steps the cpu op set on fake tensors (observed: fp32 exact, L3 within 0.2 %)."""
    assert_meta_predicts_cpu(segmentation_rows, strategy)


@pytest.mark.memory_gb(2.0)  # 1.90 GB measured, children included
def test_verify_grads_trains_a_segmentation_models_own_loss() -> None:
    """verify-grads builds the model, batch and loss of its task: every parameter the segmentation loss
    trains gets a finite compressed gradient (the auxiliary head's too), and an unknown name is one line."""
    from actbench.actnn import level_config
    from actbench.studies.gradients import VerifyConfig, verify_grads

    rows = verify_grads(VerifyConfig("deeplabv3_mobilenet_v3_large", level_config("L3"), 2, 2, 32, "cpu"))
    names = {r.parameter for r in rows}
    assert any(n.startswith("aux_classifier.") for n in names) and any(n.startswith("classifier.") for n in names)
    assert all(math.isfinite(r.rel_bias) and math.isfinite(r.rel_std) for r in rows)
    assert any(r.rel_std > 0 for r in rows)
    with pytest.raises(ValueError, match="unknown model 'resnet19'"):
        VerifyConfig("resnet19")


def test_trust_compares_another_tasks_model_at_a_height_by_width_size(tmp_path) -> None:
    """actbench trust takes any task's model and an HxW size; its CSV records the width."""
    import csv

    result = CliRunner().invoke(app, ["trust", "--models", SMALL_SEGMENTER, "--strategies", "fp32",
                                      "--image-size", "32x48", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (row,) = csv.DictReader((tmp_path / "meta_vs_cpu.csv").open())
    assert (row["image_size"], row["image_width"], row["frames"]) == ("32", "48", "")
    assert abs(float(row["peak_ratio"]) - 1) <= 0.01
    refused = CliRunner().invoke(app, ["trust", "--models", "raft_small", "--image-size", "100"])
    assert refused.exit_code == 2 and "multiple of 8 and at least 128" in refused.output
