"""After-commit dispatch through the transaction-hook registry (seed: 事务提交后投递; SPEC §6).

A minimal test ``Transaction`` provider is registered with ``haze.transactions``:
nested blocks are savepoints, hooks run after the outermost commit (before the block
returns) and are dropped with the level that rolls back. The SQLAlchemy and ``Db``
integrations are covered elsewhere.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import haze
import pytest
from haze import JobContext, define_job
from haze import transactions as tx_registry

# ----------------------------------------------------------------------------- test provider


class FakeTransaction:
    """One transaction level; a nested one is a savepoint."""

    def __init__(self, parent: FakeTransaction | None) -> None:
        self.parent = parent
        self.callbacks: list[Callable[[], Any]] = []

    def on_commit(self, callback: Callable[[], Any]) -> None:
        self.callbacks.append(callback)


_current: contextvars.ContextVar[FakeTransaction | None] = contextvars.ContextVar(
    "contract_fake_tx", default=None
)


def _provider() -> FakeTransaction | None:
    return _current.get()


class Rollback(Exception):
    pass


@contextlib.asynccontextmanager
async def transaction() -> AsyncIterator[FakeTransaction]:
    parent = _current.get()
    tx = FakeTransaction(parent)
    token = _current.set(tx)
    try:
        yield tx
    except BaseException:
        _current.reset(token)
        tx.callbacks.clear()  # rollback (of the savepoint): forget its hooks
        raise
    _current.reset(token)
    if parent is not None:
        parent.callbacks.extend(tx.callbacks)  # savepoint released: wait for the outer commit
        return
    callbacks, tx.callbacks = tx.callbacks, []
    tx_registry.fire(callbacks)
    await tx_registry.wait_pending()  # hooks finish before the block returns


@pytest.fixture(autouse=True)
def _provider_registered() -> Any:
    tx_registry.register_provider(_provider)
    RUNS.clear()
    yield
    tx_registry.unregister_provider(_provider)


# ----------------------------------------------------------------------------- jobs

RUNS: list[dict[str, Any]] = []


@define_job(name="ac_receipt", after_commit=True)
async def ac_receipt(payload: dict, job: JobContext) -> None:
    RUNS.append({"job": "receipt", "id": job.id, "payload": payload})


@define_job(name="ac_notify")
async def ac_notify(payload: dict, job: JobContext) -> None:
    RUNS.append({"job": "notify", "id": job.id, "payload": payload})


@define_job(name="ac_unique", unique={"key": lambda p: str(p["order"])}, after_commit=True)
async def ac_unique(payload: dict, job: JobContext) -> None:
    RUNS.append({"job": "unique", "id": job.id, "payload": payload})


@define_job(name="ac_fails", after_commit=True)
async def ac_fails(payload: dict, job: JobContext) -> None:
    RUNS.append({"job": "fails", "id": job.id, "payload": payload})
    raise RuntimeError("receipt service down")


# ----------------------------------------------------------------------------- tests


async def test_three_ways_to_defer_until_commit(app, done):
    async with transaction():
        a = await ac_receipt.with_({"order": 1}).dispatch()
        b = await ac_notify.with_({"order": 1}).after_commit().dispatch()
        c_id = await ac_notify.dispatch({"order": 2}, after_commit=True)
        await done()
        assert RUNS == [], "nothing is enqueued before COMMIT"
        assert a.deferred
        assert b.deferred
        assert not a.skipped
        assert not b.skipped
    # hooks ran before the block returned
    await done()
    ids = {r["id"] for r in RUNS}
    assert ids == {a.id, b.id, c_id}, "the deferred id is the id the job runs with"


async def test_after_commit_false_does_not_defer(app, done):
    async with transaction():
        r = await ac_receipt.with_({"order": 1}).after_commit(False).dispatch()
        i = await ac_receipt.dispatch({"order": 2}, after_commit=False)
        assert r.deferred is False
        await done()
        assert {x["id"] for x in RUNS} == {r.id, i}


async def test_rollback_drops_the_dispatch(app, done):
    with pytest.raises(Rollback):  # noqa: PT012
        async with transaction():
            await ac_receipt.dispatch({"order": 1})
            await ac_notify.with_({"order": 1}).after_commit().dispatch()
            raise Rollback
    await done()
    assert RUNS == []


async def test_savepoints_wait_for_the_outermost_commit(app, done):
    async with transaction():
        async with transaction():
            kept = await ac_receipt.with_({"order": "inner"}).dispatch()
        await done()
        assert RUNS == [], "a released savepoint does not fire hooks"
        with pytest.raises(Rollback):  # noqa: PT012
            async with transaction():
                await ac_receipt.dispatch({"order": "rolled back"})
                raise Rollback
        outer = await ac_receipt.with_({"order": "outer"}).dispatch()
    await done()
    assert sorted(r["payload"]["order"] for r in RUNS) == ["inner", "outer"]
    assert {r["id"] for r in RUNS} == {kept.id, outer.id}


async def test_outside_a_transaction_dispatch_is_immediate(app, done):
    r = await ac_receipt.with_({"order": 1}).dispatch()
    assert r.deferred is False
    await done()
    assert [x["id"] for x in RUNS] == [r.id]


async def test_no_provider_means_immediate(app, done):
    tx_registry.unregister_provider(_provider)
    r = await ac_receipt.with_({"order": 1}).dispatch()
    assert r.deferred is False
    await done()
    assert len(RUNS) == 1


async def test_unique_lock_is_taken_only_at_the_real_enqueue(app, driver, done):
    async with transaction():
        first = await ac_unique.with_({"order": 5}).dispatch()
        second = await ac_unique.with_({"order": 5}).dispatch()
        assert first.deferred
        assert second.deferred
        assert not first.skipped
        assert not second.skipped
        assert [k for k in app.queue_store._data if k.startswith("haze:unique:")] == []
    await done()
    assert RUNS[0]["id"] == first.id
    if driver.inline:
        # sync ran (and unlocked) the first one inside the commit hook
        assert len(RUNS) == 2
    else:
        assert len(RUNS) == 1, "the second dispatch found the lock at the real enqueue"


@pytest.mark.requires("queued")
async def test_errors_in_deferred_dispatch_are_logged_not_raised(app, done, caplog, monkeypatch):
    async def broken(body: str, message: Any, delay: float) -> None:
        raise ConnectionError("queue unreachable")

    monkeypatch.setattr(app.driver("main"), "enqueue", broken)
    with caplog.at_level(logging.ERROR, logger="haze"):
        async with transaction():
            r = await ac_receipt.with_({"order": 1}).dispatch()
            assert r.deferred
        await done()
    assert RUNS == []
    assert "after-commit dispatch" in caplog.text
    assert r.id in caplog.text
    assert "queue unreachable" in caplog.text


async def test_payload_that_is_not_json_fails_at_dispatch_even_when_deferred(app, done):
    async with transaction():
        with pytest.raises(TypeError, match="when"):
            await ac_receipt.dispatch({"when": object()})
    await done()
    assert RUNS == []


async def test_failing_job_on_sync_is_logged_after_commit(app, driver, done, caplog):
    if not driver.inline:
        pytest.skip("sync-only rule: the job runs inside the commit hook")
    with caplog.at_level(logging.ERROR, logger="haze"):
        async with transaction():
            await ac_fails.dispatch({"order": 1})
    assert len(RUNS) == 1
    assert "after-commit dispatch" in caplog.text


async def test_fake_records_only_after_commit(app, queue_fake):
    async with transaction():
        r = await ac_receipt.with_({"order": 1}).dispatch()
        await ac_unique.dispatch({"order": 9})
        await ac_unique.dispatch({"order": 9})
        queue_fake.assert_nothing_dispatched()
    queue_fake.assert_dispatched(ac_receipt, lambda p: p["order"] == 1)
    assert queue_fake.recorded(ac_receipt)[0].message.id == r.id
    queue_fake.assert_pushed_unique(ac_unique)
    queue_fake.assert_skipped(ac_unique)

    with pytest.raises(Rollback):  # noqa: PT012
        async with transaction():
            await ac_notify.with_({"x": 1}).after_commit().dispatch()
            raise Rollback
    queue_fake.assert_not_dispatched(ac_notify)


async def test_after_commit_callback_sync_and_async(app):
    calls: list[str] = []

    async def async_cb() -> None:
        calls.append("async")

    async with transaction():
        haze.after_commit(lambda: calls.append("sync"))
        haze.after_commit(async_cb)
        assert calls == []
    assert calls == ["sync", "async"]

    with pytest.raises(Rollback):  # noqa: PT012
        async with transaction():
            haze.after_commit(lambda: calls.append("dropped"))
            raise Rollback
    assert "dropped" not in calls

    haze.after_commit(lambda: calls.append("now"))
    assert calls[-1] == "now", "outside a transaction it runs at once"
    haze.after_commit(async_cb)
    await tx_registry.wait_pending()
    assert calls[-1] == "async"


async def test_after_commit_callback_errors_are_logged(app, caplog):
    def boom() -> None:
        raise RuntimeError("hook failed")

    async def aboom() -> None:
        raise RuntimeError("async hook failed")

    with caplog.at_level(logging.ERROR, logger="haze"):
        async with transaction():
            haze.after_commit(boom)
            haze.after_commit(aboom)
    assert "hook failed" in caplog.text
    assert "async hook failed" in caplog.text


def test_after_commit_rejects_non_callables():
    with pytest.raises(TypeError):
        haze.after_commit("not callable")  # type: ignore[arg-type]


def test_after_commit_option_must_be_a_bool():
    with pytest.raises(ValueError, match="after_commit"):

        @define_job(name="ac_bad_option", after_commit="yes")  # type: ignore[arg-type]
        async def bad(payload: dict) -> None: ...

    with pytest.raises(ValueError, match="after_commit"):
        ac_notify.with_({}).after_commit("yes")  # type: ignore[arg-type]
