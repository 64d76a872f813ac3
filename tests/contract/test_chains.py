"""Contract: chains and their callbacks (seed 任务链, 回调：任务或函数; SPEC §9, §12, §13)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from haze import JobContext, Queue, define_job, use_app
from haze._base.crypto import generate_key
from haze._base.message import decode, encode

# ---------------------------------------- jobs

LOG: list[tuple[str, Any]] = []
SEEN: dict[str, dict[str, Any]] = {}  # job name -> what the context looked like
FAIL: dict[str, int] = {}  # job name -> failures still to raise
CATCH_ERRORS: list[BaseException] = []


def _note(ctx: JobContext) -> None:
    SEEN[ctx.name] = {
        "queue": ctx.queue,
        "connection": ctx.connection,
        "chain_id": ctx.message.chain_id if ctx.message else None,
        "chain": list(ctx.message.chain or []) if ctx.message else [],
        "id": ctx.id,
        "attempt": ctx.attempt,
    }


async def _step(name: str, payload: Any, ctx: JobContext) -> None:
    _note(ctx)
    LOG.append(("start", name))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    if FAIL.get(name, 0) > 0:
        FAIL[name] -= 1
        LOG.append(("fail", name))
        raise RuntimeError(f"{name} boom")
    LOG.append((name, payload))


@define_job(name="ch_a")
async def ch_a(payload: Any, job: JobContext) -> None:
    await _step("ch_a", payload, job)


@define_job(name="ch_b")
async def ch_b(payload: Any, job: JobContext) -> None:
    await _step("ch_b", payload, job)


@define_job(name="ch_c")
async def ch_c(payload: Any, job: JobContext) -> None:
    await _step("ch_c", payload, job)


@define_job(name="ch_retry", tries=3, backoff=0)
async def ch_retry(payload: Any, job: JobContext) -> None:
    await _step("ch_retry", payload, job)


@define_job(name="ch_cleanup")
async def ch_cleanup(payload: Any, job: JobContext) -> None:
    LOG.append(("ch_cleanup", payload))


@define_job(name="ch_queued", queue="ch_jobq")
async def ch_queued(payload: Any, job: JobContext) -> None:
    await _step("ch_queued", payload, job)


@define_job(name="ch_queued2", queue="ch_jobq")
async def ch_queued2(payload: Any, job: JobContext) -> None:
    await _step("ch_queued2", payload, job)


@define_job(name="ch_grow")
async def ch_grow(payload: Any, job: JobContext) -> None:
    await _step("ch_grow", payload, job)
    if payload.get("prepend"):
        job.prepend_to_chain(ch_c.with_({"prepended": True}))
    if payload.get("append"):
        job.append_to_chain(ch_cleanup.with_({"appended": True}))


@define_job(name="ch_member")
async def ch_member(payload: Any, job: JobContext) -> None:
    await _step("ch_member", payload, job)
    LOG.append(("member", payload["i"]))


@define_job(name="ch_member_bad")
async def ch_member_bad(payload: Any, job: JobContext) -> None:
    LOG.append(("member_bad", payload))
    raise RuntimeError("member boom")


@define_job(name="ch_caught")
async def ch_caught(payload: Any, job: JobContext) -> None:
    LOG.append(("caught", payload))


class Catcher:
    """A chain catch callback: a function where the driver allows it (records the
    error), else the job reference ``ch_caught`` (remote drivers)."""

    def __init__(self, driver: Any) -> None:
        self.local = driver.local_callbacks
        self.errors: list[BaseException] = []

    @property
    def cb(self) -> Any:
        return self.errors.append if self.local else ch_caught.with_("caught")

    @property
    def n(self) -> int:
        return len(self.errors) + sum(1 for e in LOG if e[0] == "caught")

    def messages(self) -> list[str] | None:
        return [str(e) for e in self.errors] if self.local else None


@pytest.fixture(autouse=True)
def _reset() -> None:
    LOG.clear()
    SEEN.clear()
    FAIL.clear()
    CATCH_ERRORS.clear()


def names() -> list[str]:
    return [e[0] for e in LOG if e[0] not in ("start", "fail", "member", "member_bad", "caught")]


# ---------------------------------------- order


async def test_links_run_in_order_after_the_previous_succeeded(app, done):
    res = await Queue.chain(
        [ch_a.with_({"n": 1}), ch_b.with_({"n": 2}), ch_c.with_({"n": 3})]
    ).dispatch()
    await done()
    assert LOG == [
        ("start", "ch_a"),
        ("ch_a", {"n": 1}),
        ("start", "ch_b"),
        ("ch_b", {"n": 2}),
        ("start", "ch_c"),
        ("ch_c", {"n": 3}),
    ]
    assert isinstance(res.chain_id, str) and res.chain_id
    assert res.skipped is False


async def test_bare_job_definitions_are_links_with_no_payload(app, done):
    await Queue.chain([ch_a, ch_b]).dispatch()
    await done()
    assert LOG[1] == ("ch_a", None) and LOG[3] == ("ch_b", None)


@pytest.mark.requires("retries")
async def test_next_link_waits_for_success_after_retries(app, done):
    FAIL["ch_retry"] = 2
    await (
        Queue.chain([ch_a.with_(1), ch_retry.with_(2), ch_b.with_(3)])
        .catch(ch_cleanup.with_("catch"))
        .dispatch()
    )
    await done()
    assert LOG == [
        ("start", "ch_a"),
        ("ch_a", 1),
        ("start", "ch_retry"),
        ("fail", "ch_retry"),
        ("start", "ch_retry"),
        ("fail", "ch_retry"),
        ("start", "ch_retry"),
        ("ch_retry", 2),
        ("start", "ch_b"),
        ("ch_b", 3),
    ]
    assert SEEN["ch_retry"]["attempt"] == 3
    assert ("ch_cleanup", "catch") not in LOG


async def test_catch_not_called_when_every_link_succeeds(app, done, driver):
    c = Catcher(driver)
    await (
        Queue.chain([ch_a.with_(1), ch_b.with_(2)])
        .catch(ch_cleanup.with_("x"))
        .catch(c.cb)
        .dispatch()
    )
    await done()
    assert names() == ["ch_a", "ch_b"]
    assert c.n == 0


# ---------------------------------------- failure


async def test_final_failure_drops_the_rest_and_dispatches_the_catch_job_once(app, done, quietly):
    FAIL["ch_b"] = 99
    res = await quietly(
        Queue.chain([ch_a.with_(1), ch_b.with_(2), ch_c.with_(3)])
        .catch(ch_cleanup.with_({"id": 7}))
        .dispatch()
    )
    await done()
    if isinstance(res, Exception):  # sync raises the final failure to the caller
        assert "ch_b boom" in str(res)
    assert names() == ["ch_a", "ch_cleanup"]
    assert LOG.count(("ch_cleanup", {"id": 7})) == 1
    assert ("start", "ch_c") not in LOG


@pytest.mark.requires("retries")
async def test_catch_runs_once_after_the_last_try_not_per_attempt(app, done, driver):
    FAIL["ch_retry"] = 99
    c = Catcher(driver)
    await (
        Queue.chain([ch_retry.with_(1), ch_c.with_(2)])
        .catch(c.cb)
        .catch(ch_cleanup.with_("c"))
        .dispatch()
    )
    await done()
    assert LOG.count(("fail", "ch_retry")) == 3
    assert c.n == 1 and c.messages() in (None, ["ch_retry boom"])
    assert LOG.count(("ch_cleanup", "c")) == 1
    assert ("start", "ch_c") not in LOG


@pytest.mark.requires("local_callbacks")
async def test_function_catch_is_called_with_the_error(app, done, quietly):
    FAIL["ch_a"] = 99
    got: list[Any] = []

    def on_error(*args: Any) -> None:
        got.append(args)

    await quietly(Queue.chain([ch_a.with_(1), ch_b.with_(2)]).catch(on_error).dispatch())
    await done()
    assert len(got) == 1
    (args,) = got
    assert len(args) == 1 and isinstance(args[0], RuntimeError) and str(args[0]) == "ch_a boom"
    assert "ch_b" not in names()


@pytest.mark.requires("local_callbacks")
async def test_async_function_catch_is_awaited(app, done, quietly):
    FAIL["ch_b"] = 99
    got: list[BaseException] = []

    async def on_error(error: BaseException) -> None:
        await asyncio.sleep(0)
        got.append(error)

    await quietly(Queue.chain([ch_a.with_(1), ch_b.with_(2)]).catch(on_error).dispatch())
    await done()
    assert [str(e) for e in got] == ["ch_b boom"]


async def test_catch_rejects_non_callables(app):
    with pytest.raises(ValueError):
        Queue.chain([ch_a.with_(1)]).catch(42)


async def test_chain_needs_at_least_one_job(app):
    with pytest.raises(ValueError):
        Queue.chain([])


# ---------------------------------------- options precedence


async def test_chain_on_queue_applies_to_links_and_beats_define_job(app, done):
    await Queue.chain([ch_a.with_(1), ch_queued.with_(2)]).on_queue("q1").dispatch()
    await done()
    assert SEEN["ch_a"]["queue"] == "q1"
    assert SEEN["ch_queued"]["queue"] == "q1"  # chain default beats define_job(queue=...)


async def test_define_job_queue_used_without_chain_queue(app, done):
    await Queue.chain([ch_a.with_(1), ch_queued.with_(2)]).dispatch()
    await done()
    assert SEEN["ch_a"]["queue"] == "default"
    assert SEEN["ch_queued"]["queue"] == "ch_jobq"


async def test_link_own_on_queue_beats_chain_default(app, done):
    await (
        Queue.chain([ch_a.with_(1), ch_queued.with_(2).on_queue("q2"), ch_queued2.with_(3)])
        .on_queue("q1")
        .dispatch()
    )
    await done()
    assert SEEN["ch_a"]["queue"] == "q1"
    assert SEEN["ch_queued"]["queue"] == "q2"
    assert SEEN["ch_queued2"]["queue"] == "q1"


async def test_chain_on_connection_and_link_own_connection(app, done):
    await (
        Queue.chain([ch_a.with_(1), ch_b.with_(2).on_connection("main"), ch_c.with_(3)])
        .on_connection("other")
        .dispatch()
    )
    await done()
    assert names() == ["ch_a", "ch_b", "ch_c"]
    assert SEEN["ch_a"]["connection"] == "other"
    assert SEEN["ch_b"]["connection"] == "main"
    assert SEEN["ch_c"]["connection"] == "other"


async def test_default_connection_is_the_configs(app, done):
    await Queue.chain([ch_a.with_(1), ch_b.with_(2)]).dispatch()
    await done()
    assert SEEN["ch_a"]["connection"] == "main" and SEEN["ch_b"]["connection"] == "main"


# ---------------------------------------- ids and messages


async def test_chain_id_is_shared_by_every_link(app, done):
    res = await Queue.chain([ch_a.with_(1), ch_b.with_(2), ch_c.with_(3)]).dispatch()
    await done()
    assert {SEEN[n]["chain_id"] for n in ("ch_a", "ch_b", "ch_c")} == {res.chain_id}
    assert res.id == SEEN["ch_a"]["id"]
    assert len({SEEN[n]["id"] for n in ("ch_a", "ch_b", "ch_c")}) == 3


async def test_two_chains_get_different_ids(app, done):
    r1 = await Queue.chain([ch_a.with_(1)]).dispatch()
    r2 = await Queue.chain([ch_a.with_(1)]).dispatch()
    await done()
    assert r1.chain_id != r2.chain_id


async def test_rest_of_chain_travels_in_the_message(app, done):
    await (
        Queue.chain(
            [ch_a.with_({"x": 1}), ch_b.with_({"y": 2}).on_queue("q2"), ch_c.with_({"z": 3})]
        )
        .on_queue("q1")
        .catch(ch_cleanup.with_("c"))
        .dispatch()
    )
    await done()
    rest = SEEN["ch_a"]["chain"]
    assert [link["job"] for link in rest] == ["ch_b", "ch_c"]
    assert rest[0]["payload"] == {"y": 2} and rest[0]["queue"] == "q2"
    assert rest[1]["payload"] == {"z": 3} and rest[1]["queue"] == "q1"
    assert [link["job"] for link in SEEN["ch_b"]["chain"]] == ["ch_c"]
    assert SEEN["ch_c"]["chain"] == []


@pytest.mark.requires("queued")
async def test_encoded_message_carries_the_rest_of_the_chain(app, done):
    """Spy on the driver's enqueue: the stored body is JSON holding the remaining links."""
    drv = app.driver("main")
    bodies: list[str] = []
    orig = drv.enqueue

    async def spy(body: str, message: Any, delay: float) -> None:
        bodies.append(body)
        await orig(body, message, delay)

    drv.enqueue = spy  # type: ignore[method-assign]
    try:
        res = (
            await Queue.chain([ch_a.with_({"x": 1}), ch_b.with_({"y": 2}), ch_c.with_(3)])
            .catch(ch_cleanup.with_({"c": 1}))
            .dispatch()
        )
        await done()
    finally:
        del drv.enqueue
    assert len(bodies) == 3
    first = json.loads(bodies[0])
    assert first["job"] == "ch_a" and first["chain_id"] == res.chain_id
    assert [(x["job"], x["payload"]) for x in first["chain"]] == [("ch_b", {"y": 2}), ("ch_c", 3)]
    assert first["chain_catch"] == [{"job": "ch_cleanup", "payload": {"c": 1}}]
    second = decode(bodies[1])
    assert second.job == "ch_b" and [x["job"] for x in second.chain or []] == ["ch_c"]
    assert not decode(bodies[2]).chain


