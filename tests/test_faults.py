"""Faults a run directory must survive (results/README.md "Guarantees").

- failures to measure (``error``, ``timeout``) are measured again by a rerun, results (``ok``,
  ``oom``, ``over_budget``) are not; ``retry_failed=False`` keeps them; the latest row per key wins;
- a torn last line of ``rows.jsonl`` is set aside before the next append, so the next row is intact;
- unreadable lines (not JSON, not a row, wrong types, invalid UTF-8) are one warning naming file and
  line, never a traceback, in RunStore, resume, ``plot`` and ``report`` (``accuracy.jsonl`` too);
- concurrent writers to one run directory share it: one row per key, nobody crashes.

Most tests drive :class:`PointRunner` with a scripted executor (no torch, milliseconds); the
``ACTBENCH_TEST_FAULT`` hook is used on meta points (in process) and, for a real timeout, on one
tiny cpu point in a child.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest
from typer.testing import CliRunner

from actbench.core.devices import profile
from actbench.store.results import RunStore
from actbench.execution.runner import PointRunner
from actbench.planning.point import Point
from actbench.schema import Measurement, ModelSpec, PointConfig

REPO = Path(__file__).resolve().parent.parent
FAULT_ENV = "ACTBENCH_TEST_FAULT"


# --- helpers -------------------------------------------------------------------------------------
def point(batch: int, device: str = "meta", **kw: Any) -> Point:
    return Point.resolve(PointConfig(model=ModelSpec("resnet18"), strategy="fp32", batch_size=batch, image_size=16,
                                     device=device, warmup_steps=1, timed_steps=1, **kw))


class Scripted:
    """An executor that answers from a script: ``statuses[batch]`` (default ok); counts its calls."""

    def __init__(self, statuses: dict[int, str] | None = None, delay_s: float = 0.0) -> None:
        self.statuses = statuses or {}
        self.delay_s = delay_s
        self.calls: list[int] = []

    def measure(self, points: Iterable[Point]) -> Iterator[Measurement]:
        for p in points:
            self.calls.append(p.batch_size)
            time.sleep(self.delay_s)
            status = self.statuses.get(p.batch_size, "ok")
            yield Measurement(status=status, message="" if status == "ok" else f"scripted {status}",
                              activation_bytes=1000 * p.batch_size if status == "ok" else None)

    def environment(self, device) -> dict[str, Any]:
        return {"device": device.name, "scripted": True}


def runner(run_dir: Path, executor: Scripted, **kw: Any) -> PointRunner:
    return PointRunner(RunStore(run_dir), profile("meta"), executor=executor, **kw)


def lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


def table(run_dir: Path) -> list[dict]:
    with (run_dir / "table.csv").open() as fh:
        return list(csv.DictReader(fh))


def warnings_about(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and needle in r.getMessage()]


# --- 1. retry of failures to measure -------------------------------------------------------------
def test_error_rows_from_the_fault_hook_are_measured_again(tmp_path: Path, monkeypatch) -> None:
    """Meta points in process: ``error@batch=2`` fails once; the rerun measures batch 2 again only."""
    run_dir = tmp_path / "run"
    points = [point(2), point(3)]  # (batch 1 at 16 px is an error of its own: one value per BatchNorm channel)
    monkeypatch.setenv(FAULT_ENV, "error@batch=3")
    first = [PointRunner(RunStore(run_dir), profile("meta")).run(p) for p in points]
    assert [r.status for r in first] == ["ok", "error"]
    assert "injected error" in first[1].message

    monkeypatch.delenv(FAULT_ENV)
    events: list[tuple[str, int]] = []
    again = PointRunner(RunStore(run_dir), profile("meta"),
                        on_event=lambda kind, p, _: events.append((kind, p.batch_size)))
    second = [again.run(p) for p in points]
    assert [r.status for r in second] == ["ok", "ok"]
    assert ("cached", 2) in events and ("start", 3) in events and ("start", 2) not in events
    history = [(r["batch_size"], r["status"]) for r in lines(run_dir)]
    assert history == [(2, "ok"), (3, "error"), (3, "ok")]  # the history stays, appended
    assert [(r["batch_size"], r["status"]) for r in table(run_dir)] == [("2", "ok"), ("3", "ok")]
    assert [r.status for r in RunStore(run_dir).rows] == ["ok", "ok"]


@pytest.mark.parametrize("status", ["error", "timeout"])
def test_failures_to_measure_are_retried(tmp_path: Path, status: str) -> None:
    run_dir = tmp_path / "run"
    runner(run_dir, Scripted({2: status})).run(point(2))
    ex = Scripted()
    row = runner(run_dir, ex).run(point(2))
    assert ex.calls == [2] and row.status == "ok"
    assert [r["status"] for r in lines(run_dir)] == [status, "ok"]


@pytest.mark.parametrize("status", ["error", "timeout"])
def test_no_retry_keeps_failures(tmp_path: Path, status: str) -> None:
    run_dir = tmp_path / "run"
    runner(run_dir, Scripted({2: status})).run(point(2))
    ex = Scripted()
    row = runner(run_dir, ex, retry_failed=False).run(point(2))
    assert ex.calls == [] and row.status == status
    assert len(lines(run_dir)) == 1


@pytest.mark.parametrize("status", ["oom", "over_budget", "ok"])
def test_results_are_not_measured_again(tmp_path: Path, status: str) -> None:
    run_dir = tmp_path / "run"
    runner(run_dir, Scripted({4: status})).run(point(4))
    ex = Scripted()
    row = runner(run_dir, ex).run(point(4))
    assert ex.calls == [] and row.status == status
    assert len(lines(run_dir)) == 1


def test_a_failure_is_retried_once_per_run(tmp_path: Path) -> None:
    """A point that fails again is final for this run (a search that asks twice gets the row)."""
    run_dir = tmp_path / "run"
    runner(run_dir, Scripted({2: "error"})).run(point(2))
    ex = Scripted({2: "timeout"})
    again = runner(run_dir, ex)
    assert again.run(point(2)).status == "timeout"
    assert again.run(point(2)).status == "timeout"
    assert ex.calls == [2]
    assert [r["status"] for r in lines(run_dir)] == ["error", "timeout"]
    assert [r["status"] for r in table(run_dir)] == ["timeout"]


def test_latest_row_wins_in_analysis(tmp_path: Path) -> None:
    from actbench.reporting.runs import find_runs

    run_dir = tmp_path / "results" / "run"
    runner(run_dir, Scripted({2: "error"})).run(point(2))
    runner(run_dir, Scripted()).run(point(2))
    (run,) = find_runs(tmp_path / "results")
    assert [(r.batch_size, r.status) for r in run.rows] == [(2, "ok")]
    assert len(RunStore(run_dir).read_rows()) == 2  # the history


@pytest.mark.memory_gb(2.1)  # 2.01 GB measured, children included
@pytest.mark.slow
def test_timeout_from_a_real_child_is_retried(tmp_path: Path, monkeypatch) -> None:
    """a point killed by --timeout is measured again by a rerun with a longer one."""
    run_dir = tmp_path / "run"
    p = point(2, device="cpu")
    monkeypatch.setenv(FAULT_ENV, "hang")
    assert PointRunner(RunStore(run_dir), profile("cpu"), timeout_s=2).run(p).status == "timeout"
    monkeypatch.delenv(FAULT_ENV)
    assert PointRunner(RunStore(run_dir), profile("cpu"), timeout_s=600).run(p).status == "ok"
    assert [r["status"] for r in lines(run_dir)] == ["timeout", "ok"]


# --- 2. torn lines and unreadable lines ----------------------------------------------------------
def test_torn_last_line_is_set_aside_and_the_next_row_is_intact(tmp_path: Path, caplog) -> None:
    run_dir = tmp_path / "run"
    first = runner(run_dir, Scripted())
    for b in (1, 2, 3):
        first.run(point(b))
    rows_path = run_dir / "rows.jsonl"
    size = rows_path.stat().st_size
    os.truncate(rows_path, size - 200)  # disk full / killed during the write of batch 3's row
    torn_tail = rows_path.read_bytes().rsplit(b"\n", 1)[1]
    assert torn_tail

    ex = Scripted()
    again = runner(run_dir, ex)
    assert [again.run(point(b)).status for b in (1, 2, 3, 4)] == ["ok"] * 4
    assert ex.calls == [3, 4]  # the torn row is measured again, the intact ones are not
    got = lines(run_dir)  # every line parses: nothing glued onto the torn one
    assert [r["batch_size"] for r in got] == [1, 2, 3, 4]
    assert (run_dir / "rows.jsonl.torn").read_bytes() == torn_tail + b"\n"
    assert warnings_about(caplog, "rows.jsonl:3")
    assert [r["batch_size"] for r in table(run_dir)] == ["1", "2", "3", "4"]


def _refuse_writes(monkeypatch, path: Path) -> None:
    """Opening ``path`` for writing fails as it does on a read-only or immutable file (the tests run as
    root, whom permission bits do not stop)."""
    real = Path.open

    def guarded(self: Path, mode: str = "r", *args: Any, **kwargs: Any):
        if self == path and any(c in mode for c in "+wa"):
            raise PermissionError(1, "Operation not permitted", str(self))
        return real(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", guarded)


def test_a_finished_run_resumes_from_a_read_only_rows_file(tmp_path: Path, monkeypatch) -> None:
    run_dir = tmp_path / "run"
    runner(run_dir, Scripted()).run(point(1))
    before = (run_dir / "rows.jsonl").read_bytes()
    _refuse_writes(monkeypatch, run_dir / "rows.jsonl")
    ex = Scripted()
    assert runner(run_dir, ex).run(point(1)).status == "ok"
    assert ex.calls == [] and (run_dir / "rows.jsonl").read_bytes() == before


def test_a_torn_read_only_rows_file_or_an_unmakeable_lock_is_one_line(tmp_path: Path, monkeypatch) -> None:
    from actbench.store.reading import RunFileError
    run_dir = tmp_path / "run"
    runner(run_dir, Scripted()).run(point(1))
    rows_path = run_dir / "rows.jsonl"
    with rows_path.open("ab") as fh:
        fh.write(b'{"batch')
    before = rows_path.read_bytes()
    with monkeypatch.context() as patch:
        _refuse_writes(patch, rows_path)
        with pytest.raises(RunFileError, match=r"rows\.jsonl' cannot be repaired: Operation not permitted"):
            runner(run_dir, Scripted()).run(point(2))
    assert rows_path.read_bytes() == before
    (run_dir / ".lock").unlink()
    real_open = os.open

    def no_lock(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(".lock"):
            raise PermissionError(1, "Operation not permitted", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_lock)
    with pytest.raises(RunFileError, match=r"\.lock' cannot be opened: Operation not permitted") as caught:
        runner(run_dir, Scripted()).run(point(2))
    assert "\n" not in str(caught.value) and rows_path.read_bytes() == before


@pytest.mark.parametrize("name", ["rows.jsonl", ".lock", "rows.jsonl.torn"])
def test_a_run_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path: Path, name: str) -> None:
    from actbench.store.reading import RunFileError
    run_dir = tmp_path / "run"
    runner(run_dir, Scripted()).run(point(1))
    target = tmp_path / "someone_elses_file"
    target.write_bytes(b"not a row, and no newline at its end")
    (run_dir / name).unlink(missing_ok=True)
    (run_dir / name).symlink_to(target)
    with pytest.raises(RunFileError, match=f"{name}' is a symbolic link .*put a copy of the target in its place"):
        runner(run_dir, Scripted()).run(point(2))
    assert target.read_bytes() == b"not a row, and no newline at its end"


def test_last_row_without_its_newline_is_kept(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    runner(run_dir, Scripted()).run(point(1))
    rows_path = run_dir / "rows.jsonl"
    rows_path.write_bytes(rows_path.read_bytes().rstrip(b"\n"))
    ex = Scripted()
    again = runner(run_dir, ex)
    again.run(point(2))
    again.run(point(1))
    assert ex.calls == [2]
    assert [r["batch_size"] for r in lines(run_dir)] == [1, 2]
    assert not (run_dir / "rows.jsonl.torn").exists()


def test_glued_row_from_an_older_version_is_recovered(tmp_path: Path, caplog) -> None:
    """A file written before the repair existed: a torn row with the next one glued onto it."""
    run_dir = tmp_path / "run"
    r = runner(run_dir, Scripted())
    r.run(point(1))
    r.run(point(2))
    rows_path = run_dir / "rows.jsonl"
    one, two = rows_path.read_bytes().splitlines()
    rows_path.write_bytes(one[:-150] + two + b"\n")
    store = RunStore(run_dir)
    assert [row.batch_size for row in store.rows] == [2]
    assert warnings_about(caplog, "rows.jsonl:1: recovered") == [
        f"{rows_path}:1: recovered a row glued after a torn one; skipped the torn start ({len(one) - 150} bytes)"]


def test_a_line_that_is_not_json_is_named_without_its_content(tmp_path: Path, caplog) -> None:
    """rows.jsonl may be a link to any file (/etc/passwd): a warning names the line and the decoder's
    reason, never what the line holds."""
    run_dir = tmp_path / "run"
    runner(run_dir, Scripted()).run(point(1))
    rows_path = run_dir / "rows.jsonl"
    with rows_path.open("ab") as fh:
        fh.write(b"root:x:0:0:secret:/root:/bin/bash\n")
        fh.write(b'{"key": "secret", "status": \n')
        fh.write(b'{"key": "secret-start' + rows_path.read_bytes().splitlines()[0] + b"\n")
    passwd = tmp_path / "passwd"
    passwd.write_bytes(b"root:x:0:0:secret:/root:/bin/bash\n")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "rows.jsonl").symlink_to(passwd)
    assert [row.batch_size for row in RunStore(run_dir).rows] == [1]  # the recovered row is the same point
    assert [row.batch_size for row in RunStore(linked).rows] == []
    assert "secret" not in caplog.text
    assert warnings_about(caplog, "skipped:") == [
        f"{rows_path}:2: skipped: not valid JSON (Expecting value at column 1)",
        f"{rows_path}:3: skipped: not valid JSON (Expecting value at column 29)",
        f"{linked / 'rows.jsonl'}:1: skipped: not valid JSON (Expecting value at column 1)"]
    assert warnings_about(caplog, "recovered") == [
        f"{rows_path}:4: recovered a row glued after a torn one; skipped the torn start (21 bytes)"]


BAD_LINES = {
    "number": b"123",
    "array": b"[1,2]",
    "string": b'"row"',
    "null": b"null",
    "not-json": b'{"key": "abc", "status": ',
    "not-utf8": b'{"key": "\xff\xfe"}',
    "wrong-type": None,       # a real row with batch_size "many"
    "missing-field": None,    # a real row without status
    "unknown-status": None,   # a real row with status "great"
    "bool-for-int": None,     # a real row with batch_size true
}


def bad_line(kind: str, good: dict) -> bytes:
    if BAD_LINES[kind] is not None:
        return BAD_LINES[kind]
    row = dict(good, key="f" * 16)
    if kind == "wrong-type":
        row["batch_size"] = "many"
    elif kind == "missing-field":
        del row["status"]
    elif kind == "unknown-status":
        row["status"] = "great"
    elif kind == "bool-for-int":
        row["batch_size"] = True
    return json.dumps(row).encode()


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_unreadable_line_is_one_warning_in_runstore(tmp_path: Path, caplog, kind: str) -> None:
    run_dir = tmp_path / "run"
    r = runner(run_dir, Scripted())
    r.run(point(1))
    rows_path = run_dir / "rows.jsonl"
    with rows_path.open("ab") as fh:
        fh.write(bad_line(kind, lines(run_dir)[0]) + b"\n")
    caplog.clear()
    store = RunStore(run_dir)
    assert [row.batch_size for row in store.rows] == [1]
    found = warnings_about(caplog, f"{rows_path}:2: skipped")
    assert len(found) == 1, caplog.text
    # a writer appends after it and the table holds the good rows only
    ex = Scripted()
    PointRunner(store, profile("meta"), executor=ex).run(point(2))
    assert ex.calls == [2]
    assert [r["batch_size"] for r in table(run_dir)] == ["1", "2"]
    assert json.loads(rows_path.read_bytes().splitlines()[-1])["batch_size"] == 2


def test_accuracy_rows_with_unreadable_lines_warn(tmp_path: Path, caplog) -> None:
    from actbench.studies.accuracy import ROW_COLUMNS, AccuracyRow, AccuracyStore

    good = AccuracyRow(**{name: None for name in ROW_COLUMNS} | dict(
        key="a" * 16, run_id="acc", status="ok", message="", setting="fp32", chance_accuracy=0.1, steps=10,
        batch_size=8, image_size=16, num_classes=10, model="cifar_resnet8", seed=0, elapsed_s=1.0,
        test_accuracy=0.9, train_loss_final=0.3, test_loss=0.3, train_accuracy_final=0.9, finished_at=""))
    path = tmp_path / "acc" / "accuracy.jsonl"
    path.parent.mkdir()
    bad = [b"123", b"[1,2]", b'{"key": "\xff"}', json.dumps(asdict(good) | {"steps": "ten"}).encode(),
           json.dumps({"key": "x"}).encode(), json.dumps(asdict(good) | {"setting": "weird"}).encode(),
           json.dumps(asdict(good) | {"target_bits": 2.0}).encode()]  # a setting that is not its bits' name
    path.write_bytes(json.dumps(asdict(good)).encode() + b"\n" + b"\n".join(bad) + b"\n" + b'{"key": "torn')
    rows = AccuracyStore(path.parent).read_rows()
    assert [r.key for r in rows] == [good.key]
    for lineno in range(2, 10):
        assert warnings_about(caplog, f"{path}:{lineno}: skipped"), (lineno, caplog.text)


# --- plot, report and resume through the CLI -----------------------------------------------------
def invoke(args: list[str]):
    return CliRunner(env={FAULT_ENV: None}).invoke(app(), args, catch_exceptions=False)


def app():
    from actbench.cli import app as the_app

    return the_app


@pytest.fixture(scope="module")
def meta_run(tmp_path_factory) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("meta")
    args = ["memory", "resnet18", "--strategies", "fp32", "--batch", "2:3:1", "--image-size", "16", "--device", "meta",
            "--out", str(out)]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    return out, args


def test_bad_lines_warn_in_resume_plot_and_report(meta_run, tmp_path: Path, caplog) -> None:
    import shutil

    src, args = meta_run
    out = tmp_path / "out"
    shutil.copytree(src, out)
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    rows_path = run_dir / "rows.jsonl"
    good = lines(run_dir)[0]
    kinds = sorted(BAD_LINES)
    with rows_path.open("ab") as fh:
        for kind in kinds:
            fh.write(bad_line(kind, good) + b"\n")
    acc = out / "acc" / "accuracy.jsonl"  # an accuracy run with only bad lines beside it
    acc.parent.mkdir()
    acc.write_bytes(b"123\n[1,2]\n\xff\xfe\n")
    bad_numbers = range(3, 3 + len(kinds))
    args = [a if a != str(src) else str(out) for a in args]

    for command in (args, [*args, "--jobs", "2"], ["plot", str(out), "--out", str(tmp_path / "fig")],
                    ["report", str(out), "--out", str(tmp_path / "report.md"), "--no-figures"]):
        caplog.clear()
        result = invoke(command)
        assert result.exit_code == 0, (command[0], result.output)
        assert "Traceback" not in result.output
        for n in bad_numbers:  # once per command, however many handles of the run it opens
            assert len(warnings_about(caplog, f"{rows_path}:{n}: skipped")) == 1, (command, n, caplog.text)
        if command[0] != "memory":
            for n in (1, 2, 3):
                assert warnings_about(caplog, f"{acc}:{n}: skipped"), (command[0], n, caplog.text)
    assert "0 points predicted, 2 resumed" in " ".join(invoke(args).output.split())
    assert (tmp_path / "report.md").exists()


# --- 3. concurrent writers -----------------------------------------------------------------------
WRITER = """
import sys, time
from pathlib import Path
from actbench.core.devices import profile
from actbench.store.results import RunStore
from actbench.execution.runner import PointRunner
from actbench.planning.point import Point
from actbench.schema import Measurement, ModelSpec, PointConfig

