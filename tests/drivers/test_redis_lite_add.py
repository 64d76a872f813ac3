"""The ``redis`` driver's lite add (``redis_add_job.lua``) against BullMQ's own
``addStandardJob``: the same job added both ways must leave the same bytes in Redis, so
the lite add can never drift from BullMQ unnoticed.

Each case adds the same jobs, with the same timestamps, to two queues of one prefix:
one through bullmq's own builder and script (over redis-py), one through the lite add
(over the lean connection). Every key of the two queues is then compared by its type and
its contents as a reader sees them: a hash's fields and values, a list in order, a
sorted set's members and scores in order, a string's value; the events stream, whose
entry ids are clock-based, by the fields of each entry in order.

Not by ``DUMP``: a job hash holds a data value longer than ``hash-max-listpack-value``
(64 bytes), so Redis stores it as a hash table, and DUMP writes a hash table's fields in
bucket order. That order depends on the server's hash seed (random at each start) and on
how far the table's incremental rehash has gone, which any later read of the hash (an
HGET) moves on. Two hashes written by the same HMSET with the same fields, values and
order can then DUMP differently; whether they do depends on the seed, so a DUMP test
passes or fails per Redis start, not per code. No reader sees that order: BullMQ (Node
and Python) and dashboards read a job with HGETALL into a map. A missing or extra field,
or any different value, still fails the comparison.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from bullmq.redis_connection import loadScript  # type: ignore[import-untyped]
from haze._base.message import Message, encode, new_id
from haze.drivers.redis import RedisDriver
from haze.drivers.redis import link as redis_link
from haze.drivers.redis.link import _Link
from haze.drivers.redis.scripts import _NewJob, _Scripts
from redis_spec import REDIS_URL, needs_redis

pytestmark = needs_redis

TS = 1764433200123


@pytest.fixture
async def driver(redis_prefix: str) -> AsyncIterator[RedisDriver]:
    d = RedisDriver("r", {"url": REDIS_URL, "prefix": redis_prefix})
    try:
        yield d
    finally:
        await d.close()


@pytest.fixture
async def raw() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL)  # bytes: values compared as stored
    try:
        yield client
    finally:
        await client.aclose()


async def _add_bullmq(link: _Link, queue: str, name: str, body: str, ts: int) -> Any:
    # bullmq's own argument builder and script; the driver's subclass only puts the
    # already-encoded JSON body in place of json.dumps(job.data)
    s = link.scripts(queue)
    return await s.addStandardJob(_NewJob(name, body, 0, ts), ts, link.client)


async def _add_lite(link: _Link, queue: str, name: str, body: str, ts: int) -> Any:
    s = link.scripts(queue)
    if not isinstance(s._add, list):
        s.add_args(_NewJob(name, body, 0, ts))  # the template check the driver makes first
    lite = link.lite_add(s)
    assert lite is not None, "no lite add on a plain TCP connection next to bullmq 3.4.4"
    wire, script, head = lite
    return await wire.run_head(script, head, (name, body, ts))


async def _contents(raw: aioredis.Redis, key: bytes, kind: str) -> Any:
    """A key's value as a reader sees it (see the module docstring: not its DUMP)."""
    if kind == "hash":
        return await raw.hgetall(key)  # a map: a hash table's field order is not data
    if kind == "list":
        return await raw.lrange(key, 0, -1)
    if kind == "zset":
        return await raw.zrange(key, 0, -1, withscores=True)
    if kind == "string":
        return await raw.get(key)
    if kind == "set":
        return await raw.smembers(key)
    if kind == "stream":  # entry ids are clock-based: the fields of each entry, in order
        return [fields for _, fields in await raw.xrange(key)]
    raise AssertionError(f"{key!r}: a {kind} key, which this test does not compare yet")


async def _snapshot(raw: aioredis.Redis, prefix: str, queue: str) -> dict[str, Any]:
    base = f"{prefix}:{queue}:".encode()
    out: dict[str, Any] = {}
    async for key in raw.scan_iter(match=base + b"*", count=1000):
        kind = (await raw.type(key)).decode()
        out[key[len(base) :].decode()] = (kind, await _contents(raw, key, kind))
    return out


def _body(i: int, text: str = "") -> str:
    message = Message(
        id=new_id(), job="rd_plain", payload={"i": i, "text": text}, queue="q", ts=1.5
    )
    return encode(message)


JOBS = [
    ("rd_plain", _body(1)),
    ("envoi_facture_é", _body(2, '€ 😀 \u2028 "quoted" \\ back')),
    ("x" * 300, _body(3, "y" * 5000)),  # past the wire's cache of short strings
    ("rd_plain", "not json at all: BullMQ stores whatever it is given"),
]


async def _meta_max_events(link: _Link, q: str) -> None:
    await link.client.hset(link.scripts(q).keys["meta"], "opts.maxLenEvents", "7")


async def _paused(link: _Link, q: str) -> None:
    await link.scripts(q).pause(True)  # BullMQ's pause script


async def _maxed(link: _Link, q: str) -> None:
    s = link.scripts(q)
    await link.client.hset(s.keys["meta"], "concurrency", "1")
    await link.client.lpush(s.keys["active"], "999")


