"""Unique jobs (seed: 唯一任务; SPEC §5, §9, §11) on every driver.

The lock is taken at dispatch in the queue store (owner = message id) and released:
at start for ``until="processing"``; at the end for ``"processed"`` (final failure
included, retries and ``release()`` excluded); after ``for``; when the enqueue fails.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import haze
import pytest
from haze import JobContext, Queue, define_job

# ----------------------------------------------------------------------------- helpers

#: What the handlers saw, reset per test.
RUNS: list[dict[str, Any]] = []
#: Probes run inside a handler while it holds its lock: name -> async fn(payload, job).
PROBES: dict[str, Callable[[Any, JobContext], Awaitable[Any]]] = {}
#: Results recorded by probes.
SEEN: dict[str, Any] = {}


async def quietly(aw: Any) -> Any:
    """Await; return the raised exception instead of propagating it (sync raises)."""
    try:
        return await aw
    except Exception as e:
        return e


@pytest.fixture(autouse=True)
def _reset() -> Any:
    RUNS.clear()
    PROBES.clear()
    SEEN.clear()
    yield
    PROBES.clear()


async def _probe(payload: Any, job: JobContext) -> None:
    RUNS.append(
        {"id": job.id, "payload": payload, "attempt": job.attempt, "tenant": haze.current_tenant()}
    )
    name = (payload or {}).get("probe")
    if name and name in PROBES:
        await PROBES[name](payload, job)


def _feed_key(p: dict[str, Any]) -> str:
    return str(p["feed_id"])


@define_job(name="uq_sync_feed", unique={"key": _feed_key, "for": "1h"})
async def uq_sync_feed(payload: dict, job: JobContext) -> None:
    await _probe(payload, job)


@define_job(name="uq_plain", unique=True)
async def uq_plain(payload: dict, job: JobContext) -> None:
    await _probe(payload, job)


@define_job(name="uq_processing", unique={"key": _feed_key, "until": "processing"})
async def uq_processing(payload: dict, job: JobContext) -> None:
    await _probe(payload, job)


@define_job(name="uq_fails", unique={"key": _feed_key}, tries=1)
async def uq_fails(payload: dict, job: JobContext) -> None:
    await _probe(payload, job)
    raise RuntimeError("boom")


@define_job(name="uq_retry", unique={"key": _feed_key}, tries=2, backoff=0)
async def uq_retry(payload: dict, job: JobContext) -> None:
    await _probe(payload, job)
    if job.attempt == 1:
        raise RuntimeError("first attempt fails")


@define_job(name="uq_release", unique={"key": _feed_key}, tries=1)
async def uq_release(payload: dict, job: JobContext) -> None:
    await _probe(payload, job)
    if sum(1 for r in RUNS if r["payload"].get("feed_id") == payload["feed_id"]) == 1:
        job.release(0)


@define_job(name="uq_short", unique={"key": _feed_key, "for": "1m"})
async def uq_short(payload: dict, job: JobContext) -> None:
    await _probe(payload, job)


async def _async_key(p: dict[str, Any]) -> str:
    await asyncio.sleep(0)
    return f"acct-{p['acct']}"


@define_job(name="uq_async_key", unique={"key": _async_key})
async def uq_async_key(payload: dict, job: JobContext) -> None:
    await _probe(payload, job)


def _lock_keys(app: haze.App, job_name: str) -> list[str]:
    store = app.queue_store
    return [k for k in list(store._data) if k.startswith("haze:unique:") and job_name in k]  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- skipping


async def test_second_dispatch_is_skipped_while_the_job_runs(app, done):
    """While the holder runs, with_().dispatch() says skipped=True and Job.dispatch()
    returns the holder's id; another key is not affected."""

    async def probe(payload: dict, job: JobContext) -> None:
        res = await uq_sync_feed.with_({"feed_id": 1}).dispatch()
        SEEN["with"] = res
        SEEN["dispatch"] = await uq_sync_feed.dispatch({"feed_id": 1})
        SEEN["other"] = await uq_sync_feed.with_({"feed_id": 2}).dispatch()
        SEEN["holder"] = job.id

    PROBES["p"] = probe
    first = await uq_sync_feed.with_({"feed_id": 1, "probe": "p"}).dispatch()
    await done()

    assert first.skipped is False
    assert SEEN["with"].skipped is True
    assert SEEN["with"].id == first.id == SEEN["holder"]
    assert SEEN["dispatch"] == first.id
    assert SEEN["other"].skipped is False
    assert sorted(r["payload"]["feed_id"] for r in RUNS) == [1, 2]
    # released once processed: the next dispatch is accepted
    again = await uq_sync_feed.with_({"feed_id": 1}).dispatch()
    assert again.skipped is False
    await done()
    assert _lock_keys(app, "uq_sync_feed") == []


