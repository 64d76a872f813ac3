"""An exception raised by job code is that job's failure, whatever its class.

``KeyboardInterrupt``, ``SystemExit`` and other ``BaseException`` subclasses raised by a
job (async, or a plain ``def`` running in a thread) are recorded in failed jobs with
their real type; the worker keeps working and the other running jobs finish. The
worker's own SIGINT/SIGTERM handling is unchanged: it drains and exits 0.

A real ``haze queue:work`` process on SQLite, and an in-process memory worker.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest
from haze import App, Queue, define_queue_config
from rb_harness import jobs, rig

pytestmark = [pytest.mark.timeout(120)]

RAISED = [
    (jobs.rb_raise, "KeyboardInterrupt", "KeyboardInterrupt: raised by rb_raise"),
    (jobs.rb_raise, "SystemExit", "SystemExit: 3"),
    (jobs.rb_raise, "RbCustomBaseError", "RbCustomBaseError: raised by rb_raise"),
    (jobs.rb_raise_sync, "KeyboardInterrupt", "KeyboardInterrupt: raised by rb_raise"),
    (jobs.rb_raise_sync, "SystemExit", "SystemExit: 3"),
    (jobs.rb_raise_timed, "KeyboardInterrupt", "KeyboardInterrupt: raised by rb_raise"),
    (jobs.rb_raise_timed, "SystemExit", "SystemExit: 3"),
    # a CancelledError the job raises itself (no one cancelled the worker)
    (jobs.rb_raise, "CancelledError", "CancelledError: raised by rb_raise"),
    (jobs.rb_raise_timed, "CancelledError", "CancelledError: raised by rb_raise"),
]


async def _dispatch_all(connection: str) -> None:
    await jobs.rb_record.dispatch({"k": "slow", "sleep": 1.5}, connection=connection)
    for i, (job, kind, _) in enumerate(RAISED):
        await job.dispatch({"k": f"raise{i}", "kind": kind, "after": 0.2}, connection=connection)
    await jobs.rb_record.dispatch({"k": "after"}, connection=connection)


def _check_failed(failed: list[Any]) -> None:
    assert len(failed) == len(RAISED), [f.exception for f in failed]
    by_key = {f.payload["k"]: f for f in failed}
    for i, (job, _, line) in enumerate(RAISED):
        f = by_key[f"raise{i}"]
        assert f.name == job.name
        assert f.exception.strip().splitlines()[-1].endswith(line), f.exception
        assert "crash or retry_after" not in f.exception


async def test_a_worker_process_fails_the_job_and_keeps_working(tmp_path: Path) -> None:
    async with rig("sqlite", tmp_path) as r:
        await _dispatch_all("db")
        code, log = await r.run_until_empty("--concurrency", "4", within=60)
        assert code == 0, log
        assert r.counts("end") == {"slow": 1, "after": 1}, log
        assert sum(r.counts("start").values()) == len(RAISED) + 2, "each raising job ran once"
        assert await r.leftover() == [], log
        _check_failed(await r.failed())
        for job, kind, _ in RAISED:  # logged with the job's name and the real type
            lines = [ln for ln in log.splitlines() if job.name in ln and kind in ln]
            assert any("failed" in ln.lower() for ln in lines), log
        assert "unexpected error" not in log, log

        # The worker's own signals are unchanged: SIGINT and SIGTERM drain and exit 0.
        for sig in (signal.SIGINT, signal.SIGTERM):
            key = f"drain{int(sig)}"
            await jobs.rb_record.dispatch({"k": key, "sleep": 1.0}, connection="db")
            p = r.worker()
            await r.wait_ready(p)
            while not r.counts("start")[key]:
                await asyncio.sleep(0.05)
            p.send_signal(sig)
            assert await r.wait_exit(p, 30) == 0, r.log(p)
            assert r.counts("end")[key] == 1, r.log(p)


async def test_an_in_process_memory_worker_fails_the_job_and_keeps_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs.txt"
    monkeypatch.setenv("RB_RUNS_FILE", str(runs))

    def ended() -> list[str]:
        return sorted(ln.split()[1] for ln in runs.read_text().splitlines() if ln[:3] == "end")

    app = App(
        queue=define_queue_config(
            default="mem", connections={"mem": {"driver": "memory", "concurrency": 4}}
        )
    )
    async with app:
        await _dispatch_all("mem")
        await asyncio.wait_for(Queue.idle(), 30)
        assert ended() == ["after", "slow"]
        _check_failed(await Queue.failed())
        # the worker is still there: a job dispatched now runs
        await jobs.rb_record.dispatch({"k": "later"}, connection="mem")
        await asyncio.wait_for(Queue.idle(), 10)
        assert ended() == ["after", "later", "slow"]
