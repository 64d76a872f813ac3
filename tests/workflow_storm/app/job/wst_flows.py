"""The workflow of tests/workflow_storm/test_workflow_storm.py: five steps, a sleep and a
gather. Every line goes to the file named by ``WST_RUNS_FILE`` (O_APPEND, one write per
line, so concurrent processes never interleave): ``<event> <key> <token> <pid> <time>``.

A step writes ``start``/``end`` with key ``<run>.<step>`` and a fresh token, and returns
that token (its result). After each step returns, the workflow writes ``seen`` with the
token it got: every replay of a run must see the one token that was kept.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from typing import Any

from haze import workflow


def record(event: str, key: str, token: str) -> None:
    line = f"{event} {key} {token} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(os.environ["WST_RUNS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


async def side_effect(n: int, step: str) -> str:
    token = uuid.uuid4().hex[:12]
    record("start", f"{n}.{step}", token)
    await asyncio.sleep(random.uniform(0.05, 0.3))
    record("end", f"{n}.{step}", token)
    return token


@workflow(name="wst_flow", tries=200)
async def wst_flow(run: Any, n: int, nap: float) -> list[str]:
    one = await run.step("one", side_effect, n, "one")
    record("seen", f"{n}.one", one)
    await run.sleep("nap", nap)
    two, three = await run.gather(
        run.step("two", side_effect, n, "two"), run.step("three", side_effect, n, "three")
    )
    record("seen", f"{n}.two", two)
    record("seen", f"{n}.three", three)
    four = await run.step("four", side_effect, n, "four")
    record("seen", f"{n}.four", four)
    five = await run.step("five", side_effect, n, "five")
    record("seen", f"{n}.five", five)
    record("done", str(n), run.id)
    return [one, two, three, four, five]
