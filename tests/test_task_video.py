"""Video classification (actbench/training/tasks/video.py) and what ActNN does with video models.

r3d_18 is measured at 4 frames of 32², batch 2: L3 keeps several times fewer activation bytes than
fp32, and meta predicts cpu's bytes. The ActNN paths video models take are checked on small modules:
F.max_pool3d rerouted to the MaxPool3d twin (gradients bit-equal to torch's), Swin3D's relative-position
index (model state while the window is whole), and attention written as ``q @ k.transpose(-2, -1)``
(queries and keys at ``qk_bits``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from actbench.actnn import convert, level_config, saved_tensor_census
from actbench.actnn.hooks import packer_of
from actbench.cli import app
from actbench.execution.specs import CommandSpec, SpecError
from actbench.measure.meta import MetaSessions
from actbench.planning.point import Point
from actbench.schema import InputSize, ModelSpec, PointConfig
from actbench.training.tasks import registered, task_of
from actbench.training.tasks.video import KINETICS_CLASSES
from test_actnn_saved_arguments import FunctionalAttention
from task_points import assert_l3_keeps_less, cpu_and_meta_rows

try:
    from test_actnn_standins import patch_ops
except ImportError:  # tests/ became a package
    from tests.test_actnn_standins import patch_ops

CPU = torch.device("cpu")
CLIP = InputSize(32, 32, frames=4)


@pytest.fixture
def backend(monkeypatch):
    return patch_ops(monkeypatch)


# --- the task ---------------------------------------------------------------------------------
def test_video_task_answers_for_torchvisions_video_models() -> None:
    task = registered()["video"]
    assert task.pinned_models == ("mc3_18", "mvit_v1_b", "mvit_v2_s", "r2plus1d_18", "r3d_18", "s3d", "swin3d_b",
                                  "swin3d_s", "swin3d_t")
    assert all(task_of(name) is task for name in task.pinned_models)
    assert task.sample == "clip" and task.default_size == InputSize(112, 112, frames=16)
    assert task.num_classes(ModelSpec("r3d_18")) == KINETICS_CLASSES == 400
    assert task.num_classes(ModelSpec("r3d_18", num_classes=7)) == 7


def test_video_batch_is_seeded_clips_and_labels() -> None:
    task, spec = task_of("r3d_18"), ModelSpec("r3d_18")
    clips, labels = task.batch(spec, 3, InputSize(32, 48, frames=5), CPU, seed=5)
    assert clips.shape == (3, 3, 5, 32, 48) and clips.dtype == torch.float32  # [B, C, T, H, W]
    assert labels.shape == (3,) and labels.dtype == torch.int64
    assert 0 <= int(labels.min()) and int(labels.max()) < KINETICS_CLASSES
    again = task.batch(spec, 3, InputSize(32, 48, frames=5), CPU, seed=5)
    assert torch.equal(clips, again[0]) and torch.equal(labels, again[1])
    assert task.batch(spec, 1, 32, CPU, seed=0)[0].shape == (1, 3, 16, 32, 32)  # a side alone: the default frames


def test_video_loss_is_cross_entropy_on_the_logits() -> None:
    torch.manual_seed(0)
    task, spec = task_of("r3d_18"), ModelSpec("r3d_18")
    model = task.build(spec, CLIP)
    clips, labels = task.batch(spec, 2, CLIP, CPU, seed=0)
    with torch.no_grad():
        output = task.forward(model, clips, labels)
        assert output.shape == (2, KINETICS_CLASSES)
        losses = task.losses(output, labels)
        assert set(losses) == {"cross_entropy"}
        torch.testing.assert_close(losses["cross_entropy"], F.cross_entropy(output, labels))
        torch.testing.assert_close(task.loss(model, clips, labels), losses["cross_entropy"])


def test_frames_reach_the_clips_time_axis() -> None:
    """--frames -> the command's size -> the point -> the batch's T (and back through a point's dict)."""
    spec = CommandSpec("memory", "r3d_18", ("L3",), batch="2", image_size="32x48", device="meta", frames=6)
    (point,) = spec.plan().config.points()
    assert point.size == InputSize(32, 48, frames=6)
    again = Point.resolve(PointConfig.from_dict(point.config.to_dict()))
    clips, _ = again.task.batch(again.model, again.batch_size, again.size, CPU, seed=0)
    assert clips.shape == (2, 3, 6, 32, 48)
    default = CommandSpec("memory", "r3d_18", ("L3",), batch="2", device="meta").input_size()
    assert default == InputSize(112, 112, frames=16)


def test_mvit_is_built_for_the_points_size() -> None:
    """MViT's builder fixes 224² x 16; the task builds it for the clip (its positional encoding's grid)."""
    task, spec = task_of("mvit_v1_b"), ModelSpec("mvit_v1_b")
    with torch.device("meta"):
        model = task.build(spec, InputSize(32, 48, frames=4))
        assert model.pos_encoding.temporal_size == 2 and model.pos_encoding.spatial_size == (8, 12)
        assert model(torch.empty(1, 3, 4, 32, 48)).shape == (1, KINETICS_CLASSES)


@pytest.mark.parametrize("model, size, what", [
    ("s3d", "64", "s3d takes clips of at least 13 frames at 209 px a side"),
    ("mvit_v2_s", "64", "mvit_v2_s takes an even number of frames and sides that are multiples of 4"),
    ("mvit_v1_b", "66", "mvit_v1_b takes an even number of frames and sides that are multiples of 4"),
])
def test_a_size_a_model_cannot_take_is_one_line(model, size, what) -> None:
    frames = "7" if model == "mvit_v2_s" else "8"
    result = CliRunner().invoke(app, ["memory", model, "--strategies", "fp32", "--batch", "1", "--image-size", size,
                                      "--frames", frames, "--device", "meta", "--out", "/nonexistent"])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and what in lines[0] and f"got {frames}x{size}" in lines[0], result.output
    with pytest.raises(ValueError, match=f"^{what}"):
        task_of(model).build(ModelSpec(model), InputSize(int(size), int(size), int(frames)))


def test_checking_a_video_model_and_its_size_imports_no_torch() -> None:
    code = ("import sys\nfrom actbench.training.tasks import task_of\nfrom actbench.schema import InputSize\n"
            "print(task_of('s3d').size_problem('s3d', InputSize(64, 64, 8)) is not None, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]


def test_frames_are_refused_for_an_image_model() -> None:
    with pytest.raises(SpecError) as refused:
        CommandSpec("memory", "resnet18", ("L3",), batch="2", device="meta", frames=8)
    assert refused.value.as_option() == ("--frames applies to video models; 'resnet18' is a classification model, "
                                         "got 8")


# --- measured and predicted ----------------------------------------------------------------------
def _video_point(strategy: str, device: str) -> Point:
    return Point.resolve(PointConfig(ModelSpec("r3d_18"), strategy, 2, CLIP.height, device, warmup_steps=1,
                                     timed_steps=0, frames=CLIP.frames))


@pytest.fixture(scope="module")
def video_rows() -> dict[tuple[str, str], object]:
    return cpu_and_meta_rows(_video_point)


@pytest.mark.memory_gb(2.0)  # 1.86 GB measured, children included
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_r3d_at_L3_keeps_several_times_less(video_rows, device) -> None:
    """Observed at 4x32², batch 2: fp32 6.9 MB, L3 0.63 MB (every conv through its twin)."""
    l3 = assert_l3_keeps_less(video_rows, device, 5)
    assert "0 through the saved-tensor hook path" in l3.strategy_note, l3.strategy_note  # Conv3DSimple converted


@pytest.mark.parametrize("strategy", ["fp32", "L3"])
def test_r3d_meta_predicts_cpu_bytes(video_rows, strategy) -> None:
    """Within 1 % (observed: fp32 exact, L3 within 0.3 %)."""
    cpu, meta = video_rows[strategy, "cpu"], video_rows[strategy, "meta"]
    assert abs(meta.activation_bytes / cpu.activation_bytes - 1) <= 0.01
    assert abs(meta.peak_alloc_bytes / cpu.peak_alloc_bytes - 1) <= 0.01
    assert meta.flops_per_sample == cpu.flops_per_sample and meta.model_bytes == cpu.model_bytes


# --- ActNN on video models -----------------------------------------------------------------------
class FunctionalPool(nn.Module):
    """A conv, then F.max_pool3d called as a function (no nn.MaxPool3d to swap)."""

    def __init__(self, **pool) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 4, 1)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool3d(self.conv(x), **self.pool)


POOLS = [
    dict(kernel_size=(1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
    dict(kernel_size=3, stride=1, padding=1),
    dict(kernel_size=(2, 2, 2), ceil_mode=True),
    dict(kernel_size=(3, 2, 3), stride=(2, 1, 2), padding=(1, 0, 1), dilation=(1, 2, 1), ceil_mode=True),
]


@pytest.mark.parametrize("pool", POOLS, ids=lambda k: ",".join(f"{a}={v}" for a, v in k.items()))
def test_functional_max_pool3d_matches_torch_bit_for_bit(backend, pool) -> None:
    """The rerouted pool's output and input gradient equal torch's (its int8 offsets lose nothing)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 13, 11, generator=gen)
    plain = FunctionalPool(**pool)
    conv = convert(FunctionalPool(**pool), level_config("L3", backend=backend))
    conv.model.load_state_dict(plain.state_dict())
    feats = []
    for model in (plain, conv.model):
        model.conv.register_forward_hook(lambda m, i, o: feats.append(o))
    out_plain, out_l3 = plain(x), conv.model(x)
    assert torch.equal(out_plain, out_l3)
    grad = torch.randn(out_plain.shape, generator=gen)
    (g_plain,) = torch.autograd.grad(out_plain, feats[0], grad)
    (g_l3,) = torch.autograd.grad(out_l3, feats[1], grad)
    assert torch.equal(g_plain, g_l3)


def test_functional_max_pool3d_saves_one_byte_per_output(backend) -> None:
    """At L0 (nothing quantized) F.max_pool3d keeps int8 offsets only, as the twin: no int64 indices."""
    conv = convert(FunctionalPool(kernel_size=3, stride=1, padding=1), level_config("L0", backend=backend))
    census = saved_tensor_census(conv.model, torch.randn(2, 3, 4, 8, 8, requires_grad=True))
    pool = [g for g in census.groups if g.saved_by == "twin: max_pool3d"]
    assert [(g.category, g.nbytes) for g in pool] == [("compressed", 2 * 4 * 4 * 8 * 8)], census.groups
    assert "integer or bool" not in census.bytes_by_category(), census.groups


def _swin_attention() -> nn.Module:
    from torchvision.models.video.swin_transformer import ShiftedWindowAttention3d

    return ShiftedWindowAttention3d(16, window_size=[2, 2, 2], shift_size=[1, 1, 1], num_heads=2)


def test_swin3d_position_index_is_model_state_while_the_window_is_whole() -> None:
    """Swin3D's bias lookup saves its int64 relative-position index for backward: with the whole window
    it is the module's buffer itself (model state, not an activation); a clip smaller than the window
    shrinks it, and the index's slice is copied (V² int64 per block, kept until backward)."""
    torch.manual_seed(0)
    plain = _swin_attention()
    x = torch.randn(1, 4, 4, 4, 16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        plain(x)
    index = [t for t in saved if t.dtype == torch.int64]
    buffer = plain.relative_position_index.untyped_storage().data_ptr()
    assert index and all(t.untyped_storage().data_ptr() == buffer for t in index)
    conv = convert(plain, "L3")
    whole = saved_tensor_census(conv.model, x)
    assert "integer or bool" not in whole.bytes_by_category(), whole.groups
    shrunk = saved_tensor_census(conv.model, torch.randn(1, 1, 4, 4, 16, requires_grad=True))  # window (1, 2, 2)
    assert shrunk.bytes_by_category()["integer or bool"] == 4 * 4 * 8, shrunk.groups


class MatmulAttention(FunctionalAttention):
    """Attention written with matmuls (Swin3D's and MViT's layout): q, k and v views of one projection."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.softmax((q * 0.25) @ k.transpose(-2, -1), dim=-1) @ v


def test_matmul_attention_packs_query_and_key_at_qk_bits(backend) -> None:
    """What ``q @ k.transpose(-2, -1)`` saves gets ``qk_bits`` (4 at L3), as SDPA's query and key; the
    softmax's output and V (the second matmul's operands) stay at the 2-bit target."""
    conv = convert(MatmulAttention(), level_config("L3", backend=backend))
    seen = []
    packer_of(conv.model).observer = lambda t, packed, reason, owner: seen.append((t, packed))
    x = torch.randn(2, 64, 64, requires_grad=True)
    conv.model(x).backward()
    kinds = [(packed.slot.info.kind, packed.spec.bits) for t, packed in seen if packed is not None and t.dim() >= 3]
    assert sorted(kinds[:2]) == [("qk", 4), ("qk", 4)], kinds  # the first matmul: scaled q, and k
    assert len(kinds) >= 4 and set(kinds[2:]) == {("hook", 2)}, kinds  # softmax's output (twice), v
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.heavy
@pytest.mark.parametrize("model, size", [
    ("mc3_18", InputSize(64, 64, 8)), ("r2plus1d_18", InputSize(64, 64, 8)), ("s3d", InputSize(209, 209, 13)),
    ("mvit_v2_s", InputSize(64, 64, 8)), ("swin3d_t", InputSize(64, 64, 8)),
])
def test_each_family_on_meta_keeps_several_times_less_at_L3(model, size) -> None:
    """One model of each family, predicted at a small clip (observed fp32 / L3: mc3_18 11.3, r2plus1d_18
    11.8, s3d 12.3, mvit_v2_s 13.1, swin3d_t 8.8; Swin3D's copies of its index slice are most of the rest)."""
    sessions = MetaSessions()
    rows = {s: sessions.measure_point(Point.resolve(PointConfig(ModelSpec(model), s, 2, size.height, "meta",
                                                                warmup_steps=1, timed_steps=0, frames=size.frames)))
            for s in ("fp32", "L3")}
    assert rows["fp32"].status == "ok" and rows["L3"].status == "ok", (rows["fp32"].message, rows["L3"].message)
    assert 5 * rows["L3"].activation_bytes < rows["fp32"].activation_bytes
    assert "0 unsupported" in rows["L3"].strategy_note, rows["L3"].strategy_note
