"""The optical-flow task (RAFT): frame pairs, the sequence loss, the size rule, and RAFT under ActNN.

Sizes are RAFT's smallest, 128x128 (features at 1/8 pooled three times keep 2 pixels), batch 1. Most
steps run 2 flow updates instead of the reference's 12 (``NUM_FLOW_UPDATES`` patched): the update block
is the same at every update, so 2 already exercise a layer called several times per forward; the
12-update point is ``heavy``.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Iterator

import pytest
import torch
from typer.testing import CliRunner

import actbench.training.tasks.optical_flow as optical_flow
from actbench.actnn import convert, level_config
from actbench.actnn import saved_arguments
from actbench.actnn.hooks import SKIP_POSITION, SKIP_TWIN, packer_of
from actbench.cli import app
from actbench.planning.point import Point
from actbench.schema import InputSize, ModelSpec, PointConfig
from actbench.training.tasks import task_of
from actbench.training.tasks.optical_flow import GAMMA, MAX_FLOW, NUM_FLOW_UPDATES, sequence_loss
from task_points import assert_l3_keeps_less, assert_meta_predicts_cpu, cpu_and_meta_rows

# the module (``actbench.actnn.convert`` the attribute is the function): its LEAN_FORWARDS table
convert_module = importlib.import_module("actbench.actnn.convert")
CPU = torch.device("cpu")
SMALL = InputSize(128, 128)
RAFT_SMALL = ModelSpec("raft_small")
#: raft_small's correlation neighbourhood: radius 3, so 7 x 7 sampling points per pixel and level
RAFT_SMALL_SIDE = 7
PYRAMID_LEVELS = 4


@contextlib.contextmanager
def flow_updates(n: int) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(optical_flow, "NUM_FLOW_UPDATES", n)
        yield


# --- the task's declarations, batch and loss -----------------------------------------------------
def test_raft_models_are_the_optical_flow_task() -> None:
    task = task_of("raft_large")
    assert task.name == "optical_flow" and task_of("raft_small") is task
    assert task.pinned_models == ("raft_large", "raft_small") == task.installed_models()
    assert task.sample == "frame pair" and task.default_size == InputSize(368, 496)
    assert NUM_FLOW_UPDATES == 12  # the reference's --num_flow_updates


def test_batch_is_a_seeded_frame_pair_with_flow_and_valid_mask() -> None:
    task, size = task_of("raft_small"), InputSize(128, 136)
    (image1, image2), (flow, valid) = task.batch(RAFT_SMALL, 2, size, CPU, seed=4)
    for image in (image1, image2):
        assert image.shape == (2, 3, 128, 136) and image.dtype == torch.float32
    assert flow.shape == (2, 2, 128, 136) and flow.dtype == torch.float32
    assert valid.shape == (2, 128, 136) and valid.dtype == torch.bool
    assert 0 < float(valid.float().mean()) < 1 and not torch.equal(image1, image2)
    (again1, again2), (flow_again, valid_again) = task.batch(RAFT_SMALL, 2, size, CPU, seed=4)
    assert all(torch.equal(a, b) for a, b in ((image1, again1), (image2, again2), (flow, flow_again),
                                               (valid, valid_again)))
    assert not torch.equal(task.batch(RAFT_SMALL, 2, size, CPU, seed=5)[1][0], flow)


def test_sequence_loss_matches_a_hand_computation() -> None:
    """Three predictions over a 1 x 2 x 1 x 3 flow: pixel 1 is invalid, pixel 2's flow has norm 500 >= 400;
    both count 0 but stay in the mean's 6 values, and prediction i weighs 0.8^(2-i)."""
    flow = torch.tensor([[[[1.0, 2.0, 300.0]], [[0.0, -1.0, 400.0]]]])
    valid = torch.tensor([[[True, False, True]]])
    predictions = [torch.full_like(flow, value) for value in (0.0, 1.0, 2.0)]
    # only pixel 0 counts: |p - 1| + |p - 0| over its two components, divided by 6 values
    per_update = [(abs(p - 1.0) + abs(p - 0.0)) / 6 for p in (0.0, 1.0, 2.0)]
    expected = sum(GAMMA ** (2 - i) * term for i, term in enumerate(per_update))
    got = sequence_loss(predictions, flow, valid)
    assert got.shape == () and abs(float(got) - expected) < 1e-6, (float(got), expected)
    assert MAX_FLOW == 400.0 and GAMMA == 0.8


def test_the_task_trains_the_sequence_loss_of_its_flow_predictions() -> None:
    task = task_of("raft_small")
    torch.manual_seed(0)
    model = task.build(RAFT_SMALL, SMALL)
    inputs, targets = task.batch(RAFT_SMALL, 1, SMALL, CPU, seed=0)
    with flow_updates(2), torch.no_grad():
        predictions = task.forward(model, inputs, targets)
        assert len(predictions) == 2 and all(p.shape == (1, 2, 128, 128) for p in predictions)
        assert model.corr_block.corr_pyramid == []  # dropped after forward
        losses = task.losses(predictions, targets)
        assert set(losses) == {"sequence"}
        torch.testing.assert_close(losses["sequence"], sequence_loss(predictions, *targets))