async def _under_concurrency(link: _Link, q: str) -> None:
    s = link.scripts(q)
    await link.client.hset(s.keys["meta"], "concurrency", "2")
    await link.client.lpush(s.keys["active"], "999")


async def _counter_ahead(link: _Link, q: str) -> None:
    await link.client.set(link.scripts(q).keys["id"], "41")


Setup = Callable[[_Link, str], Awaitable[None]] | None

CASES: dict[str, tuple[Setup, int]] = {
    "new queue": (None, len(JOBS)),
    "events trimmed at the queue's maxLenEvents": (_meta_max_events, 320),
    "paused queue: no marker": (_paused, len(JOBS)),
    "concurrency reached: no marker": (_maxed, len(JOBS)),
    "under its concurrency: marker": (_under_concurrency, len(JOBS)),
    "id counter already used": (_counter_ahead, len(JOBS)),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_lite_add_writes_what_bullmqs_addstandardjob_writes(
    driver: RedisDriver, raw: aioredis.Redis, redis_prefix: str, case: str
) -> None:
    setup, n = CASES[case]
    link = driver._link()
    assert link.add_lite is not None
    for q in ("bull", "lite"):
        if setup is not None:
            await setup(link, q)
    ids: dict[str, list[Any]] = {"bull": [], "lite": []}
    for i in range(n):
        name, body = JOBS[i % len(JOBS)]
        ts = TS + i
        ids["bull"].append(await _add_bullmq(link, "bull", name, body, ts))
        ids["lite"].append(await _add_lite(link, "lite", name, body, ts))
    assert ids["lite"] == ids["bull"]
    bull = await _snapshot(raw, redis_prefix, "bull")
    lite = await _snapshot(raw, redis_prefix, "lite")
    assert sorted(lite) == sorted(bull)
    for key in bull:
        assert lite[key] == bull[key], key
    # the comparison above must have covered the interesting keys
    assert {"wait", "meta", "id", "events", ids["bull"][-1]} <= set(bull)
    assert ("marker" in bull) == (
        case not in {"paused queue: no marker", "concurrency reached: no marker"}
    )
    if case.startswith("events trimmed"):
        assert len(bull["events"][1]) < 2 * n  # MAXLEN ~ did trim, the same way


async def test_dispatches_after_a_queues_first_take_the_lite_add(
    driver: RedisDriver, raw: aioredis.Redis, redis_prefix: str
) -> None:
    """Through ``enqueue``: the first job of a queue goes through BullMQ's script (and
    checks haze's template against bullmq's builder), the next ones through the lite
    add; both end up as BullMQ would have written them. (The HGETs of the timestamps
    move the rehash of queue a's job hashes on: a DUMP comparison failed here under
    about half of Redis's hash seeds, see the module docstring.)"""
    link = driver._link()
    bodies = [_body(i) for i in range(3)]
    for body in bodies:
        await driver.enqueue(body, Message(id="x", job="rd_plain", payload=None, queue="a"), 0)
        if body is bodies[0]:
            assert "a" in link.lite_adds
    # the same jobs, through BullMQ, with the timestamps the driver took
    for i, body in enumerate(bodies, 1):
        ts = int(await link.client.hget(f"{redis_prefix}:a:{i}", "timestamp"))
        await _add_bullmq(link, "b", "rd_plain", body, ts)
    a = await _snapshot(raw, redis_prefix, "a")
    b = await _snapshot(raw, redis_prefix, "b")
    assert a == b
    assert len(a["events"][1]) == 6


async def test_delayed_jobs_keep_bullmqs_script(driver: RedisDriver, redis_prefix: str) -> None:
    link = driver._link()
    for _ in range(2):
        await driver.enqueue(_body(0), Message(id="x", job="rd_plain", payload=None), 5.0)
    assert link.lite_adds == {}
    assert await link.client.zcard(f"{redis_prefix}:default:delayed") == 2


async def test_another_bullmq_script_turns_the_lite_add_off(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_link, "_ADD_STANDARD_SHA", "0" * 40)
    d = RedisDriver("r", {"url": REDIS_URL, "prefix": redis_prefix})
    try:
        link = d._link()
        assert link.add_lite is None
        for i in range(3):
            await d.enqueue(_body(i), Message(id="x", job="rd_plain", payload=None), 0)
        assert link.lite_adds == {}
        assert await link.client.llen(f"{redis_prefix}:default:wait") == 3
    finally:
        await d.close()


def test_the_lite_add_copies_the_installed_bullmq_script() -> None:
    """The driver compares the SHA at run time and falls back to BullMQ's script when it
    differs; this test says so loudly: after a bullmq upgrade, re-derive
    redis_add_job.lua from the new addStandardJob and update ``_ADD_STANDARD_SHA``."""
    installed = hashlib.sha1(loadScript("addStandardJob-9.lua").encode()).hexdigest()
    assert installed == redis_link._ADD_STANDARD_SHA


def test_the_opts_json_is_cjson_of_the_packed_opts() -> None:
    import msgpack  # type: ignore[import-untyped]

    opts = msgpack.unpackb(_Scripts._ADD_OPTS)
    assert json.dumps(opts, separators=(",", ":")) == _Scripts._ADD_OPTS_JSON
