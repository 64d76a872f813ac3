"""The ``redis`` driver against a real Redis: BullMQ's data model, attempts, stalled
jobs, priorities, failed jobs and undecodable messages."""

from __future__ import annotations

import asyncio
import builtins
import importlib
import itertools
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from haze import App, JobContext, Queue, define_job, define_queue_config, define_redis_config
from haze._app.driver_context import AppDriverContext
from haze._base.errors import ConfigError, MissingDependencyError
from haze._workers.worker import Worker
from haze.drivers.redis import RedisDriver
from haze.drivers.redis.scripts import _NewJob
from redis_spec import REDIS_URL, needs_redis

pytestmark = needs_redis

RUNS: list[dict[str, Any]] = []
GATE: dict[str, asyncio.Event] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    RUNS.clear()
    GATE.clear()


def _seen(name: str, payload: Any, job: JobContext) -> None:
    RUNS.append(
        {
            "job": name,
            "payload": payload,
            "attempt": job.attempt,
            "id": job.id,
            "queue": job.queue,
            "at": time.monotonic(),
        }
    )


@define_job(name="rd_plain")
async def rd_plain(payload: Any, job: JobContext) -> None:
    _seen("rd_plain", payload, job)
    gate = GATE.get(str(payload.get("gate"))) if isinstance(payload, dict) else None
    if gate is not None:
        await gate.wait()


@define_job(name="rd_flaky", tries=3, backoff=[0.2, 0.4])
async def rd_flaky(payload: Any, job: JobContext) -> None:
    _seen("rd_flaky", payload, job)
    if job.attempt < 3:
        raise ValueError(f"flaky {job.attempt}")


@define_job(name="rd_always_fails", tries=2)
async def rd_always_fails(payload: Any, job: JobContext) -> None:
    _seen("rd_always_fails", payload, job)
    if not (isinstance(payload, dict) and payload.get("ok_on_retry") and "ok" in GATE):
        raise ValueError("boom")


@define_job(name="rd_releases", tries=1)
async def rd_releases(payload: Any, job: JobContext) -> None:
    _seen("rd_releases", payload, job)
    if sum(1 for r in RUNS if r["job"] == "rd_releases") < 3:
        job.release(0.1)


@define_job(name="rd_slow", tries=1)
async def rd_slow(payload: Any, job: JobContext) -> None:
    _seen("rd_slow", payload, job)
    await asyncio.sleep(float(payload))


async def _until(pred: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.01)


async def _work(
    app: App,
    pred: Callable[[], bool],
    *,
    queues: list[str] | None = None,
    concurrency: int = 1,
    within: float = 10.0,
) -> Worker:
    w = Worker(app, "r", queues, concurrency, sleep=0.05, max_sleep=0.2)
    w.start()
    try:
        await _until(pred, within)
    finally:
        await w.stop()
    return w


def _client() -> aioredis.Redis:
    return aioredis.Redis.from_url(REDIS_URL, decode_responses=True)


# ----------------------------------------------------------------------------- key layout


async def test_a_colon_in_a_queue_name_or_prefix_is_refused(redis_app, redis_prefix):
    """Keys are ``<prefix>:<queue>:<suffix>``: with a ``:`` allowed in both, the prefix
    ``p`` and the queue ``a:b`` would share their keys with the prefix ``p:a`` and the
    queue ``b``."""
    async with redis_app() as app:
        with pytest.raises(ValueError, match="cannot contain ':'") as info:
            await rd_plain.dispatch({"n": 1}, queue="a:b")
        assert "\n" not in str(info.value)
        with pytest.raises(ValueError, match="cannot contain ':'"):
            await Queue.size("a:b")
        with pytest.raises(ConfigError, match="cannot contain ':'"):
            Worker(app, "r", ["default", "a:b"])
    for options in ({"prefix": f"{redis_prefix}:a"}, {"queues": ["default", "a:b"]}):
        with pytest.raises(ConfigError, match="cannot contain ':'") as config_error:
            async with redis_app(**options):
                pass
        assert "\n" not in str(config_error.value)
    r = _client()
    try:
        assert await r.keys(f"{redis_prefix}*") == []
    finally:
        await r.aclose()