@pytest.mark.requires("failed_store")
async def test_failed_job_record_carries_the_chain_id(app, done):
    FAIL["ch_b"] = 99
    res = await Queue.chain([ch_a.with_(1), ch_b.with_(2), ch_c.with_(3)]).dispatch()
    await done()
    failed = await Queue.failed()
    assert len(failed) == 1
    rec = failed[0]
    assert rec.name == "ch_b" and rec.chain_id == res.chain_id and rec.batch_id is None
    assert rec.id == SEEN["ch_b"]["id"]
    assert [x["job"] for x in decode(rec.body).chain or []] == ["ch_c"]


@pytest.mark.requires("failed_store")
async def test_retrying_a_failed_link_continues_the_chain(app, done, driver):
    FAIL["ch_b"] = 1
    c = Catcher(driver)
    res = await Queue.chain([ch_a.with_(1), ch_b.with_(2), ch_c.with_(3)]).catch(c.cb).dispatch()
    await done()
    assert names() == ["ch_a"] and c.n == 1
    (rec,) = await Queue.failed()
    assert await Queue.retry(rec.id) == [rec.id]
    await done()
    assert names() == ["ch_a", "ch_b", "ch_c"]
    assert SEEN["ch_c"]["chain_id"] == res.chain_id
    assert c.n == 1
    assert await Queue.failed() == []