@pytest.mark.requires("delay")
async def test_queued_job_holds_the_lock_until_processed(app, done):
    first = await uq_plain.with_({"n": 1}).delay(0.05).dispatch()
    dup = await uq_plain.with_({"n": 2}).dispatch()
    assert dup.skipped is True
    assert dup.id == first.id
    assert await uq_plain.dispatch({"n": 3}) == first.id
    # the lock lives in the queue store, owned by the message id
    keys = _lock_keys(app, "uq_plain")
    assert len(keys) == 1
    assert await app.queue_store.get(keys[0]) == first.id
    await done()
    assert [r["payload"]["n"] for r in RUNS] == [1]
    assert _lock_keys(app, "uq_plain") == []
    assert (await uq_plain.with_({"n": 4}).dispatch()).skipped is False
    await done()


async def test_unique_true_means_one_per_job_name(app, done):
    async def probe(payload: dict, job: JobContext) -> None:
        SEEN["dup"] = await uq_plain.with_({"anything": "else"}).dispatch()

    PROBES["p"] = probe
    await uq_plain.dispatch({"probe": "p"})
    await done()
    assert SEEN["dup"].skipped is True


async def test_async_key_function(app, done):
    async def probe(payload: dict, job: JobContext) -> None:
        SEEN["same"] = await uq_async_key.with_({"acct": 1, "x": 2}).dispatch()
        SEEN["other"] = await uq_async_key.with_({"acct": 2}).dispatch()

    PROBES["p"] = probe
    await uq_async_key.dispatch({"acct": 1, "probe": "p"})
    await done()
    assert SEEN["same"].skipped is True
    assert SEEN["other"].skipped is False


# ----------------------------------------------------------------------------- release timing


async def test_until_processing_releases_at_start(app, done):
    async def probe(payload: dict, job: JobContext) -> None:
        SEEN["dup"] = await uq_processing.with_({"feed_id": 1}).dispatch()

    PROBES["p"] = probe
    await uq_processing.dispatch({"feed_id": 1, "probe": "p"})
    await done()
    assert SEEN["dup"].skipped is False
    assert len(RUNS) == 2
    assert _lock_keys(app, "uq_processing") == []


async def test_until_processed_releases_after_final_failure(app, driver, done):
    err = await quietly(uq_fails.dispatch({"feed_id": 7}))
    await done()
    if driver.inline:
        assert isinstance(err, RuntimeError)
    assert len(RUNS) == 1
    assert _lock_keys(app, "uq_fails") == []
    res = await quietly(uq_fails.with_({"feed_id": 7}).dispatch())
    if not driver.inline:
        assert res.skipped is False
    await done()
    assert len(RUNS) == 2


@pytest.mark.requires("retries")
async def test_lock_is_kept_across_a_retry(app, done):
    async def probe(payload: dict, job: JobContext) -> None:
        SEEN[f"dup{job.attempt}"] = await uq_retry.with_({"feed_id": 3}).dispatch()

    PROBES["p"] = probe
    first = await uq_retry.with_({"feed_id": 3, "probe": "p"}).dispatch()
    await done()
    assert [r["attempt"] for r in RUNS] == [1, 2]
    assert SEEN["dup1"].skipped is True
    assert SEEN["dup2"].skipped is True, "the lock must survive the retry"
    assert SEEN["dup2"].id == first.id
    assert _lock_keys(app, "uq_retry") == []


@pytest.mark.requires("release")
async def test_lock_is_kept_across_release(app, done):
    async def probe(payload: dict, job: JobContext) -> None:
        SEEN.setdefault("dups", []).append(await uq_release.with_({"feed_id": 4}).dispatch())

    PROBES["p"] = probe
    first = await uq_release.with_({"feed_id": 4, "probe": "p"}).dispatch()
    await done()
    assert len(RUNS) == 2  # released once, then ran again
    assert [d.skipped for d in SEEN["dups"]] == [True, True]
    assert {d.id for d in SEEN["dups"]} == {first.id}
    assert _lock_keys(app, "uq_release") == []