async def test_a_colon_in_a_later_link_of_a_chain_is_refused_at_dispatch(redis_app, redis_prefix):
    """A chain's later links are queued only when the link before them succeeds: a
    ``:`` found then lost the rest of the chain (logged, the job acked). It is refused
    when the chain, or a batch holding it, is dispatched, and nothing is queued."""
    async with redis_app():
        attempts = [
            lambda: Queue.chain([rd_plain.with_({"n": 1}), rd_plain.with_({}).on_queue("a:b")]),
            lambda: Queue.batch(
                [rd_plain.with_({"n": 0}), [rd_plain.with_({}), rd_plain.with_({}).on_queue("a:b")]]
            ),
            lambda: Queue.chain(
                [rd_plain.with_({"n": 1}), Queue.batch([rd_plain.with_({}).on_queue("a:b")])]
            ),
        ]
        for pending in attempts:
            with pytest.raises(ValueError, match="cannot contain ':'") as info:
                await pending().dispatch()
            assert "\n" not in str(info.value)
        assert await Queue.size("default") == 0


# ----------------------------------------------------------------------------- data model


async def test_jobs_are_bullmq_jobs_named_after_the_haze_job(redis_app, redis_prefix):
    async with redis_app() as app:
        job_id = await rd_plain.dispatch({"n": 1})
        r = _client()
        try:
            [bull_id] = await r.lrange(f"{redis_prefix}:default:wait", 0, -1)
            h = await r.hgetall(f"{redis_prefix}:default:{bull_id}")
        finally:
            await r.aclose()
        assert h["name"] == "rd_plain"
        data = json.loads(h["data"])
        assert data["id"] == job_id
        assert data["job"] == "rd_plain"
        assert data["payload"] == {"n": 1}
        assert json.loads(h["opts"])["attempts"] == 1  # BullMQ never retries on its own
        assert await Queue.size() == 1
        await _work(app, lambda: len(RUNS) == 1)
        assert RUNS[0]["id"] == job_id
        assert RUNS[0]["attempt"] == 1
        assert await Queue.size() == 0


async def test_bulk_is_one_multi_and_keeps_the_order(redis_app, redis_prefix):
    async with redis_app() as app:
        driver = app.driver()
        assert isinstance(driver, RedisDriver)
        calls: list[str] = []
        link = driver._link()
        # the per-job calls use the driver's lean connection when it can (redis_wire)
        target, attr = (
            (link.client, "pipeline") if link.wire is None else (link.wire, "execute_many")
        )
        orig = getattr(target, attr)

        def spy(*a: Any, **kw: Any) -> Any:
            if attr == "execute_many":
                assert a[0][0] == ("MULTI",) and a[0][-1] == ("EXEC",)
            calls.append("pipeline")
            return orig(*a, **kw)

        setattr(target, attr, spy)
        ids = await Queue.bulk(
            [rd_plain.with_({"n": i}) for i in range(50)]
            + [rd_plain.with_({"n": "later"}).delay(0.2)]
        )
        setattr(target, attr, orig)
        assert calls == ["pipeline"]
        assert len(ids) == 51
        assert len(set(ids)) == 51
        assert await Queue.size() == 51
        await _work(app, lambda: len(RUNS) == 51)
        assert [r["payload"]["n"] for r in RUNS] == [*range(50), "later"]
        assert [r["id"] for r in RUNS] == ids


async def test_delay_uses_the_delayed_set(redis_app, redis_prefix):
    async with redis_app() as app:
        started = time.monotonic()
        await rd_plain.dispatch({"n": 1}, delay=0.4)
        r = _client()
        try:
            assert await r.zcard(f"{redis_prefix}:default:delayed") == 1
            assert await r.llen(f"{redis_prefix}:default:wait") == 0
        finally:
            await r.aclose()
        assert await Queue.size() == 1
        await _work(app, lambda: len(RUNS) == 1)
        assert RUNS[0]["at"] - started >= 0.38


async def test_purge_clears_waiting_and_delayed(redis_app):
    async with redis_app():
        await rd_plain.dispatch({"n": 1})
        await rd_plain.dispatch({"n": 2}, delay=30)
        await Queue.bulk([rd_plain.with_({"n": 3}), rd_plain.with_({"n": 4}).on_queue("other")])
        assert await Queue.size() == 3
        assert await Queue.clear() == 3
        assert await Queue.size() == 0
        assert await Queue.size("other") == 1


# ----------------------------------------------------------------------------- attempts


async def test_retries_use_haze_backoff_and_count_attempts(redis_app, redis_prefix):
    async with redis_app() as app:
        await rd_flaky.dispatch({"n": 1})
        await _work(app, lambda: len(RUNS) == 3)
        assert [r["attempt"] for r in RUNS] == [1, 2, 3]
        gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(RUNS)]
        assert gaps[0] >= 0.18, gaps
        assert gaps[1] >= 0.38, gaps
        assert await Queue.failed() == []
        r = _client()
        try:
            [bull_id] = await r.zrange(f"{redis_prefix}:default:completed", 0, -1)
            h = await r.hgetall(f"{redis_prefix}:default:{bull_id}")
        finally:
            await r.aclose()
        assert h["atm"] == "3"  # BullMQ's attemptsMade: two retries and the success