# ---------------------------------------- callbacks: job or function


async def test_function_callbacks_follow_the_driver_capability(app, driver, done, quietly):
    """sync/memory accept a plain function; every non-local driver must refuse it."""
    chain = Queue.chain([ch_a.with_(1)]).catch(lambda e: None)
    batch = Queue.batch([ch_b.with_(2)]).then(lambda b: None)
    if driver.local_callbacks:
        await chain.dispatch()
        await batch.dispatch()
        await done()
        assert sorted(names()) == ["ch_a", "ch_b"]
    else:
        with pytest.raises(ValueError, match="job reference"):
            await chain.dispatch()
        with pytest.raises(ValueError, match="job reference"):
            await batch.dispatch()
        await done()
        assert names() == []


async def test_function_callback_on_a_remote_driver_raises(make_app, remote_sim, driver, done):
    """Simulated remote driver (test-only MemoryDriver subclass with local_callbacks=False,
    remote=True, see conftest.REMOTE_SIM); the real database/redis/sqs drivers are covered
    by ``test_function_callbacks_follow_the_driver_capability`` once they are in DRIVERS."""
    if driver.id != "memory":
        pytest.skip("driver-independent: runs once")
    async with make_app(spec=remote_sim) as app:
        with pytest.raises(ValueError, match="job reference") as ei:
            await Queue.chain([ch_a.with_(1), ch_b.with_(2)]).catch(lambda e: None).dispatch()
        assert "main" in str(ei.value)
        for cb in ("then", "catch", "finally_", "progress"):
            with pytest.raises(ValueError, match="job reference"):
                await getattr(Queue.batch([ch_a.with_(1)]), cb)(lambda *a: None).dispatch()
        with pytest.raises(ValueError, match="job reference"):
            await Queue.batch([ch_a.with_(1)]).allow_failures(lambda *a: None).dispatch()
        await done(app)
        assert names() == []  # nothing was enqueued
        # job references work on the remote driver, and the chain continues there
        FAIL["ch_b"] = 99
        await (
            Queue.chain([ch_a.with_(1), ch_b.with_(2), ch_c.with_(3)])
            .catch(ch_cleanup.with_("remote"))
            .dispatch()
        )
        await done(app)
        assert names() == ["ch_a", "ch_cleanup"]
        assert LOG.count(("ch_cleanup", "remote")) == 1


