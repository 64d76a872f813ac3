"""The pipeline of a job: global middleware, then the job's own, then its handler.

Composed once per job. A plain ``def`` handler runs in a thread (inline under Pyodide,
which has none); ``timeout`` runs the pipeline in a task of its own and aborts the
job's signal before cancelling it.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from haze._base.describe import error_line
from haze._base.errors import JobTimeoutError

if TYPE_CHECKING:
    from haze._jobs.context import JobContext
    from haze._jobs.definition import JobDefinition

__all__ = ["Contained", "Pipeline", "compose", "with_timeout"]

_EMSCRIPTEN = sys.platform == "emscripten"

Pipeline = Callable[[Any, "JobContext"], Awaitable[Any]]


class Contained(Exception):
    """A BaseException raised by job code in a task of its own (``timeout``), carried
    out as an Exception: raised out of a task, KeyboardInterrupt and SystemExit would
    stop the event loop, and so the worker and every other running job."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error_line(error))
        self.error = error


async def _contained(aw: Awaitable[Any]) -> Any:
    try:
        return await aw
    except (Exception, asyncio.CancelledError, GeneratorExit):
        raise
    except BaseException as e:
        raise Contained(e) from None


async def with_timeout(
    job: JobDefinition[Any], pipeline: Pipeline, payload: Any, ctx: JobContext
) -> Any:
    timeout = job.timeout
    assert timeout is not None
    task = asyncio.ensure_future(_contained(pipeline(payload, ctx)))
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if task in done:
        return task.result()
    err = JobTimeoutError(f'Job "{job.name}" timed out after {timeout:g}s (attempt {ctx.attempt})')
    ctx.signal.abort(err)  # the signal is set first, then the handler is cancelled
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception:
        pass
    raise err


def compose(middleware: list[Callable[..., Any]], job: JobDefinition[Any]) -> Pipeline:
    handler = job.handler
    n = job._n_params
    call: Pipeline
    if job.is_async:
        # Plain functions that return the handler's own coroutine: awaiting it directly
        # spares a coroutine frame per job.
        if n == 0:

            def call(payload: Any, ctx: JobContext) -> Awaitable[Any]:
                return handler()  # type: ignore[no-any-return]
        elif n == 1:

            def call(payload: Any, ctx: JobContext) -> Awaitable[Any]:
                return handler(payload)  # type: ignore[no-any-return]
        else:
            call = handler
    else:
        call = _sync_call(handler, n)
    for mw in reversed(middleware):
        call = _wrap(mw, call)
    return call


def _sync_call(handler: Callable[..., Any], n: int) -> Pipeline:
    def invoke(payload: Any, ctx: JobContext) -> Any:
        if n == 0:
            return handler()
        if n == 1:
            return handler(payload)
        return handler(payload, ctx)

    # A plain def that returns an awaitable (a decorator's wrapper around an async
    # function) is an async handler in disguise: its awaitable is awaited here, on the
    # loop. Dropped, its body would never run and the job would count as done.
    if _EMSCRIPTEN:  # no threads under Pyodide: run inline

        async def inline(payload: Any, ctx: JobContext) -> Any:
            result = invoke(payload, ctx)
            if inspect.isawaitable(result):
                result = await result
            return result

        return inline

    async def threaded(payload: Any, ctx: JobContext) -> Any:
        loop = ctx._loop = asyncio.get_running_loop()  # for job.progress() from the thread
        cv = contextvars.copy_context()
        result = await loop.run_in_executor(None, cv.run, invoke, payload, ctx)
        if inspect.isawaitable(result):
            result = await result
        return result

    return threaded


def _wrap(mw: Callable[..., Any], nxt: Pipeline) -> Pipeline:
    async def step(payload: Any, ctx: JobContext) -> Any:
        async def call_next() -> Any:
            return await nxt(payload, ctx)

        result = mw(payload, ctx, call_next)
        if inspect.isawaitable(result):
            result = await result
        return result

    return step