async def test_release_consumes_no_try_and_keeps_the_job(redis_app, redis_prefix):
    async with redis_app() as app:
        await rd_releases.dispatch({"n": 1})
        await _work(app, lambda: len(RUNS) == 3)
        assert [r["attempt"] for r in RUNS] == [1, 1, 1]
        assert (RUNS[1]["at"] - RUNS[0]["at"]) >= 0.09
        assert await Queue.failed() == []
        r = _client()
        try:
            assert await r.zcard(f"{redis_prefix}:default:completed") == 1  # the same job
        finally:
            await r.aclose()


async def test_final_failure_goes_to_the_bullmq_failed_set(redis_app, redis_prefix):
    async with redis_app() as app:
        job_id = await rd_always_fails.dispatch({"n": 1})
        await _work(app, lambda: len(RUNS) == 2)
        await asyncio.sleep(0.1)
        r = _client()
        try:
            [bull_id] = await r.zrange(f"{redis_prefix}:default:failed", 0, -1)
            h = await r.hgetall(f"{redis_prefix}:default:{bull_id}")
        finally:
            await r.aclose()
        assert h["failedReason"] == "ValueError: boom"
        assert "Traceback" in json.loads(h["stacktrace"])[-1]
        [failed] = await Queue.failed()
        assert failed.id == job_id
        assert failed.name == "rd_always_fails"
        assert failed.queue == "default"
        assert failed.connection == "r"
        assert failed.payload == {"n": 1}
        assert failed.exception.startswith("Traceback")
        assert "ValueError: boom" in failed.exception
        assert [r["attempt"] for r in RUNS] == [1, 2]


# ----------------------------------------------------------------------------- stalled jobs


async def test_stalled_job_comes_back_and_counts_the_restart(redis_app, redis_prefix):
    async with redis_app(retry_after=0.3) as app:
        driver = app.driver()
        assert isinstance(driver, RedisDriver)
        job_id = await rd_plain.dispatch({"n": 1})
        # a worker claims the job, then dies: nobody renews its lock
        claimed = await driver.reserve(["default"], 0)
        assert claimed is not None
        assert claimed.attempt == 1
        assert claimed.message is not None
        assert claimed.message.id == job_id
        assert await driver.reserve(["default"], 0) is None
        # the stalled check (the worker side runs it every retry_after; here also by
        # hand) marks the active job, then finds its lock expired and puts it back
        r = _client()
        try:
            deadline = time.monotonic() + 5
            while not await r.llen(f"{redis_prefix}:default:wait"):
                assert time.monotonic() < deadline, "the stalled job did not come back"
                await driver.check_stalled(["default"])
                await asyncio.sleep(0.05)
            assert await r.hget(f"{redis_prefix}:default:{claimed.token[0]}", "stc") == "1"
        finally:
            await r.aclose()
        again = await driver.reserve(["default"], 1.0)
        assert again is not None
        assert again.message is not None
        assert again.message.id == job_id
        assert again.attempt == 2
        # the dead worker's late ack is refused: the job belongs to the new claim
        await driver.ack(claimed)
        assert await driver.size("default") == 1
        await driver.ack(again)
        assert await driver.size("default") == 0


async def test_stalled_job_without_tries_left_fails_without_running(redis_app):
    async with redis_app(retry_after=0.2) as app:
        driver = app.driver()
        job_id = await rd_slow.dispatch("0")
        assert await driver.reserve(["default"], 0) is not None  # the worker that dies
        w = Worker(app, "r", None, 1, sleep=0.05, max_sleep=0.1)
        w.start()  # its stalled check returns the job; the manager fails it (tries=1)
        try:
            deadline = time.monotonic() + 5
            failed: list[Any] = []
            while not failed and time.monotonic() < deadline:
                failed = await Queue.failed()
                await asyncio.sleep(0.05)
        finally:
            await w.stop()
        assert RUNS == []
        assert [f.id for f in failed] == [job_id]
        assert "MaxAttemptsExceededError" in failed[0].exception


async def test_heartbeat_keeps_a_long_job_from_being_reclaimed(redis_app):
    async with redis_app(retry_after=0.3, concurrency=2) as app:
        await rd_slow.dispatch("1.2")
        w = Worker(app, "r", None, 2, sleep=0.05, max_sleep=0.1)
        w.start()
        try:
            await _until(lambda: len(RUNS) == 1)
            await asyncio.sleep(1.6)
        finally:
            await w.stop()
        assert [r["attempt"] for r in RUNS] == [1]
        assert await Queue.failed() == []
        assert await Queue.size() == 0


