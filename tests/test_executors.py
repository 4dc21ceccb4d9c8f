"""The executor seam (docs/design.md §7): the same work in a child process or in this one.

The runner only sees ``Executor``; accuracy and verify-grads run their measuring parts as tasks;
a child dies with its parent, however the parent dies.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from actbench.core.devices import profile
from actbench.execution.executors import ChildProcessExecutor, InProcessExecutor, Task, TaskError, executor_for
from actbench.execution.worker_processes import WorkerProcess, run_child
from actbench.store.results import RunStore
from actbench.execution.runner import PointRunner
from actbench.planning.point import Point
from actbench.schema import Measurement, ModelSpec, PointConfig
from workers import live_workers


class RecordingExecutor:
    """An executor that measures nothing: it answers each point with a made-up peak."""

    def __init__(self) -> None:
        self.seen: list[Point] = []

    def measure(self, points):
        for point in points:
            self.seen.append(point)
            yield Measurement("ok", peak_alloc_bytes=1000 * point.batch_size)

    def environment(self, device) -> dict:
        return {"device": device.name, "fake": True}

    def call(self, task: Task) -> dict:
        raise AssertionError("the runner runs no tasks")


def test_runner_sees_only_the_executor_interface(tmp_path: Path) -> None:
    executor = RecordingExecutor()
    runner = PointRunner(RunStore(tmp_path / "run"), profile("cpu"), executor=executor)
    points = [Point.resolve(PointConfig(ModelSpec("resnet18"), "fp32", b, 32, "cpu")) for b in (2, 4)]
    rows = [runner.run(p) for p in points]
    assert [r.peak_alloc_bytes for r in rows] == [2000, 4000] and executor.seen == points
    assert runner.run(points[0]).peak_alloc_bytes == 2000 and len(executor.seen) == 2  # resumed, not re-measured
    assert (tmp_path / "run" / "env.json").read_text().count('"fake": true') == 1


def test_the_device_profile_chooses_the_executor() -> None:
    assert isinstance(executor_for(profile("meta")), InProcessExecutor)
    assert isinstance(executor_for(profile("cpu")), ChildProcessExecutor)
    assert isinstance(executor_for(profile("cuda")), ChildProcessExecutor)


VERIFY_ARGS = dict(model="resnet18", level="L3", batch_size=2, seeds=2, image_size=32, device="cpu")


@pytest.mark.memory_gb(2.9)  # 2.83 GB measured, children included
def test_verify_grads_task_gives_the_same_rows_in_a_child_and_here() -> None:
    here = InProcessExecutor().call(Task("verify-grads", VERIFY_ARGS))["rows"]
    there = ChildProcessExecutor(timeout_s=600).call(Task("verify-grads", VERIFY_ARGS))["rows"]
    assert [r["parameter"] for r in here] == [r["parameter"] for r in there] and len(here) > 10
    for a, b in zip(here, there):
        assert a["numel"] == b["numel"]
        assert a["rel_std"] == pytest.approx(b["rel_std"], rel=1e-3, abs=1e-9)


@pytest.mark.memory_gb(2.4)  # 2.28 GB measured, children included
def test_a_failing_task_in_a_child_is_one_line_task_error() -> None:
    with pytest.raises(TaskError, match="unknown model 'resnet19'"):
        ChildProcessExecutor(timeout_s=300).call(Task("verify-grads", {**VERIFY_ARGS, "model": "resnet19"}))
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        ChildProcessExecutor().call(Task("nope", {}))


@pytest.mark.heavy  # a child trains; the executor's call path is also covered by verify-grads' test above
def test_accuracy_settings_run_through_the_executor(tmp_path: Path) -> None:
    from actbench.studies.accuracy import AccuracyConfig, run_accuracy

    cfg = AccuracyConfig(bits=(2,), steps=4, batch_size=16, train_size=64, test_size=32, image_size=16)
    calls: list[str] = []

    class Counting(InProcessExecutor):
        def call(self, task: Task) -> dict:
            calls.append(task.name)
            return super().call(task)

    _, here = run_accuracy(cfg, tmp_path / "a", executor=Counting())
    _, there = run_accuracy(cfg, tmp_path / "b", executor=ChildProcessExecutor(timeout_s=600))
    assert calls == ["accuracy-setting", "accuracy-setting"]  # fp32 and 2 bits
    assert [r.status for r in here] == [r.status for r in there] == ["ok", "ok"]
    for a, b in zip(here, there):
        assert a.test_accuracy == pytest.approx(b.test_accuracy, abs=1e-6)
        assert a.train_loss_final == pytest.approx(b.train_loss_final, rel=1e-4)


def _worker_pids(marker: str) -> list[int]:
    """Live workers whose command line names ``marker``."""
    return live_workers(lambda p: marker in p.cmdline)


@pytest.mark.memory_gb(2.0)  # 1.88 GB measured, children included
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_worker_dies_with_its_parent(tmp_path: Path, how: signal.Signals) -> None:
    """kill -9 (or TERM) of the process that started a worker leaves no worker behind."""
    marker = f"actbench-{os.getpid()}-{how.name}"
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import os, tempfile
        tempfile.tempdir = os.getcwd()  # the worker's request path then names this test's folder
        os.environ["ACTBENCH_TEST_FAULT"] = "hang"
        from actbench.execution.worker_processes import run_child
        from actbench.schema import ModelSpec, PointConfig
        point = PointConfig(ModelSpec("resnet18"), "fp32", 2, 32, "cpu")
        run_child({{"task": "measure", "point": point.to_dict()}}, timeout_s=600)
    """))
    (tmp_path / marker).mkdir()
    parent = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path / marker,
                              env={**os.environ, "TMPDIR": str(tmp_path / marker)})
    try:
        deadline = time.time() + 120
        while not _worker_pids(marker) and time.time() < deadline:
            time.sleep(0.5)
        assert _worker_pids(marker), "the worker never started"
        parent.send_signal(how)
        parent.wait(timeout=30)
        deadline = time.time() + 20
        while _worker_pids(marker) and time.time() < deadline:
            time.sleep(0.5)
        assert not _worker_pids(marker), "the worker outlived its parent"
    finally:
        parent.kill()
        for pid in _worker_pids(marker):
            os.kill(pid, signal.SIGKILL)