class Slow:
    calls = 0
    def measure(self, points):
        for p in points:
            Slow.calls += 1
            time.sleep(0.01)
            yield Measurement(status="ok", activation_bytes=p.batch_size)
    def environment(self, device):
        return {"device": device.name}

run_dir, n = Path(sys.argv[1]), int(sys.argv[2])
r = PointRunner(RunStore(run_dir), profile("meta"), executor=Slow())
for b in range(1, n + 1):
    r.run(Point.resolve(PointConfig(ModelSpec("resnet18"), "fp32", b, 16, "meta")))
print(Slow.calls)
"""


def test_concurrent_writers_share_the_work(tmp_path: Path) -> None:
    """Six processes run the same 40 points: each point measured once, every writer returns all rows."""
    run_dir, n = tmp_path / "run", 40
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), str(n)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, [e for _, e in outs]
    assert sum(int(o.strip()) for o, _ in outs) == n  # no point measured twice
    got = lines(run_dir)
    assert sorted(r["batch_size"] for r in got) == list(range(1, n + 1))
    assert len({r["key"] for r in got}) == n
    assert sorted(int(r["batch_size"]) for r in table(run_dir)) == list(range(1, n + 1))
    assert not list(run_dir.glob("*.tmp")) and not list((run_dir / ".claims").iterdir())


def test_concurrent_retry_measures_a_failed_point_once(tmp_path: Path) -> None:
    """Two writers (threads, each its own store) find the same recorded error: one re-measures it."""
    run_dir = tmp_path / "run"
    runner(run_dir, Scripted({2: "error"})).run(point(2))
    executors = [Scripted(delay_s=0.3), Scripted(delay_s=0.3)]
    runners = [runner(run_dir, ex) for ex in executors]
    results: list[str] = []
    threads = [threading.Thread(target=lambda r=r: results.append(r.run(point(2)).status)) for r in runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == ["ok", "ok"]
    assert sum(len(ex.calls) for ex in executors) == 1
    assert [r["status"] for r in lines(run_dir)] == ["error", "ok"]


def test_a_claim_dies_with_its_writer(tmp_path: Path) -> None:
    """A writer killed while measuring leaves a claim file; the next writer measures the point."""
    run_dir = tmp_path / "run"
    holder = RunStore(run_dir)
    with holder.locked():
        fd = holder.try_claim(point(1).key())
    assert fd is not None
    ex = Scripted()
    waiter = threading.Thread(target=lambda: runner(run_dir, ex).run(point(1)))
    waiter.start()
    time.sleep(0.3)
    assert ex.calls == []  # it waits for the holder
    os.close(fd)  # what the kernel does when the holder dies: the flock goes, the file stays
    waiter.join(30)
    assert ex.calls == [1]
    assert len(lines(run_dir)) == 1


def test_a_writer_waits_for_the_run_lock(tmp_path: Path) -> None:
    """Checking, claiming and appending happen under run_dir/.lock: nothing moves while another holds it."""
    run_dir = tmp_path / "run"
    runner(run_dir, Scripted()).run(point(1))
    holder = RunStore(run_dir)
    ex = Scripted()
    writer = threading.Thread(target=lambda: runner(run_dir, ex).run(point(2)))
    with holder.locked():
        writer.start()
        time.sleep(0.3)
        assert ex.calls == [] and len(lines(run_dir)) == 1
    writer.join(30)
    assert ex.calls == [2] and len(lines(run_dir)) == 2


@pytest.mark.memory_gb(2.7)  # 2.58 GB measured, children included
@pytest.mark.slow
def test_three_concurrent_cli_runs_write_one_row_per_key(tmp_path: Path) -> None:
    """three copies of one meta sweep at once into one run directory."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "actbench", "memory", "resnet18", "--strategies", "fp32", "--batch", "2:6:1",
           "--image-size", "16",
           "--device", "meta", "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e[-2000:] for _, e in outs]
    assert all("Traceback" not in e for _, e in outs)
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    got = lines(run_dir)
    assert len(got) == 5 and len({r["key"] for r in got}) == 5
    assert {r["status"] for r in got} == {"ok"}
    assert len(table(run_dir)) == 5
    assert not list(run_dir.glob("*.tmp"))