# ----------------------------------------------------------------------------- priority


async def test_queues_in_priority_order(redis_app):
    async with redis_app(queues=["high", "default"]) as app:
        for i in range(3):
            await rd_plain.dispatch({"n": f"d{i}"})
        for i in range(3):
            await rd_plain.dispatch({"n": f"h{i}"}, queue="high")
        await _work(app, lambda: len(RUNS) == 6, queues=["high", "default"])
        assert [r["payload"]["n"] for r in RUNS] == ["h0", "h1", "h2", "d0", "d1", "d2"]


async def test_a_prefetch_never_jumps_a_higher_queue(redis_app):
    """While a ``default`` job runs, ``high`` jobs arrive: the next job is a ``high``
    one even though finishing a job can fetch the next one of its own queue."""
    async with redis_app() as app:
        GATE["g"] = asyncio.Event()
        await rd_plain.dispatch({"n": "d0", "gate": "g"})
        await rd_plain.dispatch({"n": "d1"})
        w = Worker(app, "r", ["high", "default"], 1, sleep=0.05, max_sleep=0.1)
        w.start()
        try:
            await _until(lambda: len(RUNS) == 1)
            await rd_plain.dispatch({"n": "h0"}, queue="high")
            GATE["g"].set()
            await _until(lambda: len(RUNS) == 3)
        finally:
            await w.stop()
        assert [r["payload"]["n"] for r in RUNS] == ["d0", "h0", "d1"]


async def test_a_prefetched_job_goes_back_to_the_head_of_the_queue(redis_app, redis_prefix):
    async with redis_app() as app:
        for i in range(4):
            await rd_plain.dispatch({"n": i})
        w = Worker(app, "r", None, 1, max_jobs=1, sleep=0.05)
        await w.run()
        await asyncio.sleep(0.1)
        assert [r["payload"]["n"] for r in RUNS] == [0]
        r = _client()
        try:
            assert await r.llen(f"{redis_prefix}:default:active") == 0
        finally:
            await r.aclose()
        assert await Queue.size() == 3
        await _work(app, lambda: len(RUNS) == 4)
        assert [r["payload"]["n"] for r in RUNS] == [0, 1, 2, 3]
        assert [r["attempt"] for r in RUNS] == [1, 1, 1, 1]


# ----------------------------------------------------------------------------- failed jobs


async def test_failed_list_find_retry_forget_flush(redis_app):
    async with redis_app(queues=["default", "mail"]) as app:
        a = await rd_always_fails.dispatch({"n": "a", "ok_on_retry": True})
        b = await rd_always_fails.dispatch({"n": "b"}, queue="mail")
        c = await rd_always_fails.dispatch({"n": "c"})
        await _work(app, lambda: len(RUNS) == 6, queues=["default", "mail"])
        await asyncio.sleep(0.1)
        failed = await Queue.failed()
        assert sorted(f.id for f in failed) == sorted([a, b, c])
        assert [f.id for f in await Queue.failed(queue="mail")] == [b]
        driver = app.driver()
        found = await driver.failed.find(b)
        assert found is not None
        assert found.queue == "mail"
        assert found.payload == {"n": "b"}
        fresh = RedisDriver(
            "r",
            {"url": REDIS_URL, "prefix": driver.prefix, "queues": ["default", "mail"]},
            AppDriverContext(app, "r", "'redis'"),
        )
        try:  # a new process: finds the job by its haze id with the server-side scan
            again = await fresh.failed.find(a)
            assert again is not None
            assert again.id == a
            assert await fresh.failed.find("0" * 32) is None
        finally:
            await fresh.close()

        RUNS.clear()
        GATE["ok"] = asyncio.Event()
        assert await Queue.retry(a) == [a]
        await _work(app, lambda: len(RUNS) == 1)
        assert RUNS[0]["payload"]["n"] == "a"
        assert RUNS[0]["attempt"] == 1
        assert sorted(f.id for f in await Queue.failed()) == sorted([b, c])

        assert await Queue.forget(c) is True
        assert await Queue.forget(c) is False
        assert [f.id for f in await Queue.failed()] == [b]
        assert await Queue.flush(older_than=3600) == 0
        assert await Queue.flush() == 1
        assert await Queue.failed() == []