def test_children_lead_a_process_group_of_their_own_in_this_session() -> None:
    """A group of their own: a timeout kills the group, the terminal's Ctrl-C does not reach them.
    This session, not one of their own: Linux shares the CPU between sessions before it looks at nice
    values, so a spare worker in its own session took an equal share beside the measured point."""
    seen: list[tuple[int, int, int]] = []

    def track(proc: subprocess.Popen | None) -> None:
        if proc is not None:
            seen.append((os.getsid(proc.pid), os.getpgid(proc.pid), proc.pid))

    outcome = run_child({"task": "call", "name": "no-such-task", "args": {}}, timeout_s=60, track=track)
    assert outcome.result is not None and "no-such-task" in outcome.result["error"]
    worker = WorkerProcess(None, None)
    try:
        seen.append((os.getsid(worker.proc.pid), os.getpgid(worker.proc.pid), worker.proc.pid))
    finally:
        worker.close()
    assert len(seen) == 2
    assert all(sid == os.getsid(0) and pgid == pid != os.getpgid(0) for sid, pgid, pid in seen), seen


@pytest.mark.memory_gb(2.0)  # 1.78-1.95 GB measured, children included
def test_task_arguments_survive_json() -> None:
    """What a child receives is JSON: a LevelConfig travels as its fields and comes back as one."""
    import json

    from actbench.actnn import level_config
    from actbench.studies.gradients import VerifyConfig

    config = VerifyConfig("resnet18", level_config("L2"), batch_size=2, seeds=2, image_size=32)
    args = json.loads(json.dumps(dataclasses.asdict(config)))
    rows = InProcessExecutor().call(Task("verify-grads", args))["rows"]
    assert rows and all(r["rel_std"] >= 0 for r in rows)


def test_a_worker_releases_after_points_that_computed_not_after_predictions() -> None:
    """A meta point holds no device memory: releasing after it (a garbage collection) only slowed the
    next prediction of the worker's session; cpu and cuda points are released (and checked clean)."""
    from actbench.schema import ModelSpec, PointConfig
    from actbench.worker import _predicted

    def request(device: str) -> dict:
        return {"task": "measure", "point": PointConfig(ModelSpec("resnet18"), "fp32", 2, 32, device).to_dict()}

    assert _predicted(request("meta"))
    assert not _predicted(request("cpu")) and not _predicted(request("cuda"))
    assert not _predicted({"task": "call", "name": "verify_grads", "args": {}})
