"""What a step costs in the run state: a step that succeeds at its first try is ONE
write (its name, position, result and attempt together), and a replay reads the run
once, however many steps it has (the store's calls are counted; no time is measured)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from haze import App, Workflow, define_queue_config, workflow
from haze._workflows.engine import workflow_state

STEPS = 6


@workflow(name="wsw_steps")
async def wsw_steps(run: Any) -> int:
    total = 0
    for i in range(STEPS):
        total += await run.step(f"s{i}", lambda i=i: i)
    return total


@pytest.fixture
async def app() -> AsyncIterator[App]:
    config = define_queue_config(
        default="main", connections={"main": {"driver": "memory", "concurrency": 1}}
    )
    async with App(queue=config) as a:
        yield a


async def test_a_new_step_is_one_write_and_a_replay_reads_once(app: App) -> None:
    store: Any = workflow_state(app.manager.state_store()).store
    calls: Counter[str] = Counter()
    for verb in ("get", "get_many", "add", "add_listed", "put", "increment", "delete"):
        real = getattr(store, verb)

        def counted(*args: Any, _real: Any = real, _verb: str = verb, **kw: Any) -> Any:
            keys = [str(k) for k in (args[0] if _verb == "get_many" else [args[0]])]
            if any(":wf:" in k and ":runs" not in k for k in keys):
                calls[_verb] += 1
            if _verb in ("add", "add_listed") and keys[0].endswith(":run"):
                calls["run added"] += 1
            if _verb == "add" and keys[0].endswith(":start"):
                calls["start token"] += 1  # concurrent starts of one id: one runs the run
            if _verb == "get_many" and len(keys) > 3 and keys[1].endswith(":state"):
                calls["replay read"] += 1  # input, states and step records together
            if _verb == "get" and any(":pos:" in k or ":res:" in k for k in keys):
                calls["step read"] += 1
            return _real(*args, **kw)

        setattr(store, verb, counted)
    rid = await Workflow.start(wsw_steps)
    st = await Workflow.wait(rid, timeout=10)
    assert (st.state, st.result) == ("done", sum(range(STEPS)))
    assert [(s.name, s.state, s.attempts) for s in st.steps] == [
        (f"s{i}", "done", 1) for i in range(STEPS)
    ]
    calls.clear()
    rid = await Workflow.start(wsw_steps)
    await Workflow.wait(rid, timeout=10)
    # beside the run's record (added by the starter, or by its message when it comes
    # first) and its start token: one write a step and the final state; the replay reads the run once (twice
    # when the starter adds it between the read and the message's own add), never a step
    writes = sum(calls[v] for v in ("add", "add_listed", "put", "increment", "delete"))
    assert calls["start token"] == 1
    assert writes - calls["run added"] - calls["start token"] == STEPS + 1
    assert calls["run added"] in (1, 2) and calls["replay read"] in (1, 2)
    assert calls["step read"] == 0