async def test_function_callback_on_a_local_connection_of_a_remote_app(
    make_app, remote_sim, driver, done
):
    """A chain sent to a local connection (on_connection) accepts a function even when
    the default connection is remote."""
    if driver.id != "memory":
        pytest.skip("driver-independent: runs once")
    got: list[BaseException] = []
    async with make_app(spec=remote_sim) as app:
        FAIL["ch_a"] = 99
        await (
            Queue.chain([ch_a.with_(1), ch_b.with_(2)])
            .on_connection("other")
            .catch(got.append)
            .dispatch()
        )
        await done(app)
    assert [str(e) for e in got] == ["ch_a boom"]


# ---------------------------------------- growing a chain


async def test_prepend_and_append_to_chain_from_the_job_context(app, done):
    await Queue.chain([ch_grow.with_({"prepend": True, "append": True}), ch_b.with_(2)]).dispatch()
    await done()
    assert names() == ["ch_grow", "ch_c", "ch_b", "ch_cleanup"]
    assert LOG[-1] == ("ch_cleanup", {"appended": True})
    # the prepended/appended links belong to the same chain
    assert SEEN["ch_c"]["chain_id"] == SEEN["ch_grow"]["chain_id"] == SEEN["ch_b"]["chain_id"]


async def test_append_to_chain_without_a_chain_starts_one(app, done):
    await ch_grow.dispatch({"append": True})
    await done()
    assert names() == ["ch_grow", "ch_cleanup"]


