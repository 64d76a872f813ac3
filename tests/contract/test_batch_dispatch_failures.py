"""Contract: a batch whose dispatch fails part of the way ends consistent, on every driver.

Either nothing of it was queued (the caller sees the send's own error, and nothing
runs), or what was queued is tracked: the batch is indexed, the jobs not queued count
as failed so its callbacks fire once the queued ones end, and the caller sees a
``DispatchIncompleteError`` naming how many went out. A job that would be refused
(its payload, size, queue name) refuses the batch before anything is sent.

The send that fails mid-way is a real one: a member of the batch goes to a Redis
connection whose server is not there (port 1), after the batch's first jobs were
queued on the driver under test. ``DISPATCH_CHUNK`` is set to 2 so that a batch of a
few jobs goes out in several chunks (a knob, not a stand-in).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from haze import DispatchIncompleteError, JobContext, Queue, define_job
from haze._orchestration.batches import recent_ids
from haze.errors import PayloadError

RAN: list[Any] = []

DEAD = {"dead": {"driver": "redis", "url": "redis://127.0.0.1:1/0"}}


def dead() -> dict[str, Any]:
    """The connection whose server is not there; its driver's client must be importable
    (Pyodide has no Redis client: those runs skip the tests that need it)."""
    pytest.importorskip("redis", reason="the unreachable connection is a Redis one")
    pytest.importorskip("bullmq", reason="the unreachable connection is a Redis one")
    return DEAD


@define_job(name="bdf_ok")
async def bdf_ok(payload: Any, job: JobContext) -> None:
    await asyncio.sleep(0)
    RAN.append(payload)


@define_job(name="bdf_record")
async def bdf_record(payload: Any, job: JobContext) -> None:
    RAN.append(payload)


@pytest.fixture(autouse=True)
def _reset(monkeypatch: pytest.MonkeyPatch) -> None:
    RAN.clear()
    from haze._orchestration import batch_records, batches

    for module in (batch_records, batches):
        monkeypatch.setattr(module, "DISPATCH_CHUNK", 2)
    try:
        from haze._orchestration import batch_dispatch
    except ImportError:  # before the batch's dispatch had a module of its own
        return
    monkeypatch.setattr(batch_dispatch, "DISPATCH_CHUNK", 2)


def callbacks(pending: Any) -> Any:
    """Job-reference callbacks (a plain function may not follow a job to "dead")."""
    return (
        pending.then(bdf_record.with_("then"))
        .catch(bdf_record.with_("catch"))
        .finally_(bdf_record.with_("finally"))
    )


async def test_a_payload_refused_late_refuses_the_batch_before_anything_runs(
    app: Any, done: Any
) -> None:
    # the bad member comes after the first chunk: it used to go out (or, on sync, run)
    # before the bad one was found, and the batch never ended
    jobs = [bdf_ok.with_({"n": n}) for n in range(3)] + [bdf_ok.with_({"bad": object()})]
    with pytest.raises(PayloadError) as e:
        await callbacks(Queue.batch(jobs)).dispatch()
    assert "\n" not in str(e.value)
    await done()
    assert RAN == []  # no member and no callback ran
    assert await Queue.size() == 0


async def test_a_send_failing_after_some_were_queued_still_ends_the_batch(
    make_app: Any, done: Any
) -> None:
    async with make_app(connections=dead()) as app:
        jobs: list[Any] = [bdf_ok.with_({"n": 0}), bdf_ok.with_({"n": 1})]
        jobs += [bdf_ok.with_({"n": 2}).on_connection("dead"), bdf_ok.with_({"n": 3})]
        with pytest.raises(DispatchIncompleteError) as e:
            await callbacks(Queue.batch(jobs).allow_failures()).dispatch()
        assert "2 of 4 jobs were queued" in str(e.value), e.value
        assert "\n" not in str(e.value)
        assert e.value.unsent == 2 and e.value.batch_id is not None
        await done()
        batch = await Queue.find_batch(e.value.batch_id)
        assert batch is not None and batch.finished, batch
        assert (batch.total, batch.processed, batch.failed, batch.pending) == (4, 2, 2, 0)
        assert sorted(p["n"] for p in RAN if isinstance(p, dict)) == [0, 1]
        # the unsent count as failures: catch and finally once, then never
        assert sorted(p for p in RAN if isinstance(p, str)) == ["catch", "finally"]
        # indexed: the dashboard lists it and queue:prune-batches finds it
        assert e.value.batch_id in await recent_ids(app.manager)
        # the jobs that never had an id are one count, not one failed slot each: every
        # job of the batch reads its failed slots when it starts
        store = app.manager.stores.batches()
        assert await store.get(f"haze:batch:{e.value.batch_id}:failed") is None
        assert batch.failed_job_ids == []


class _DumpsOnce:
    """A payload model whose JSON form can be taken once: the batch's check before the
    first send takes it, the send of its chunk takes it again and gets a ``RuntimeError``
    (an error that is neither an outage nor a partial send, raised by the app's own
    code in the middle of a dispatch, the same way on every driver)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.dumps = 0

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        self.dumps += 1
        if self.dumps > 1:
            raise RuntimeError("the payload cannot be read twice")
        return {"n": self.n}


