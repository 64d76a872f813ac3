"""The ``_blocking`` twins: usable from sync code, refused inside a running loop."""

from __future__ import annotations

import inspect
import threading
from typing import Any

import pytest
from haze import (
    App,
    Batch,
    DispatchResult,
    JobDefinition,
    PendingBatch,
    PendingChain,
    PendingDispatch,
    Queue,
    define_job,
    tenant,
)
from haze._base.blocking import blocking, run_blocking
from haze._jobs.context import current_tenant

seen: list[Any] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    seen.clear()


@define_job(name="blocking_record")
async def blocking_record(payload: dict) -> None:
    seen.append((payload, current_tenant()))


@define_job(name="blocking_fails", tries=1)
async def blocking_fails(payload: dict) -> None:
    raise RuntimeError("no")


def test_dispatch_blocking_from_sync_code() -> None:
    assert threading.current_thread() is threading.main_thread()
    job_id = blocking_record.dispatch_blocking({"n": 1})
    assert isinstance(job_id, str)
    assert len(job_id) == 32
    res = blocking_record.with_({"n": 2}).on_queue("other").dispatch_blocking()
    assert res.skipped is False
    Queue.dispatch_blocking("blocking_record", {"n": 3})
    with tenant("acme"):
        blocking_record.dispatch_blocking({"n": 4})
    Queue.idle_blocking()
    assert sorted(seen, key=lambda s: s[0]["n"]) == [
        ({"n": 1}, None),
        ({"n": 2}, None),
        ({"n": 3}, None),
        ({"n": 4}, "acme"),
    ]


def test_facade_blocking_twins_from_sync_code() -> None:
    job_id = blocking_fails.dispatch_blocking({})
    Queue.idle_blocking()
    assert job_id in [f.id for f in Queue.failed_blocking()]
    assert Queue.forget_blocking(job_id) is True
    assert Queue.size_blocking() == 0
    blocking_fails.dispatch_blocking({})
    Queue.idle_blocking()
    assert Queue.flush_blocking() >= 1
    assert Queue.failed_blocking() == []


def test_blocking_twin_raises_the_error_of_the_call() -> None:
    with pytest.raises(TypeError, match=r"payload\['x'\]"):
        blocking_record.dispatch_blocking({"x": object()})
    with pytest.raises(LookupError):
        Queue.dispatch_blocking("blocking_no_such_job", {})


async def test_blocking_twins_raise_inside_a_running_loop(app: App) -> None:
    with pytest.raises(RuntimeError, match="running event loop") as info:
        blocking_record.dispatch_blocking({"n": 1})
    assert "await dispatch(" in str(info.value)
    with pytest.raises(RuntimeError, match="running event loop"):
        blocking_record.with_({"n": 1}).dispatch_blocking()
    with pytest.raises(RuntimeError, match="running event loop"):
        Queue.dispatch_blocking(blocking_record, {"n": 1})
    with pytest.raises(RuntimeError, match="running event loop"):
        Queue.idle_blocking()
    with pytest.raises(RuntimeError, match="running event loop"):
        Queue.failed_blocking()
    # nothing was dispatched
    assert await Queue.size() == 0
    await Queue.idle()
    assert seen == []


async def test_run_blocking_closes_the_coroutine_when_refused() -> None:
    async def never() -> None:  # pragma: no cover - must not run
        seen.append("ran")

    coro = never()
    with pytest.raises(RuntimeError):
        run_blocking(coro, "never")
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED


@define_job(name="blocking_kept", keep_result="1h")
async def blocking_kept(payload: dict) -> dict:
    return {"twice": payload["n"] * 2}


def test_status_twins_from_sync_code() -> None:
    res = blocking_kept.with_({"n": 21}).dispatch_blocking()
    status = res.wait_blocking(timeout=10)
    assert status.state == "done" and status.result == {"twice": 42}
    assert Queue.wait_blocking(res.id, timeout=1) == status
    assert Queue.status_blocking(res.id) == status
    assert Queue.cancel_blocking(res.id) is False  # it is over


def test_blocking_wraps_any_coroutine_function() -> None:
    async def add(a: int, b: int = 1) -> int:
        return a + b

    add_blocking = blocking(add)
    assert add_blocking.__name__ == "add_blocking"
    assert add_blocking(2, b=3) == 5


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        (JobDefinition, "dispatch"),
        (PendingDispatch, "dispatch"),
        (PendingChain, "dispatch"),
        (PendingBatch, "dispatch"),
        (Batch, "fresh"),
        (Batch, "cancel"),
        (Batch, "add"),
        (Queue, "dispatch"),
        (Queue, "bulk"),
        (Queue, "find_batch"),
        (Queue, "failed"),
        (Queue, "retry"),
        (Queue, "forget"),
        (Queue, "flush"),
        (Queue, "idle"),
        (Queue, "size"),
        (Queue, "clear"),
        (Queue, "status"),
        (Queue, "wait"),
        (Queue, "cancel"),
        (DispatchResult, "wait"),
    ],
)
def test_every_public_awaitable_has_a_blocking_twin(owner: type, name: str) -> None:
    method = getattr(owner, name)
    # a job's dispatch returns its coroutine from a plain method (it warns, naming the
    # job, when it is never awaited): declared so, since Python 3.11 cannot mark it
    returns = str(inspect.signature(method).return_annotation)
    assert inspect.iscoroutinefunction(method) or returns.startswith("Coroutine[Any, Any, ")
    twin = getattr(owner, f"{name}_blocking")
    assert callable(twin)
    assert not inspect.iscoroutinefunction(twin)