# --- 4. a build dies with its command ---------------------------------------------------------------
def _compilers_under(folder: Path) -> list[int]:
    """Pids of live non-Python processes working in ``folder`` (ninja, c++, cc1plus of a build there)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if cwd.startswith(str(folder)) and state != "Z" and "python" not in cmdline.split(" ")[0]:
            pids.append(int(proc.name))
    return pids


@pytest.mark.memory_gb(2.1)  # 2.01 GB measured, children included
@pytest.mark.parametrize("args", [["build"], ["memory", "resnet18", "--levels", "L3", "--no-baseline", "--device",
                                               "cpu", "--batch", "2", "--image-size", "16"]])
def test_sigterm_during_the_first_build_kills_the_compilers(tmp_path: Path, args: list[str]) -> None:
    import signal

    cache = tmp_path / "cache"
    env = {**os.environ, "ACTBENCH_CACHE_DIR": str(cache), "ACTBENCH_WITH_CUDA": "0"}
    out = [] if args == ["build"] else ["--out", str(tmp_path / "out")]
    proc = subprocess.Popen([sys.executable, "-m", "actbench", *args, *out], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not _compilers_under(cache) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert _compilers_under(cache), "no compiler started"
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 5
        while _compilers_under(cache) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _compilers_under(cache)
        assert not left, [(Path(f"/proc/{pid}/cmdline").read_bytes()[:80]) for pid in left]
        assert proc.returncode != 0
    finally:
        for pid in _compilers_under(cache):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- a resume times its points as the run did -----------------------------------------------------
class Captured(Scripted):
    """A scripted executor that records this process's real environment (its timing included)."""

    def environment(self, device) -> dict[str, Any]:
        from actbench.measure.environment import capture_environment

        return capture_environment(device)