async def test_a_later_chunk_failing_with_an_unexpected_error_still_ends_the_batch(
    app: Any, done: Any
) -> None:
    # the first chunk (2 jobs) is queued, the second's first job raises a RuntimeError
    jobs: list[Any] = [bdf_ok.with_({"n": 0}), bdf_ok.with_({"n": 1})]
    jobs += [bdf_ok.with_(_DumpsOnce(2)), bdf_ok.with_({"n": 3})]
    with pytest.raises(DispatchIncompleteError) as e:
        await callbacks(Queue.batch(jobs).allow_failures()).dispatch()
    assert "2 of 4 jobs were queued" in str(e.value), e.value
    assert "RuntimeError: the payload cannot be read twice" in str(e.value)
    assert "\n" not in str(e.value)
    assert e.value.unsent == 2 and e.value.batch_id is not None
    await done()
    batch = await Queue.find_batch(e.value.batch_id)
    assert batch is not None and batch.finished, batch
    assert (batch.total, batch.processed, batch.failed, batch.pending) == (4, 2, 2, 0)
    assert sorted(p["n"] for p in RAN if isinstance(p, dict)) == [0, 1]
    assert sorted(p for p in RAN if isinstance(p, str)) == ["catch", "finally"]
    assert e.value.batch_id in await recent_ids(app.manager)


async def test_a_send_failing_first_queues_nothing_and_raises_its_own_error(
    make_app: Any, done: Any
) -> None:
    async with make_app(connections=dead()):
        jobs = [bdf_ok.with_({"n": 0}).on_connection("dead"), bdf_ok.with_({"n": 1})]
        with pytest.raises(Exception) as e:
            await callbacks(Queue.batch(jobs)).dispatch()
        assert not isinstance(e.value, DispatchIncompleteError), e.value
        assert "unavailable" in str(e.value)
        await done()
        assert RAN == []


async def test_a_bulk_whose_second_connection_fails_names_the_messages_not_queued(
    make_app: Any, done: Any
) -> None:
    async with make_app(connections=dead()):
        jobs = [bdf_ok.with_({"n": 0}), bdf_ok.with_({"n": 1})]
        jobs.append(bdf_ok.with_({"n": 2}).on_connection("dead"))
        with pytest.raises(DispatchIncompleteError) as e:
            await Queue.bulk(jobs)
        assert len(e.value.failed) == 1 and e.value.unsent == 1, e.value
        assert "2 of 3" in str(e.value)
        await done()
        assert sorted(p["n"] for p in RAN) == [0, 1]


# ---------------------------------------- a chain whose head cannot be sent


def _stored_tails(app: Any) -> list[str]:
    """Keys of stored chain links left in the batches store (the contract's memory store)."""
    store = app.manager.stores.batches()
    return [k for k in list(store._data) if k.startswith("haze:chain:")]


async def test_a_chain_whose_head_is_not_sent_leaves_no_stored_link(
    make_app: Any, done: Any, tmp_path: Any
) -> None:
    folder = tmp_path / "offload"
    main = {"offload": {"to": f"file://{folder}", "over": "1KiB"}}
    async with make_app(options=main, connections=dead()) as app:
        # the head goes to "dead"; the next link's payload is offloaded to main's store
        # and, the chain being long, most links are stored in the batches store, both
        # before the head is sent
        links = [bdf_ok.with_({"n": 0}).on_connection("dead")]
        links.append(bdf_ok.with_({"n": 1, "blob": "x" * 4096}).on_connection("main"))
        links += [
            bdf_ok.with_({"n": n, "pad": "y" * 900}).on_connection("main") for n in range(2, 40)
        ]
        with pytest.raises(Exception, match="unavailable"):
            await Queue.chain(links).dispatch()
        assert _stored_tails(app) == []
        assert not folder.exists() or sorted(folder.iterdir()) == []
        await done()
        assert RAN == []


