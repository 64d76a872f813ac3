"""The failure path on every driver that keeps failed jobs: a message id that fails a
second time keeps one failed record, and an error inside the failure path itself still
settles the message and is recorded with the job's own error; a retry queues each
failed job once, and one that dies at any of its writes never runs it twice; a job's
``failed()`` runs again after a worker died in it, and never twice otherwise."""

from __future__ import annotations

import asyncio
import copy
import sys
from typing import Any

import pytest
from haze import App, Queue, define_job
from haze._base.message import decode
from haze._engine.hooks import Outcome, Run, Stage
from haze._workers.worker import Worker
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


async def test_a_failure_whose_text_holds_nul_is_kept(app: App, done: Any) -> None:
    # The error is made of the payload, which may hold NUL: PostgreSQL text cannot, so
    # every store keeps the text with NUL shown as the four characters \x00.
    job_id = await declined.dispatch({"order": "7\x00b"})
    await done()
    [failed] = await Queue.failed()
    assert failed.id == job_id
    assert "ValueError: order 7\\x00b declined" in failed.exception
    assert failed.payload == {"order": "7\x00b"}


async def test_a_failure_no_store_keeps_goes_back_to_its_queue(
    app: App, monkeypatch: pytest.MonkeyPatch, driver: Any
) -> None:
    """A failed-job store that refuses the record (here its ``fail`` raises on cue, a
    fault injected on the driver object: no real store refuses on cue on every driver)
    twice: the job is not dropped with only a log line; it goes back to its queue, to
    run again later."""
    if driver.id == "cloudflare" and sys.platform == "emscripten":
        pytest.skip(
            "inside a Worker the released message goes back to Cloudflare's queue, which "
            "has no count and which this session cannot purge (the REST API is outside)"
        )
    conn = app.driver()
    refused: list[str] = []

    async def refuse(reserved: Any, record: Any) -> bool:
        refused.append(record.id)
        raise RuntimeError("the failed-job store refuses this record")

    real_release = conn.release
    released: list[float] = []

    async def release(reserved: Any, delay: float, *, consume_attempt: bool) -> bool:
        owned = await real_release(reserved, delay, consume_attempt=consume_attempt)
        released.append(delay)
        return owned

    monkeypatch.setattr(conn, "fail", refuse)
    monkeypatch.setattr(conn, "release", release)
    job_id = await declined.dispatch({"order": 10})
    for _ in range(400):
        if released:
            break
        await asyncio.sleep(0.05)
    assert refused == [job_id, job_id]
    assert released and released[0] > 0
    assert await conn.size("default") == 1
    assert await Queue.failed() == []
    await conn.purge("default")


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


#: fo_declined's failed(): how often it started and how often it ran to its end.
_failed_calls: dict[str, list[int]] = {"started": [], "finished": []}
#: The injector of the test that runs: a write inside failed() (its own side effect).
_inside: list[Any] = []


async def _fo_failed(payload: dict[str, Any], error: BaseException, job: Any) -> None:
    _failed_calls["started"].append(payload["n"])
    for injector in _inside:
        injector.tick("inside failed()")  # the process may die here
    _failed_calls["finished"].append(payload["n"])


@define_job(name="fo_declined", tries=1, failed=_fo_failed)
def fo_declined(payload: dict[str, Any]) -> None:
    raise ValueError(f"order {payload['n']} declined")


def _dies_at(what: str) -> Any:
    """An ``Injector`` whose process dies at the first write named ``what``, and writes
    nothing after that (``stay_dead``) until it is disarmed (a fresh worker)."""
    from crash_points import Crash, Injector

    class At(Injector):
        def tick(self, name: str) -> None:
            if self.armed and self.crashed is None and name.startswith(what):
                self.crashed = name
                raise Crash(name)
            super().tick(name)

    return At(None, stay_dead=True)


async def _take(app: App, spec: Any) -> tuple[Any, Any]:
    """One message off the queue by hand, and what ends its delivery (``finish(threw)``):
    a Cloudflare Worker's messages come in a batch that the platform settles when
    ``queue()`` returns (or throws)."""
    take_one = spec.extra.get("take_one")
    if take_one is not None:
        taken = take_one(app)
        if taken is None:
            await asyncio.sleep(0.05)
            return None, None
        return taken
    return await app.driver().reserve(["default"], 0.2), lambda threw: None


async def _queued(app: App, spec: Any) -> int:
    stored = spec.extra.get("stored")
    return int(stored()) if stored is not None else await app.driver().size("default")


def _written(injector: Any, name: str, real: Any) -> Any:
    """The driver's write ``name``, a crash point of ``injector``."""

    async def write(*args: Any, **kw: Any) -> Any:
        injector.tick(name)
        return await real(*args, **kw)

    return write