async def test_prepended_link_failure_drops_the_rest_and_catches(app, done, quietly, driver):
    FAIL["ch_c"] = 99
    c = Catcher(driver)
    await quietly(
        Queue.chain([ch_grow.with_({"prepend": True}), ch_b.with_(2)]).catch(c.cb).dispatch()
    )
    await done()
    assert names() == ["ch_grow"]
    assert c.n == 1 and c.messages() in (None, ["ch_c boom"])


# ---------------------------------------- batches inside chains


async def test_chain_continues_after_a_batch_link_finishes(app, done):
    res = await Queue.chain(
        [
            ch_a.with_(1),
            Queue.batch([ch_member.with_({"i": 1}), ch_member.with_({"i": 2})]).name("ch_inner"),
            ch_c.with_(3),
        ]
    ).dispatch()
    await done()
    order = names()
    assert order[0] == "ch_a" and order[-1] == "ch_c"
    assert sorted(x for x in LOG if x[0] == "member") == [("member", 1), ("member", 2)]
    assert order.count("ch_c") == 1
    assert SEEN["ch_c"]["chain_id"] == res.chain_id


async def test_chain_starting_with_a_batch(app, done):
    await Queue.chain(
        [Queue.batch([ch_member.with_({"i": 1}), ch_member.with_({"i": 2})]), ch_c.with_(3)]
    ).dispatch()
    await done()
    assert names()[-1] == "ch_c" and names().count("ch_member") == 2


