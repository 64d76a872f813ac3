"""The store engine's time: a 2-day sleep under a controllable clock, a real 3 s sleep
that holds no worker slot, and sleeps past a driver's longest delay going in hops
(Cloudflare Queues 12 h, SQS 15 min: the drivers' own ``max_delay``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from haze import App, Workflow, define_job, define_queue_config, workflow
from haze._workflows import engine
from haze._workflows.api import wake
from haze.contracts.driver import MaxDelay
from haze.drivers.cloudflare import CloudflareDriver
from haze.drivers.memory import MemoryDriver
from haze.drivers.sqs import SqsDriver

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RAN.clear()
    yield
    engine.set_clock(None)


@pytest.fixture
async def app() -> AsyncIterator[App]:
    config = define_queue_config(
        default="main", connections={"main": {"driver": "memory", "concurrency": 1}}
    )
    async with App(queue=config) as a:
        yield a


def note(what: str) -> str:
    RAN.append(what)
    return what


@workflow(name="wfe_signup")
async def wfe_signup(run: Any, user: int) -> str:
    await run.step("welcome", note, "welcome")
    await run.sleep("two-days", "2d")
    return str(await run.step("nudge", note, "nudge"))


async def _state_of(rid: str, state: str) -> Any:
    for _ in range(200):
        st = await Workflow.status(rid)
        if st is not None and st.state == state:
            return st
        await asyncio.sleep(0.01)
    raise AssertionError(f"run {rid} never became {state}: {st}")


async def test_a_two_day_sleep_under_a_controllable_clock(app: App) -> None:
    clock = [1_800_000_000.0]
    engine.set_clock(lambda: clock[0])
    rid = await Workflow.start(wfe_signup, user=1)
    st = await _state_of(rid, "sleeping")
    assert st.resume_at == clock[0] + 2 * 86400
    clock[0] += 86400  # one day on: a resume now is early and ends at once
    assert await wake(rid) is True
    await _settled(app)
    assert (await Workflow.status(rid)).state == "sleeping"  # type: ignore[union-attr]
    assert RAN == ["welcome"]
    clock[0] += 86400  # two days on
    await wake(rid)
    st = await Workflow.wait(rid, timeout=5)
    assert (st.state, st.result, RAN) == ("done", "nudge", ["welcome", "nudge"])
    [_, nap, _] = st.steps
    assert nap.finished_at is not None and nap.started_at is not None
    assert nap.finished_at - nap.started_at == 2 * 86400


async def _settled(app: App) -> None:
    """Until nothing is ready or running (the 2-day resume stays delayed)."""
    driver = app.driver("main")
    assert isinstance(driver, MemoryDriver)
    for _ in range(300):
        counts = await driver.counts("default")
        if counts.ready == 0 and counts.running == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"still busy: {counts}")


@define_job(name="wfe_plain")
async def wfe_plain() -> None:
    RAN.append("plain")


@workflow(name="wfe_nap")
async def wfe_nap(run: Any) -> None:
    await run.step("before", note, "before")
    await run.sleep("nap", 3)
    await run.step("after", note, "after")


async def test_a_real_three_second_sleep_holds_no_worker_slot(app: App) -> None:
    driver = app.driver("main")
    assert isinstance(driver, MemoryDriver)
    started = time.monotonic()
    rid = await Workflow.start(wfe_nap)
    await _state_of(rid, "sleeping")
    counts = await driver.counts("default")
    # one slot (concurrency 1), none of it held: the sleep is a delayed message
    assert (counts.running, counts.delayed) == (0, 1)
    await wfe_plain.dispatch()
    await _until(lambda: "plain" in RAN)
    assert time.monotonic() - started < 3  # the plain job ran during the sleep
    assert (await driver.counts("default")).running == 0
    st = await Workflow.wait(rid, timeout=15)
    assert st.state == "done" and RAN == ["before", "plain", "after"]
    assert time.monotonic() - started >= 3


async def _until(ok: Any) -> None:
    for _ in range(300):
        if ok():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never")


def test_a_resume_waits_at_most_the_drivers_longest_delay() -> None:
    cloudflare = object.__new__(CloudflareDriver)
    sqs = object.__new__(SqsDriver)
    assert isinstance(cloudflare, MaxDelay) and isinstance(sqs, MaxDelay)
    assert engine.hop(cloudflare, 2 * 86400) == 12 * 3600
    assert engine.hop(sqs, 2 * 86400) == 15 * 60
    assert engine.hop(sqs, 60) == 60
    memory = object.__new__(MemoryDriver)
    assert not isinstance(memory, MaxDelay)
    assert engine.hop(memory, 2 * 86400) == 2 * 86400


@workflow(name="wfe_hops")
async def wfe_hops(run: Any) -> str:
    await run.sleep("nap", 1.0)
    return str(await run.step("after", note, "after"))


async def test_a_sleep_past_the_longest_delay_goes_in_hops(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The memory driver given a 0.3 s longest delay, as Cloudflare has 12 h.
    monkeypatch.setattr(MemoryDriver, "max_delay", 0.3, raising=False)
    delays: list[float] = []
    driver = app.driver("main")
    enqueue = driver.enqueue

    async def counting(body: str, message: Any, delay: float) -> None:
        if '"wake"' in body:
            delays.append(delay)
        await enqueue(body, message, delay)

    # on the instance: the memory driver then hands it every body (it keeps a plain
    # message without writing one otherwise)
    monkeypatch.setattr(driver, "enqueue", counting)
    started = time.monotonic()
    rid = await Workflow.start(wfe_hops)
    st = await Workflow.wait(rid, timeout=10)
    assert st.state == "done" and st.result == "after"
    assert time.monotonic() - started >= 1.0
    assert len(delays) >= 4 and max(delays) <= 0.3  # 1 s in hops of at most 0.3 s
