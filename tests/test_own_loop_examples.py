"""The scripts of README's "ActNN in your own training loop" train at tiny sizes and print a census.

Each script runs as a user would run it (a subprocess, 64 px, batch 2, 2 steps, L3) against this
tree's package; the test reads what it printed: one finite loss per step and the census line last.
The classifier also shows what the README says of the controller: the first step has no allocation
and the second has one near L3's 2-bit target, without any call in the loop. On 2 shared cores the
classifier takes about 10 s and the segmentation model 10-11 s; the detector (15-27 s) and the
classifier's L0 run (a second case of the same script) are heavy.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEP = re.compile(r"^step (\d+) loss (\S+)(?: mean_bits (\S+))?$")
CENSUS = re.compile(r"^census: uncompressed (\d+\.\d)% of (\d+\.\d) MiB saved")


def _run(script: str, *args: str) -> tuple[list[tuple[int, float, float | None]], str]:
    """Run ``scripts/<script>`` at 64 px, batch 2, 2 steps -> ((step, loss, mean bits), ...), census line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--steps", "2", "--size", "64",
                           "--batch", "2", *args], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    steps = []
    for line in lines[:-1]:
        m = STEP.match(line)
        assert m, f"unexpected line {line!r} in:\n{done.stdout}"
        steps.append((int(m[1]), float(m[2]), float(m[3]) if m[3] else None))
    assert [s for s, _, _ in steps] == [1, 2], done.stdout
    assert all(math.isfinite(loss) for _, loss, _ in steps), done.stdout
    assert CENSUS.match(lines[-1]), done.stdout
    return steps, lines[-1]


def _uncompressed_share(census: str) -> float:
    return float(CENSUS.match(census)[1])


@pytest.mark.memory_gb(2.2)  # 2.10 GB measured, children included
def test_classifier_trains_at_l3_with_the_allocation_from_its_second_step() -> None:
    steps, census = _run("own_loop_classifier.py")
    (_, first, bits_1), (_, second, bits_2) = steps
    assert second < first, steps  # one fixed batch: SGD with momentum lowers its loss
    assert bits_1 is None, steps  # no gradient statistics before the first backward: uniform bits
    assert bits_2 is not None and 1.9 <= bits_2 <= 2.0, steps  # the allocation meets L3's budget from below
    assert _uncompressed_share(census) < 1.0, census  # every saved activation of ResNet-18 is compressed


@pytest.mark.heavy
def test_classifier_at_l0_keeps_activations_in_full_precision() -> None:
    """L0 compresses only masks: the census must say most saved bytes stay full precision."""
    steps, census = _run("own_loop_classifier.py", "--level", "L0")
    assert all(bits is None for _, _, bits in steps), steps  # no mixed precision at L0
    assert _uncompressed_share(census) > 50.0 and "full precision by level" in census, census


@pytest.mark.memory_gb(2.3)  # 2.19 GB measured, children included
def test_segmentation_trains_at_l3() -> None:
    steps, census = _run("own_loop_segmentation.py")
    assert steps[1][1] < steps[0][1], steps  # one fixed batch of rectangles to find
    assert _uncompressed_share(census) < 10.0, census


@pytest.mark.heavy
def test_detector_trains_at_l3_with_its_boxes_exact() -> None:
    steps, census = _run("own_loop_detector.py")
    assert len(steps) == 2, steps  # two steps of a detector promise finite losses, not a lower one
    assert "positions: kept exact" in census, census  # roi_align's boxes are never quantized
    assert _uncompressed_share(census) < 10.0, census
