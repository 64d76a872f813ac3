"""Jobs for tests/database/test_batch_claim.py. Every run appends one line to the file
named by ``DBX_RUNS_FILE`` (O_APPEND, one write per line):

    <event> <job key> <attempt> <pid> <time>

``dbx_batch_kill`` SIGKILLs its own worker from the ``after`` event of its first attempt:
the job has finished and its ack is in the worker's buffer, not yet sent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from haze import JobContext, Queue, define_job


def record(event: str, key: Any, attempt: int) -> None:
    line = f"{event} {key} {attempt} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(os.environ["DBX_RUNS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@define_job(name="dbx_batch_record", tries=5)
async def dbx_batch_record(payload: dict[str, Any], job: JobContext) -> None:
    """``{"k": key, "sleep": seconds}``: start, sleep, end."""
    record("start", payload["k"], job.attempt)
    if payload.get("sleep"):
        await asyncio.sleep(payload["sleep"])
    record("end", payload["k"], job.attempt)


@define_job(name="dbx_batch_kill", tries=5)
async def dbx_batch_kill(payload: dict[str, Any], job: JobContext) -> None:
    record("start", payload["k"], job.attempt)
    record("end", payload["k"], job.attempt)


@Queue.on("after")
def _kill_after_first_attempt(ctx: JobContext) -> None:
    if ctx.name == "dbx_batch_kill" and ctx.attempt == 1:
        payload = ctx.message.payload if ctx.message is not None else None
        record("killed", payload["k"] if isinstance(payload, dict) else "?", 1)
        os.kill(os.getpid(), signal.SIGKILL)
