"""An ``encrypted`` job's payload is never written in plaintext, whatever carries it.

A chain link travels in the previous link's ``chain`` field, a chain's ``catch`` in
every link's ``chain_catch``, a batch's callbacks in its store record (kept for days),
a batch inside a chain in a ``{"batch": spec}`` link, a failed job in the failed store,
a unique lock's key in the lock store. These tests dispatch all of them with a marker
in the payloads, then read what haze wrote as raw bytes: the SQLite database file (and
its WAL, free pages included, so a row written and later deleted still shows) and
every Redis key of the test, read value by value on a real Redis. The marker must not
appear anywhere, and every job must still run with its plaintext payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from haze import (
    App,
    JobContext,
    Queue,
    define_cache_config,
    define_database_config,
    define_job,
    define_queue_config,
    define_redis_config,
    limit_concurrency,
    rate_limited,
    throttles_exceptions,
    without_overlapping,
)
from haze._base.crypto import generate_key, open_failed
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables
from haze.transactions import register_provider, unregister_provider
from redis_spec import REDIS_URL, delete_prefix, needs_redis, unique_prefix

MARKER = "PLAINTEXT-MARKER-4242"

ran: list[tuple[str, Any]] = []


@define_job(name="sec_rest_plain")
async def sec_rest_plain(payload: Any) -> None:
    ran.append(("plain", payload))


@define_job(name="sec_rest_link", encrypted=True, tries=1)
async def sec_rest_link(payload: dict[str, Any], job: JobContext) -> None:
    ran.append(("link", payload))
    if payload.get("fail"):
        raise RuntimeError("declined")  # no payload in the message: it is stored too


@define_job(name="sec_rest_cb", encrypted=True)
async def sec_rest_cb(payload: dict[str, Any]) -> None:
    ran.append(("cb", payload))


@define_job(
    name="sec_rest_unique", encrypted=True, unique={"key": lambda p: p["card"], "for": "1h"}
)
async def sec_rest_unique(payload: dict[str, Any]) -> None:
    ran.append(("unique", payload))


def secret(tag: str, **extra: Any) -> dict[str, Any]:
    return {"card": f"{MARKER}:{tag}", **extra}


async def dispatch_everything() -> None:
    """Every way a payload of an encrypted job is written, some of it left waiting."""
    # Left waiting (a 1 h delay on the first link): the rest of the chain, its catch,
    # and a batch inside it, sit in that message until the raw read.
    await (
        Queue.chain(
            [
                sec_rest_plain.with_({"n": "waiting"}).delay("1h"),
                sec_rest_link.with_(secret("waiting-link")),
                Queue.batch([sec_rest_link.with_(secret("waiting-batch-member"))]).then(
                    sec_rest_cb.with_(secret("waiting-batch-then"))
                ),
            ]
        )
        .catch(sec_rest_cb.with_(secret("waiting-catch")))
        .dispatch()
    )
    # A unique lock whose key is computed from the secret, held by a waiting job.
    await sec_rest_unique.with_(secret("unique")).delay("1h").dispatch()
    # Run now: a chain whose links pass the secret on, then fail with a catch.
    await (
        Queue.chain(
            [
                sec_rest_plain.with_({"n": "head"}),
                sec_rest_link.with_(secret("link-1")),
                sec_rest_link.with_(secret("link-2", fail=True)),
                sec_rest_link.with_(secret("never-runs")),
            ]
        )
        .catch(sec_rest_cb.with_(secret("chain-catch")))
        .dispatch()
    )
    # A batch (with a chain inside) whose callbacks carry the secret, and one that fails.
    await (
        Queue.batch(
            [
                sec_rest_link.with_(secret("member")),
                [sec_rest_link.with_(secret("inner-1")), sec_rest_link.with_(secret("inner-2"))],
            ]
        )
        .then(sec_rest_cb.with_(secret("then")))
        .catch(sec_rest_cb.with_(secret("never-caught")))
        .finally_(sec_rest_cb.with_(secret("finally")))
        .dispatch()
    )
    await (
        Queue.batch([sec_rest_link.with_(secret("member-fails", fail=True))])
        .then(sec_rest_cb.with_(secret("never-then")))
        .catch(sec_rest_cb.with_(secret("catch")))
        .finally_(sec_rest_cb.with_(secret("finally-failed")))
        .dispatch()
    )


EXPECTED_RUNS = {
    ("plain", "head"),
    ("link", "link-1"),
    ("link", "link-2"),
    ("cb", "chain-catch"),
    ("link", "member"),
    ("link", "inner-1"),
    ("link", "inner-2"),
    ("link", "member-fails"),
    ("cb", "then"),
    ("cb", "catch"),
    ("cb", "finally"),
    ("cb", "finally-failed"),
}


def runs() -> set[tuple[str, str]]:
    out = set()
    for kind, payload in ran:
        if kind == "plain":
            out.add((kind, payload["n"]))
        else:
            assert payload["card"].startswith(MARKER + ":")  # decrypted for the job
            out.add((kind, payload["card"].removeprefix(MARKER + ":")))
    return out


async def drain(app: App, connection: str) -> None:
    """Work until the chains and batch have settled (callbacks are dispatched late)."""
    for _ in range(40):
        await Worker(app, connection, ["default"], 4, sleep=0.02, stop_when_empty=True).run()
        if runs() >= EXPECTED_RUNS:
            return
        await asyncio.sleep(0.05)


def assert_no_marker(blobs: dict[str, bytes]) -> None:
    leaks = [where for where, data in blobs.items() if MARKER.encode() in data]
    assert not leaks, f"the plaintext marker is stored in: {leaks[:10]}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


# --------------------------------------------------------------------------- SQLite


def sqlite_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.parent.glob(path.name + "*")}


async def test_sqlite_file_holds_no_plaintext(tmp_path: Path) -> None:
    db = tmp_path / "queue.db"
    app = App(
        queue=define_queue_config(
            default="db",
            connections={"db": {"driver": "database", "connection": "main", "retry_after": 30}},
            store="database",
        ),
        cache=define_cache_config(
            stores={"database": {"driver": "database", "connection": "main"}}
        ),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{db}"}}
        ),
        key=generate_key(),
    )
    async with app:
        await ensure_queue_tables(app)
        await dispatch_everything()
        assert_no_marker(sqlite_bytes(db))
        await drain(app, "db")
        assert runs() == EXPECTED_RUNS
        failed = await Queue.failed()
        assert sorted(f.name for f in failed) == ["sec_rest_link", "sec_rest_link"]
        assert all(f.payload is None and MARKER not in f.body for f in failed)
        assert_no_marker(sqlite_bytes(db))
    assert_no_marker(sqlite_bytes(db))
    # the test can see a marker: a plain job's payload is in the file
    async with app:
        await sec_rest_plain.with_({"n": MARKER}).delay("1h").dispatch()
    assert any(MARKER.encode() in data for data in sqlite_bytes(db).values())


# --------------------------------------------------------------------------- Redis


def redis_values(token: str) -> dict[str, bytes]:
    """Every key containing ``token`` and every byte of its value, read by type (not
    DUMP, whose RDB encoding can compress a string)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    out: dict[str, bytes] = {}
    try:
        for key in client.scan_iter(match=f"*{token}*", count=1000):
            kind = client.type(key).decode()
            parts: list[bytes] = [key]
            if kind == "string":
                parts.append(client.get(key) or b"")
            elif kind == "hash":
                for k, v in client.hgetall(key).items():
                    parts += [k, v]
            elif kind == "list":
                parts += client.lrange(key, 0, -1)
            elif kind == "set":
                parts += list(client.smembers(key))
            elif kind == "zset":
                parts += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
            elif kind == "stream":
                for _id, fields in client.xrange(key):
                    for k, v in fields.items():
                        parts += [k, v]
            else:
                raise AssertionError(f"unexpected Redis type {kind} for {key!r}")
            out[key.decode()] = b"\x00".join(parts)
    finally:
        client.close()
    return out


