"""``Queue.wait`` wakes on the store's notification (Redis pub/sub, PostgreSQL NOTIFY).

A real ``haze queue:work`` process runs a job that holds until this test creates a file;
this process waits for the job with the fallback poll (``status._NOTIFIED_POLL``) set to
30 s. The wait is entered (subscribed, record read: still running) before the job is
released, so returning within 10 s can only come from the notification the worker
sends with the final status write. The control test listens on another channel: the
same wait then stays asleep after the record is final.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import haze._jobs.status as status
import pytest
from haze import App, Queue
from haze.contracts.store import StatusNotifier
from worker_procs import WorkerProcs

pytestmark = [pytest.mark.timeout(180)]

# ``worker_app`` (this folder's app, opened, with its worker processes) is in conftest.py.


async def _started(procs: WorkerProcs, job_id: str, limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while not any(e[0] == "start" and e[1] == job_id for e in procs.events()):
        if time.monotonic() > deadline:
            raise AssertionError("job did not start:\n" + "\n".join(map(procs.log, procs.procs)))
        await asyncio.sleep(0.05)


async def _start_wait(
    monkeypatch: pytest.MonkeyPatch, job_id: str, timeout: float
) -> asyncio.Task[status.JobStatus]:
    """``Queue.wait(job_id)`` in a task, returned once the wait has subscribed and read
    the record (still running)."""
    entered = asyncio.Event()
    subscribed: list[bool] = []
    inner = status._wait_loop

    async def spy(*args: Any) -> status.JobStatus:
        subscribed.append(args[4] is not None)  # the Subscription, or None when polling
        entered.set()
        return await inner(*args)

    monkeypatch.setattr(status, "_wait_loop", spy)
    waiter = asyncio.create_task(Queue.wait(job_id, timeout=timeout))
    await asyncio.wait_for(entered.wait(), 10)
    assert subscribed == [True], "the store did not offer a subscription"
    await asyncio.sleep(0.3)  # the first read happens while the job still runs
    assert (await Queue.status(job_id)).state == "running"  # type: ignore[union-attr]
    return waiter


@pytest.mark.parametrize("worker_app", ["postgres", "redis"], indirect=True)
async def test_wait_wakes_on_the_notification_of_another_process(
    worker_app: tuple[App, WorkerProcs, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    app, procs, env = worker_app
    assert isinstance(app.queue_store, StatusNotifier)
    monkeypatch.setattr(status, "_NOTIFIED_POLL", 30.0)  # no poll within the timeout
    p = procs.spawn(env["JSTAT_CONNECTION"], "default", ["--sleep", "0.1"], env)
    await procs.wait_ready(p)
    go = tmp_path / "go"
    job_id = await Queue.dispatch("jstat_gated", {"go": str(go)})
    await _started(procs, job_id)
    waiter = await _start_wait(monkeypatch, job_id, timeout=60)
    go.write_text("go")
    # Its next poll is 30 s away, its deadline 60 s: within 10 s only a notification
    # wakes it.
    final = await asyncio.wait_for(waiter, 10)
    assert (final.state, final.result) == ("done", "released")


@pytest.mark.parametrize("worker_app", ["postgres", "redis"], indirect=True)
async def test_control_a_wait_on_another_channel_times_out(
    worker_app: tuple[App, WorkerProcs, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Without the notification the same wait sleeps on after the record is final: the
    test above passes only through it."""
    _app, procs, env = worker_app
    monkeypatch.setattr(status, "_NOTIFIED_POLL", 30.0)
    monkeypatch.setattr(status, "final_channel", lambda job_id: f"haze:final:elsewhere:{job_id}")
    p = procs.spawn(env["JSTAT_CONNECTION"], "default", ["--sleep", "0.1"], env)
    await procs.wait_ready(p)
    go = tmp_path / "go"
    job_id = await Queue.dispatch("jstat_gated", {"go": str(go)})
    await _started(procs, job_id)
    waiter = await _start_wait(monkeypatch, job_id, timeout=60)
    go.write_text("go")
    try:
        deadline = time.monotonic() + 30
        while not (await Queue.status(job_id)).final:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the job did not end"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # the notification, had it come, was read by now
        assert not waiter.done(), "the wait returned without its notification"
    finally:
        waiter.cancel()


@pytest.mark.parametrize("worker_app", ["postgres", "redis"], indirect=True)
async def test_cancelling_a_queued_job_wakes_its_waiter(
    worker_app: tuple[App, WorkerProcs, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """No worker: ``Queue.cancel`` writes ``cancelled`` itself and notifies too."""
    monkeypatch.setattr(status, "_NOTIFIED_POLL", 30.0)
    job_id = await Queue.dispatch("jstat_gated", {"go": str(tmp_path / "go")})
    entered = asyncio.Event()
    inner = status._wait_loop

    async def spy(*args: Any) -> status.JobStatus:
        assert args[4] is not None  # subscribed
        entered.set()
        return await inner(*args)

    monkeypatch.setattr(status, "_wait_loop", spy)
    waiter = asyncio.create_task(Queue.wait(job_id, timeout=60))
    await asyncio.wait_for(entered.wait(), 10)
    await asyncio.sleep(0.3)  # its first read saw "queued"
    assert await Queue.cancel(job_id) is True
    final = await asyncio.wait_for(waiter, 10)
    assert final.state == "cancelled"


@pytest.mark.parametrize("worker_app", ["redis"], indirect=True)
async def test_redis_waits_past_the_subscription_cap_poll(
    worker_app: tuple[App, WorkerProcs, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Each Redis subscription holds a pooled connection: past the cap a wait polls."""
    import haze.stores.redis as redis_store

    app, _procs, _env = worker_app
    store = app.queue_store
    assert isinstance(store, redis_store.RedisStore)
    monkeypatch.setattr(redis_store, "_MAX_SUBSCRIPTIONS", 1)
    monkeypatch.setattr(status, "_NOTIFIED_POLL", 30.0)
    job_id = await Queue.dispatch("jstat_gated", {"go": str(tmp_path / "go")})
    subscribed: list[bool] = []
    inner = status._wait_loop

    async def spy(*args: Any) -> status.JobStatus:
        subscribed.append(args[4] is not None)
        return await inner(*args)

    monkeypatch.setattr(status, "_wait_loop", spy)
    async with store.subscribe("haze:final:someone-else"):
        waiter = asyncio.create_task(Queue.wait(job_id, timeout=60))
        await asyncio.sleep(0.3)
        assert await Queue.cancel(job_id) is True
        final = await asyncio.wait_for(waiter, 10)
    assert (final.state, subscribed) == ("cancelled", [False])
    async with store.subscribe("haze:final:again"):  # the slot was given back
        pass