@pytest.mark.parametrize("recorded, now", [(True, ""), (False, "1")])
def test_resume_refuses_to_mix_exact_step_timings(tmp_path: Path, monkeypatch, recorded: bool, now: str) -> None:
    from actbench.core.devices import EXACT_STEPS_ENV

    run_dir = tmp_path / "run"
    monkeypatch.setenv(EXACT_STEPS_ENV, "1" if recorded else "")
    first = PointRunner(RunStore(run_dir), profile("cpu"), executor=Captured())
    first.run(point(2, device="cpu"))
    env = json.loads((run_dir / "env.json").read_text())
    assert ("timing" in env) is recorded
    rows_before = (run_dir / "rows.jsonl").read_text()
    monkeypatch.setenv(EXACT_STEPS_ENV, now)
    executor = Captured()
    with pytest.raises(ValueError) as info:
        PointRunner(RunStore(run_dir), profile("cpu"), executor=executor).run(point(4, device="cpu"))
    message = str(info.value)
    assert "\n" not in message and EXACT_STEPS_ENV in message and "=1" in message and "unset" in message
    assert executor.calls == [] and (run_dir / "rows.jsonl").read_text() == rows_before


# --- 4. hostile content, run files of the wrong kind, full disks -----------------------------------
HUGE_LINES = {
    "huge-integer": None,                                  # a real row with a 5000-digit batch_size
    "deep-nesting": None,                                  # a real row with 100 levels of arrays beside it
    "long-line": None,                                     # a real row padded past the line limit
}


