"""The failure path as a user meets it: ``haze queue:work`` processes on a SQLite
``database`` connection, a message id that fails twice, and an error that cannot be
described. Real processes and a real SQLite file."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_procs import db_root

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes")

FAILING_JOB = """\
from haze import define_job

@define_job(name="fp_always_fails", tries=1)
def always_fails(payload: dict) -> None:
    raise ValueError(f"order {payload['order']} declined")
"""


def _env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("HAZE_APP_ROOT", None)
    e["PYTHONUNBUFFERED"] = "1"
    return e


def _work(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haze.cli", "--root", str(root), "queue:work", "--stop-when-empty"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )


def _app(root: Path, job: str) -> Path:
    db_root(root)
    # a short retry_after: a row left reserved is reclaimed by the second worker
    queue_config = root / "config" / "queue.py"
    queue_config.write_text(
        queue_config.read_text().replace("'sleep'", "'retry_after': '3s', 'sleep'")
    )
    module = root / "app" / "job" / "fp.py"
    module.parent.mkdir(parents=True)
    module.write_text(job)
    return root


def _dispatch_twice(db: Path, job: str, payload: object) -> None:
    """One envelope, and an operator's copy of its row (the same message id)."""
    body = json.dumps(
        {
            "v": 1,
            "id": "fp-repeated-1",
            "job": job,
            "payload": payload,
            "queue": "default",
            "ts": time.time(),
        }
    )
    with sqlite3.connect(db) as c:
        for _ in range(2):
            c.execute(
                "INSERT INTO jobs (queue, payload, attempts, available_at, created_at) "
                "VALUES ('default', ?, 0, ?, ?)",
                (body, time.time(), time.time()),
            )


def _rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as c:
        return list(c.execute(sql))


def test_a_message_id_that_fails_twice_leaves_no_row_behind(tmp_path: Path) -> None:
    root = _app(tmp_path, FAILING_JOB)
    db = root / "q.db"
    _dispatch_twice(db, "fp_always_fails", {"order": 7})
    first = _work(root)
    assert first.returncode == 0, first.stderr
    time.sleep(3.5)  # past retry_after: a row left reserved would be claimed again
    second = _work(root)
    assert second.returncode == 0, second.stderr
    assert _rows(db, "SELECT id FROM jobs") == []
    failed = _rows(db, "SELECT uuid, exception FROM failed_jobs")
    assert [uuid for uuid, _ in failed] == ["fp-repeated-1"]
    assert "ValueError: order 7 declined" in str(failed[0][1])
    for run in (first, second):
        assert "unexpected error" not in run.stdout + run.stderr
        assert "IntegrityError" not in run.stdout + run.stderr


DEEP_ERROR_JOB = """\
from haze import define_job

class Deep(Exception):
    pass

@define_job(name="fp_deep_error", tries=1)
def deep_error(payload: dict) -> None:
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    raise Deep("x" * 200_000, nested)
"""


def test_an_error_that_cannot_be_described_is_still_recorded(tmp_path: Path) -> None:
    root = _app(tmp_path, DEEP_ERROR_JOB)
    db = root / "q.db"
    _dispatch_twice(db, "fp_deep_error", {})
    run = _work(root)
    assert run.returncode == 0, run.stderr
    assert _rows(db, "SELECT id FROM jobs") == []
    [(exception,)] = _rows(db, "SELECT exception FROM failed_jobs")
    text = str(exception)
    assert "Deep" in text
    assert "MaxAttemptsExceededError" not in text
    assert len(text.encode()) <= 64 * 1024
    assert "unexpected error" not in run.stdout + run.stderr


def _haze(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haze.cli", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )


def test_a_deeply_nested_failed_record_breaks_no_failed_job_command(tmp_path: Path) -> None:
    root = _app(tmp_path, FAILING_JOB)
    db = root / "q.db"
    deep = "[" * 100_000 + "]" * 100_000
    with sqlite3.connect(db) as c:
        for uuid, body in (("deep-1", deep), ("plain-1", '{"v":1,"id":"plain-1","job":"gone"}')):
            c.execute(
                "INSERT INTO failed_jobs (uuid, connection, queue, payload, exception, failed_at)"
                " VALUES (?, 'db', 'default', ?, 'RecursionError: too deep', ?)",
                (uuid, body, time.time()),
            )
    listed = _haze(root, "queue:failed")
    assert listed.returncode == 0, listed.stderr
    assert "deep-1" in listed.stdout and "plain-1" in listed.stdout
    shown = _haze(root, "queue:failed", "deep-1")
    assert shown.returncode == 0, shown.stderr
    assert "RecursionError: too deep" in shown.stdout
    retried = _haze(root, "queue:retry", "all")
    assert "Traceback" not in retried.stderr
    assert _rows(db, "SELECT id FROM jobs") == []  # neither is run as a job
    forgot = _haze(root, "queue:forget", "deep-1")
    assert forgot.returncode == 0, forgot.stderr
    assert [r[0] for r in _rows(db, "SELECT uuid FROM failed_jobs")] == ["plain-1"]
    for run in (listed, shown, retried, forgot):
        assert "Traceback" not in run.stderr and "RecursionError:" not in run.stderr


def test_three_concurrent_retry_all_processes_queue_each_job_once(tmp_path: Path) -> None:
    root = _app(tmp_path, FAILING_JOB)
    db = root / "q.db"
    with sqlite3.connect(db) as c:
        for n in range(300):
            body = json.dumps(
                {
                    "v": 1,
                    "id": f"fp-{n}",
                    "job": "fp_always_fails",
                    "payload": {"order": n},
                    "queue": "default",
                    "ts": time.time(),
                }
            )
            c.execute(
                "INSERT INTO failed_jobs (uuid, connection, queue, payload, exception, failed_at)"
                " VALUES (?, 'db', 'default', ?, 'ValueError', ?)",
                (f"fp-{n}", body, time.time()),
            )
    command = [sys.executable, "-m", "haze.cli", "--root", str(root), "queue:retry", "all"]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
        for _ in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    queued = [json.loads(str(body))["id"] for (body,) in _rows(db, "SELECT payload FROM jobs")]
    assert sorted(queued) == sorted(f"fp-{n}" for n in range(300))
    assert _rows(db, "SELECT uuid FROM failed_jobs") == []


def test_a_failed_store_that_refuses_every_record_keeps_the_job_queued(tmp_path: Path) -> None:
    """A failed_jobs table that refuses every insert (a trigger, as a constraint or a
    full disk would): the failure goes to the log, whole, and the row goes back to the
    queue for a minute (not dropped with the log line as its only record, nor failing
    the same way after every retry_after)."""
    root = _app(tmp_path, FAILING_JOB)
    db = root / "q.db"
    with sqlite3.connect(db) as c:
        c.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON failed_jobs "
            "BEGIN SELECT RAISE(ABORT, 'failed_jobs is read-only here'); END"
        )
    _dispatch_twice(db, "fp_always_fails", {"order": 9})
    run = _work(root)
    assert run.returncode == 0, run.stderr
    rows = _rows(db, "SELECT reserved_at, available_at FROM jobs")
    assert len(rows) == 2  # the row and its copy, each waiting to run again
    assert all(reserved is None and due > time.time() for reserved, due in rows)
    out = run.stdout + run.stderr
    assert "could not be recorded" in out
    assert "goes back to its queue" in out
    assert "failed_jobs is read-only here" in out
    assert "ValueError: order 9 declined" in out
    assert "unexpected error" not in out