async def test_release_on_sync_drops_the_job_and_frees_the_lock(app, driver, done, caplog):
    if not driver.inline:
        pytest.skip("sync-only rule")
    with caplog.at_level(logging.WARNING, logger="haze"):
        await uq_release.dispatch({"feed_id": 5})
    assert len(RUNS) == 1
    assert "release()" in caplog.text
    assert _lock_keys(app, "uq_release") == []


async def test_lock_expires_after_for(app, done, monkeypatch):
    """The lock's TTL is ``for``; once it has passed, a new dispatch takes the lock. The
    store's clock is moved forward instead of sleeping for a minute."""
    from haze.stores import memory as memory_store

    if not isinstance(app.queue_store, memory_store.MemoryStore):
        pytest.skip("moves the memory store's clock")
    offset = [0.0]
    real = memory_store._monotonic
    monkeypatch.setattr(memory_store, "_monotonic", lambda: real() + offset[0])

    async def probe(payload: dict, job: JobContext) -> None:
        SEEN["before"] = await uq_short.with_({"feed_id": 1}).dispatch()
        SEEN["ttl"] = await job.app.queue_store.ttl(_lock_keys(job.app, "uq_short")[0])
        offset[0] = 61.0
        SEEN["after"] = await uq_short.with_({"feed_id": 1}).dispatch()

    PROBES["p"] = probe
    first = await uq_short.with_({"feed_id": 1, "probe": "p"}).dispatch()
    await done()
    assert SEEN["before"].skipped is True
    assert 0 < SEEN["ttl"] <= 60
    assert SEEN["after"].skipped is False
    assert SEEN["after"].id != first.id
    assert len(RUNS) == 2
    # the first job's end did not release the lock the second one now holds: owner check
    assert _lock_keys(app, "uq_short") == []


async def test_default_lock_lifetime_is_one_day(app, driver, done):
    async def probe(payload: dict, job: JobContext) -> None:
        keys = _lock_keys(job.app, "uq_plain")
        SEEN["ttl"] = await job.app.queue_store.ttl(keys[0])

    PROBES["p"] = probe
    await uq_plain.dispatch({"probe": "p"})
    await done()
    assert 86400 - 60 < SEEN["ttl"] <= 86400


@pytest.mark.requires("queued")
async def test_lock_released_when_the_enqueue_fails(app, monkeypatch):
    drv = app.driver("main")

    async def broken(body: str, message: Any, delay: float) -> None:
        raise ConnectionError("queue down")

    monkeypatch.setattr(drv, "enqueue", broken)
    with pytest.raises(ConnectionError):
        await uq_sync_feed.dispatch({"feed_id": 9})
    assert _lock_keys(app, "uq_sync_feed") == []
    monkeypatch.undo()
    res = await uq_sync_feed.with_({"feed_id": 9}).dispatch()
    assert res.skipped is False


# ----------------------------------------------------------------------------- tenants, batches


async def test_keys_are_isolated_per_tenant(app, done):
    async def probe(payload: dict, job: JobContext) -> None:
        SEEN["tenant"] = haze.current_tenant()
        with haze.tenant("b"):
            SEEN["b"] = await uq_sync_feed.with_({"feed_id": 1}).dispatch()
        with haze.tenant("a"):
            SEEN["a"] = await uq_sync_feed.with_({"feed_id": 1}).dispatch()
        SEEN["inherited"] = await uq_sync_feed.with_({"feed_id": 1}).dispatch()
        with haze.tenant(None):
            SEEN["central"] = await uq_sync_feed.with_({"feed_id": 1}).dispatch()

    PROBES["p"] = probe
    with haze.tenant("a"):
        await uq_sync_feed.dispatch({"feed_id": 1, "probe": "p"})
    await done()
    assert SEEN["tenant"] == "a"  # restored around handle
    assert SEEN["a"].skipped is True  # inside the job, tenant "a" is current
    assert SEEN["b"].skipped is False
    assert SEEN["inherited"].skipped is True  # the job runs as tenant "a"
    assert SEEN["central"].skipped is False  # central (no tenant) is another scope
    assert sorted(str(r["tenant"]) for r in RUNS) == ["None", "a", "b"]


async def test_batch_members_ignore_unique(app, done):
    batch = await Queue.batch(
        [uq_sync_feed.with_({"feed_id": 1}), uq_sync_feed.with_({"feed_id": 1})]
    ).dispatch()
    await done()
    assert len(RUNS) == 2
    assert (await batch.fresh()).processed == 2
    assert _lock_keys(app, "uq_sync_feed") == []