async def test_a_batch_s_chain_whose_head_is_not_sent_leaves_no_stored_link(
    make_app: Any, done: Any, tmp_path: Any
) -> None:
    folder = tmp_path / "offload"
    main = {"offload": {"to": f"file://{folder}", "over": "1KiB"}}
    async with make_app(options=main, connections=dead()) as app:
        chain = [bdf_ok.with_({"n": 10}).on_connection("dead")]
        chain.append(bdf_ok.with_({"n": 11, "blob": "x" * 4096}).on_connection("main"))
        jobs: list[Any] = [bdf_ok.with_({"n": 0}), chain]
        with pytest.raises(DispatchIncompleteError) as e:
            await callbacks(Queue.batch(jobs).allow_failures()).dispatch()
        assert "1 of 3 jobs were queued" in str(e.value), e.value
        assert not folder.exists() or sorted(folder.iterdir()) == []
        await done()
        batch = await Queue.find_batch(e.value.batch_id)
        assert batch is not None and batch.finished and batch.failed == 2, batch
        assert sorted(p for p in RAN if isinstance(p, str)) == ["catch", "finally"]
        assert [p["n"] for p in RAN if isinstance(p, dict)] == [0]
        del app


# ---------------------------------------- Batch.add

GATE: list[asyncio.Event] = []


@define_job(name="bdf_gate")
async def bdf_gate(payload: Any, job: JobContext) -> None:
    await GATE[0].wait()
    RAN.append("gate")


@pytest.mark.requires("queued")
async def test_adding_jobs_that_are_refused_or_not_sent_leaves_the_batch_as_it_was(
    make_app: Any, done: Any
) -> None:
    GATE[:] = [asyncio.Event()]
    async with make_app(connections=dead()):
        try:
            batch = await callbacks(Queue.batch([bdf_gate.with_({})])).dispatch()
            with pytest.raises(PayloadError):
                await batch.add([bdf_ok.with_({"n": 1}), bdf_ok.with_({"bad": object()})])
            with pytest.raises(Exception, match="unavailable"):
                await batch.add([bdf_ok.with_({"n": 2}).on_connection("dead")])
        finally:
            GATE[0].set()
        await done()
        after = await batch.fresh()
        assert after.finished and (after.total, after.pending) == (1, 0), after
        assert sorted(str(p) for p in RAN) == ["finally", "gate", "then"]


@define_job(name="bdf_tracked", track=True)
async def bdf_tracked(payload: Any, job: JobContext) -> None:
    RAN.append(payload)


async def test_a_bulk_keeps_no_status_record_for_a_message_not_queued(
    make_app: Any, done: Any
) -> None:
    async with make_app(connections=dead()):
        jobs = [bdf_tracked.with_({"n": 0}), bdf_tracked.with_({"n": 1}).on_connection("dead")]
        with pytest.raises(DispatchIncompleteError) as e:
            await Queue.bulk(jobs)
        (lost,) = e.value.failed
        assert await Queue.status(lost) is None  # it was never queued: no "queued" record
        await done()
        assert RAN == [{"n": 0}]


class _CancelsOnSecondDump:
    """A payload model whose second JSON dump (its chunk's send; the batch's check took
    the first) cancels the task awaiting the batch's dispatch, as a caller's timeout
    (``asyncio.wait_for``) does while the batch's jobs go out."""

    task: asyncio.Task[Any] | None = None

    def __init__(self, n: int) -> None:
        self.n = n
        self.dumps = 0

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        self.dumps += 1
        if self.dumps == 2 and self.task is not None:
            self.task.cancel()
        return {"n": self.n}


async def test_a_batch_whose_dispatch_is_cancelled_midway_still_ends(app: Any, done: Any) -> None:
    """The send in flight when the caller cancels goes out whole; the jobs after it are
    counted as failed, so the batch is listed and ends once the queued ones do, and the
    caller gets its CancelledError. Before, the batch was never listed and never ended."""
    jobs: list[Any] = [bdf_ok.with_({"n": 0}), bdf_ok.with_({"n": 1})]
    jobs += [bdf_ok.with_(_CancelsOnSecondDump(2)), bdf_ok.with_({"n": 3})]
    jobs += [bdf_ok.with_({"n": 4}), bdf_ok.with_({"n": 5})]
    before = set(await recent_ids(app.manager))
    task = asyncio.ensure_future(callbacks(Queue.batch(jobs).allow_failures()).dispatch())
    _CancelsOnSecondDump.task = task
    try:
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        _CancelsOnSecondDump.task = None
    await done()
    listed = set(await recent_ids(app.manager)) - before
    assert len(listed) == 1, listed
    batch = await Queue.find_batch(listed.pop())
    assert batch is not None and batch.finished, batch
    ran = sorted(p["n"] for p in RAN if isinstance(p, dict))
    assert ran == list(range(len(ran))) and len(ran) >= 2, ran
    assert (batch.total, batch.processed, batch.failed, batch.pending) == (
        6,
        len(ran),
        6 - len(ran),
        0,
    )
    called = ["catch", "finally"] if len(ran) < 6 else ["finally", "then"]
    assert sorted(p for p in RAN if isinstance(p, str)) == called
