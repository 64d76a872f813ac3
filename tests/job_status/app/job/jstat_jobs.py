"""Jobs for tests/job_status/test_cancel_procs.py. Each appends lines to the file named by
``JSTAT_RUNS_FILE`` (``<event> <id> <attempt> <pid> <time>``): ``start``, ``stop`` when it
saw the cancel, ``failed`` if its failed() hook ran."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from haze import JobContext, define_job


def record(event: str, job_id: str, attempt: int) -> None:
    line = f"{event} {job_id} {attempt} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(os.environ["JSTAT_RUNS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


async def _failed(payload: Any, error: BaseException, job: JobContext) -> None:
    record("failed", job.id, job.attempt)


async def _long(payload: dict[str, Any], job: JobContext) -> str:
    record("start", job.id, job.attempt)
    for i in range(600):  # 60 s at most
        job.progress(min(i, 100))
        if job.signal.aborted:
            record("stop", job.id, job.attempt)
            job.signal.throw_if_aborted()
        await asyncio.sleep(0.1)
    record("end", job.id, job.attempt)
    return "finished"


@define_job(name="jstat_long", tries=3, keep_result="1h", failed=_failed)
async def jstat_long(payload: dict[str, Any], job: JobContext) -> str:
    return await _long(payload, job)


@define_job(name="jstat_plain_long", tries=3, failed=_failed)
async def jstat_plain_long(payload: dict[str, Any], job: JobContext) -> str:
    return await _long(payload, job)


@define_job(name="jstat_sync_progress", keep_result="1h")
def jstat_sync_progress(payload: dict[str, Any], job: JobContext) -> int:
    for i in (25, 50, 75):
        job.progress(i)
        time.sleep(0.05)
    return 3


@define_job(name="jstat_gated", keep_result="1h")
async def jstat_gated(payload: dict[str, Any], job: JobContext) -> str:
    """Runs until the file ``payload["go"]`` exists (60 s at most), then returns."""
    record("start", job.id, job.attempt)
    for _ in range(1200):
        if os.path.exists(payload["go"]):
            break
        await asyncio.sleep(0.05)
    record("end", job.id, job.attempt)
    return "released"