# ----------------------------------------------------------------------------- the store warning


async def test_warns_once_for_memory_store_with_remote_consumers(make_app, remote_sim, caplog):
    with caplog.at_level(logging.WARNING, logger="haze"):
        async with make_app(spec=remote_sim):
            await uq_sync_feed.dispatch({"feed_id": 1})
            await uq_sync_feed.dispatch({"feed_id": 2})
            await uq_plain.dispatch({"x": 1})
    warnings = [r for r in caplog.records if "consumed by other processes" in r.getMessage()]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert '"memory" store' in msg
    assert "unique jobs" in msg
    assert "redis" in msg


async def test_warning_only_for_remote_connections(app, driver, done, caplog):
    """The contract apps keep the default memory store: remote drivers warn, local ones not."""
    with caplog.at_level(logging.WARNING, logger="haze"):
        await uq_sync_feed.dispatch({"feed_id": 1})
        await uq_sync_feed.dispatch({"feed_id": 2})
        await done()
    warned = caplog.text.count("consumed by other processes")
    assert warned == (1 if driver.remote and not app.queue_store.shared else 0)


# ----------------------------------------------------------------------------- definition errors


@pytest.mark.parametrize(
    ("unique", "needle"),
    [
        ({"until": "x"}, "until"),
        ({"for": "soon"}, "for"),
        ({"for": 0}, "for"),
        ({"ttl": "1h"}, "ttl"),
        ({"key": "feed_id"}, "key"),
        ("yes", "unique"),
    ],
)
def test_bad_unique_options_fail_at_definition(unique, needle):
    with pytest.raises(ValueError, match=needle) as ei:

        @define_job(name="uq_bad_definition", unique=unique)
        async def bad(payload: dict) -> None: ...

    assert "uq_bad_definition" in str(ei.value)
    assert "uq_bad_definition" not in haze._jobs.definition.registered_jobs()


# ----------------------------------------------------------------------------- the fake


async def test_fake_simulates_locks_and_drain_releases_them(app, queue_fake):
    first = await uq_sync_feed.with_({"feed_id": 1}).dispatch()
    dup = await uq_sync_feed.with_({"feed_id": 1}).dispatch()
    holder = await uq_sync_feed.dispatch({"feed_id": 1})
    other = await uq_sync_feed.with_({"feed_id": 2}).dispatch()
    assert dup.skipped is True
    assert dup.id == first.id
    assert holder == first.id
    assert other.skipped is False

    queue_fake.assert_pushed_unique(uq_sync_feed, lambda p: p["feed_id"] == 1)
    queue_fake.assert_pushed_unique(uq_sync_feed, lambda p: p["feed_id"] == 2)
    queue_fake.assert_skipped(uq_sync_feed)
    queue_fake.assert_skipped(uq_sync_feed, lambda p: p["feed_id"] == 1)
    with pytest.raises(AssertionError):
        queue_fake.assert_skipped(uq_sync_feed, lambda p: p["feed_id"] == 2)
    with pytest.raises(AssertionError):
        queue_fake.assert_skipped(uq_plain)
    # the real store is untouched: the fake keeps its own locks
    assert _lock_keys(app, "uq_sync_feed") == []

    await queue_fake.drain()
    assert sorted(r["payload"]["feed_id"] for r in RUNS) == [1, 2]
    again = await uq_sync_feed.with_({"feed_id": 1}).dispatch()
    assert again.skipped is False
    with pytest.raises(AssertionError, match="exactly once"):
        queue_fake.assert_pushed_unique(uq_sync_feed, lambda p: p["feed_id"] == 1)


async def test_fake_assert_pushed_unique_rejects_a_non_unique_job(app, queue_fake):
    @define_job(name="uq_not_unique_fake")
    async def not_unique(payload: dict) -> None: ...

    await not_unique.dispatch({"a": 1})
    queue_fake.assert_dispatched(not_unique)
    with pytest.raises(AssertionError, match="not as a unique job"):
        queue_fake.assert_pushed_unique(not_unique)
    with pytest.raises(AssertionError):
        queue_fake.assert_pushed_unique(uq_plain)


async def test_fake_lock_released_after_a_failed_drain(app, queue_fake):
    await uq_fails.dispatch({"feed_id": 1})
    await queue_fake.drain()
    assert len(queue_fake.failed) == 1
    assert (await uq_fails.with_({"feed_id": 1}).dispatch()).skipped is False