def hostile_line(kind: str, good: dict) -> bytes:
    row = dict(good, key="e" * 16)
    if kind == "huge-integer":
        return json.dumps(dict(row, batch_size="HUGE")).replace('"HUGE"', "1" * 5000).encode()
    if kind == "deep-nesting":
        row["extra"] = json.loads("[" * 100 + "]" * 100)
    else:
        row["message"] = "x" * (2 << 20)
    return json.dumps(row).encode()


@pytest.mark.parametrize("kind", sorted(HUGE_LINES))
def test_a_line_past_the_limits_is_skipped_in_reading_repair_and_resume(tmp_path: Path, caplog, kind: str) -> None:
    run_dir = tmp_path / "run"
    runner(run_dir, Scripted()).run(point(1))
    rows_path = run_dir / "rows.jsonl"
    hostile = hostile_line(kind, lines(run_dir)[0])
    with rows_path.open("ab") as fh:
        fh.write(hostile + b"\n")
    caplog.clear()
    store = RunStore(run_dir)
    assert [row.batch_size for row in store.rows] == [1]
    assert len(warnings_about(caplog, f"{rows_path}:2: skipped")) == 1, caplog.text
    # the same line as a torn tail (no newline): the repair sets it aside instead of crashing
    rows_path.write_bytes(rows_path.read_bytes().rstrip(b"\n"))
    ex = Scripted()
    PointRunner(RunStore(run_dir), profile("meta"), executor=ex).run(point(2))
    assert ex.calls == [2]
    assert [json.loads(line)["batch_size"] for line in rows_path.read_bytes().splitlines()] == [1, 2]
    assert (run_dir / "rows.jsonl.torn").read_bytes() == hostile + b"\n"


