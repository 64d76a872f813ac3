"""Cancelling a job that runs in another process.

A real ``haze queue:work`` process (SQLite file, or Redis) runs a long job; this process
reads its status and progress, cancels it, and sees it end ``cancelled`` within about one
cancel poll (1 s): no retry, no ``failed()`` call, no failed-job record. The same for a
job without a status record (its worker polls the marker all the same). The jobs write
what they did to a file (``app/job/jstat_jobs.py``).
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from haze import App, Queue
from worker_procs import WorkerProcs

pytestmark = [pytest.mark.timeout(180)]


def _events(runs: Path) -> list[list[str]]:
    if not runs.exists():
        return []
    return [line.split() for line in runs.read_text().splitlines() if line.strip()]


async def _until(cond: Any, limit: float, what: str, procs: WorkerProcs) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached:\n" + "\n".join(map(procs.log, procs.procs)))
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("worker_app", ["sqlite", "redis"], indirect=True)
async def test_cancel_reaches_a_job_running_in_another_process(
    worker_app: tuple[App, WorkerProcs, dict[str, str]],
) -> None:
    _app, procs, env = worker_app
    conn = env["JSTAT_CONNECTION"]
    p = procs.spawn(conn, "default", ["--concurrency", "2", "--sleep", "0.1"], env)
    await procs.wait_ready(p)
    runs = procs.runs_file

    # A tracked job: status and progress are visible here while it runs there.
    job_id = await Queue.dispatch("jstat_long", {})
    await _until(lambda: any(e[:2] == ["start", job_id] for e in _events(runs)), 30, "start", procs)
    st = await Queue.status(job_id)
    assert st is not None and st.state == "running" and st.attempt == 1
    deadline = time.monotonic() + 10
    while (st is None or not st.progress) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        st = await Queue.status(job_id)
    assert st is not None and isinstance(st.progress, int) and st.progress > 0
    began = time.monotonic()
    assert await Queue.cancel(job_id) is True
    final = await Queue.wait(job_id, timeout=15)
    took = time.monotonic() - began
    assert final.state == "cancelled" and final.error == "cancelled while running", final
    # one cancel poll (1 s), one status write and a read; slack for a loaded machine
    assert took < 6, f"cancel took {took:.1f}s"
    assert await Queue.cancel(job_id) is False  # over

    # An untracked job: no record, but the worker polls its marker all the same.
    plain = await Queue.dispatch("jstat_plain_long", {})
    await _until(lambda: any(e[:2] == ["start", plain] for e in _events(runs)), 30, "start", procs)
    assert await Queue.status(plain) is None
    began = time.monotonic()
    assert await Queue.cancel(plain) is True
    await _until(lambda: any(e[:2] == ["stop", plain] for e in _events(runs)), 15, "stop", procs)
    assert time.monotonic() - began < 6

    # Neither ran again, failed, or left a failed-job record; the worker went on.
    await asyncio.sleep(1.5)
    events = _events(runs)
    assert [e[0] for e in events if e[1] == job_id] == ["start", "stop"], events
    assert [e[0] for e in events if e[1] == plain] == ["start", "stop"], events
    assert await Queue.failed() == []
    assert p.poll() is None
    p.send_signal(signal.SIGTERM)
    assert await procs.wait_exit(p, 30) == 0
    assert "Traceback" not in procs.err(p), procs.log(p)


@pytest.mark.parametrize("worker_app", ["sqlite"], indirect=True)
async def test_queued_job_cancelled_before_a_worker_starts_never_runs(
    worker_app: tuple[App, WorkerProcs, dict[str, str]],
) -> None:
    _app, procs, env = worker_app
    tracked = await Queue.dispatch("jstat_long", {})
    plain = await Queue.dispatch("jstat_plain_long", {})
    assert (await Queue.status(tracked)).state == "queued"  # type: ignore[union-attr]
    assert await Queue.cancel(tracked) is True
    assert await Queue.cancel(plain) is True
    assert (await Queue.status(tracked)).state == "cancelled"  # type: ignore[union-attr]
    sync_id = await Queue.dispatch("jstat_sync_progress", {})
    p = procs.spawn(env["JSTAT_CONNECTION"], "default", ["--stop-when-empty"], env)
    assert await procs.wait_exit(p, 60) == 0, procs.log(p)
    assert _events(procs.runs_file) == []
    assert (await Queue.status(tracked)).state == "cancelled"  # type: ignore[union-attr]
    # a plain def job reports progress from its thread; the result is kept
    st = await Queue.wait(sync_id, timeout=5)
    assert st.state == "done" and st.result == 3 and st.progress == 75
