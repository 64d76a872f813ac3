"""The failure path on every driver that keeps failed jobs: a message id that fails a
second time keeps one failed record, and an error inside the failure path itself still
settles the message and is recorded with the job's own error; a retry queues each
failed job once, and one that dies at any of its writes never runs it twice."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from haze import App, Queue, define_job
from haze._engine.hooks import Outcome, Run, Stage
from haze._kernel.message import decode
from haze._runners.worker import Worker
from haze.contracts.failed import RetriesAtomically

pytestmark = pytest.mark.requires("queued", "failed_store")


@define_job(name="fp_declined", tries=1)
def declined(payload: dict[str, Any]) -> None:
    raise ValueError(f"order {payload['order']} declined")


async def _enqueue_twice(app: App, payload: dict[str, Any]) -> str:
    """One message, enqueued twice under its one id (a redelivery, a copied row)."""
    pending = declined.with_(payload)
    conn, queue = app.manager.resolve(pending)
    message = app.manager.build(pending, conn, queue)
    driver = app.driver(conn)
    body = app.manager.encode(message, driver, declined)
    for _ in range(2):
        await driver.enqueue(body, message, 0.0)
    return message.id


async def test_a_repeated_id_keeps_one_failed_record(app: App, done: Any) -> None:
    job_id = await _enqueue_twice(app, {"order": 7})
    await done()
    failed = await Queue.failed()
    assert [f.id for f in failed] == [job_id]
    assert "ValueError: order 7 declined" in failed[0].exception
    assert await app.driver().size("default") == 0


class _BrokenHook:
    """An outcome hook with a bug: its step of a final failure raises."""

    async def settling(self, run: Run) -> None:
        if run.outcome == Outcome.FAILED:
            raise KeyError("hook bug")

    async def settled(self, run: Run) -> None:
        return None


async def test_an_error_in_the_failure_path_still_settles_the_job(app: App, done: Any) -> None:
    app.manager.hooks.add(_BrokenHook(), Stage.RECORD)
    await declined.dispatch({"order": 8})
    await done()
    [failed] = await Queue.failed()
    assert "ValueError: order 8 declined" in failed.exception
    assert "KeyError: 'hook bug'" in failed.exception
    assert await app.driver().size("default") == 0


#: Whether fp_flaky fails, and how often each of its messages ran.
_flaky = {"failing": True}
_runs: dict[str, int] = {}


@define_job(name="fp_flaky", tries=1)
def flaky(payload: dict[str, Any], job: Any) -> None:
    _runs[job.id] = _runs.get(job.id, 0) + 1
    if _flaky["failing"]:
        raise RuntimeError(f"flaky {payload['n']}")


async def test_concurrent_retries_queue_each_failed_job_once(app: App, done: Any) -> None:
    _flaky["failing"] = True
    _runs.clear()
    for n in range(6):
        await flaky.dispatch({"n": n})
    await done()
    ids = sorted(f.id for f in await Queue.failed())
    assert len(ids) == 6
    _flaky["failing"] = False
    results = await asyncio.gather(*(app.manager.retry() for _ in range(3)))
    assert sorted(i for r in results for i in r) == ids  # each record won once
    await done()
    assert {i: _runs[i] for i in ids} == dict.fromkeys(ids, 2)  # failed once, retried once
    assert await Queue.failed() == []


async def test_a_retried_job_that_fails_again_keeps_its_new_record(app: App, done: Any) -> None:
    _flaky["failing"] = True
    _runs.clear()
    await flaky.dispatch({"n": 1})
    await done()
    [first] = await Queue.failed()
    assert await app.manager.retry([first.id]) == [first.id]
    await done()
    [again] = await Queue.failed()
    assert again.id == first.id and again.failed_at > first.failed_at
    assert _runs[first.id] == 2
    with pytest.raises(LookupError):
        await app.manager.retry(["no-such-failed-job"])


async def test_a_retry_that_died_after_queueing_leaves_no_record(app: App, done: Any) -> None:
    """The crash window between queueing the job and deleting the record: the job's
    first run deletes the record its retry claimed."""
    _flaky["failing"] = True
    await flaky.dispatch({"n": 3})
    await done()
    [rec] = await Queue.failed()
    failed = app.driver().failed
    claimed = await failed.claim_retry(rec.id, "dead-retrier", 900.0)
    assert claimed is not None
    _flaky["failing"] = False
    # What Admin.retry does before it would delete the record, then the process dies.
    await app.manager.admin._requeue(decode(claimed.body), app.driver(), "dead-retrier")
    await done()
    assert await Queue.failed() == []
    assert await app.manager.retry() == []  # nothing left to queue a second time


class _CrashingRetry:
    """Counts the writes of a retry (the failed store's claim, queueing, release; the
    driver's enqueue) on an ``Injector``, which raises ``Crash`` at one of them."""

    WRITES = ("claim_retry", "requeue_claimed", "retried", "forget")

    def __init__(self, driver: Any, injector: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        for owner, names in ((driver.failed, self.WRITES), (driver, ("enqueue",))):
            for name in names:
                real = getattr(owner, name, None)
                if real is not None:
                    monkeypatch.setattr(owner, name, self._counted(injector, name, real))

    @staticmethod
    def _counted(injector: Any, name: str, real: Any) -> Any:
        async def write(*args: Any) -> Any:
            injector.tick(name)
            return await real(*args)

        return write


async def _no_consumers(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on nothing takes jobs off the queue: a retried job waits (a backlog)."""
    for worker in getattr(app, "_contract_workers", []):
        await worker.stop()
    await app.manager.local.stop(asyncio.get_running_loop())
    monkeypatch.setattr(app.manager, "ensure_local_worker", lambda connection: None)


def _consume_again(app: App, spec: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Consumers again, as the contract app had them (stopped with it)."""
    monkeypatch.undo()
    if not app.driver().remote:
        app.manager.ensure_local_worker("main")
        return
    consumer = spec.extra.get("consumer")  # cloudflare: the platform's batches
    worker = (
        consumer(app, None)
        if consumer is not None
        else Worker(app, "main", None, 1, sleep=0.01, max_sleep=0.02)
    )
    worker.start()
    app._contract_workers.append(worker)  # type: ignore[attr-defined]


@pytest.mark.parametrize("crash_at", [1, 2, 3])
async def test_a_retry_that_dies_at_any_write_runs_its_job_once(
    app: App, done: Any, driver: Any, crash_at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry dies at its n-th write; its claim's lease then ends while the job (if it
    was queued) has not started. Where the failed jobs share the queue's backend, the
    next retry call leaves the job queued exactly once and no failed record beside it;
    on every driver, the job then runs once."""
    from crash_points import Crash, Injector  # not in the Pyodide run's files

    _flaky["failing"] = True
    _runs.clear()
    await flaky.dispatch({"n": 4})
    await done()
    [rec] = await Queue.failed()
    await _no_consumers(app, monkeypatch)
    monkeypatch.setattr("haze._engine.admin.RETRY_LEASE", 0.2)
    injector = Injector(crash_at, stay_dead=True)
    queue = app.driver()
    _CrashingRetry(queue, injector, monkeypatch)
    try:
        await app.manager.retry()
    except Crash:
        pass
    injector.armed = False
    await asyncio.sleep(0.3)  # the dead retry's claim ends
    _flaky["failing"] = False
    await app.manager.retry()
    if isinstance(queue.failed, RetriesAtomically):
        queued = await queue.size("default")
        assert (queued, await Queue.failed()) == (1, []), injector.crashed
        assert await app.manager.retry() == []  # and nothing left to queue again
    _consume_again(app, driver, monkeypatch)
    await done()
    assert _runs[rec.id] == 2, injector.crashed  # failed once, then ran once
    assert await Queue.failed() == []
