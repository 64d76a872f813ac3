"""Jobs for tests/concurrency_limit/test_concurrency_procs.py. Every run appends one line
to the file named by ``CLS_RUNS_FILE`` (O_APPEND, one write per line, so concurrent
processes never interleave): ``<event> <key> <attempt> <pid> <time>``, ``start`` once it
holds a slot, ``end`` before it gives the slot back. The test computes from these lines
how many ran at once.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from haze import JobContext, define_job, limit_concurrency


def record(event: str, key: Any, attempt: int) -> None:
    line = f"{event} {key} {attempt} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(os.environ["CLS_RUNS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


async def _run(payload: dict[str, Any], job: JobContext) -> None:
    record("start", payload["k"], job.attempt)
    await asyncio.sleep(payload["sleep"])
    record("end", payload["k"], job.attempt)


@define_job(
    name="cls_limited",
    tries=50,
    middleware=[
        limit_concurrency(
            int(os.environ.get("CLS_MAX", "3")),
            "cls-storm",
            release_after="100ms",
            expire_after=os.environ.get("CLS_EXPIRE_AFTER", "6s"),
        )
    ],
)
async def cls_limited(payload: dict[str, Any], job: JobContext) -> None:
    await _run(payload, job)


@define_job(name="cls_plain", tries=50)
async def cls_plain(payload: dict[str, Any], job: JobContext) -> None:
    """No middleware of its own: limited by queue ``limited``'s config."""
    await _run(payload, job)