async def test_failing_batch_link_stops_the_chain_and_catches_once(app, done, quietly, driver):
    c = Catcher(driver)
    await quietly(
        Queue.chain(
            [
                ch_a.with_(1),
                Queue.batch([ch_member_bad.with_(1), ch_member.with_({"i": 2})]),
                ch_c.with_(3),
            ]
        )
        .catch(c.cb)
        .catch(ch_cleanup.with_("batch-failed"))
        .dispatch()
    )
    await done()
    assert "ch_c" not in names()
    assert c.n == 1
    assert LOG.count(("ch_cleanup", "batch-failed")) == 1


async def test_batch_link_with_allow_failures_lets_the_chain_go_on(app, done, quietly, driver):
    c = Catcher(driver)
    await quietly(
        Queue.chain(
            [
                Queue.batch([ch_member_bad.with_(1), ch_member.with_({"i": 2})]).allow_failures(),
                ch_c.with_(3),
            ]
        )
        .catch(c.cb)
        .dispatch()
    )
    await done()
    assert names()[-1] == "ch_c"
    assert c.n == 0


async def test_function_callback_refused_when_any_job_runs_on_a_remote_connection(
    make_app, remote_sim, driver, done
):
    """The function would be called by whichever worker settles the chain/batch; a link
    or member on a remote connection means that worker may be another process."""
    if driver.id != "memory":
        pytest.skip("driver-independent: runs once")
    async with make_app(spec=remote_sim) as app:  # "main" remote, "other" local memory
        with pytest.raises(ValueError, match="job reference"):
            await (
                Queue.chain([ch_a.with_(1), ch_b.with_(2).on_connection("main")])
                .on_connection("other")
                .catch(lambda e: None)
                .dispatch()
            )
        with pytest.raises(ValueError, match="job reference"):
            await (
                Queue.batch([ch_a.with_(1), ch_b.with_(2).on_connection("main")])
                .on_connection("other")
                .then(lambda b: None)
                .dispatch()
            )
        with pytest.raises(ValueError, match="job reference"):
            await (
                Queue.chain([ch_a.with_(1), Queue.batch([ch_b.with_(2)]).on_connection("main")])
                .on_connection("other")
                .catch(lambda e: None)
                .dispatch()
            )
        await done(app)
        assert names() == []
        # all-local: accepted
        await (
            Queue.chain([ch_a.with_(1), ch_b.with_(2)])
            .on_connection("other")
            .catch(lambda e: None)
            .dispatch()
        )
        await done(app)
        assert names() == ["ch_a", "ch_b"]


# ---------------------------------------- long chains: the tail is stored once

#: Links of the long-chain tests, each with an 800-character payload: about 42 KB of
#: links in all, several times what one message carries inline. (Few links: the sync
#: driver runs each next link inside the previous one, a Python frame stack deep.)
LONG = 50
PAD = "x" * 800
#: What one message of a long chain may weigh: its inline links stay under 16 KiB.
MESSAGE_MAX = 20_000


@define_job(name="ch_long")
async def ch_long(payload: Any, job: JobContext) -> None:
    assert job.message is not None
    LOG.append(("ch_long", payload["n"]))
    LOG.append(("size", len(encode(job.message))))
    if payload["n"] == 0:
        SEEN["first"] = {"chain": list(job.message.chain or [])}
    if payload.get("fail") and FAIL.get("ch_long", 0) > 0:
        FAIL["ch_long"] -= 1
        raise RuntimeError("long boom")


