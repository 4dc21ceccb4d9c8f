"""Unit tests of the harness library (in-process, CPU): tracker, strategies, measurement, searches."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from actbench import strategies
from actbench.measure.environment import GIT_COMMIT_VAR, _git_commit
from actbench.core.devices import PROFILES, pinned_host_bytes
from actbench.measure.accounting import count_flops
from actbench.measure.point import measure_point
from actbench.measure.tracker import LiveStorageTracker, unique_storage_bytes
from actbench.training.model_names import validate_model_spec
from actbench.training.models import build_model, grown_resnet152_layers, logits_of, real_depth
from actbench.execution.parsing import combine_strategies, parse_bytes, parse_int_range, parse_levels, parse_strategies
from actbench.schema import COLUMNS, Measurement, ModelSpec, PointConfig, ResultRow
from actbench.planning.configs import multiples_of
from actbench.planning.guided import binary_search_largest
from actbench.planning.point import Point
from actbench.planning.search import linear_scan, SearchOutcome
from actbench.planning.settings import MeasureSettings
from actbench.strategies import ALL_STRATEGIES, LEVEL_NAMES
from actbench.strategies.mechanics.checkpointing import apply_checkpointing
from actbench.training.step import build_training_step, synthetic_batch
from actbench.training.tasks import CLASSIFICATION

TINY = dict(batch_size=4, image_size=32, device="cpu", warmup_steps=1, timed_steps=1)


def _point(strategy: str, **kw) -> Point:
    args = {**TINY, **kw}
    return Point.resolve(PointConfig(model=ModelSpec("resnet18"), strategy=strategy, **args))


@pytest.fixture(scope="module")
def fp32_measurement():
    """One fp32 baseline shared by the comparisons (a CPU step costs seconds on 2 cores)."""
    return measure_point(_point("fp32", timed_steps=3))


# --- result rows -------------------------------------------------------------------------------
def test_result_row_carries_every_measurement_field_and_the_point(fp32_measurement) -> None:
    point = _point("fp32", timed_steps=3)
    row = ResultRow.build(point.config, fp32_measurement, run_id="r1", env_id="e1")
    for f in fields(Measurement):
        assert getattr(row, f.name) == getattr(fp32_measurement, f.name), f.name
    assert (row.key, row.model, row.batch_size, row.timed_steps) == (point.key(), "resnet18", 4, 3)
    assert set(COLUMNS) >= {f.name for f in fields(Measurement)} and row.finished_at
    assert ResultRow.from_dict(asdict(row)) == row


@pytest.mark.parametrize("device,command,expected", [
    ("cuda", "sweep-batch", (3, 10)), ("cpu", "sweep-batch", (1, 3)), ("cuda", "memory", (3, 0)),
    ("cpu", "memory", (1, 0)), ("meta", "sweep-batch", (1, 0)), ("meta", "plan", (1, 0))])
def test_measure_settings_defaults_per_device(device: str, command: str, expected: tuple[int, int]) -> None:
    s = MeasureSettings.resolve(PROFILES[device], command)
    assert (s.warmup_steps, s.timed_steps) == expected
    given = MeasureSettings.resolve(PROFILES[device], command, warmup_steps=5, timed_steps=0)
    assert (given.warmup_steps, given.timed_steps) == ((1, 0) if device == "meta" else (5, 0))


def test_measure_settings_meta_refuses_timed_steps() -> None:
    with pytest.raises(ValueError, match="meta predicts memory only.*got 4"):
        MeasureSettings.resolve(PROFILES["meta"], "sweep-batch", timed_steps=4)


def test_git_commit_from_the_checkout_else_from_the_variable(tmp_path, monkeypatch) -> None:
    """A lent GPU gets the tree without .git: ACTBENCH_GIT_COMMIT names the commit there, never here."""
    import subprocess

    # a checkout of its own (this test may itself run from a copy without .git, as on a lent GPU)
    repo = tmp_path / "checkout"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run([*git[:3], "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    bare = tmp_path / "copy"
    bare.mkdir()
    monkeypatch.setenv(GIT_COMMIT_VAR, "not-this")
    assert _git_commit(repo) == head
    assert _git_commit(bare) == "not-this"
    monkeypatch.delenv(GIT_COMMIT_VAR)
    assert _git_commit(bare) is None


# --- tracker ------------------------------------------------------------------------------------
def test_tracker_is_exact_on_hand_computable_case() -> None:
    """relu(x @ w.T).sum() with x [8,16], w [4,16] fp32: mm output 8*4*4 = 128 B, relu output 128 B,
    loss 4 B. relu saves its output, sum saves nothing, the mm output dies after relu -> 132 B live
    after forward; peak 256 B (mm and relu outputs coexist). Views share storage; float64 is 8 B."""
    tracker = LiveStorageTracker()
    x, w = torch.randn(8, 16), torch.randn(4, 16, requires_grad=True)
    tracker.adopt([x, w, w])  # adopting the same storage twice counts it once
    base = tracker.live_bytes
    assert base == 8 * 16 * 4 + 4 * 16 * 4
    with tracker:
        tracker.reset_peak()
        loss = torch.relu(x @ w.t()).sum()
        assert tracker.live_bytes - base == 132
        assert tracker.peak_bytes - base == 256
        a = torch.empty(1000)
        b = a.view(10, 100)
        c = torch.empty(250, dtype=torch.float64)
        assert tracker.live_bytes - base == 132 + 4000 + 2000
        del a
        assert tracker.live_bytes - base == 132 + 4000 + 2000  # b still holds the storage
        del b
        assert tracker.live_bytes - base == 132 + 2000
        loss.backward()  # frees relu's saved output (128 B), adds w.grad (256 B)
        assert tracker.live_bytes - base == 4 + 2000 + 256
        del c
    assert tracker.live_bytes - base == 4 + 256


def test_tracker_peak_agrees_with_pytorch_memtracker() -> None:
    """Cross-check with torch's own MemTracker on a steady-state MLP step (SGD momentum). MemTracker
    does not see the input batch (made before tracking); actbench adopts it, so the peaks differ by
    exactly its 8*100*4 bytes."""
    def make():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(100, 200), nn.ReLU(), nn.Linear(200, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(8, 100)
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()  # warm-up: momentum buffers exist
        opt.zero_grad(set_to_none=True)
        return model, opt, x

    from actbench.core.compat import memtracker_class

    model, opt, x = make()
    mem_tracker = memtracker_class()()
    mem_tracker.track_external(model, opt)
    with mem_tracker:
        model(x).sum().backward()
        opt.step()
    theirs = mem_tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]

    model, opt, x = make()
    tracker = LiveStorageTracker()
    tracker.adopt([*model.parameters(), *(v for st in opt.state.values() for v in st.values()), x])
    with tracker:
        tracker.reset_peak()
        model(x).sum().backward()
        opt.step()
    assert tracker.peak_bytes == theirs + x.numel() * 4


def test_tracker_files_host_allocations_separately() -> None:
    tracker = LiveStorageTracker()
    with tracker:
        dev = torch.zeros(100)
        with tracker.host_allocations():
            host = torch.zeros(50)
        assert (tracker.live_bytes, tracker.host_live_bytes) == (400, 200)
        del host
        assert tracker.host_live_bytes == 0 and tracker.host_peak_bytes == 200
    del dev


def test_unique_storage_bytes_dedups_views() -> None:
    t = torch.zeros(10, 10)
    assert unique_storage_bytes([t, t[0], t.t()]) == 400


# --- models -------------------------------------------------------------------------------------
def test_real_depth_counts_built_layers() -> None:
    assert real_depth(build_model(ModelSpec("resnet18"), 32)) == 18
    assert real_depth(build_model(ModelSpec("resnet152"), 32)) == 152
    assert grown_resnet152_layers(44) == (3, 16, 72, 3)  # upstream's 8:36 split
    grown = build_model(ModelSpec("resnet152", extra_blocks=44), 32)
    assert real_depth(grown) == 3 * (3 + 16 + 72 + 3) + 2
    assert real_depth(build_model(ModelSpec("mobilenet_v3_small"), 32)) is None


def test_width_per_group_changes_the_model() -> None:
    base = sum(p.numel() for p in build_model(ModelSpec("resnet152"), 32).parameters())
    wide = sum(p.numel() for p in build_model(ModelSpec("resnet152", width_per_group=80), 32).parameters())
    assert wide > base


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(ValueError, match="unknown model 'resnt18'.*resnet18"):
        validate_model_spec(ModelSpec("resnt18"))
    with pytest.raises(ValueError, match="resnet152 only"):
        validate_model_spec(ModelSpec("resnet18", extra_blocks=2))


def test_the_listed_classifiers_are_the_installed_torchvisions() -> None:
    from actbench.training.tasks.classification import TORCHVISION_CLASSIFIERS
    from actbench.training.model_names import list_model_names

    assert TORCHVISION_CLASSIFIERS == list_model_names(), "regenerate actbench/training/tasks/classification.py's list"


def test_checking_a_known_model_name_imports_no_torch() -> None:
    """The command's own process checks its input before any worker starts: in a fresh interpreter,
    a known name and a bad depth are decided without torch (3.8 s of a 30 s cpu sweep before)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from actbench.training.model_names import validate_model_spec\n"
            "from actbench.schema import ModelSpec\n"
            "validate_model_spec(ModelSpec('resnet50'))\n"
            "try:\n    validate_model_spec(ModelSpec('resnet152', extra_blocks=-1))\n"
            "except ValueError as e:\n    print(e)\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["extra blocks must be >= 0, got -1", "False"], out