def test_a_huge_integer_does_not_stop_report_or_plot(meta_run, tmp_path: Path, caplog) -> None:
    import shutil

    src, args = meta_run
    out = tmp_path / "out"
    shutil.copytree(src, out)
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    rows_path = run_dir / "rows.jsonl"
    lineno = len(lines(run_dir)) + 1
    with rows_path.open("ab") as fh:
        fh.write(hostile_line("huge-integer", lines(run_dir)[0]) + b"\n")
    for command in (["report", str(out), "--out", str(tmp_path / "r.md"), "--no-figures"],
                    ["plot", str(out), "--out", str(tmp_path / "figs")]):
        caplog.clear()
        result = invoke(command)
        assert result.exit_code == 0, result.output
        assert warnings_about(caplog, f"{rows_path}:{lineno}: skipped"), caplog.text


def _make_wrong_kind(run_dir: Path, kind: str) -> Path:
    """Turn one run file of ``run_dir`` into the wrong kind of file; the path it concerns."""
    name, what = kind.split(":")
    path = run_dir / name
    if path.is_dir():
        shutil_rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if what == "dir":
        path.mkdir()
        (path / "x").write_text("")
    elif what == "file":
        path.write_text("")
    elif what == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return path


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


WRONG_KINDS = ["rows.jsonl:dir", "rows.jsonl:fifo", "rows.jsonl:device", ".lock:dir", ".lock:fifo",
               "env.json:dir", "env.json:fifo", ".claims:file", "config.json:dir", "rows.jsonl.torn:dir",
               "rows.jsonl.torn:fifo"]


