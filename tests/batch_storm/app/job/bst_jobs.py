"""Jobs for tests/batch_storm/test_batch_storm.py. Every run appends one line to the file
named by ``BST_RUNS_FILE`` (O_APPEND, one write per line, so concurrent processes never
interleave): ``<event> <key> <attempt> <pid> <time>``.

Members write ``start``/``end`` with key ``<batch>.<job>``; the batch callbacks write
``fire`` with key ``<kind>.<batch>.<message id>``: a redelivery of one callback message
(its worker killed before the ack) repeats the id, a second dispatch would not.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from haze import JobContext, define_job


def record(event: str, key: Any, attempt: int) -> None:
    line = f"{event} {key} {attempt} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(os.environ["BST_RUNS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@define_job(name="bst_member", tries=50)
async def bst_member(payload: dict[str, Any], job: JobContext) -> None:
    key = f"{payload['b']}.{payload['j']}"
    record("start", key, job.attempt)
    await asyncio.sleep(payload["sleep"])
    record("end", key, job.attempt)


@define_job(name="bst_callback", tries=50)
async def bst_callback(payload: dict[str, Any], job: JobContext) -> None:
    record("fire", f"{payload['kind']}.{payload['b']}.{job.id}", job.attempt)
