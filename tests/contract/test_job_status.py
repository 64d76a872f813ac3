"""Job status records, results, progress and cancellation on every driver.

``track=True`` / ``keep_result`` keep a record in the app's lock store; ``Queue.wait``
returns it once final; ``Queue.cancel`` stops queued, delayed and running jobs. The
contract app keeps its store in memory (its worker runs in this process); a cancel
across real processes is in ``tests/robustness/test_cancel_procs.py``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from haze import (
    JobContext,
    JobProgressError,
    JobStatus,
    Queue,
    UntrackedJobError,
    define_job,
)

RAN: list[tuple[str, Any]] = []
FAILED_CALLS: list[Any] = []
GATES: dict[str, asyncio.Event] = {}
PROGRESS_SEEN: list[tuple[str, Any]] = []


@pytest.fixture(autouse=True)
def _reset() -> Any:
    RAN.clear()
    FAILED_CALLS.clear()
    GATES.clear()
    PROGRESS_SEEN.clear()


@define_job(name="status_sum", keep_result="1h")
async def status_sum(payload: dict) -> dict:
    RAN.append(("status_sum", payload))
    return {"sum": sum(payload["n"])}


@define_job(name="status_tracked", track=True)
async def status_tracked(payload: dict) -> str:
    RAN.append(("status_tracked", payload))
    return "not kept"


@define_job(name="status_plain")
async def status_plain(payload: dict) -> None:
    RAN.append(("status_plain", payload))


@define_job(name="status_untracked", track=False)
async def status_untracked(payload: dict) -> None:
    RAN.append(("status_untracked", payload))


@define_job(name="status_fails", tries=2, track=True)
async def status_fails(payload: dict) -> None:
    RAN.append(("status_fails", payload))
    raise RuntimeError("boom")


@define_job(name="status_big", keep_result="1h")
async def status_big(payload: dict) -> str:
    return "x" * 70_000


async def _failed_hook(payload: Any, error: BaseException, job: JobContext) -> None:
    FAILED_CALLS.append(payload)


@define_job(name="status_gated", tries=3, track=True, failed=_failed_hook)
async def status_gated(payload: dict, job: JobContext) -> str:
    """Runs until its gate opens; with ``obey`` it stops when cancelled."""
    RAN.append(("status_gated", payload))
    job.progress(10)
    job.progress({"step": "waiting", "done": 1})
    gate = GATES.setdefault(payload["gate"], asyncio.Event())
    deadline = time.monotonic() + payload.get("max", 15)
    while not gate.is_set() and time.monotonic() < deadline:
        if payload.get("obey"):
            job.signal.throw_if_aborted()
        await asyncio.sleep(0.02)
    RAN.append(("status_gated:end", {**payload, "cancelled": job.cancelled()}))
    return "finished"


@define_job(name="status_gated_plain", failed=_failed_hook)
async def status_gated_plain(payload: dict, job: JobContext) -> None:
    RAN.append(("status_gated_plain", payload))
    gate = GATES.setdefault(payload["gate"], asyncio.Event())
    deadline = time.monotonic() + 15
    while not gate.is_set() and time.monotonic() < deadline:
        job.signal.throw_if_aborted()
        await asyncio.sleep(0.02)


def _ran(name: str) -> list[Any]:
    return [p for n, p in RAN if n == name]


async def _until(cond: Any, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def _state(job_id: str, state: str, limit: float = 10.0) -> JobStatus:
    deadline = time.monotonic() + limit
    while True:
        st = await Queue.status(job_id)
        if st is not None and st.state == state:
            return st
        assert time.monotonic() < deadline, f"state {state!r} not reached: {st}"
        await asyncio.sleep(0.01)


async def test_result_is_kept_and_wait_returns_it(app: Any, done: Any) -> None:
    res = await status_sum.with_({"n": [1, 2, 3]}).dispatch()
    st = await res.wait(timeout=10)
    assert st.state == "done" and st.final
    assert st.result == {"sum": 6}
    assert st.attempt == 1 and st.name == "status_sum" and st.id == res.id
    assert st.error is None
    assert await Queue.status(res.id) == st
    assert (await Queue.wait(res.id, timeout=5)).result == {"sum": 6}
    await done()


async def test_tracked_without_keep_result_keeps_no_result(app: Any, done: Any) -> None:
    job_id = await status_tracked.dispatch({"a": 1})
    st = await Queue.wait(job_id, timeout=10)
    assert st.state == "done" and st.result is None


async def test_untracked_job_has_no_record(app: Any, done: Any) -> None:
    job_id = await status_plain.dispatch({"a": 1})
    await done()
    assert _ran("status_plain") == [{"a": 1}]
    assert await Queue.status(job_id) is None
    with pytest.raises(UntrackedJobError, match="track=True"):
        await Queue.wait(job_id, timeout=1)
    assert app.queue_store._data.get(f"haze:status:{job_id}") is None


async def test_queue_config_track_tracks_every_job(make_app: Any, done: Any) -> None:
    # define_queue_config(track=True, keep_result=...) is validated in
    # runtime/tests/test_job_status_config.py; here its effect on every driver.
    async with make_app() as app:
        app.queue_config.track = True
        app.queue_config.keep_result = 60.0
        app.manager._tracking.clear()
        job_id = await status_plain.dispatch({"b": 2})
        st = await Queue.wait(job_id, timeout=10)
        assert st.state == "done"
        opted_out = await status_untracked.dispatch({"c": 3})
        await done()
        assert await Queue.status(opted_out) is None


@pytest.mark.requires("retries")
async def test_failed_after_retries(app: Any, done: Any, quietly: Any) -> None:
    job_id = await status_fails.dispatch({"x": 1})
    st = await Queue.wait(job_id, timeout=10)
    assert st.state == "failed"
    assert st.attempt == 2
    assert st.error is not None and st.error.startswith("RuntimeError: boom")
    assert len(_ran("status_fails")) == 2


async def test_failed_on_sync_too(driver: Any, app: Any, quietly: Any) -> None:
    if driver.id != "sync":
        pytest.skip("the inline driver raises the failure to dispatch()")
    res = await quietly(status_fails.with_({"x": 1}).dispatch())
    assert isinstance(res, RuntimeError)
    recs = [v for k, v in app.queue_store._data.items() if k.startswith("haze:status:")]
    assert [r[0]["state"] for r in recs] == ["failed"]


async def test_oversized_result_is_dropped_with_a_reason(
    app: Any, done: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = await status_big.dispatch({})
    st = await Queue.wait(job_id, timeout=10)
    assert st.state == "done" and st.result is None
    assert st.error is not None and "65536-byte limit" in st.error
    assert "65536-byte limit" in caplog.text


@pytest.mark.requires("delay")
async def test_delayed_then_cancelled_never_runs(app: Any, done: Any) -> None:
    job_id = await status_sum.dispatch({"n": [1]}, delay="1s")
    st = await Queue.status(job_id)
    assert st is not None and st.state == "delayed" and st.attempt == 0
    assert await Queue.cancel(job_id) is True
    st = await Queue.wait(job_id, timeout=1)
    assert st.state == "cancelled"
    await asyncio.sleep(1.5)  # past its due time: delivered, seen cancelled, acked
    await done()
    assert _ran("status_sum") == []
    st = await Queue.status(job_id)
    assert st is not None and st.state == "cancelled"
    assert st.attempt == 0, "it never ran: no attempt"
    assert await Queue.cancel(job_id) is False  # already over


@pytest.mark.requires("delay")
async def test_untracked_delayed_cancel_never_runs(app: Any, done: Any) -> None:
    job_id = await status_plain.dispatch({"u": 1}, delay="1s")
    assert await Queue.cancel(job_id) is True  # unknown state: recorded
    await asyncio.sleep(1.5)
    await done()
    assert _ran("status_plain") == []


@pytest.mark.requires("queued")
async def test_queued_behind_a_busy_worker_is_cancelled(make_app: Any, done: Any) -> None:
    async with make_app(concurrency=1):
        blocker = await status_gated.dispatch({"gate": "b"})
        await _until(lambda: _ran("status_gated"))
        tracked = await status_sum.dispatch({"n": [2]})
        plain = await status_plain.dispatch({"p": 1})
        assert (await Queue.status(tracked)).state == "queued"  # type: ignore[union-attr]
        assert await Queue.cancel(tracked) is True
        assert await Queue.cancel(plain) is True
        GATES["b"].set()
        assert (await Queue.wait(blocker, timeout=10)).state == "done"
        assert (await Queue.wait(tracked, timeout=10)).state == "cancelled"
        await done()
        assert _ran("status_sum") == [] and _ran("status_plain") == []
        st = await Queue.status(tracked)
        assert st is not None and st.attempt == 0, "it never ran: no attempt"


@pytest.mark.requires("queued")
async def test_running_job_that_stops_ends_cancelled(app: Any, done: Any) -> None:
    job_id = await status_gated.dispatch({"gate": "r", "obey": True})
    await _state(job_id, "running")
    began = time.monotonic()
    assert await Queue.cancel(job_id) is True
    st = await Queue.wait(job_id, timeout=10)
    took = time.monotonic() - began
    assert st.state == "cancelled", st
    assert st.error == "cancelled while running"
    assert st.progress == {"step": "waiting", "done": 1}
    assert took < 5, f"took {took:.1f}s"  # one poll (1 s) plus slack on a loaded machine
    await done()
    assert len(_ran("status_gated")) == 1  # no retry (tries=3)
    assert FAILED_CALLS == []  # failed() not called
    if "failed_store" in app._contract_spec.capabilities:
        assert [f.id for f in await Queue.failed()] == []


@pytest.mark.requires("queued")
async def test_untracked_running_job_is_cancelled_too(app: Any, done: Any) -> None:
    job_id = await status_gated_plain.dispatch({"gate": "u"})
    await _until(lambda: _ran("status_gated_plain"))
    assert await Queue.cancel(job_id) is True
    await done()
    assert FAILED_CALLS == []
    if "failed_store" in app._contract_spec.capabilities:
        assert await Queue.failed() == []


@pytest.mark.requires("queued")
async def test_running_job_that_ignores_the_signal_finishes(app: Any, done: Any) -> None:
    job_id = await status_gated.dispatch({"gate": "i", "obey": False, "max": 2.5})
    await _state(job_id, "running")
    await Queue.cancel(job_id)
    st = await Queue.wait(job_id, timeout=10)
    assert st.state == "done"
    assert _ran("status_gated:end") == [{"gate": "i", "obey": False, "max": 2.5, "cancelled": True}]


@pytest.mark.requires("queued")
async def test_progress_updates_the_record_and_emits_events(app: Any, done: Any) -> None:
    def seen(job: JobContext, value: Any) -> None:
        PROGRESS_SEEN.append((job.id, value))

    Queue.on("progress", seen)
    try:
        job_id = await status_gated.dispatch({"gate": "p"})
        st = await _state(job_id, "running")
        await _until(lambda: len(PROGRESS_SEEN) == 2)
        deadline = time.monotonic() + 5
        while st.progress != {"step": "waiting", "done": 1} and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            st = await Queue.status(job_id)  # type: ignore[assignment]
        assert st.progress == {"step": "waiting", "done": 1}
        assert [(job_id, 10), (job_id, {"step": "waiting", "done": 1})] == PROGRESS_SEEN
        GATES["p"].set()
        final = await Queue.wait(job_id, timeout=10)
        assert final.state == "done" and final.progress == {"step": "waiting", "done": 1}
    finally:
        from haze._engine.manager import events

        events.off("progress", seen)


async def test_progress_values_are_checked(app: Any) -> None:
    from haze._jobs.status import check_progress

    assert check_progress(0) == 0 and check_progress(100) == 100
    for bad in (101, -1, True, 1.5, "50", {"x": object()}, {"big": "y" * 2000}):
        with pytest.raises(JobProgressError, match=r"job\.progress\(\)"):
            check_progress(bad)


@pytest.mark.requires("queued")
async def test_cancelled_batch_member_counts_as_processed(make_app: Any, done: Any) -> None:
    async with make_app(concurrency=1):
        blocker = await status_gated.dispatch({"gate": "bb"})
        await _until(lambda: _ran("status_gated"))
        batch = await Queue.batch(
            [status_sum.with_({"n": [1]}), status_sum.with_({"n": [2]})]
        ).dispatch()
        from haze import use_app

        recs = [
            v[0]
            for k, v in use_app().queue_store._data.items()
            if k.startswith("haze:status:") and v[0]["name"] == "status_sum"
        ]
        assert len(recs) == 2
        assert await Queue.cancel(recs[0]["id"]) is True
        GATES["bb"].set()
        await Queue.wait(blocker, timeout=10)
        await done()
        assert (await Queue.status(recs[0]["id"])).state == "cancelled"  # type: ignore[union-attr]
        fresh = await batch.fresh()
        assert fresh.finished and not fresh.cancelled
        assert fresh.processed == 2 and fresh.failed == 0
        assert len(_ran("status_sum")) == 1
