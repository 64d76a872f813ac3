"""The short path of a plain job on the memory driver, counted in Python calls.

A deterministic guard of its design (what a timing test cannot be on a shared box):
``sys.setprofile`` counts every Python function entered while jobs are dispatched and
drained. A plain job costs a fixed handful of calls (the dispatch, its awaitable, the
payload copy, the queue's keep, the claim, the handler, its end); a frame added to that
path shows up here as one more call per job, long before any benchmark notices it.
"""

from __future__ import annotations

import asyncio
import sys
from types import FrameType
from typing import Any

from haze import App, Queue, define_job, define_queue_config
from haze_plain_conditions import plain_conditions

#: Jobs counted: enough that ``Queue.idle()`` and the loop's own passes, paid once per
#: burst, round away.
N = 400
#: Python calls per plain job at most (the handler included). 18 before the copies
#: and the consumer check lost their frames; 10.46 after.
MAX_CALLS_PER_JOB = 11

ran = 0


@define_job(name="plain_counted")
async def plain_counted(payload: dict[str, Any]) -> None:
    global ran
    ran += 1


async def _calls_per_job(payload: Any) -> float:
    calls = 0

    def count(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    app = App(queue=define_queue_config(connections={"memory": {"driver": "memory"}}))
    async with app:
        with plain_conditions(app):
            for _ in range(50):  # warm: the worker started, each job's plan found
                await plain_counted.dispatch(payload)
            await Queue.idle()
            await asyncio.sleep(0)
            sys.setprofile(count)
            try:
                for _ in range(N):
                    await plain_counted.dispatch(payload)
                await Queue.idle()
            finally:
                sys.setprofile(None)
    return calls / N


async def test_a_plain_job_costs_a_fixed_handful_of_python_calls() -> None:
    global ran
    ran = 0
    per_job = await _calls_per_job({"i": 1, "name": "x"})
    assert ran == N + 50
    assert per_job <= MAX_CALLS_PER_JOB, f"{per_job:.2f} Python calls per plain job"


async def test_a_nested_payload_costs_a_call_per_dict_or_list_in_each_copy() -> None:
    flat = await _calls_per_job({"i": 1, "name": "x"})
    nested = await _calls_per_job({"i": 1, "tags": ["a"], "meta": {"k": 1}})
    # two containers: copied at dispatch (2 calls), walked and copied at the claim (1 + 2);
    # the half a call over it is the event loop's passes per burst, which vary with how
    # the bursts fall on a busy box (5.02 seen): one more frame per job is a whole call
    assert nested - flat <= 5.5, f"{nested:.2f} Python calls per job against {flat:.2f}"
