"""The ``redis`` driver's lite claim (``claim_job.lua``) against BullMQ's own
``moveToActive``: the same claims made both ways, on the same jobs with the same token
and time, must return the same reply and leave the same state, so the lite claim can
never drift from BullMQ unnoticed.

Each case sets up two queues of one prefix alike (jobs added by BullMQ's own scripts,
with fixed timestamps), claims from one with bullmq's ``moveToActive`` (its packed
options, over redis-py) and from the other with the lite claim (plain arguments, over
the lean connection), then compares every key of the two queues as a reader sees it
(hash fields, lists in order, sorted sets with scores, strings, the events stream's
entries by their fields: the ids are clock-based). Not by ``DUMP``: see
test_redis_lite_add.py for why a hash table's DUMP is not data.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
import redis.asyncio as aioredis
from haze._base.message import Message, encode, new_id
from haze.drivers.redis import RedisDriver
from haze.drivers.redis import link as redis_link
from haze.drivers.redis.link import _Link
from haze.drivers.redis.scripts import _ACTIVATE_KEYS, _NewJob
from redis_spec import REDIS_URL, needs_redis

pytestmark = needs_redis

TOKEN = "tok"
LOCK_MS = 30000


@pytest.fixture
async def driver(redis_prefix: str) -> AsyncIterator[RedisDriver]:
    d = RedisDriver("r", {"url": REDIS_URL, "prefix": redis_prefix})
    try:
        yield d
    finally:
        await d.close()


@pytest.fixture
async def raw() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


def _now_ms() -> int:
    return round(time.time() * 1000)


#: the same bodies on both queues
BODIES = [
    encode(Message(id=new_id(), job="rd_plain", payload={"i": i}, queue="q", ts=1.5))
    for i in range(4)
]


async def _add(link: _Link, q: str, i: int, ts: int, **opts: Any) -> None:
    job = _NewJob("rd_plain", BODIES[i], opts.pop("delay", 0), ts)
    job.opts.update(opts)
    await link.scripts(q).addJob(job, link.client)


async def _claim_bullmq(link: _Link, q: str, now: int) -> Any:
    s = link.scripts(q)
    packed = msgpack.packb(
        {"token": TOKEN, "lockDuration": LOCK_MS, "limiter": None}, use_bin_type=True
    )
    return await link.commands["moveToActive"](
        keys=s.getKeys(_ACTIVATE_KEYS), args=[s.keys[""], now, packed]
    )


async def _claim_lite(link: _Link, q: str, now: int | str) -> Any:
    assert link.claim_lite is not None and link.wire is not None
    return await link.wire.run_head(link.claim_lite, link.claim_head(q), (now, TOKEN, LOCK_MS))


async def _snapshot(raw: aioredis.Redis, prefix: str, q: str) -> dict[str, Any]:
    base = f"{prefix}:{q}:"
    out: dict[str, Any] = {}
    async for key in raw.scan_iter(match=base + "*", count=1000):
        kind = await raw.type(key)
        if kind == "hash":
            value: Any = await raw.hgetall(key)
        elif kind == "list":
            value = await raw.lrange(key, 0, -1)
        elif kind == "zset":
            value = await raw.zrange(key, 0, -1, withscores=True)
        elif kind == "string":
            value = await raw.get(key)
        elif kind == "stream":
            value = [fields for _, fields in await raw.xrange(key)]
        else:
            raise AssertionError(f"{key}: a {kind} key, which this test does not compare yet")
        out[key[len(base) :]] = (kind, value)
    return out


# ----------------------------------------------------------------------------- cases

TS = 1764433200123


async def _waiting(link: _Link, q: str) -> None:
    for i in range(3):
        await _add(link, q, i, TS + i)


async def _delayed_due(link: _Link, q: str) -> None:
    await _add(link, q, 0, TS)
    await _add(link, q, 1, TS + 1, delay=500)  # due long before "now"
    await _add(link, q, 2, TS + 2, delay=400, priority=3)  # promoted into prioritized


async def _delayed_later(link: _Link, q: str) -> None:
    await _add(link, q, 0, TS, delay=10**11)  # due years from now


async def _paused(link: _Link, q: str) -> None:
    await _waiting(link, q)
    await link.scripts(q).pause(True)


async def _maxed(link: _Link, q: str) -> None:
    await _waiting(link, q)
    await link.client.hset(link.scripts(q).keys["meta"], "concurrency", "2")


async def _prioritized(link: _Link, q: str) -> None:
    await _add(link, q, 0, TS, priority=5)  # a Node producer's job with a priority
    await _add(link, q, 1, TS + 1, priority=2)


async def _rate_limited(link: _Link, q: str) -> None:
    await _waiting(link, q)
    s = link.scripts(q)
    await link.client.hset(s.keys["meta"], mapping={"max": "2", "duration": "60000"})
    await link.client.hset(s.toKey("2"), "defa", "1")  # a deferred failure is not counted


async def _legacy_marker(link: _Link, q: str) -> None:
    await _waiting(link, q)
    await link.client.rpush(link.scripts(q).keys["wait"], "0:1")  # before BullMQ v5


Setup = Callable[[_Link, str], Awaitable[None]]

#: setup, how many claims
CASES: dict[str, tuple[Setup, int]] = {
    "waiting jobs, then an empty queue": (_waiting, 4),
    "due delayed jobs promoted first": (_delayed_due, 4),
    "a delayed job not due yet: its due time": (_delayed_later, 2),
    "paused queue": (_paused, 2),
    "concurrency reached": (_maxed, 3),
    "prioritized jobs (a BullMQ producer's)": (_prioritized, 3),
    "a queue with a rate limit": (_rate_limited, 4),
    "a legacy marker in wait": (_legacy_marker, 4),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_lite_claim_writes_what_bullmqs_movetoactive_writes(
    driver: RedisDriver, raw: aioredis.Redis, redis_prefix: str, case: str
) -> None:
    setup, n = CASES[case]
    link = driver._link()
    for q in ("bull", "lite"):
        await setup(link, q)
    for i in range(n):
        now = _now_ms() + i
        bull = await _claim_bullmq(link, "bull", now)
        lite = await _claim_lite(link, "lite", now)
        if case == "a queue with a rate limit" and bull[2]:
            assert abs(lite[2] - bull[2]) < 1000  # the limiter's PTTL, a moment later
            lite[2] = bull[2]
        assert lite == bull, (i, bull)
    bull_keys = await _snapshot(raw, redis_prefix, "bull")
    lite_keys = await _snapshot(raw, redis_prefix, "lite")
    assert sorted(lite_keys) == sorted(bull_keys)
    for key in bull_keys:
        assert lite_keys[key] == bull_keys[key], key
    assert "events" in bull_keys


async def test_an_empty_timestamp_is_the_servers_clock(
    driver: RedisDriver, raw: aioredis.Redis, redis_prefix: str
) -> None:
    link = driver._link()
    await _add(link, "q", 0, TS)
    await _add(link, "q", 1, _now_ms(), delay=300)
    before = _now_ms()
    reply = await _claim_lite(link, "q", "")
    assert reply[1] == "1"
    started = int(await raw.hget(f"{redis_prefix}:q:1", "processedOn"))
    assert before - 5 <= started <= _now_ms() + 5
    time.sleep(0.4)  # noqa: ASYNC251 - the delayed job comes due on the server's clock
    reply = await _claim_lite(link, "q", "")
    assert reply[1] == "2"


async def test_the_worker_claims_with_the_lite_claim(
    driver: RedisDriver, raw: aioredis.Redis, redis_prefix: str
) -> None:
    """Through ``reserve``: the job comes back as BullMQ's moveToActive would have left
    it (which script each claim ran: test_redis_wait_claim.py, with ``MONITOR``)."""
    link = driver._link()
    assert link.claim_lite is not None
    await _add(link, "q", 0, TS)
    job = await driver.reserve(["q"], 1.0)
    assert job is not None and job.token[0] == "1"
    fields = await raw.hgetall(f"{redis_prefix}:q:1")
    assert fields["ats"] == "1" and int(fields["processedOn"]) >= TS
    assert await raw.get(f"{redis_prefix}:q:1:lock") == job.token[1]
    assert await raw.lrange(f"{redis_prefix}:q:active", 0, -1) == ["1"]
    assert await driver.ack(job)


async def test_another_bullmq_turns_the_lite_claim_off(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_link, "_MOVE_TO_ACTIVE_SHA", "0" * 40)
    d = RedisDriver("r", {"url": REDIS_URL, "prefix": redis_prefix})
    try:
        link = d._link()
        assert link.claim_lite is None
        await _add(link, "q", 0, TS)
        job = await d.reserve(["q"], 1.0)
        assert job is not None and job.token[0] == "1"  # BullMQ's moveToActive claimed it
        assert await d.ack(job)
    finally:
        await d.close()


def test_the_lite_claim_is_the_reviewed_script() -> None:
    """The driver loads the lite claim only when its text has the SHA pinned next to it:
    a change to claim_job.lua must come with this file's comparison run again and the
    pin updated (``_CLAIM_JOB_SHA``)."""
    text = (Path(redis_link.__file__).parent / "claim_job.lua").read_bytes()
    assert hashlib.sha1(text).hexdigest() == redis_link._CLAIM_JOB_SHA
