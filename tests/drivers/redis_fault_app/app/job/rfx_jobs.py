"""Jobs for tests/drivers/test_redis_faults.py. Every run appends one line to the file named
by ``RFX_RUNS_FILE`` (O_APPEND, one write per line, so concurrent processes never interleave):

    <event> <job key> <attempt> <pid> <time>

``event`` is ``start`` or ``end``; the test counts runs per key from these lines.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from haze import JobContext, define_job


def record(event: str, key: Any, attempt: int) -> None:
    line = f"{event} {key} {attempt} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(os.environ["RFX_RUNS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@define_job(name="rfx_record", tries=50)
async def rfx_record(payload: dict[str, Any], job: JobContext) -> None:
    """``{"k": key, "sleep": seconds}``: start, sleep, end."""
    record("start", payload["k"], job.attempt)
    if payload.get("sleep"):
        await asyncio.sleep(payload["sleep"])
    record("end", payload["k"], job.attempt)


@define_job(name="rfx_slow_first", tries=3)
async def rfx_slow_first(payload: dict[str, Any], job: JobContext) -> None:
    """Long on its first attempt (so a test can kill the worker mid-job), quick after."""
    record("start", payload["k"], job.attempt)
    if job.attempt == 1:
        await asyncio.sleep(payload.get("sleep", 30))
    record("end", payload["k"], job.attempt)