@pytest.mark.parametrize("kind", WRONG_KINDS)
def test_run_files_of_the_wrong_kind_are_one_line_errors(meta_run, tmp_path: Path, kind: str) -> None:
    """Resume (the same command again) and report: exit 2, one line naming the path, never a hang."""
    import shutil

    src, args = meta_run
    out = tmp_path / "out"
    shutil.copytree(src, out)
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    path = _make_wrong_kind(run_dir, kind)
    if kind.startswith("rows.jsonl.torn"):  # a torn tail, so the resume's repair would write to it
        with (run_dir / "rows.jsonl").open("ab") as fh:
            fh.write(b'{"torn')
    resume = [a if a != str(src) else str(out) for a in args]
    for command in (resume, ["report", str(out), "--out", str(tmp_path / "r.md"), "--no-figures"]):
        done = subprocess.run([sys.executable, "-m", "actbench", *command], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env={**os.environ, FAULT_ENV: ""})
        # the torn tail made above is warned of as it is read; the error is the one other line
        err = [line for line in done.stderr.strip().splitlines() if "skipped: incomplete last line" not in line]
        if command[0] == "report" and kind.split(":")[0] in (".lock", ".claims", "rows.jsonl.torn"):
            assert done.returncode == 0, done.stderr  # files of writers: a report reads none
            continue
        if command[0] == "report" and kind.split(":")[0] in ("env.json", "config.json"):
            # the report goes on without that file, saying so
            assert done.returncode == 0, done.stderr
            assert any(str(path) in line for line in err), done.stderr
            continue
        assert done.returncode == 2, (command[0], done.stderr)
        assert len(err) == 1 and str(path) in err[0] and "expected" in err[0], (command[0], done.stderr)


def test_an_unreadable_env_json_is_named_and_the_rest_reported(meta_run, tmp_path: Path, caplog) -> None:
    import shutil

    src, _ = meta_run
    for content in (b"\xff\xfe not utf-8", b'{"torch": ' + b"9" * 5000 + b"}", b"[1, 2"):
        out = tmp_path / f"out{len(content)}"
        shutil.copytree(src, out)
        (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
        (run_dir / "env.json").write_bytes(content)
        caplog.clear()
        result = invoke(["report", str(out), "--out", str(out / "r.md"), "--no-figures"])
        assert result.exit_code == 0, result.output
        assert warnings_about(caplog, str(run_dir / "env.json")), caplog.text
        assert "Maximum batch" in (out / "r.md").read_text()


def _full_disk_write_text():
    """A Path.write_text on a full disk: the file is created (truncated), writing any byte fails."""
    import errno

    real = Path.write_text

    def write_text(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        if data:
            self.open("w").close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data, *args, **kwargs)

    return write_text


def test_a_full_disk_keeps_the_previous_report(meta_run, tmp_path: Path, monkeypatch) -> None:
    src, _ = meta_run
    report = tmp_path / "report.md"
    report.write_text("the previous report\n")
    monkeypatch.setattr(Path, "write_text", _full_disk_write_text())
    result = CliRunner().invoke(app(), ["report", str(src), "--out", str(report), "--no-figures"])
    monkeypatch.undo()
    assert result.exit_code == 2, result.output
    assert str(report) in result.output and "No space left" in result.output
    assert report.read_text() == "the previous report\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_a_full_disk_while_drawing_is_one_line_and_keeps_the_previous_figure(meta_run, tmp_path: Path,
                                                                              monkeypatch) -> None:
    import errno

    from matplotlib.figure import Figure

    src, _ = meta_run
    figs = tmp_path / "figs"
    assert invoke(["plot", str(src), "--out", str(figs)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in figs.iterdir()}

    def full(self, fname, *args, **kwargs):
        Path(fname).write_bytes(b"")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    result = CliRunner().invoke(app(), ["plot", str(src), "--out", str(figs)])
    assert result.exit_code == 2, result.output
    assert "No space left" in result.output and str(figs) in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert {p.name: p.read_bytes() for p in figs.iterdir()} == before


def test_a_full_disk_while_writing_the_table_is_one_line_and_keeps_it(tmp_path: Path, monkeypatch) -> None:
    import errno

    run_dir = tmp_path / "run"
    runner(run_dir, Scripted()).run(point(1))
    before = (run_dir / "table.csv").read_bytes()

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv.DictWriter, "writeheader", full)
    with pytest.raises(ValueError, match="table.csv.*No space left"):
        RunStore(run_dir).write_table()
    assert (run_dir / "table.csv").read_bytes() == before
    assert [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")] == []


def test_a_paper_csv_that_is_a_fifo_is_refused_not_read(meta_run, tmp_path: Path) -> None:
    src, _ = meta_run
    fifo = tmp_path / "paper.csv"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "actbench", "plot", str(src), "--out", str(tmp_path / "figs"),
                           "--paper", "--paper-csv", str(fifo)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"actbench: error: '{fifo}' is a FIFO; expected a regular file"]