# --- sizes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("size, side", [(InputSize(130, 128), "height"), (InputSize(128, 100), "width"),
                                        (InputSize(64, 96), "height")])
def test_a_size_raft_cannot_train_at_is_one_line_naming_it(size: InputSize, side: str) -> None:
    task = task_of("raft_small")
    message = rf"^RAFT's image {side} must be a multiple of 8 and at least 128 pixels .*, got {size.text()}$"
    for call in (lambda: task.require_size("raft_small", size), lambda: task.batch(RAFT_SMALL, 1, size, CPU, 0),
                 lambda: task.build(RAFT_SMALL, size)):
        with pytest.raises(ValueError, match=message):
            call()
    task.require_size("raft_small", SMALL)
    task.require_size("raft_small", task.default_size)


def test_the_command_refuses_such_a_size_before_building() -> None:
    result = CliRunner().invoke(app, ["memory", "raft_small", "--image-size", "128x132", "--device", "meta",
                                      "--budget", "1GiB", "--dry-run"])
    assert result.exit_code != 0
    assert "multiple of 8 and at least 128 pixels" in result.output and "128x132" in result.output
    result = CliRunner().invoke(app, ["memory", "raft_small", "--image-size", "128x136", "--device", "meta",
                                      "--budget", "1GiB", "--dry-run"])
    assert result.exit_code == 0, result.output


# --- a step on cpu, predicted on meta -------------------------------------------------------------
def _point(strategy: str, device: str) -> Point:
    return Point.resolve(PointConfig(RAFT_SMALL, strategy, 1, device=device, warmup_steps=1, timed_steps=0,
                                     **SMALL.point_fields()))


def _rows(updates: int) -> dict[tuple[str, str], object]:
    with flow_updates(updates):
        return cpu_and_meta_rows(_point)


@pytest.fixture(scope="module")
def flow_rows() -> dict[tuple[str, str], object]:
    return _rows(2)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_raft_small_step_at_L3_keeps_fewer_activation_bytes(flow_rows, device) -> None:
    l3 = assert_l3_keeps_less(flow_rows, device, 2)
    assert "positions: kept exact" in l3.strategy_note  # the correlation lookups' grids


@pytest.mark.parametrize("strategy", ["fp32", "L3"])
def test_raft_small_meta_predicts_cpu_bytes(flow_rows, strategy) -> None:
    """Within 1 %. At L3 this needs the controller to weigh a layer by all its calls in a step (the update
    block runs once per update): weighed by one call, the mixed-precision split of cpu's measured step
    moved its bytes 1.6 % (2 updates) to 4 % (12) away from meta's uniform first step."""
    assert_meta_predicts_cpu(flow_rows, strategy)


@pytest.mark.heavy  # four raft_small points at the reference's 12 updates: about 2 minutes on 2 shared cores
@pytest.mark.parametrize("strategy", ["fp32", "L3"])
def test_raft_small_meta_predicts_cpu_bytes_at_12_updates(strategy) -> None:
    assert_meta_predicts_cpu(_rows(NUM_FLOW_UPDATES), strategy)


# --- ActNN never quantizes a sampling position ------------------------------------------------------
def _l3_gradients(model: torch.nn.Module, keep_detached_exact: bool = False) -> tuple[dict[str, torch.Tensor], list]:
    """One L3 step of ``model`` (a copy; rounding seeded) on a fixed batch: its parameter gradients and what
    the hook path did with each saved tensor. ``keep_detached_exact``: also keep exact every floating
    tensor the hook path meets that does not require grad; in RAFT those are the coordinates (its
    update loop detaches them), whatever op saves them."""
    task = task_of("raft_small")
    converted = convert(model, level_config("L3"), generator=torch.Generator().manual_seed(7)).model
    packer = packer_of(converted)
    if keep_detached_exact:
        decide = packer.skip_reason

        def exact_coordinates(t: torch.Tensor, role: str | None = None) -> str | None:
            reason = decide(t, role)
            return SKIP_POSITION if reason is None and not t.requires_grad else reason

        packer.skip_reason = exact_coordinates
    seen = []
    packer.observer = lambda t, packed, reason, owner: seen.append((tuple(t.shape), t.requires_grad, packed, reason))
    inputs, targets = task.batch(RAFT_SMALL, 1, SMALL, CPU, seed=3)
    with flow_updates(2):
        task.loss(converted, inputs, targets).backward()
    return {n: p.grad.clone() for n, p in converted.named_parameters() if p.grad is not None}, seen