async def test_undecodable_and_unknown_jobs_fail_with_a_clear_error(redis_app, redis_prefix):
    async with redis_app() as app:
        driver = app.driver()
        assert isinstance(driver, RedisDriver)
        scripts = driver._link().scripts("default")
        now = round(time.time() * 1000)
        await scripts.addJob(_NewJob("rd_bad", "{not json", 0, now))
        await scripts.addJob(
            _NewJob(
                "rd_nobody",
                json.dumps({"v": 1, "id": "f" * 32, "job": "rd_nobody_defines_this", "payload": 1}),
                0,
                now,
            )
        )
        w = Worker(app, "r", None, 1, sleep=0.05)
        w.start()
        try:
            deadline = time.monotonic() + 5
            failed: list[Any] = []
            while len(failed) < 2 and time.monotonic() < deadline:
                failed = await Queue.failed()
                await asyncio.sleep(0.05)
        finally:
            await w.stop()
        assert len(failed) == 2
        bad = next(f for f in failed if f.name == "<undecodable>" or f.name == "rd_bad")
        assert "not valid JSON" in bad.exception
        assert bad.body == "{not json"
        assert bad.id.startswith("bullmq:default:")
        unknown = next(f for f in failed if f.id == "f" * 32)
        assert "no job named 'rd_nobody_defines_this'" in unknown.exception
        # both are kept (nothing is lost) and can be looked up and removed
        assert (await driver.failed.find(bad.id)) is not None
        assert await Queue.forget(bad.id) is True
        assert [f.id for f in await Queue.failed()] == ["f" * 32]


# ----------------------------------------------------------------------------- config


async def test_connection_settings_come_from_config_redis_without_key_prefix(redis_prefix):
    app = App(
        queue=define_queue_config(
            default="r",
            connections={"r": {"driver": "redis", "connection": "jobs", "prefix": redis_prefix}},
        ),
        redis=define_redis_config(
            default="default",
            connections={
                "default": {"url": "redis://127.0.0.1:1/0"},
                "jobs": {"url": REDIS_URL, "key_prefix": "ignored-by-bullmq:"},
            },
        ),
    )
    async with app:
        await rd_plain.dispatch({"n": 1})
        r = _client()
        try:
            assert await r.llen(f"{redis_prefix}:default:wait") == 1
            assert await r.keys("ignored-by-bullmq:*") == []
        finally:
            await r.aclose()


def test_missing_bullmq_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name: str, *a: Any, **kw: Any) -> Any:
        if name == "bullmq" or name.startswith("bullmq."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *a, **kw)

    monkeypatch.delitem(sys.modules, "haze.drivers.redis")
    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(MissingDependencyError, match=r"(haze-jobs|runtime)\[redis\]") as info:
        importlib.import_module("haze.drivers.redis")
    assert "the redis driver" in str(info.value)
    assert "bullmq" in str(info.value)


async def test_keep_completed_trims_the_completed_set(redis_app, redis_prefix):
    async with redis_app(keep_completed=2) as app:
        await Queue.bulk([rd_plain.with_({"n": i}) for i in range(5)])
        await _work(app, lambda: len(RUNS) == 5)
        r = _client()
        try:
            assert await r.zcard(f"{redis_prefix}:default:completed") == 2
        finally:
            await r.aclose()


async def test_failed_store_record_keeps_a_failure_from_elsewhere(redis_app):
    from haze.drivers import FailedJob

    async with redis_app() as app:
        body = json.dumps({"v": 1, "id": "e" * 32, "job": "rd_plain", "payload": {"n": 9}})
        await app.driver().failed.record(
            FailedJob(
                id="e" * 32,
                name="rd_plain",
                connection="r",
                queue="default",
                payload={"n": 9},
                exception="Traceback ...\nKeyError: 'x'",
                failed_at=time.time(),
                body=body,
            )
        )
        [failed] = await Queue.failed()
        assert failed.id == "e" * 32
        assert failed.payload == {"n": 9}
        assert failed.exception.endswith("KeyError: 'x'")
        assert await Queue.retry("e" * 32) == ["e" * 32]
        await _work(app, lambda: len(RUNS) == 1)
        assert RUNS[0]["payload"] == {"n": 9}
        assert await Queue.failed() == []


def test_a_starting_worker_is_told_when_its_locks_cannot_all_be_renewed_in_time() -> None:
    # One heartbeat renews every running job's lock in one script call; with more
    # running jobs than that call renews within the heartbeat interval (half the lock),
    # a job goes past its lock between two renewals and the stalled check hands it out
    # again. Built alone: no connection is opened.
    driver = RedisDriver("r", {"url": REDIS_URL, "retry_after": 0.1})
    assert driver.lease_warning(100) is None
    line = driver.lease_warning(10_000)
    assert line is not None
    assert "--concurrency 10000 " in line and "retry_after 0.1s" in line and "Redis" in line