@pytest.mark.parametrize("command", ["plot", "report"])
def test_a_figures_folder_that_is_a_link_is_refused_not_followed(meta_run, tmp_path: Path, command: str) -> None:
    from actbench.cli import app

    import shutil

    src = shutil.copytree(meta_run[0], tmp_path / "runs")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (src / "figures").symlink_to(elsewhere)
    result = CliRunner().invoke(app, [command, str(src)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"actbench: error: '{src / 'figures'}' is a symbolic link (to '{elsewhere}'): figures are drawn into a real "
        "folder beside the runs; name another folder to draw them elsewhere (plot --out, report --figures)"]
    assert list(elsewhere.iterdir()) == [] and not (src / "report.md").exists()


def test_a_full_disk_while_a_command_writes_its_table_is_one_line_and_keeps_the_rows(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    import errno

    from actbench.cli import app

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv.DictWriter, "writeheader", full)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["memory", "resnet18", "--strategies", "fp32", "--batch", "2", "--image-size",
                                      "32", "--device", "meta", "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert "table.csv" in lines[-1] and "No space left" in lines[-1] and "Traceback" not in result.stderr
    (rows,) = out.glob("*/rows.jsonl")
    assert len(rows.read_text().splitlines()) == 1


# --- CSVs outside run directories: atomic, never over another run's file ---------------------------
def _full_disk_csv(monkeypatch) -> None:
    """csv writers (DictWriter writes through csv.writer) on a full disk: the header goes through, the
    first row fails, as on a disk that fills up."""
    import csv as csv_module
    import errno

    real_writer = csv_module.writer

    class Writer:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._inner, self._rows = real_writer(*args, **kwargs), 0

        def writerow(self, row: Any) -> Any:
            self._rows += 1
            if self._rows > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self._inner.writerow(row)

        def writerows(self, rows: Any) -> None:
            for row in rows:
                self.writerow(row)

    monkeypatch.setattr(csv_module, "writer", Writer)


@pytest.mark.parametrize("writer", ["trust", "speed"])
def test_a_full_disk_keeps_the_previous_trust_csv(tmp_path: Path, monkeypatch, writer: str) -> None:
    from actbench.store.outputs import OutputError
    from actbench.studies import trust

    row: Any
    if writer == "trust":
        row = trust.Comparison(**{name: None for name in trust.Comparison.__dataclass_fields__})
        write = trust.write_csv
    else:
        row = trust.SpeedComparison(**{name: None for name in trust.SpeedComparison.__dataclass_fields__})
        write = trust.write_speed_csv
    path = tmp_path / "meta_vs_cpu.csv"
    path.write_text("the previous points\n")
    _full_disk_csv(monkeypatch)
    with pytest.raises(OutputError, match="No space left") as info:
        write([row], path)
    assert str(path) in str(info.value)
    assert path.read_text() == "the previous points\n"
    assert [p.name for p in tmp_path.iterdir()] == ["meta_vs_cpu.csv"]


def test_verify_grads_csvs_of_one_second_get_names_of_their_own(tmp_path: Path) -> None:
    from actbench.studies.gradients import GradRow, write_csv

    row = GradRow(**{name: 1 for name in GradRow.__dataclass_fields__})
    first = write_csv([row], tmp_path / "resnet18-L3-b4-k8-20260102-030405.csv")
    second = write_csv([row], tmp_path / "resnet18-L3-b4-k8-20260102-030405.csv")
    assert first != second and second.name == "resnet18-L3-b4-k8-20260102-030405-2.csv"
    assert first.read_text() == second.read_text() and first.read_text().count("\n") == 2


@pytest.mark.parametrize("command", ["bench-harness", "bench-kernels", "bench-actnn"])
def test_a_full_disk_while_a_benchmark_writes_its_csv_is_one_line(tmp_path: Path, monkeypatch,
                                                                   command: str) -> None:
    """The benchmark's CSV is whole or absent (no header-only or cut file), and the error one line."""
    from actbench.kernels import bench as kernel_bench
    from actbench.studies import actnn_cost, harness_cost

    monkeypatch.setattr("actbench.measure.environment.capture_environment", lambda device: {"device": device.name})

    def fake(cls: type) -> Any:
        return cls(**{name: 1 for name in cls.__dataclass_fields__})

    monkeypatch.setattr(harness_cost, "run_benchmarks", lambda *a, **k: [fake(harness_cost.HarnessBenchRow)] * 2)
    monkeypatch.setattr(actnn_cost, "run", lambda *a, **k: [fake(actnn_cost.ActnnBenchRow)] * 2)

    def kernels(config: Any, on_row: Any = None) -> list:
        rows = [fake(kernel_bench.KernelRow)] * 2
        for row in rows:
            on_row(row)
        return rows

    monkeypatch.setattr(kernel_bench, "run", kernels)
    args = {"bench-harness": ["--quick"], "bench-kernels": ["--sizes-mib", "1"], "bench-actnn": ["--quick"]}[command]
    _full_disk_csv(monkeypatch)
    result = CliRunner().invoke(app(), [command, *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "No space left" in lines[-1] and ".csv'" in lines[-1], result.stderr
    (run_dir,) = (tmp_path / "out").iterdir()
    assert sorted(p.name for p in run_dir.iterdir()) == ["env.json"]


def test_a_full_disk_when_a_point_is_claimed_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """The claim of a point (a file in .claims/) cannot be made on a full disk: one line naming it, exit 2."""
    import errno

    from actbench.cli import app
    from actbench.store import results

    real_open = os.open

    def full(path, flags, *args):
        if ".claims" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *args)

    monkeypatch.setattr(results.os, "open", full)
    result = CliRunner().invoke(app, ["memory", "resnet18", "--strategies", "fp32", "--batch", "2", "--image-size",
                                      "32", "--device", "meta", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert ".claims" in lines[-1] and "No space left" in lines[-1] and "Traceback" not in result.stderr
