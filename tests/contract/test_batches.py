"""Contract: batches (seed 批量任务, 回调：任务或函数; SPEC §9, §12, §13)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import pytest
from haze import (
    Batch,
    BatchFinishedError,
    HazeError,
    JobContext,
    Queue,
    define_cache_config,
    define_job,
)

# ---------------------------------------- jobs

LOG: list[tuple[str, Any]] = []
IDS: dict[Any, str] = {}  # payload marker -> job id
BATCH_IDS: set[str] = set()  # batches the bt_ok / bt_bad members ran in
SNAPSHOTS: list[Any] = []
STATE: dict[str, Any] = {}


@define_job(name="bt_ok")
async def bt_ok(payload: Any, job: JobContext) -> None:
    IDS[json.dumps(payload, sort_keys=True)] = job.id
    if job.batch() is not None:
        BATCH_IDS.add(job.batch().id)  # type: ignore[union-attr]
    await asyncio.sleep(0)
    LOG.append(("ok", payload))


@define_job(name="bt_bad")
async def bt_bad(payload: Any, job: JobContext) -> None:
    IDS[json.dumps(payload, sort_keys=True)] = job.id
    if job.batch() is not None:
        BATCH_IDS.add(job.batch().id)  # type: ignore[union-attr]
    await asyncio.sleep(0)
    LOG.append(("bad", payload))
    raise RuntimeError(f"bad {payload}")


@define_job(name="bt_flaky", tries=3, backoff=0)
async def bt_flaky(payload: Any, job: JobContext) -> None:
    LOG.append(("flaky_attempt", job.attempt))
    if job.attempt < 3:
        raise RuntimeError("flaky")


@define_job(name="bt_record")
async def bt_record(payload: Any, job: JobContext) -> None:
    """A job-reference callback: counts its own runs."""
    LOG.append(("record", payload))


@define_job(name="bt_snapshot")
async def bt_snapshot(payload: Any, job: JobContext) -> None:
    b = job.batch()
    SNAPSHOTS.append(b)
    if b is not None:
        SNAPSHOTS.append(await b.fresh())
    STATE["queue"] = job.queue


@define_job(name="bt_cancel_self")
async def bt_cancel_self(payload: Any, job: JobContext) -> None:
    b = job.batch()
    assert b is not None
    await b.cancel()
    LOG.append(("cancelled_by_job", payload))


@define_job(name="bt_gate")
async def bt_gate(payload: Any, job: JobContext) -> None:
    """Blocks until the test opens the gate (memory/remote-sim: same process)."""
    STATE["gate_started"].set()
    await STATE["gate_open"].wait()
    LOG.append(("gate", payload))


@define_job(name="bt_adder")
async def bt_adder(payload: Any, job: JobContext) -> None:
    b = job.batch()
    assert b is not None
    after = await b.add([bt_ok.with_({"added": 1}), bt_ok.with_({"added": 2})])
    STATE["after_add"] = after
    LOG.append(("adder", payload))


@define_job(name="bt_looper")
async def bt_looper(payload: Any, job: JobContext) -> None:
    b = job.batch()
    assert b is not None
    for _ in range(400):
        if (await b.fresh()).cancelled:
            LOG.append(("looper_saw_cancel", payload))
            return
        await asyncio.sleep(0.005)
    LOG.append(("looper_timeout", payload))


@define_job(name="bt_unique", unique=True)
async def bt_unique(payload: Any, job: JobContext) -> None:
    await asyncio.sleep(0)
    LOG.append(("unique", payload))


@define_job(name="bt_queued", queue="bt_jobq")
async def bt_queued(payload: Any, job: JobContext) -> None:
    LOG.append(("queued", (payload, job.queue, job.connection)))


INFLIGHT = {"now": 0, "max": 0}


@define_job(name="bt_many")
async def bt_many(payload: Any, job: JobContext) -> None:
    INFLIGHT["now"] += 1
    INFLIGHT["max"] = max(INFLIGHT["max"], INFLIGHT["now"])
    try:
        for _ in range(3):
            await asyncio.sleep(0)
        # a moment of real work: on a remote driver each claim is a round trip, longer
        # than three loop turns, so without it the jobs could never overlap
        await asyncio.sleep(0.002)
    finally:
        INFLIGHT["now"] -= 1


@pytest.fixture(autouse=True)
def _reset() -> None:
    LOG.clear()
    IDS.clear()
    BATCH_IDS.clear()
    SNAPSHOTS.clear()
    STATE.clear()
    INFLIGHT.update(now=0, max=0)


def count(kind: str, payload: Any = None) -> int:
    return sum(1 for k, p in LOG if k == kind and (payload is None or p == payload))


class Calls:
    """Batch callbacks: functions that record their arguments where the driver allows
    them, else the job reference ``bt_record.with_("cb:<kind>")`` (remote drivers)."""

    def __init__(self, driver: Any) -> None:
        self.local = driver.local_callbacks
        self.calls: dict[str, list[tuple[Any, ...]]] = {}

    def cb(self, kind: str) -> Any:
        if not self.local:
            return bt_record.with_("cb:" + kind)

        def f(*args: Any) -> None:
            self.calls.setdefault(kind, []).append(args)

        return f

    def n(self, kind: str) -> int:
        return len(self.calls.get(kind, [])) + count("record", "cb:" + kind)


@contextlib.asynccontextmanager
async def gated(make_app: Any, **kw: Any) -> Any:
    """``make_app(**kw)`` for a test that holds ``bt_gate``: the gate opens whenever the
    test leaves the app, since leaving waits for the running jobs and a check that
    failed while the gate was shut would otherwise hang there, not be reported."""
    STATE["gate_started"], STATE["gate_open"] = asyncio.Event(), asyncio.Event()
    async with make_app(**kw) as app:
        try:
            yield app
        finally:
            STATE["gate_open"].set()


async def the_batch() -> Batch:
    """The one batch the members of this test ran in (works when dispatch() raised)."""
    assert len(BATCH_IDS) == 1, BATCH_IDS
    b = await Queue.find_batch(next(iter(BATCH_IDS)))
    assert b is not None
    return b


# ---------------------------------------- fields


async def test_every_field_of_a_finished_batch(app, done):
    before = time.time()
    batch = (
        await Queue.batch([bt_ok.with_(1), bt_ok.with_(2), bt_ok.with_(3)])
        .name("import")
        .dispatch()
    )
    assert isinstance(batch, Batch)
    assert isinstance(batch.id, str) and batch.id
    assert batch.name == "import" and batch.total == 3
    assert before - 1 <= batch.created_at <= time.time() + 1
    await done()
    b = await Queue.find_batch(batch.id)
    assert b is not None
    assert (b.id, b.name, b.total, b.pending, b.processed, b.failed) == (
        batch.id,
        "import",
        3,
        0,
        3,
        0,
    )
    assert b.progress == 100 and isinstance(b.progress, int)
    assert b.finished is True and b.finished_at is not None and b.finished_at >= b.created_at
    assert b.cancelled is False and b.cancelled_at is None
    assert b.created_at == batch.created_at
    assert b.failed_job_ids == []


@pytest.mark.requires("queued")
async def test_fields_before_the_jobs_run(make_app, done):
    async with gated(make_app) as app:
        batch = await Queue.batch([bt_gate.with_(0), bt_ok.with_(1)]).dispatch()
        assert (batch.total, batch.pending, batch.processed, batch.failed) == (2, 2, 0, 0)
        assert batch.progress == 0 and batch.finished is False and batch.finished_at is None
        assert batch.cancelled is False and batch.name is None
        await asyncio.wait_for(STATE["gate_started"].wait(), 5)
        mid = await batch.fresh()
        assert mid.pending == 2 and mid.finished is False
        STATE["gate_open"].set()
        await done(app)
        assert (await batch.fresh()).finished


@pytest.mark.requires("local_callbacks")
async def test_progress_is_an_int_rounded_down(make_app, done):
    seen: list[int] = []
    async with make_app(concurrency=1) as app:
        await (
            Queue.batch([bt_ok.with_(i) for i in range(3)])
            .progress(lambda b: seen.append(b.progress))
            .dispatch()
        )
        await done(app)
    assert sorted(seen) == [33, 66, 100]
    assert all(type(p) is int for p in seen)


def test_progress_property_floor_and_bounds():
    assert Batch(id="x", total=3, pending=2).progress == 33
    assert Batch(id="x", total=3, pending=1).progress == 66
    assert Batch(id="x", total=7, pending=0).progress == 100
    assert Batch(id="x", total=1000, pending=999).progress == 0
    assert Batch(id="x", total=0, pending=0).progress == 0


async def test_to_dict_is_json_ready(app, done, quietly, driver):
    c = Calls(driver)
    await quietly(  # sync raises the member's failure to the caller, after the batch ended
        Queue.batch([bt_ok.with_(1), bt_bad.with_(2)])
        .name("d")
        .allow_failures()
        .finally_(c.cb("finally"))
        .dispatch()
    )
    await done()
    b = await the_batch()
    assert c.n("finally") == 1
    d = b.to_dict()
    assert set(d) >= {
        "id",
        "name",
        "total",
        "pending",
        "processed",
        "failed",
        "progress",
        "finished",
        "finished_at",
        "cancelled",
        "cancelled_at",
        "created_at",
        "failed_job_ids",
    }
    assert json.loads(json.dumps(d)) == d
    assert d["id"] == b.id and d["name"] == "d" and d["total"] == 2
    assert d["processed"] == 1 and d["failed"] == 1 and d["pending"] == 0
    assert d["progress"] == 100 and d["finished"] is True and d["cancelled"] is False
    assert d["failed_job_ids"] == [IDS["2"]]


async def test_find_batch_unknown_is_none(app):
    assert await Queue.find_batch("nope") is None


async def test_fresh_reads_the_state_again(app, done, driver):
    batch = await Queue.batch([bt_ok.with_(1), bt_ok.with_(2)]).dispatch()
    await done()
    fresh = await batch.fresh()
    assert fresh is not batch and fresh.id == batch.id
    assert fresh.finished and fresh.processed == 2 and fresh.pending == 0
    if not driver.inline:
        assert batch.pending == 2 and not batch.finished  # the snapshot did not change


# ---------------------------------------- callbacks


async def test_then_and_finally_once_when_all_succeed_job_references(app, done):
    await (
        Queue.batch([bt_ok.with_(i) for i in range(4)])
        .then(bt_record.with_("then"))
        .catch(bt_record.with_("catch"))
        .finally_(bt_record.with_("finally"))
        .dispatch()
    )
    await done()
    assert count("record", "then") == 1
    assert count("record", "finally") == 1
    assert count("record", "catch") == 0
    assert count("ok") == 4


@pytest.mark.requires("local_callbacks")
async def test_callback_shapes_for_functions(app, done, quietly, driver):
    c = Calls(driver)
    res = await quietly(
        Queue.batch([bt_ok.with_(1), bt_bad.with_(2), bt_ok.with_(3)])
        .allow_failures()
        .then(c.cb("then"))
        .catch(c.cb("catch"))
        .finally_(c.cb("finally"))
        .progress(c.cb("progress"))
        .dispatch()
    )
    await done()
    if isinstance(res, Exception):
        assert "bad 2" in str(res)  # sync raises the failure to the caller
    assert c.n("then") == 0
    ((b, err),) = c.calls["catch"]
    assert isinstance(b, Batch) and isinstance(err, RuntimeError) and str(err) == "bad 2"
    ((fb,),) = c.calls["finally"]
    assert isinstance(fb, Batch) and fb.finished and fb.failed == 1 and fb.processed == 2
    assert c.n("progress") == 2
    assert all(len(a) == 1 and isinstance(a[0], Batch) for a in c.calls["progress"])


@pytest.mark.requires("local_callbacks")
async def test_then_receives_the_finished_batch(app, done, driver):
    c = Calls(driver)
    batch = (
        await Queue.batch([bt_ok.with_(1)])
        .name("t")
        .then(c.cb("then"))
        .finally_(c.cb("finally"))
        .dispatch()
    )
    await done()
    ((b,),) = c.calls["then"]
    assert b.id == batch.id and b.name == "t" and b.finished and b.pending == 0
    assert c.n("finally") == 1


@pytest.mark.requires("local_callbacks")
async def test_async_function_callbacks_are_awaited(app, done):
    got: list[str] = []

    async def then(b: Batch) -> None:
        await asyncio.sleep(0)
        got.append("then:" + b.id)

    batch = await Queue.batch([bt_ok.with_(1)]).then(then).dispatch()
    await done()
    assert got == ["then:" + batch.id]


async def test_first_failure_cancels_the_batch(make_app, done, quietly, driver):
    c = Calls(driver)
    async with make_app(concurrency=1) as app:
        res = await quietly(
            Queue.batch([bt_bad.with_(1), bt_ok.with_(2), bt_ok.with_(3)])
            .then(c.cb("then"))
            .catch(c.cb("catch"))
            .catch(bt_record.with_("catch"))
            .finally_(c.cb("finally"))
            .finally_(bt_record.with_("finally"))
            .dispatch()
        )
        await done(app)
        b = await the_batch()
        if isinstance(res, Batch):
            assert b.id == res.id
    assert count("ok") == 0  # not started jobs are skipped
    assert b.cancelled and b.cancelled_at is not None
    assert (b.total, b.pending, b.processed, b.failed) == (3, 0, 2, 1)
    assert b.failed_job_ids == [IDS["1"]]
    assert b.finished and b.progress == 100
    assert c.n("then") == 0 and c.n("catch") == 1 and c.n("finally") == 1
    assert count("record", "catch") == 1 and count("record", "finally") == 1


async def test_allow_failures_runs_every_job(make_app, done, quietly, driver):
    c = Calls(driver)
    async with make_app(concurrency=1) as app:
        await quietly(
            Queue.batch([bt_bad.with_(1), bt_ok.with_(2), bt_bad.with_(3), bt_ok.with_(4)])
            .allow_failures(c.cb("failure"))
            .then(c.cb("then"))
            .catch(c.cb("catch"))
            .finally_(c.cb("finally"))
            .dispatch()
        )
        await done(app)
        fb = await the_batch()
    assert count("ok") == 2 and count("bad") == 2
    assert not fb.cancelled
    assert (fb.total, fb.pending, fb.processed, fb.failed) == (4, 0, 2, 2)
    assert sorted(fb.failed_job_ids) == sorted([IDS["1"], IDS["3"]])
    assert c.n("then") == 0  # a failure: no then
    assert c.n("catch") == 1  # once, on the first failure
    assert c.n("failure") == 2  # allow_failures(callback): every failure
    if c.local:
        assert str(c.calls["catch"][0][1]) == "bad 1"
        assert all(
            isinstance(b, Batch) and isinstance(e, RuntimeError) for b, e in c.calls["failure"]
        )
    assert c.n("finally") == 1


@pytest.mark.requires("retries")
async def test_member_retried_to_success_is_not_a_failure(app, done, driver):
    c = Calls(driver)
    batch = (
        await Queue.batch([bt_flaky.with_(1), bt_ok.with_(2)])
        .then(c.cb("then"))
        .catch(c.cb("catch"))
        .finally_(c.cb("finally"))
        .dispatch()
    )
    await done()
    b = await batch.fresh()
    assert count("flaky_attempt") == 3
    assert (b.processed, b.failed, b.cancelled) == (2, 0, False)
    assert c.n("then") == 1 and c.n("catch") == 0 and c.n("finally") == 1


@pytest.mark.requires("failed_store")
async def test_failed_batch_member_record_has_the_batch_id(app, done):
    batch = await Queue.batch([bt_bad.with_("x")]).dispatch()
    await done()
    (rec,) = await Queue.failed()
    assert rec.batch_id == batch.id and rec.id == IDS['"x"']


async def test_empty_batch_finishes_at_once(app, done, driver):
    c = Calls(driver)
    batch = await Queue.batch([]).then(c.cb("then")).finally_(c.cb("finally")).dispatch()
    await done()
    b = await batch.fresh()
    assert b.total == 0 and b.finished and b.progress == 100
    assert c.n("then") == 1 and c.n("finally") == 1


async def test_callbacks_reject_non_callables(app):
    for method in ("then", "catch", "finally_", "progress", "allow_failures"):
        with pytest.raises(ValueError):
            getattr(Queue.batch([bt_ok.with_(1)]), method)(42)
    with pytest.raises(ValueError):
        Queue.batch([bt_ok.with_(1)]).name("")


# ---------------------------------------- cancel / add / job.batch()


async def test_cancel_from_a_job_skips_not_started_jobs(make_app, done, driver):
    c = Calls(driver)
    async with make_app(concurrency=1) as app:
        batch = (
            await Queue.batch(
                [bt_cancel_self.with_(0), bt_ok.with_(1), bt_ok.with_(2), bt_ok.with_(3)]
            )
            .then(c.cb("then"))
            .finally_(c.cb("finally"))
            .dispatch()
        )
        await done(app)
        b = await batch.fresh()
    assert count("cancelled_by_job") == 1 and count("ok") == 0
    assert b.cancelled and b.cancelled_at is not None and b.finished
    assert (b.total, b.pending, b.processed, b.failed) == (4, 0, 4, 0)
    assert c.n("then") == 0 and c.n("finally") == 1


@pytest.mark.requires("queued")
async def test_cancel_from_outside_while_a_job_runs(make_app, done, driver):
    c = Calls(driver)
    async with gated(make_app, concurrency=1) as app:
        batch = (
            await Queue.batch([bt_gate.with_(0), bt_ok.with_(1), bt_ok.with_(2)])
            .then(c.cb("then"))
            .finally_(c.cb("finally"))
            .dispatch()
        )
        await asyncio.wait_for(STATE["gate_started"].wait(), 5)
        await batch.cancel()
        assert batch.cancelled and batch.cancelled_at is not None
        STATE["gate_open"].set()
        await done(app)
        b = await Queue.find_batch(batch.id)
    assert b is not None and b.cancelled
    assert count("gate") == 1 and count("ok") == 0  # the running job finished; the rest skipped
    assert (b.processed, b.failed, b.pending) == (3, 0, 0)
    assert c.n("then") == 0 and c.n("finally") == 1


@pytest.mark.requires("concurrency")
async def test_running_job_sees_the_cancel_through_fresh(make_app, done):
    async with make_app(concurrency=2) as app:
        await Queue.batch([bt_looper.with_(0), bt_bad.with_(1)]).dispatch()
        await done(app)
    assert count("looper_saw_cancel") == 1


async def test_add_from_inside_a_job(app, done, driver):
    c = Calls(driver)
    batch = await Queue.batch([bt_adder.with_(0)]).then(c.cb("then")).dispatch()
    await done()
    b = await batch.fresh()
    assert STATE["after_add"].total == 3
    assert (b.total, b.processed, b.pending) == (3, 3, 0) and b.finished
    assert count("ok") == 2 and c.n("then") == 1


@pytest.mark.requires("queued")
async def test_add_from_outside_before_it_finished(make_app, done, driver):
    c = Calls(driver)
    async with gated(make_app, concurrency=1) as app:
        batch = await Queue.batch([bt_gate.with_(0)]).then(c.cb("then")).dispatch()
        await asyncio.wait_for(STATE["gate_started"].wait(), 5)
        added = await batch.add([bt_ok.with_(1), [bt_ok.with_(2), bt_ok.with_(3)]])
        assert added.total == 4 and added.pending == 4
        STATE["gate_open"].set()
        await done(app)
        b = await batch.fresh()
    assert (b.total, b.processed) == (4, 4) and c.n("then") == 1 and count("ok") == 3


async def test_add_after_finish_raises(app, done):
    batch = await Queue.batch([bt_ok.with_(1)]).dispatch()
    await done()
    with pytest.raises(BatchFinishedError) as ei:
        await batch.add([bt_ok.with_(2)])
    assert isinstance(ei.value, HazeError)
    await done()
    assert count("ok") == 1
    assert (await batch.fresh()).total == 1


async def test_job_batch_is_a_snapshot_inside_the_job(app, done):
    batch = await Queue.batch([bt_snapshot.with_(1)]).name("snap").dispatch()
    await done()
    snap, fresh = SNAPSHOTS
    assert isinstance(snap, Batch) and snap.id == batch.id and snap.name == "snap"
    assert snap.total == 1 and snap.pending == 1 and not snap.finished
    assert fresh.id == batch.id


async def test_job_batch_is_none_outside_a_batch(app, done):
    await bt_snapshot.dispatch(1)
    await done()
    assert SNAPSHOTS == [None]


# ---------------------------------------- options


async def test_batch_members_ignore_unique(app, done):
    batch = await Queue.batch(
        [bt_unique.with_(1), bt_unique.with_(2), bt_unique.with_(3)]
    ).dispatch()
    await done()
    assert count("unique") == 3
    assert (await batch.fresh()).processed == 3
    # no lock was taken by the batch: a normal dispatch is not skipped
    res = await bt_unique.with_(4).dispatch()
    assert res.skipped is False
    await done()
    assert count("unique", 4) == 1


async def test_batch_on_queue_and_member_own_queue(app, done):
    await (
        Queue.batch(
            [
                bt_queued.with_(1),
                bt_queued.with_(2).on_queue("q2"),
                bt_queued.with_(3).on_connection("other"),
            ]
        )
        .on_queue("q1")
        .dispatch()
    )
    await done()
    got = {p: (q, c) for k, (p, q, c) in LOG if k == "queued"}
    assert got[1] == ("q1", "main")
    assert got[2] == ("q2", "main")
    assert got[3] == ("q1", "other")


async def test_batch_without_on_queue_uses_define_job_queue(app, done):
    await Queue.batch([bt_queued.with_(1)]).dispatch()
    await done()
    assert [x for x in LOG if x[0] == "queued"] == [("queued", (1, "bt_jobq", "main"))]


# ---------------------------------------- chains inside batches


async def test_chains_inside_a_batch(make_app, done, driver):
    c = Calls(driver)
    async with make_app(concurrency=1) as app:
        batch = (
            await Queue.batch(
                [[bt_ok.with_("a1"), bt_ok.with_("a2"), bt_ok.with_("a3")], bt_ok.with_("b")]
            )
            .then(c.cb("then"))
            .finally_(c.cb("finally"))
            .dispatch()
        )
        assert batch.total == 4
        await done(app)
        b = await batch.fresh()
    order = [p for k, p in LOG if k == "ok"]
    assert sorted(order) == ["a1", "a2", "a3", "b"]
    assert order.index("a1") < order.index("a2") < order.index("a3")
    assert (b.total, b.processed, b.failed, b.pending) == (4, 4, 0, 0)
    assert c.n("then") == 1 and c.n("finally") == 1


async def test_failing_link_of_a_chain_inside_a_batch(make_app, done, quietly, driver):
    c = Calls(driver)
    async with make_app(concurrency=1) as app:
        await quietly(
            Queue.batch(
                [[bt_ok.with_("a1"), bt_bad.with_("a2"), bt_ok.with_("a3")], bt_ok.with_("b")]
            )
            .allow_failures()
            .then(c.cb("then"))
            .catch(c.cb("catch"))
            .finally_(c.cb("finally"))
            .dispatch()
        )
        await done(app)
        b = await the_batch()
    assert count("ok", "a3") == 0  # the rest of that chain is dropped
    assert count("ok", "b") == 1
    assert (b.total, b.failed, b.pending) == (4, 1, 0) and b.processed == 3
    assert b.finished and c.n("then") == 0 and c.n("catch") == 1


async def test_nested_chains_in_a_batch_chain_are_refused(app):
    with pytest.raises(ValueError):
        Queue.batch([[bt_ok.with_(1), [bt_ok.with_(2)]]])
    with pytest.raises(ValueError):
        Queue.batch([[]])


# ---------------------------------------- store and ttl


async def test_state_lives_in_batches_store_with_batches_ttl(make_app, done):
    cache = define_cache_config(
        default="memory", stores={"memory": {"driver": "memory"}, "bstore": {"driver": "memory"}}
    )
    async with make_app(cache=cache, batches={"store": "bstore", "ttl": "1h"}) as app:
        batch = await Queue.batch([bt_ok.with_(1)]).dispatch()
        await done(app)
        bstore, default = app.store("bstore"), app.store("memory")
        assert app.batch_store is bstore
        key = f"haze:batch:{batch.id}"
        assert await bstore.get(key) is not None
        assert await default.get(key) is None
        ttl = await bstore.ttl(key)
        assert ttl is not None and 3500 < ttl <= 3600
        assert (await Queue.find_batch(batch.id)).finished  # type: ignore[union-attr]


async def test_batches_store_defaults_to_the_queue_store(make_app, done):
    cache = define_cache_config(
        default="memory", stores={"memory": {"driver": "memory"}, "locks": {"driver": "memory"}}
    )
    async with make_app(cache=cache, store="locks") as app:
        batch = await Queue.batch([bt_ok.with_(1)]).dispatch()
        await done(app)
        assert app.batch_store is app.store("locks")
        key = f"haze:batch:{batch.id}"
        assert await app.store("locks").get(key) is not None
        ttl = await app.store("locks").ttl(key)
        assert ttl is not None and ttl > 6 * 86400  # batches.ttl defaults to 7 days


async def test_batch_state_expires_after_batches_ttl(make_app, done, driver):
    # Remote backends need a few round trips (dispatch, a worker, the wait) before the
    # first read: a TTL that outlives them, then the same rule.
    ttl = 3.0 if driver.remote else 0.2
    async with make_app(batches={"ttl": ttl}) as app:
        batch = await Queue.batch([bt_ok.with_(1)]).dispatch()
        await done(app)
        assert await Queue.find_batch(batch.id) is not None
        await asyncio.sleep(ttl * 1.5)
        assert await Queue.find_batch(batch.id) is None


# ---------------------------------------- exactly once under concurrency


async def test_thousand_jobs_sixteen_consumers_callbacks_exactly_once(make_app, driver, done):
    # 1,000 jobs; a backend whose round trips make that too slow for the suite sets a
    # smaller DriverSpec.extra["big_batch"] (see conftest.DRIVERS): same rules, fewer jobs.
    n = driver.extra.get("big_batch", 1000)
    c = Calls(driver)
    async with make_app(concurrency=16) as app:
        pending = (
            Queue.batch([bt_many.with_(i) for i in range(n)])
            .name("big")
            .then(bt_record.with_("then"))
            .finally_(bt_record.with_("finally"))
            .then(c.cb("then"))
            .finally_(c.cb("finally"))
            .catch(c.cb("catch"))
        )
        if c.local:
            pending = pending.progress(c.cb("progress"))
        batch = await pending.dispatch()
        await done(app, timeout=40)
        b = await batch.fresh()
    assert count("record", "then") == 1
    assert count("record", "finally") == 1
    assert c.n("then") == 1 and c.n("finally") == 1 and c.n("catch") == 0
    if c.local:
        assert c.n("progress") == n
    assert (b.total, b.pending, b.processed, b.failed) == (n, 0, n, 0)
    assert b.finished and b.progress == 100
    if driver.has("concurrency"):
        assert INFLIGHT["max"] > 1  # the consumers really interleaved