@needs_redis
async def test_redis_keys_hold_no_plaintext() -> None:
    token = unique_prefix("enc")
    app = App(
        queue=define_queue_config(
            default="r",
            connections={"r": {"driver": "redis", "url": REDIS_URL, "prefix": f"{token}q"}},
            store="redis",
        ),
        redis=define_redis_config(
            default="default",
            connections={"default": {"url": REDIS_URL, "key_prefix": f"{token}s:"}},
        ),
        cache=define_cache_config(stores={"redis": {"driver": "redis", "connection": "default"}}),
        key=generate_key(),
    )
    try:
        async with app:
            await dispatch_everything()
            before = redis_values(token)
            assert any(":batch:" in k for k in before), sorted(before)  # the batch record
            assert_no_marker(before)
            await drain(app, "r")
            assert runs() == EXPECTED_RUNS
            failed = await Queue.failed()
            assert sorted(f.name for f in failed) == ["sec_rest_link", "sec_rest_link"]
            assert_no_marker(redis_values(token))
            # the reader sees a marker where one is stored in plaintext
            await sec_rest_plain.with_({"n": MARKER}).delay("1h").dispatch()
            assert any(MARKER.encode() in v for v in redis_values(token).values())
    finally:
        delete_prefix(token)


# --------------------------------------------------------------------------- after commit