async def _deliver_until_recorded(app: App, spec: Any, crash: Any, lease: float) -> None:
    """Take the job off the queue by hand until its failure is recorded. A delivery that
    crashed is delivered again (the next attempt, the same claim), as after a worker's
    death, by a fresh worker."""
    from crash_points import Crash

    driver = app.driver()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10 * lease + 20
    while not await Queue.failed():
        assert loop.time() < deadline, f"the failure was never recorded ({crash.crashed})"
        reserved, finish = await _take(app, spec)
        if reserved is None:
            continue
        try:
            await app.manager.process(reserved, driver)
        except Crash:
            crash.armed = False
            again = copy.copy(reserved)  # the driver's own claim (a memory one has slots)
            again.attempt += 1
            await app.manager.process(again, driver)
        finish(False)


@pytest.mark.parametrize("crash_at", ["inside failed()", "fail"])
async def test_a_crash_in_or_after_failed_loses_no_failed_call(
    app: App, driver: Any, crash_at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker dies inside the job's ``failed()`` (it writes nothing after that point):
    the job's next delivery runs ``failed()`` again once the dead worker's lease has
    ended, and the failure is recorded once. A worker that dies after ``failed()``
    returned, as it records the failure: the next delivery records it and does not run
    ``failed()`` again."""
    from crash_points import CrashingStore

    lease = 0.5
    monkeypatch.setattr("haze._engine.failures.FAILED_LEASE", lease)
    await _no_consumers(app, monkeypatch)
    crash = _dies_at(crash_at)
    app._stores["memory"] = CrashingStore(app.queue_store, crash)  # type: ignore[assignment]
    queue = app.driver()
    for name in ("ack", "fail", "release"):
        monkeypatch.setattr(queue, name, _written(crash, name, getattr(queue, name)))
    _failed_calls["started"].clear()
    _failed_calls["finished"].clear()
    _inside[:] = [crash]
    try:
        await fo_declined.dispatch({"n": 5})
        await _deliver_until_recorded(app, driver, crash, lease)
    finally:
        _inside.clear()
    assert crash.crashed == crash_at
    [failed] = await Queue.failed()
    assert "declined" in failed.exception or "MaxAttemptsExceededError" in failed.exception
    want = {"inside failed()": ([5, 5], [5]), "fail": ([5], [5])}[crash_at]
    assert (_failed_calls["started"], _failed_calls["finished"]) == want
    assert await _queued(app, driver) == 0


#: fo_slow's failed(): the ids it ran for; how long it takes.
_slow_failed: list[str] = []
_SLOW = {"seconds": 0.0}


async def _fo_slow_failed(payload: dict[str, Any], error: BaseException, job: Any) -> None:
    await asyncio.sleep(_SLOW["seconds"])
    _slow_failed.append(job.id)


@define_job(name="fo_slow", tries=1, failed=_fo_slow_failed)
def fo_slow(payload: dict[str, Any]) -> None:
    raise ValueError("slow declined")


async def test_a_slow_failed_runs_once_beside_a_second_delivery(
    app: App, driver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deliveries of one message fail at once (a copied row, a lost lease), and its
    ``failed()`` outlasts the lease several times: the lease is renewed while it runs, so
    the other delivery goes back to the queue, finds it done later, and records the
    failure; ``failed()`` runs once, and one failed record is kept."""
    lease = 0.3
    monkeypatch.setattr("haze._engine.failures.FAILED_LEASE", lease)
    await _no_consumers(app, monkeypatch)
    _SLOW["seconds"] = 4 * lease
    _slow_failed.clear()
    pending = fo_slow.with_({})
    conn, queue_name = app.manager.resolve(pending)
    message = app.manager.build(pending, conn, queue_name)
    spec, queue = driver, app.driver(conn)
    body = app.manager.encode(message, queue, fo_slow)
    for _ in range(2):
        await queue.enqueue(body, message, 0.0)
    (first, end_first), (second, end_second) = [await _take(app, spec) for _ in range(2)]
    assert first is not None and second is not None
    # The second delivery fails while the first runs failed() (after its lease's end).
    slow = asyncio.ensure_future(app.manager.process(first, queue))
    await asyncio.sleep(2 * lease)
    assert await app.manager.process(second, queue) == "released"
    end_second(False)
    await slow
    end_first(False)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while await _queued(app, spec):
        assert loop.time() < deadline, "the second delivery never came back"
        again, end = await _take(app, spec)
        if again is not None:
            assert await app.manager.process(again, queue) == "failed"
            end(False)
    assert _slow_failed == [message.id]
    assert [f.id for f in await Queue.failed()] == [message.id]
