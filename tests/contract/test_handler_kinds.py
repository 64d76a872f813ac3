"""Async handlers that are not a bare ``async def``, on every driver: an ``async def``
under a plain-``def`` decorator, an object whose ``__call__`` is ``async def``, a
``functools.partial`` of either, a plain ``def`` returning a coroutine. Each one's body
runs, on the worker's event loop, and one that raises fails like any job: none is
counted done with its coroutine dropped unawaited."""

from __future__ import annotations

import asyncio
import functools
import gc
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from haze import JobContext, Queue, define_job

#: (kind, payload, whether the handler got its JobContext, the loop it ran on)
SEEN: list[tuple[str, Any, bool, asyncio.AbstractEventLoop]] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    SEEN.clear()


def _logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator as many are written: a plain ``def`` around the function."""

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        return fn(*args)

    return wrapper


async def _seen(kind: str, payload: Any, job: JobContext | None = None) -> None:
    await asyncio.sleep(0)  # a real suspension: the body is more than its first step
    SEEN.append((kind, payload, isinstance(job, JobContext), asyncio.get_running_loop()))
    if isinstance(payload, dict) and payload.get("fail"):
        raise RuntimeError(f"{kind} failed")


@_logged
async def _decorated(payload: Any) -> None:
    await _seen("decorated", payload)


@_logged
async def _decorated_with_job(payload: Any, job: JobContext) -> None:
    await _seen("decorated+job", payload, job)


class _Callable:
    async def __call__(self, payload: Any) -> None:
        await _seen("callable", payload)


class _CallableWithJob:
    async def __call__(self, payload: Any, job: JobContext) -> None:
        await _seen("callable+job", payload, job)


async def _tagged(kind: str, payload: Any) -> None:
    await _seen(kind, payload)


class _TaggedCallable:
    async def __call__(self, kind: str, payload: Any) -> None:
        await _seen(kind, payload)


def _returns_a_coroutine(payload: Any) -> Any:
    return _seen("returns a coroutine", payload)


HANDLERS: dict[str, Callable[..., Any]] = {
    "decorated": _decorated,
    "decorated+job": _decorated_with_job,
    "callable": _Callable(),
    "callable+job": _CallableWithJob(),
    "partial": functools.partial(_tagged, "partial"),
    "partial of a callable": functools.partial(_TaggedCallable(), "partial of a callable"),
    "returns a coroutine": _returns_a_coroutine,
}
JOBS = {
    kind: define_job(name=f"hk_{i}", tries=2)(handler)
    for i, (kind, handler) in enumerate(HANDLERS.items())
}


@pytest.mark.parametrize("kind", list(HANDLERS))
async def test_an_async_handler_in_disguise_runs_on_the_loop(app, done, kind: str) -> None:
    loop = asyncio.get_running_loop()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... never awaited"
        await JOBS[kind].dispatch({"k": kind})
        await done()
        gc.collect()
    assert [(k, p, loop_) for k, p, _, loop_ in SEEN] == [(kind, {"k": kind}, loop)]
    assert SEEN[0][2] is kind.endswith("+job")
    assert await Queue.size() == 0


@pytest.mark.parametrize("kind", list(HANDLERS))
async def test_an_async_handler_in_disguise_that_raises_fails(
    app, done, quietly, driver, kind: str
) -> None:
    error = await quietly(JOBS[kind].dispatch({"k": kind, "fail": True}))
    await done()
    if driver.inline:  # sync: the job's error raises out of dispatch(), one try
        assert isinstance(error, RuntimeError) and str(error) == f"{kind} failed"
        assert len(SEEN) == 1
        return
    assert isinstance(error, str)  # the job's id
    assert [k for k, *_ in SEEN] == [kind, kind]  # both tries ran the body
    if driver.stores_failed:
        [failed] = await Queue.failed()
        assert failed.name == JOBS[kind].name and f"{kind} failed" in failed.exception


def test_the_definition_knows_which_handlers_are_async() -> None:
    """Known at definition: a bare ``async def``, a partial of one, an object whose
    ``__call__`` is ``async def``. A plain-``def`` wrapper is not (it may be a sync
    adapter that runs the coroutine itself): its returned awaitable is awaited when it
    runs."""
    expected = {
        "decorated": False,
        "decorated+job": False,
        "callable": True,
        "callable+job": True,
        "partial": True,
        "partial of a callable": True,
        "returns a coroutine": False,
    }
    assert {kind: job.is_async for kind, job in JOBS.items()} == expected
    assert {kind: job._n_params for kind, job in JOBS.items()} == {
        kind: 2 if kind.endswith("+job") else 1 for kind in JOBS
    }
