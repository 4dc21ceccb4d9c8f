"""Planning for a GPU spec and a host budget on meta (docs/design.md §10): options, keys, statuses.

The allocator rules themselves are tested in tests/test_allocator_model.py; here: what ``--gpu`` and
``--host-budget`` do to a spec, a point's key, a row and a search, and their one-line errors.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from actbench import strategies
from actbench.cli import app
from actbench.execution.specs import CommandSpec, SpecError
from actbench.core.gpus import MIB, gpu_spec
from actbench.measure.accounting import OverBudget
from actbench.planning.point import Point
from actbench.schema import InputSize, MEMORY_FAILURES, STATUSES, Measurement, ModelSpec, PointConfig, ResultRow

SMALL = ["resnet18", "--image-size", "32", "--batch", "4", "--device", "meta"]


def _rows(out: Path) -> list[dict]:
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


# --- options and their errors ---------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["plan", "resnet18", "--gpu", "t4", "--budget", "16GiB"], "--budget and --gpu both set the device memory"),
    (["memory", "resnet18", "--device", "cuda", "--gpu", "t4"], "--gpu plans a prediction for a GPU model"),
    (["plan", "resnet18", "--budget", "16GiB", "--host-budget", "lots"], "--host-budget cannot parse"),
    (["plan", "resnet18"], "--budget is required: plan predicts the largest size under a memory budget (e.g. 16GiB, "
                           "or --gpu t4)"),
])
def test_bad_gpu_and_host_budget_options_are_one_line_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.output


def test_gpu_sets_the_budget_to_what_the_profile_leaves_and_budget_alone_keeps_old_names_and_keys() -> None:
    spec = CommandSpec(command="plan", model="resnet50", strategies=("fp32", "L5"), device="meta", dim="batch",
                       gpu="t4", host_budget="64GiB")
    settings = spec.settings()
    assert settings.budget_bytes == gpu_spec("t4").usable_bytes and settings.gpu.name == "t4"
    assert settings.host_budget_bytes == 64 << 30
    point = settings.point(ModelSpec("resnet50"), strategies.get("L5"), 64, InputSize(224, 224))
    assert (point.gpu.name, point.config.gpu, point.host_budget_bytes) == ("t4", "t4", 64 << 30)
    # without --gpu and --host-budget nothing changes: the committed run's directory and keys
    plain = CommandSpec(command="plan", model="resnet50", device="meta", dim="batch", budget="16GiB",
                        strategies=("fp32", "swap", "checkpoint", "L0", "L1", "L2", "L3", "L4", "L5"))
    assert plain.plan().name == "plan-batch_resnet50_meta_224px_fc3bfbdc"  # results/meta/planned_max_batch
    first = plain.settings().point(ModelSpec("resnet50"), strategies.get("fp32"), 64, InputSize(224, 224))
    assert first.key() == "cffb3fecd7ab80ac"  # its first row
    assert spec.plan().name != plain.plan().name and point.key() != dataclasses.replace(point.config, gpu=None).key()


def test_experiment_files_and_the_cli_share_the_check() -> None:
    with pytest.raises(SpecError) as err:
        CommandSpec(command="plan", model="resnet50", strategies=("fp32",), device="meta", dim="batch", gpu="k80")
    assert err.value.field == "gpu" and "got 'k80'" in err.value.problem


def test_host_over_budget_is_a_memory_failure_status() -> None:
    assert "host_over_budget" in STATUSES and "host_over_budget" in MEMORY_FAILURES
    from actbench.planning.search import deciding_bytes

    row = ResultRow.build(PointConfig(ModelSpec("resnet18"), "swap", 4, 32, "meta", host_budget_bytes=1),
                          Measurement("host_over_budget", peak_alloc_bytes=10), "r", "e")
    assert deciding_bytes(row) is None  # its device bytes say nothing about where host memory runs out
    gpu_row = ResultRow.build(PointConfig(ModelSpec("resnet18"), "L3", 4, 32, "meta", budget_bytes=99, gpu="t4"),
                              Measurement("ok", peak_alloc_bytes=10, reserved_bytes=20), "r", "e")
    assert deciding_bytes(gpu_row) == 20 and gpu_row.gpu == "t4"


# --- predictions ------------------------------------------------------------------------------------
def test_reserved_bytes_decide_a_gpu_point_and_l5_can_differ_from_l4() -> None:
    from actbench.measure.meta import StepTrace, predict_reserved

    # Workspaces first: cuBLAS's 8.125 MiB in a 20 MiB segment, cuBLASLt's 1 MiB in a 2 MiB one. Then
    # 30 MiB live, 30 MiB freed, 12 MiB (best fit: the freed 30 MiB block, split), 40 MiB. Fixed segments:
    # the split 30 MiB segment cannot be released, 22 + 30 + 30 + 40 = 122 MiB. Expandable ones grow at
    # the end and reuse the freed range: 5 pages of 20 MiB + 2 = 102 MiB.
    trace = StepTrace(persistent=(), step=((1, 30 * MIB), (2, 30 * MIB), (2, 0), (3, 12 * MIB), (4, 40 * MIB)),
                      host=())
    budget = 110 * MIB
    l4 = PointConfig(ModelSpec("resnet18"), "L4", 4, 32, "meta", budget_bytes=budget, gpu="t4")
    with pytest.raises(OverBudget, match="predicted reserved .* usable on t4"):
        predict_reserved(Point.resolve(l4), Measurement("ok"), trace)
    l5 = Measurement("ok")
    predict_reserved(Point.resolve(dataclasses.replace(l4, strategy="L5")), l5, trace)
    assert l5.reserved_bytes == 5 * 20 * MIB + 2 * MIB
    # with --budget alone the same trace only fills reserved_bytes (decided on the peak, as before)
    plain = Measurement("ok")
    predict_reserved(Point.resolve(dataclasses.replace(l4, gpu=None)), plain, trace)
    assert plain.reserved_bytes == 30 * MIB + 30 * MIB + 40 * MIB  # no workspaces without a GPU spec


def test_meta_rows_record_the_gpu_spec_and_the_host_budget_status(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["memory", *SMALL, "--strategies", "swap,L3", "--gpu", "t4",
                                      "--host-budget", "64KiB", "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = {r["strategy"]: r for r in _rows(tmp_path)}
    for r in rows.values():
        assert r["gpu"] == "t4" and r["budget_bytes"] == gpu_spec("t4").usable_bytes
        assert r["host_budget_bytes"] == 64 << 10
        # the cuBLAS and cuBLASLt workspaces are alive beside the step's own peak
        assert r["reserved_bytes"] >= r["peak_alloc_bytes"] + sum(gpu_spec("t4").workspace_allocations())
    # swap's saved tensors need far more pinned memory than 64 KiB; fp32 and L3 keep nothing on the host
    assert rows["swap"]["status"] == "host_over_budget" and "pinned host" in rows["swap"]["message"]
    assert rows["L3"]["status"] == "ok" and rows["fp32"]["status"] == "ok"


def test_trust_csv_compares_predicted_and_measured_reserved_bytes(tmp_path: Path) -> None:
    from actbench.studies.trust import Comparison, write_csv

    row = Comparison("resnet18", "L5", 16, 224, "cuda", "ok", "ok", 10, 10, 100, 110, 160 * MIB, "",
                     meta_reserved_bytes=120 * MIB)
    assert row.reserved_ratio == 0.75
    write_csv([row, dataclasses.replace(row, measured_reserved_bytes=None)], tmp_path / "t.csv")
    header, *lines = (tmp_path / "t.csv").read_text().splitlines()
    names = header.split(",")
    # the columns before keep their places; the reserved comparison comes after precision, the sizes last
    assert names[-7:] == ["activation_ratio", "peak_ratio", "precision", "meta_reserved_bytes", "reserved_ratio",
                          "image_width", "frames"]
    first, second = (dict(zip(names, line.split(","))) for line in lines)
    assert first["reserved_ratio"] == "0.7500" and first["meta_reserved_bytes"] == str(120 * MIB)
    assert second["reserved_ratio"] == ""  # not measured (cpu): no ratio, not zero


def test_the_tracker_records_allocations_and_frees_in_order() -> None:
    import torch

    from actbench.measure.tracker import LiveStorageTracker

    tracker = LiveStorageTracker(record=True)
    with tracker:
        a = torch.ones(1000)  # 4000 B
        with tracker.side_stream_allocations():
            b = a * 2  # a prefetched copy on CUDA's side stream
        with tracker.host_allocations():
            c = torch.zeros(10)  # a host copy
        del a
    (sa, na), (sb, nb) = tracker.device_events[:2]
    assert (na, nb) == (4000, 4000) and tracker.device_events[2] == (sa, 0)  # a freed after b was made
    assert tracker.side_stream_serials == {sb} and tracker.host_events == [(tracker.host_events[0][0], 40)]
    del b, c
