"""The ``redis`` driver's idle wait against a real Redis: the claim written behind the
``BZPOPMIN`` (one write, run by Redis the moment the wait returns), BullMQ's
``drained`` (no claim before the wait when the queue was just found empty), the
prefetch of ``fetchNext``, and how a stopping worker ends a wait.

Round trips are counted on the server: ``MONITOR`` logs each command a client sends
(a blocked ``BZPOPMIN`` when it arrives, the command behind it when it runs), with the
client's address, so the tests see which connection sent what, in which order.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import hashlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from bullmq.redis_connection import loadScript  # type: ignore[import-untyped]
from haze._base.message import Message, encode, new_id
from haze.drivers.redis import RedisDriver
from haze.drivers.redis import link as redis_link
from haze.drivers.redis import wire as redis_wire
from haze.drivers.redis.wire import Wire, wire_for
from redis.exceptions import ResponseError
from redis_spec import REDIS_URL, needs_redis

pytestmark = needs_redis

Q = "q"


def _message(n: int = 0) -> tuple[str, Message]:
    m = Message(id=new_id(), job="rd_plain", payload={"n": n}, queue=Q, ts=time.time())
    return encode(m), m


def _now_ms() -> int:
    return round(time.time() * 1000)


@pytest.fixture
async def driver(redis_prefix: str) -> AsyncIterator[RedisDriver]:
    """The worker's side."""
    d = RedisDriver("r", {"url": REDIS_URL, "prefix": redis_prefix})
    try:
        yield d
    finally:
        await d.close()


@pytest.fixture
async def producer(redis_prefix: str) -> AsyncIterator[RedisDriver]:
    """A dispatcher on connections of its own."""
    d = RedisDriver("r", {"url": REDIS_URL, "prefix": redis_prefix})
    try:
        yield d
    finally:
        await d.close()


@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        yield c
    finally:
        await c.aclose()


class _Monitor:
    """The commands Redis receives that name this test's keys, in the order it logs
    them: (kind, client port, command)."""

    def __init__(self, prefix: str, driver: RedisDriver) -> None:
        self.prefix = prefix
        self.driver = driver
        self.seen: list[dict[str, Any]] = []

    async def start(self) -> None:
        self.client = aioredis.Redis.from_url(REDIS_URL)
        self.monitor = self.client.monitor()
        await self.monitor.__aenter__()
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while True:
            self.seen.append(await self.monitor.next_command())

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.monitor.__aexit__(None, None, None)
        await self.client.aclose()

    def kind(self, command: str) -> str:
        """What a command is, by its name or the script it runs."""
        link = self.driver._link()
        name = command.split(" ", 1)[0].upper()
        if name != "EVALSHA":
            return name
        sha = command.split(" ", 2)[1]
        assert link.claim_lite is not None
        scripts = {
            link.claim_lite.sha: "claim",
            link.commands["moveToActive"].sha: "moveToActive",
            link.commands["moveToFinished"].sha: "moveToFinished",
            link.commands["addStandardJob"].sha: "add",
        }
        if link.add_lite is not None:
            scripts[link.add_lite.sha] = "add"
        return scripts.get(sha, f"script {sha[:8]}")

    async def commands(self) -> list[tuple[str, str]]:
        # the log of a command can reach us a little after its reply reached the caller
        await asyncio.sleep(0.3)
        return [
            (self.kind(c["command"]), c["client_port"])
            for c in self.seen
            if c["client_type"] != "lua" and self.prefix in c["command"]
        ]


@pytest.fixture
async def monitor(redis_prefix: str, driver: RedisDriver) -> AsyncIterator[_Monitor]:
    m = _Monitor(redis_prefix, driver)
    await m.start()
    try:
        yield m
    finally:
        await m.stop()


async def _blocked(reserve: asyncio.Future[Any], driver: RedisDriver) -> None:
    """Until ``reserve`` waits on the queue's marker (it claimed first, found nothing)."""
    link = driver._link()
    deadline = time.monotonic() + 5
    while (Q,) not in link.waits or link.blockers.get((Q,)) is None:
        assert not reserve.done(), reserve
        assert time.monotonic() < deadline, "the claim never began its wait"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)  # its BZPOPMIN is on the server (and the clock moved on)


# ----------------------------------------------------------------------------- claim behind the wait