def _long(n: int, **extra: Any) -> Any:
    return ch_long.with_({"n": n, "pad": PAD, **extra})


def _tails() -> list[str]:
    return [link["tail"] for link in SEEN["first"]["chain"] if "tail" in link]


async def test_long_chain_runs_in_order_and_each_message_stays_small(app, done):
    res = await Queue.chain([_long(i) for i in range(LONG)]).dispatch()
    await done()
    assert [e[1] for e in LOG if e[0] == "ch_long"] == list(range(LONG))
    sizes = [e[1] for e in LOG if e[0] == "size"]
    assert len(sizes) == LONG and max(sizes) < MESSAGE_MAX
    (tail,) = _tails()
    # the chain ended: its stored links are deleted
    assert await app.batch_store.get(f"haze:chain:{tail}:1") is None
    assert await app.batch_store.get(f"haze:chain:{tail}:ended") is not None
    assert res.chain_id


@pytest.mark.requires("failed_store")
async def test_long_chain_failure_catches_once_and_a_retry_continues_it(app, done, quietly, driver):
    FAIL["ch_long"] = 1
    c = Catcher(driver)
    links = [_long(i, fail=i == LONG // 2) for i in range(LONG)]
    await quietly(Queue.chain(links).catch(c.cb).dispatch())
    await done()
    assert [e[1] for e in LOG if e[0] == "ch_long"] == list(range(LONG // 2 + 1))
    assert c.n == 1 and c.messages() in (None, ["long boom"])
    (tail,) = _tails()
    # the failed link's stored rest is kept: a retry of the failed link continues it
    assert await app.batch_store.get(f"haze:chain:{tail}:2") is not None
    (rec,) = await Queue.failed()
    assert await Queue.retry(rec.id) == [rec.id]
    await done()
    ran = [e[1] for e in LOG if e[0] == "ch_long"]
    assert ran == [*range(LONG // 2 + 1), *range(LONG // 2, LONG)]
    assert c.n == 1 and await Queue.failed() == []
    assert await app.batch_store.get(f"haze:chain:{tail}:2") is None


async def test_long_chain_with_a_batch_and_appended_links(app, done):
    links: list[Any] = [_long(i) for i in range(LONG)]
    links[LONG - 5] = Queue.batch([ch_member.with_({"i": 1}), ch_member.with_({"i": 2})])
    links.append(ch_grow.with_({"append": True}))
    await Queue.chain(links).dispatch()
    await done()
    assert [e[1] for e in LOG if e[0] == "ch_long"] == [i for i in range(LONG) if i != LONG - 5]
    assert sorted(x for x in LOG if x[0] == "member") == [("member", 1), ("member", 2)]
    assert names()[-2:] == ["ch_grow", "ch_cleanup"]
    assert max(e[1] for e in LOG if e[0] == "size") < MESSAGE_MAX


SECRET = "card-4242-4242-4242-4242"
STORED: list[str] = []  # the stored chunks of the running chain, as JSON


@define_job(name="ch_secret", encrypted=True)
async def ch_secret(payload: Any, job: JobContext) -> None:
    assert job.message is not None
    LOG.append(("secret", payload["n"]))
    if payload["n"] == 0:
        store = use_app().batch_store
        for link in job.message.chain or []:
            if "tail" in link:
                STORED.append(json.dumps(await store.get(f"haze:chain:{link['tail']}:1")))


async def test_long_chain_of_encrypted_links_stores_them_encrypted(make_app, done):
    STORED.clear()
    async with make_app(key=generate_key()):
        links = [ch_secret.with_({"n": i, "card": SECRET, "pad": PAD}) for i in range(LONG)]
        await Queue.chain(links).dispatch()
        await done()
    assert [e[1] for e in LOG if e[0] == "secret"] == list(range(LONG))
    (chunk,) = STORED
    assert '"enc"' in chunk and SECRET not in chunk