class _Tx:
    """A transaction whose after-commit callbacks this test can inspect and fire."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], Any]] = []

    def on_commit(self, callback: Callable[[], Any]) -> None:
        self.callbacks.append(callback)


def _buffered_strings(callback: object) -> list[str]:
    """The strings a buffered after-commit callback keeps: what its closure holds, its
    messages' fields and the containers in them (not the manager or the app)."""
    from haze._base.message import Message

    out: list[str] = []
    seen: set[int] = set()
    todo = [callback]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, str):
            out.append(obj)
        elif isinstance(obj, bytes):
            out.append(obj.decode("latin-1"))
        elif isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, Message):
            todo.extend(getattr(obj, f) for f in Message.__slots__)
        elif callable(obj) and hasattr(obj, "__closure__"):
            todo.extend(c.cell_contents for c in obj.__closure__ or () if c.cell_contents)
            todo.extend(getattr(obj, "__defaults__", None) or ())
    return out


@contextlib.asynccontextmanager
async def _in_transaction() -> AsyncIterator[_Tx]:
    tx = _Tx()

    def provider() -> _Tx:
        return tx

    register_provider(provider)
    try:
        yield tx
    finally:
        unregister_provider(provider)


async def test_the_after_commit_buffer_holds_no_plaintext(tmp_path: Path) -> None:
    app = App(
        queue=define_queue_config(default="memory", connections={"memory": {"driver": "memory"}}),
        key=generate_key(),
    )
    async with app:
        async with _in_transaction() as tx:
            result = await sec_rest_cb.with_(secret("buffered")).after_commit().dispatch()
        assert result.deferred
        [callback] = tx.callbacks
        strings = _buffered_strings(callback)
        assert any(s == "sec_rest_cb" for s in strings), "the buffer holds the message"
        assert not [s for s in strings if MARKER in s]
        result_of_commit = callback()
        if asyncio.iscoroutine(result_of_commit):
            await result_of_commit
        await Queue.idle()
    assert ran == [("cb", secret("buffered"))]


# --------------------------------------------------------------------------- the fake


async def test_the_fake_compares_the_plain_payloads_of_encrypted_links() -> None:
    app = App(
        queue=define_queue_config(default="memory", connections={"memory": {"driver": "memory"}}),
        key=generate_key(),
    )
    async with app:
        fake = Queue.fake()
        try:
            await Queue.chain(
                [sec_rest_link.with_(secret("a")), sec_rest_link.with_(secret("b"))]
            ).dispatch()
            [links] = fake.chains
            assert all("enc" in link and "payload" not in link for link in links)
            fake.assert_chained(
                [sec_rest_link.with_(secret("a")), sec_rest_link.with_(secret("b"))]
            )
            with pytest.raises(AssertionError):
                fake.assert_chained(
                    [sec_rest_link.with_(secret("a")), sec_rest_link.with_(secret("c"))]
                )
        finally:
            Queue.restore()


# --------------------------------------------------------------------------- failures, results