def test_models_with_resolution_arguments_build_at_other_sizes() -> None:
    vit = build_model(ModelSpec("vit_b_32"), 64)
    assert logits_of(vit(torch.randn(1, 3, 64, 64))).shape == (1, 1000)


# --- strategies ---------------------------------------------------------------------------------
def _grads_after_step(strategy: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = build_model(ModelSpec("resnet18"), 32)
    images, targets = synthetic_batch(4, 32, 1000, torch.device("cpu"), seed=1)
    step, _ = build_training_step(strategies.get(strategy), model, torch.device("cpu"))
    step.zero_grad()
    step.forward_loss(images, targets).backward()
    return [p.grad.clone() for p in step.model.parameters()]


@pytest.mark.parametrize("strategy", ["swap", "checkpoint"])
def test_strategy_gradients_match_fp32(strategy: str) -> None:
    """swap and checkpoint change where tensors live, not the math: same grads as fp32 (fp32 tolerance:
    checkpoint recomputes the same ops in the same order, so differences are rounding only)."""
    for a, b in zip(_grads_after_step("fp32"), _grads_after_step(strategy)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_swap_moves_saved_tensors_off_the_device(fp32_measurement) -> None:
    fp32 = fp32_measurement
    swap = measure_point(_point("swap"))
    assert fp32.status == swap.status == "ok"
    # Only the 4-byte loss (its saved values went to host) is left on the device after forward.
    assert swap.activation_bytes < 0.01 * fp32.activation_bytes
    assert swap.host_bytes >= 0.9 * fp32.activation_bytes
    assert swap.peak_alloc_bytes < fp32.peak_alloc_bytes


def test_checkpoint_reduces_activation_bytes(fp32_measurement) -> None:
    fp32 = fp32_measurement
    ckpt = measure_point(_point("checkpoint"))
    assert ckpt.status == "ok" and ckpt.strategy_note == "8 checkpoint segments"
    assert ckpt.activation_bytes < 0.7 * fp32.activation_bytes
    # 2 groups over 8 blocks in 4 containers (layer1..4): a group never spans a container, so 4 runs.
    fewer = measure_point(_point("checkpoint", checkpoint_segments=2))
    assert fewer.strategy_note == "4 checkpoint segments"
    assert fewer.activation_bytes < ckpt.activation_bytes


@pytest.mark.memory_gb(2.6)  # 2.31-2.45 GB measured, children included
def test_checkpoint_never_starts_a_segment_with_an_inplace_module() -> None:
    """VGG's features interleave Conv2d and ReLU(inplace=True); a segment starting at the ReLU would
    overwrite the previous segment's output that checkpoint keeps for recompute."""
    model = build_model(ModelSpec("vgg11"), 32)
    apply_checkpointing(model, segments=None)
    runs = model.features.runs
    for start, _ in runs:
        assert not getattr(model.features.inner[start], "inplace", False)
    images, targets = synthetic_batch(2, 32, 1000, torch.device("cpu"), seed=0)
    nn.CrossEntropyLoss()(model(images), targets).backward()


# --- measurement --------------------------------------------------------------------------------
def test_throughput_fields_populated_on_cpu(fp32_measurement) -> None:
    m = fp32_measurement
    assert m.status == "ok"
    assert m.samples_per_s_median > 0 and m.samples_per_s_iqr is not None and m.samples_per_s_iqr >= 0
    assert m.step_time_s_median > 0
    assert m.reserved_bytes is None  # cpu: no caching allocator, "not measured" rather than 0
    assert m.model_bytes == m.param_bytes + m.grad_bytes + m.optimizer_state_bytes
    assert m.param_bytes == m.grad_bytes == m.optimizer_state_bytes == m.num_params * 4
    # Gradients do not exist yet when forward ends (zero_grad sets them to None); they appear in backward.
    assert m.peak_alloc_bytes >= m.param_bytes + m.optimizer_state_bytes + m.activation_bytes
    assert m.peak_alloc_bytes >= m.model_bytes


def test_memory_only_point_has_no_throughput() -> None:
    m = measure_point(_point("fp32", timed_steps=0))
    assert m.samples_per_s_median is None and m.samples_per_s_iqr is None
    assert m.steps_run == 2  # one warm-up step and the memory step, nothing timed
    assert 0 < m.steps_s < m.elapsed_s


def test_a_row_says_how_many_steps_ran_and_how_long_they_took(fp32_measurement) -> None:
    """Timing goes on past timed_steps until the spread settles: the row counts what actually ran."""
    m = fp32_measurement
    assert m.steps_run >= 1 + 1 + 3  # warm-up, the memory step, at least the 3 timed steps
    timed = m.steps_run - 2
    # the median step time is one of the timed steps', so it bounds their sum from both sides loosely
    assert m.steps_s >= timed * m.step_time_s_median * 0.5
    assert m.steps_s < m.elapsed_s  # building the model and counting FLOPs come on top


def test_timing_goes_to_the_minimum_time_unless_exact_steps_are_asked_for(monkeypatch) -> None:
    """By default a cpu point times at least the profile's minimum time (the suite's own points,
    with ACTBENCH_EXACT_STEPS=1 from conftest, time exactly the steps asked for)."""
    from actbench.core.devices import EXACT_STEPS_ENV, PROFILES

    monkeypatch.setenv(EXACT_STEPS_ENV, "1")
    exact = measure_point(_point("fp32", batch_size=2, timed_steps=2))
    assert exact.steps_run == 1 + 1 + 2
    monkeypatch.delenv(EXACT_STEPS_ENV)
    default = measure_point(_point("fp32", batch_size=2, timed_steps=2))
    timed_s = default.steps_s - 2 * default.step_time_s_median  # roughly: less the warm-up and memory steps
    assert default.steps_run > exact.steps_run and timed_s >= 0.5 * PROFILES["cpu"].min_timed_seconds
    monkeypatch.setenv(EXACT_STEPS_ENV, "yes")
    with pytest.raises(ValueError, match="ACTBENCH_EXACT_STEPS must be 0 or 1.*'yes'"):
        measure_point(_point("fp32", batch_size=2, timed_steps=2))


def test_flops_match_flop_counter_mode(fp32_measurement) -> None:
    m = fp32_measurement
    model = build_model(ModelSpec("resnet18"), 32)
    images, targets = synthetic_batch(4, 32, 1000, torch.device("cpu"), seed=3)
    with FlopCounterMode(display=False) as counter:
        nn.CrossEntropyLoss()(model(images), targets).backward()
    assert m.flops_per_sample > 0
    assert m.flops_per_sample == counter.get_total_flops() / 4
    fwd, total = count_flops(model, images, targets, CLASSIFICATION)
    assert m.forward_flops_per_sample == fwd / 4 and total == counter.get_total_flops()


def test_over_budget_on_cpu_keeps_the_bytes() -> None:
    m = measure_point(_point("fp32", budget_bytes=1024))
    assert m.status == "over_budget" and "budget" in m.message
    assert m.peak_alloc_bytes > 1024 and m.samples_per_s_median is None


def test_actnn_level_runs_and_saves_less_than_fp32() -> None:
    """Needs actbench.actnn (the ActNN package); fails, not skips, without it."""
    import actbench.actnn as actnn

    assert tuple(actnn.LEVEL_NAMES) == LEVEL_NAMES
    fp32 = measure_point(_point("fp32", timed_steps=0))  # same batch as the L3 point, no timing
    l3 = measure_point(_point("L3", timed_steps=0))
    assert l3.status == "ok", l3.message
    assert l3.activation_bytes < 0.5 * fp32.activation_bytes
    assert l3.strategy_note and "L3" in l3.strategy_note


# --- parsing and searches -----------------------------------------------------------------------
def test_parsers() -> None:
    assert parse_levels("L1..L5") == ("L1", "L2", "L3", "L4", "L5")
    assert parse_levels("L1,L3") == ("L1", "L3") and parse_levels("all") == LEVEL_NAMES
    for bad in ("L1..L9", "L3..L1", "X"):
        with pytest.raises(ValueError, match="levels are L0..L5"):
            parse_levels(bad)
    assert parse_bytes("16GiB") == 16 * 2**30 and parse_bytes("1.5GB") == 1_500_000_000
    assert parse_bytes("512") == 512
    with pytest.raises(ValueError, match="cannot parse budget '16XB'"):
        parse_bytes("16XB")
    assert parse_int_range("16:64:16") == (16, 32, 48, 64) and parse_int_range("2,4") == (2, 4)
    with pytest.raises(ValueError, match="must be positive, got 0"):
        parse_int_range("0:8:2")
    assert combine_strategies(parse_strategies("swap"), parse_levels("L2"), True) == ("fp32", "swap", "L2")
    assert combine_strategies(parse_strategies("swap"), (), False) == ("swap",)
    assert set(LEVEL_NAMES) <= set(ALL_STRATEGIES)


def _row(strategy: str, status: str, batch: int = 8, extra_blocks: int = 0) -> ResultRow:
    return ResultRow(key=f"{strategy}{status}{batch}{extra_blocks}", run_id="r", env_id="e", status=status, message="",
                     model="resnet152", extra_blocks=extra_blocks, width_per_group=None, depth=None, strategy=strategy,
                     batch_size=batch, image_size=32, device="cpu", budget_bytes=None)


def test_search_outcome_bounded_only_by_a_larger_memory_failure() -> None:
    out = SearchOutcome(rows=[_row("fp32", "ok", 8), _row("fp32", "oom", 12), _row("L3", "oom", 4),
                              _row("L3", "ok", 16), _row("L2", "ok", 16), _row("L2", "error", 20)],
                        maxima={"fp32": 8, "L3": 16, "L2": 16})
    assert out.bounded("fp32")
    assert not out.bounded("L3")  # a failure below the maximum bounds nothing
    assert not out.bounded("L2")  # an error is not "does not fit"
    depth = SearchOutcome(rows=[_row("fp32", "ok", extra_blocks=3), _row("fp32", "over_budget", extra_blocks=4)],
                          maxima={"fp32": 3}, dim="depth")
    assert depth.bounded("fp32") and depth.value_of(depth.rows[1]) == 4


def test_binary_search_and_multiples() -> None:
    cands = multiples_of(4, 16, 1024)
    assert cands[0] == 16 and cands[-1] == 1024 and all(c % 4 == 0 for c in cands)
    probes: list[int] = []

    def fits(v: int) -> bool:
        probes.append(v)
        return v <= 608

    assert binary_search_largest(cands, fits) == 608
    assert len(probes) <= 8
    assert binary_search_largest(cands, lambda v: False) is None
    assert binary_search_largest(cands, lambda v: True) == 1024


def test_linear_scan_stops_after_consecutive_failures() -> None:
    from types import SimpleNamespace

    statuses = {1: "ok", 2: "oom", 3: "ok", 4: "oom", 5: "oom", 6: "ok"}
    seen: list[int] = []

    def run(p):
        seen.append(p)
        return SimpleNamespace(ok=statuses[p] == "ok")

    linear_scan([1, 2, 3, 4, 5, 6], run, stop_after=2)
    assert seen == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("stats,expected", [
    ({"active_bytes.current": 4096, "allocated_bytes.current": 8192}, 4096),  # newer torch: handed-out blocks
    ({"allocated_bytes.current": 8192}, 8192),  # older torch: only the allocator's total
    ({"num_host_alloc": 3}, None),  # no byte counter: unknown, not zero
])
def test_pinned_host_bytes_reads_torch_counters(monkeypatch, stats, expected) -> None:
    monkeypatch.setattr(torch.cuda, "host_memory_stats", lambda: stats)
    assert pinned_host_bytes() == expected


def test_pinned_host_bytes_without_the_api_is_unknown(monkeypatch) -> None:
    def missing():
        raise RuntimeError("no CUDA host allocator")
    monkeypatch.setattr(torch.cuda, "host_memory_stats", missing)
    assert pinned_host_bytes() is None


@pytest.mark.parametrize("strategy", ["L3", "checkpoint+L2"])
def test_actnn_strategies_convert_the_handed_model_in_place(strategy: str) -> None:
    """A strategy's model is the point's own (Strategy.prepare): ActNN converts it rather than a copy,
    so no second set of parameters exists (on cuda the caller's original would be counted)."""
    torch.manual_seed(0)
    model = build_model(ModelSpec("resnet18"), 32)
    params = {id(p) for p in model.parameters()}
    step, _ = build_training_step(strategies.get(strategy), model, torch.device("cpu"))
    assert {id(p) for p in step.model.parameters()} == params
    assert any(type(m).__name__ == "QConv2d" for m in model.modules())  # converted where it was handed over