async def test_the_job_that_wakes_a_waiting_worker_is_claimed_by_the_command_sent_before_it(
    driver: RedisDriver, producer: RedisDriver, monitor: _Monitor, client: aioredis.Redis
) -> None:
    """No round trip between the job's add and its claim: the claim was written behind
    the BZPOPMIN, on the same connection, before the job existed; Redis runs it right
    after the add wakes the wait, and nothing else is sent before the job is returned."""
    body, message = _message()
    await producer.enqueue(*_message(-1), 0)  # the queue's first add (BullMQ's script)
    first = await driver.reserve([Q], 1.0)
    assert first is not None and await driver.ack(first)
    reserve = asyncio.ensure_future(driver.reserve([Q], 30.0))
    await _blocked(reserve, driver)
    before = len(await monitor.commands())
    dispatched = _now_ms()
    await producer.enqueue(body, message, 0)
    job = await asyncio.wait_for(reserve, 10)
    assert job is not None and job.message is not None and job.message.id == message.id
    after = (await monitor.commands())[before:]
    kinds = [k for k, _ in after]
    assert kinds == ["add", "claim"], after
    waits = [port for k, port in (await monitor.commands())[:before] if k == "BZPOPMIN"]
    assert waits and after[1][1] == waits[-1], "the claim did not ride behind the wait"
    # The claim ran ~0.3 s after it was written: its processedOn is the server's time
    # when it ran, not the time haze wrote it.
    fields = await client.hmget(f"{monitor.prefix}:{Q}:{job.token[0]}", "processedOn", "timestamp")
    assert int(fields[0]) >= int(fields[1]) >= dispatched - 5, fields
    assert await client.get(f"{monitor.prefix}:{Q}:{job.token[0]}:lock") == job.token[1]
    assert await driver.ack(job)


async def test_a_wait_woken_by_a_marker_with_no_job_waits_again_without_claiming(
    driver: RedisDriver, producer: RedisDriver, monitor: _Monitor
) -> None:
    """After a job is claimed BullMQ leaves the marker set (for other workers): the next
    wait pops it at once, and the claim behind it, finding nothing, is the only claim:
    the worker waits again without asking once more."""
    await producer.enqueue(*_message(), 0)
    job = await driver.reserve([Q], 1.0)
    assert job is not None
    assert await driver.ack(job)
    mark = len(await monitor.commands())
    assert await driver.reserve([Q], 0.6) is None
    kinds = [k for k, _ in (await monitor.commands())[mark:]]
    assert all(kinds[i - 1] == "BZPOPMIN" for i, k in enumerate(kinds) if k == "claim"), kinds
    assert kinds[:3] == ["BZPOPMIN", "claim", "BZPOPMIN"], kinds


async def test_after_a_finish_finds_the_queue_empty_the_next_claim_is_the_wait(
    driver: RedisDriver, producer: RedisDriver, monitor: _Monitor
) -> None:
    """moveToFinished asked for the next job (``fetchNext``) and found none: the next
    reserve goes straight to the wait (BullMQ's ``drained``), and a job dispatched then
    is claimed behind it."""
    await producer.enqueue(*_message(), 0)
    job = await driver.reserve([Q], 1.0)
    assert job is not None
    mark = len(await monitor.commands())
    assert await driver.ack(job)
    assert driver._link().drained == (Q, 0)
    reserve = asyncio.ensure_future(driver.reserve([Q], 30.0))
    await _blocked(reserve, driver)
    body, message = _message(1)
    await producer.enqueue(body, message, 0)
    got = await asyncio.wait_for(reserve, 10)
    assert got is not None and got.message is not None and got.message.id == message.id
    kinds = [k for k, _ in (await monitor.commands())[mark:]]
    assert kinds[0] == "moveToFinished", kinds
    assert kinds[1:] == ["BZPOPMIN", "claim", "BZPOPMIN", "add", "claim"]


async def test_finishing_a_job_fetches_the_next_one_in_the_same_call(
    driver: RedisDriver, producer: RedisDriver, monitor: _Monitor
) -> None:
    """Draining at concurrency 1: each finish brings the next job (BullMQ's
    ``fetchNext``), so a reserve after it sends nothing."""
    sent = [_message(i) for i in range(3)]
    for body, message in sent:
        await producer.enqueue(body, message, 0)
    got = []
    for _ in sent:
        job = await driver.reserve([Q], 1.0)
        assert job is not None and job.message is not None
        got.append(job.message.id)
        assert await driver.ack(job)
    assert got == [m.id for _, m in sent]
    kinds = [k for k, _ in await monitor.commands() if k != "add"]
    assert kinds == ["claim", "moveToFinished", "moveToFinished", "moveToFinished"]