@define_job(
    name="sec_rest_raises",
    encrypted=True,
    tries=1,
    track=True,
    middleware=[
        rate_limited("sec-rest", max=100, per="1h", key=lambda p: p["card"]),
        without_overlapping(key=lambda p: p["card"]),
        throttles_exceptions(max=5, per="1h", key=lambda p: p["card"]),
        limit_concurrency(2, key=lambda p: p["card"]),
    ],
)
async def sec_rest_raises(payload: dict[str, Any], job: JobContext) -> None:
    job.progress({"at": payload["card"]})
    ran.append(("raises", payload))
    raise ValueError(f"card {payload['card']} declined")  # the README's own example


@define_job(name="sec_rest_result", encrypted=True, keep_result="1h")
async def sec_rest_result(payload: dict[str, Any], job: JobContext) -> dict[str, Any]:
    job.progress({"at": payload["card"]})
    ran.append(("result", payload))
    return {"echo": payload["card"]}


async def fail_and_keep(caplog: pytest.LogCaptureFixture, app: App, connection: str) -> str:
    """Dispatch a failing and a result-keeping encrypted job, work them, and check what
    the app itself shows of them (decrypted, with its key). Returns the result job's id."""
    failing = await sec_rest_raises.dispatch(secret("fails"))
    kept = await sec_rest_result.dispatch(secret("kept"))
    with caplog.at_level(logging.DEBUG, logger="haze"):
        for _ in range(40):
            await Worker(app, connection, ["default"], 2, sleep=0.02, stop_when_empty=True).run()
            if len(ran) >= 2:
                break
    assert {kind for kind, _ in ran} == {"raises", "result"}
    logged = "\n".join(r.getMessage() + str(r.exc_info) for r in caplog.records)
    assert MARKER not in logged, "a log line carries the exception text"
    assert "ValueError (encrypted)" in logged
    [failed] = await Queue.failed()
    assert failed.exception == "ValueError (encrypted)" and MARKER not in failed.body
    payload, exception = open_failed(app, failed)
    assert payload == secret("fails") and f"card {MARKER}:fails declined" in exception
    status = await Queue.status(kept)
    assert status is not None and status.state == "done" and status.encrypted
    assert status.result == {"echo": f"{MARKER}:kept"}
    assert status.progress == {"at": f"{MARKER}:kept"}
    failing_status = await Queue.status(failing)
    assert failing_status is not None and failing_status.state == "failed"
    assert failing_status.error is not None and MARKER in failing_status.error
    return kept


def sqlite_app(db: Path, key: str | None) -> App:
    return App(
        queue=define_queue_config(
            default="db",
            connections={"db": {"driver": "database", "connection": "main", "retry_after": 30}},
            store="database",
        ),
        cache=define_cache_config(
            stores={"database": {"driver": "database", "connection": "main"}}
        ),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{db}"}}
        ),
        key=key,
    )


async def test_sqlite_failures_results_and_middleware_keys_hold_no_plaintext(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "queue.db"
    app = sqlite_app(db, generate_key())
    async with app:
        await ensure_queue_tables(app)
        kept = await fail_and_keep(caplog, app, "db")
        assert_no_marker(sqlite_bytes(db))
    # Without the key, the record says it is encrypted and shows nothing.
    monkeypatch.delenv("APP_KEY", raising=False)
    async with sqlite_app(db, None):
        status = await Queue.status(kept)
        assert status is not None and status.encrypted and status.result is None
        assert status.progress is None and status.state == "done"


@needs_redis
async def test_redis_failures_results_and_middleware_keys_hold_no_plaintext(
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = unique_prefix("encf")
    app = App(
        queue=define_queue_config(
            default="r",
            connections={"r": {"driver": "redis", "url": REDIS_URL, "prefix": f"{token}q"}},
            store="redis",
        ),
        redis=define_redis_config(
            default="default",
            connections={"default": {"url": REDIS_URL, "key_prefix": f"{token}s:"}},
        ),
        cache=define_cache_config(stores={"redis": {"driver": "redis", "connection": "default"}}),
        key=generate_key(),
    )
    try:
        async with app:
            await fail_and_keep(caplog, app, "r")
            stored = redis_values(token)
            assert any(":mw:" in k for k in stored), sorted(stored)  # the middleware keys
            assert_no_marker(stored)
    finally:
        delete_prefix(token)