def test_L3_quantizes_no_coordinate_of_the_correlation_lookup(monkeypatch) -> None:
    """RAFT's L3 step gives the same gradients, bit for bit, as one that also keeps every detached tensor
    exact. The converted CorrBlock keeps each lookup's centres (4 levels x 2 updates), never a grid;
    torchvision's own CorrBlock keeps its grids exact through saved_arguments.py; with neither, the grids
    are packed and the gradients move (this test can fail)."""
    torch.manual_seed(0)
    model = task_of("raft_small").build(RAFT_SMALL, SMALL)
    got, seen = _l3_gradients(model)
    expected, _ = _l3_gradients(model, keep_detached_exact=True)
    assert got.keys() == expected.keys() and len(got) > 50
    assert all(torch.equal(got[n], expected[n]) for n in got), [n for n in got if not torch.equal(got[n], expected[n])]

    grid, centre = (RAFT_SMALL_SIDE, RAFT_SMALL_SIDE, 2), (1, 1, 2)
    assert not [shape for shape, *_ in seen if shape[1:] == grid]
    centres = [(packed is None, reason) for shape, _, packed, reason in seen if shape[1:] == centre]
    assert centres == [(True, SKIP_TWIN)] * (PYRAMID_LEVELS * 2), centres
    assert not [shape for shape, requires_grad, packed, _ in seen if packed is not None and not requires_grad]
    assert any(packed is not None for *_, packed, _ in seen)  # the correlation pyramid itself is packed

    monkeypatch.setattr(convert_module, "LEAN_FORWARDS", {})
    torchvisions, seen = _l3_gradients(model)
    grids = [(packed is None, reason) for shape, _, packed, reason in seen if shape[1:] == grid]
    assert grids == [(True, SKIP_POSITION)] * (PYRAMID_LEVELS * 2), grids
    assert all(torch.equal(torchvisions[n], expected[n]) for n in expected)

    monkeypatch.setattr(saved_arguments, "argument_roles", lambda *args, **kwargs: {})
    quantized, seen = _l3_gradients(model)
    assert [packed is not None for shape, _, packed, _ in seen if shape[1:] == grid] == [True] * (PYRAMID_LEVELS * 2)
    assert not all(torch.equal(quantized[n], expected[n]) for n in expected)


def test_the_converted_lookup_gives_torchvisions_gradients_at_L0_and_keeps_no_grid(monkeypatch) -> None:
    """At L0 nothing of the lookup is rounded, so the converted CorrBlock (centres kept, grids rebuilt in
    backward) must give torchvision's loss and gradients bit for bit; its saved bytes are smaller."""
    torch.manual_seed(0)
    model = task_of("raft_small").build(RAFT_SMALL, SMALL)
    with_centres, seen = _gradients_at(model, "L0")
    monkeypatch.setattr(convert_module, "LEAN_FORWARDS", {})
    with_grids, seen_grids = _gradients_at(model, "L0")
    assert with_centres.keys() == with_grids.keys() and len(with_centres) > 50
    assert all(torch.equal(with_centres[n], with_grids[n]) for n in with_grids)
    saved = sum(t.untyped_storage().nbytes() for t in {id(t): t for t in seen}.values())
    saved_grids = sum(t.untyped_storage().nbytes() for t in {id(t): t for t in seen_grids}.values())
    assert saved < saved_grids, (saved, saved_grids)


def _gradients_at(model: torch.nn.Module, level: str) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """One step of a converted copy of ``model`` at ``level`` (2 updates): gradients, and the tensors the
    correlation lookups saved as they are (grids or centres, 2 components a point)."""
    task = task_of("raft_small")
    converted = convert(model, level_config(level), generator=torch.Generator().manual_seed(7)).model
    kept: list[torch.Tensor] = []
    packer_of(converted).observer = lambda t, packed, reason, owner: (
        kept.append(t) if packed is None and t.shape[-1:] == (2,) and t.dim() == 4 else None)
    inputs, targets = task.batch(RAFT_SMALL, 1, SMALL, CPU, seed=3)
    with flow_updates(2):
        task.loss(converted, inputs, targets).backward()
    return {n: p.grad.clone() for n, p in converted.named_parameters() if p.grad is not None}, kept


def test_raft_trains_with_the_references_adamw_the_others_with_sgd() -> None:
    from actbench.strategies import get
    from actbench.training.step import build_training_step
    from actbench.training.tasks.optical_flow import ADAMW_LR

    task = task_of("raft_small")
    step, _ = build_training_step(get("fp32"), task.build(RAFT_SMALL, SMALL), CPU, task=task)
    assert isinstance(step.optimizer, torch.optim.AdamW) and step.optimizer.defaults["lr"] == ADAMW_LR
    classifier, _ = build_training_step(get("fp32"), torch.nn.Linear(2, 2), CPU)
    assert type(classifier.optimizer) is torch.optim.SGD