async def test_a_due_delayed_job_is_claimed_with_the_servers_clock(
    driver: RedisDriver, producer: RedisDriver, client: aioredis.Redis, redis_prefix: str
) -> None:
    """The wait times out when the delayed job is due; the claim behind it promotes and
    claims it as of the time it runs (it was written when the wait began)."""
    body, message = _message()
    await producer.enqueue(body, message, 0.8)
    due = _now_ms() + 800
    job = await driver.reserve([Q], 10.0)
    assert job is not None and job.message is not None and job.message.id == message.id
    started = int(await client.hget(f"{redis_prefix}:{Q}:{job.token[0]}", "processedOn"))
    assert started >= due - 50, (started, due)
    assert await driver.ack(job)


async def test_an_event_loop_pass_is_not_spent_between_the_claims_reply_and_the_job(
    driver: RedisDriver, producer: RedisDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slot that waits reads the reply itself: it resumes from ``data_received``
    (no task in between, so no event-loop pass) with the job."""
    passes = [0]
    at_reply = [-1]
    run_once = asyncio.base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]
    received = redis_wire._Protocol.data_received

    def counted(self: Any) -> None:
        passes[0] += 1
        run_once(self)

    def data_received(self: Any, data: bytes) -> None:
        at_reply[0] = passes[0]
        received(self, data)

    if not isinstance(asyncio.get_running_loop(), asyncio.base_events.BaseEventLoop):
        pytest.skip("counts the passes of asyncio's own loop")
    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "_run_once", counted)
    monkeypatch.setattr(redis_wire._Protocol, "data_received", data_received)
    await producer.enqueue(*_message(-1), 0)
    first = await driver.reserve([Q], 1.0)
    assert first is not None and await driver.ack(first)

    async def claim() -> int:
        job = await driver.reserve([Q], 30.0)
        assert job is not None
        return passes[0] - at_reply[0]

    reserve = asyncio.ensure_future(claim())
    await _blocked(reserve, driver)
    await producer.enqueue(*_message(), 0)
    assert await asyncio.wait_for(reserve, 10) == 0


# ----------------------------------------------------------------------------- stopping


async def _job_without_marker(client: aioredis.Redis, prefix: str) -> str:
    """A waiting job whose marker is gone (as after a marker lost to a crash): only a
    claim finds it, no wait wakes for it."""
    body, _ = _message()
    key = f"{prefix}:{Q}:"
    await client.hset(
        key + "77",
        mapping={"name": "rd_plain", "data": body, "opts": '{"attempts":1}', "timestamp": 1},
    )
    await client.lpush(key + "wait", "77")
    return "77"


async def test_interrupt_unblocks_the_wait_and_hands_back_what_its_claim_took(
    driver: RedisDriver, client: aioredis.Redis, redis_prefix: str
) -> None:
    reserve = asyncio.ensure_future(driver.reserve([Q], 60.0))
    await _blocked(reserve, driver)
    job_id = await _job_without_marker(client, redis_prefix)
    driver.interrupt()
    assert await asyncio.wait_for(reserve, 10) is None
    link = driver._link()
    if link.tasks:
        await asyncio.wait(link.tasks, timeout=5)
    key = f"{redis_prefix}:{Q}:"
    assert await client.lrange(key + "active", 0, -1) == []
    assert await client.lrange(key + "wait", 0, -1) == [job_id]
    assert await client.exists(key + job_id + ":lock") == 0
    # a worker that carries on claims it
    job = await driver.reserve([Q], 1.0)
    assert job is not None and job.token[0] == job_id


async def test_interrupt_ends_the_wait_where_client_unblock_is_refused(
    driver: RedisDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose ACL refuses CLIENT UNBLOCK: the wait's connection is closed."""

    async def refused(self: RedisDriver, link: Any) -> int:
        raise ResponseError("NOPERM this user has no permissions to run 'client|unblock'")

    monkeypatch.setattr(RedisDriver, "_unblock", refused)
    reserve = asyncio.ensure_future(driver.reserve([Q], 60.0))
    await _blocked(reserve, driver)
    driver.interrupt()
    assert await asyncio.wait_for(reserve, 10) is None


async def test_close_ends_a_blocked_wait_and_strands_no_job(
    redis_prefix: str, client: aioredis.Redis
) -> None:
    d = RedisDriver("r", {"url": REDIS_URL, "prefix": redis_prefix})
    reserve = asyncio.ensure_future(d.reserve([Q], 60.0))
    await _blocked(reserve, d)
    job_id = await _job_without_marker(client, redis_prefix)
    await asyncio.wait_for(d.close(), 10)
    assert await asyncio.wait_for(reserve, 10) is None
    key = f"{redis_prefix}:{Q}:"
    assert await client.lrange(key + "active", 0, -1) == []
    assert await client.lrange(key + "wait", 0, -1) == [job_id]


# ----------------------------------------------------------------------------- the claim script


def test_the_claim_after_a_wait_is_the_installed_bullmq_movetoactive() -> None:
    """The driver compares the SHA at run time and, when it differs, claims with BullMQ's
    moveToActive after the wait returns; this says so loudly after a bullmq upgrade:
    re-derive claim_job.lua from the new moveToActive, run test_redis_lite_claim.py,
    then update ``_MOVE_TO_ACTIVE_SHA`` and ``_CLAIM_JOB_SHA``."""
    installed = hashlib.sha1(loadScript("moveToActive-11.lua").encode()).hexdigest()
    assert installed == redis_link._MOVE_TO_ACTIVE_SHA


async def test_another_bullmq_claims_after_the_wait_returns(
    redis_prefix: str, producer: RedisDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_link, "_MOVE_TO_ACTIVE_SHA", "0" * 40)
    d = RedisDriver("r", {"url": REDIS_URL, "prefix": redis_prefix})
    try:
        assert d._link().claim_lite is None
        reserve = asyncio.ensure_future(d.reserve([Q], 30.0))
        await _blocked(reserve, d)
        body, message = _message()
        await producer.enqueue(body, message, 0)
        job = await asyncio.wait_for(reserve, 10)
        assert job is not None and job.message is not None and job.message.id == message.id
        assert await d.ack(job)
        assert d._link().drained is None  # no wait claims: every reserve claims first
    finally:
        await d.close()


async def test_without_the_lean_connection_the_wait_is_redis_pys_and_a_stop_ends_it(
    redis_prefix: str, producer: RedisDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TLS and Unix sockets stay on redis-py: BZPOPMIN alone, the claim after it, and
    ``interrupt`` ends the wait at once (no CLIENT UNBLOCK there)."""
    monkeypatch.setattr(redis_link, "wire_for", lambda *a, **k: None)
    d = RedisDriver("r", {"url": REDIS_URL, "prefix": redis_prefix})
    try:
        link = d._link()
        assert link.wire is None and link.claim_lite is None
        reserve = asyncio.ensure_future(d.reserve([Q], 60.0))
        await asyncio.sleep(0.5)
        assert not reserve.done()
        body, message = _message()
        await producer.enqueue(body, message, 0)
        job = await asyncio.wait_for(reserve, 10)
        assert job is not None and job.message is not None and job.message.id == message.id
        assert await d.ack(job)
        reserve = asyncio.ensure_future(d.reserve([Q], 60.0))
        await asyncio.sleep(0.5)
        d.interrupt()
        assert await asyncio.wait_for(reserve, 10) is None
    finally:
        await d.close()


# ----------------------------------------------------------------------------- the wire


async def test_the_wire_pipelines_a_command_behind_a_blocking_one(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    """``pipeline``: one write; the second command runs when the first unblocks, on a
    push or on ``CLIENT UNBLOCK`` from another connection (``track_id``)."""
    wire = wire_for(client, track_id=True)
    assert wire is not None
    a, b = f"{redis_prefix}:a", f"{redis_prefix}:b"
    try:
        assert await wire.execute("PING") == "PONG"
        assert wire.client_id == await wire.execute("CLIENT", "ID")
        call = asyncio.ensure_future(
            wire.pipeline([redis_wire.encode("BLPOP", a, 30), redis_wire.encode("RPUSH", b, "x")])
        )
        await asyncio.sleep(0.2)
        assert await client.llen(b) == 0  # still behind the blocked BLPOP
        await client.lpush(a, "1")
        assert await asyncio.wait_for(call, 5) == [[a, "1"], 1]
        call = asyncio.ensure_future(
            wire.pipeline([redis_wire.encode("BLPOP", a, 30), redis_wire.encode("RPUSH", b, "y")])
        )
        await asyncio.sleep(0.2)
        assert await client.client_unblock(wire.client_id) == 1
        assert await asyncio.wait_for(call, 5) == [None, 2]
        replies = await wire.pipeline([redis_wire.encode("INCR", b), redis_wire.encode("PING")])
        assert "WRONGTYPE" in str(replies[0]) and replies[1] == "PONG"
    finally:
        wire.close()


async def test_a_cancelled_pipeline_leaves_the_connection_in_step(redis_prefix: str) -> None:
    wire = Wire("127.0.0.1", 6379) if REDIS_URL.endswith("6379/0") else None
    if wire is None:
        pytest.skip("needs the default test server")
    a = f"{redis_prefix}:a"
    try:
        call = asyncio.ensure_future(
            wire.pipeline([redis_wire.encode("BLPOP", a, 0.2), redis_wire.encode("ECHO", "x")])
        )
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await wire.execute("ECHO", "after") == "after"
    finally:
        wire.close()
