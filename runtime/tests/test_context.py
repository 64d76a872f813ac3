"""The job context: fields, logger, log lines, timeout + abort signal, release()."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from typing import Any

import pytest
from haze import AbortSignal, App, JobContext, JobTimeoutError, Queue, define_job

state: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    state.clear()


@define_job(name="ctx_fields", queue="reports", tries=3)
async def ctx_fields(payload: dict, job: JobContext) -> None:
    state["ctx"] = job
    state["batch"] = job.batch()
    job.logger.info("hello from %s", job.name)


@define_job(name="ctx_log_ok", tries=3)
async def ctx_log_ok(payload: dict) -> None:
    pass


@define_job(name="ctx_log_retry", tries=2)
async def ctx_log_retry(payload: dict, job: JobContext) -> None:
    raise RuntimeError(f"nope {job.attempt}")


@define_job(name="ctx_timeout_async", timeout="50ms")
async def ctx_timeout_async(payload: dict, job: JobContext) -> None:
    state["ctx"] = job
    state["started"].set()
    try:
        await asyncio.sleep(5)
    except asyncio.CancelledError:
        # the signal is set first, then the handler is cancelled
        state["aborted_when_cancelled"] = job.signal.aborted
        raise


@ctx_timeout_async.on_failed
async def _ctx_timeout_failed(payload: dict, error: BaseException, job: JobContext) -> None:
    state["failed_error"] = error


@define_job(name="ctx_timeout_sync", timeout="50ms")
def ctx_timeout_sync(payload: dict, job: JobContext) -> None:
    state["thread"] = threading.current_thread() is not threading.main_thread()
    deadline = time.monotonic() + 2
    while not job.signal.aborted and time.monotonic() < deadline:
        time.sleep(0.005)
    state["sync_saw_abort"] = job.signal.aborted
    time.sleep(0.15)  # keeps running after the deadline: a thread cannot be cancelled
    state["sync_finished"] = True


@ctx_timeout_sync.on_failed
def _ctx_timeout_sync_failed(payload: dict, error: BaseException, job: JobContext) -> None:
    state["sync_failed_error"] = error
    state["sync_finished_at_failure"] = state.get("sync_finished", False)


@define_job(name="ctx_timeout_ok", timeout="1s")
async def ctx_timeout_ok(payload: dict, job: JobContext) -> None:
    await asyncio.sleep(0.01)
    state["ok_aborted"] = job.signal.aborted


@define_job(name="ctx_release", tries=1)
async def ctx_release(payload: dict, job: JobContext) -> None:
    state.setdefault("attempts", []).append((job.attempt, time.monotonic()))
    if len(state["attempts"]) < 3:
        job.release("30ms")


@define_job(name="ctx_release_then_fail", tries=2)
async def ctx_release_then_fail(payload: dict, job: JobContext) -> None:
    state.setdefault("attempts", []).append(job.attempt)
    if len(state["attempts"]) == 1:
        job.release()
        return
    raise RuntimeError("fails")


async def release_mw(payload: Any, job: JobContext, call_next: Any) -> Any:
    state.setdefault("mw", []).append(job.attempt)
    if len(state["mw"]) == 1:
        job.release(0)
        return None
    return await call_next()


@define_job(name="ctx_release_mw", middleware=[release_mw])
async def ctx_release_mw(payload: dict, job: JobContext) -> None:
    state.setdefault("attempts", []).append(job.attempt)


# --------------------------------------------------------------------------- fields


async def test_job_context_fields(app: App) -> None:
    job_id = await ctx_fields.dispatch({"x": 1})
    await Queue.idle()
    ctx: JobContext = state["ctx"]
    assert ctx.id == job_id
    assert ctx.name == "ctx_fields"
    assert ctx.attempt == 1
    assert ctx.tries == 3
    assert ctx.queue == "reports"
    assert ctx.connection == "memory"
    assert ctx.app is app
    assert isinstance(ctx.signal, AbortSignal)
    assert ctx.signal.aborted is False
    assert ctx.batch() is None
    assert state["batch"] is None
    assert isinstance(ctx.logger, logging.LoggerAdapter)
    assert ctx.logger.logger.name == "haze.job"


async def test_job_logger_carries_job_name_id_and_attempt(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="haze.job")
    job_id = await ctx_fields.dispatch({"x": 1}, connection="sync")
    [rec] = [r for r in caplog.records if r.getMessage() == "hello from ctx_fields"]
    assert rec.name == "haze.job"
    assert rec.levelno == logging.INFO
    assert (rec.job, rec.job_id, rec.attempt) == ("ctx_fields", job_id, 1)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- log lines


async def test_success_is_logged_at_debug_with_name_time_and_attempt(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="haze.job")
    job_id = await ctx_log_ok.dispatch({})
    await Queue.idle()
    mine = [r for r in caplog.records if r.name == "haze.job" and "ctx_log_ok" in r.getMessage()]
    # The start and the end, each marked with its state for `haze queue:work`'s lines.
    assert [r.state for r in mine] == ["running", "done"]  # type: ignore[attr-defined]
    assert mine[0].getMessage() == 'Job "ctx_log_ok" running (attempt 1/3)'
    rec = mine[1]
    assert rec.levelno == logging.DEBUG
    assert re.fullmatch(r'Job "ctx_log_ok" done in \d+ms \(attempt 1/3\)', rec.getMessage())
    assert (rec.job, rec.job_id, rec.attempt) == ("ctx_log_ok", job_id, 1)  # type: ignore[attr-defined]


async def test_retry_is_a_warning_and_final_failure_an_error(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="haze.job")
    await ctx_log_retry.dispatch({})
    await Queue.idle()
    job_records = [r for r in caplog.records if r.name == "haze.job"]
    states = [r.state for r in job_records]  # type: ignore[attr-defined]
    assert states == ["running", "retry", "running", "failed"]
    recs = [(r.levelno, r.getMessage()) for r in job_records if r.levelno > logging.DEBUG]
    assert recs == [
        (
            logging.WARNING,
            'Job "ctx_log_retry" failed (attempt 1/2), retrying in 0s: RuntimeError: nope 1',
        ),
        (logging.ERROR, 'Job "ctx_log_retry" failed after 2 attempt(s): RuntimeError: nope 2'),
    ]
    error = next(r for r in caplog.records if r.levelno == logging.ERROR)
    assert error.exc_info is not None
    assert isinstance(error.exc_info[1], RuntimeError)


def _lines_of(caplog: pytest.LogCaptureFixture, job: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "haze.job" and getattr(r, "job", None) == job]


@define_job(name="ctx_log_order")
async def ctx_log_order(payload: dict, job: JobContext) -> None:
    state["at_start"] = [r.getMessage() for r in state["caplog"].records]
    state["t0"] = time.time()
    job.logger.info("inside")
    await asyncio.sleep(0.01)
    job.logger.info("after an await")


@define_job(name="ctx_log_thread")
def ctx_log_thread(payload: dict, job: JobContext) -> None:
    job.logger.info("inside, in a thread")


@define_job(name="ctx_log_quiet")
async def ctx_log_quiet(payload: dict) -> None:
    await asyncio.sleep(0.5)


async def test_the_running_line_is_made_after_the_job_started_and_keeps_its_place(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """The RUNNING record is not made on the way to the job's start (the job sees none),
    yet it is dated when the job started and comes before the job's own lines."""
    caplog.set_level(logging.DEBUG, logger="haze.job")
    state["caplog"] = caplog
    before = time.time()
    await ctx_log_order.dispatch({})
    await Queue.idle()
    assert not any("ctx_log_order" in m for m in state["at_start"]), state["at_start"]
    mine = _lines_of(caplog, "ctx_log_order")
    assert [r.getMessage().split(" (")[0] for r in mine[1:3]] == ["inside", "after an await"]
    assert [getattr(r, "state", None) for r in mine] == ["running", None, None, "done"]
    assert before <= mine[0].created <= state["t0"]
    assert mine[0].msecs == int((mine[0].created % 1) * 1000)
    assert mine[0].funcName == "_attempt"  # the code that logged it, as before


async def test_a_thread_jobs_own_line_follows_its_running_line(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="haze.job")
    await ctx_log_thread.dispatch({})
    await Queue.idle()
    mine = _lines_of(caplog, "ctx_log_thread")
    assert [getattr(r, "state", r.getMessage()) for r in mine] == [
        "running",
        "inside, in a thread",
        "done",
    ]


async def test_the_running_line_is_out_while_the_job_waits(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="haze.job")
    await ctx_log_quiet.dispatch({})
    await asyncio.sleep(0.2)
    assert [getattr(r, "state", None) for r in _lines_of(caplog, "ctx_log_quiet")] == ["running"]
    await Queue.idle()
    assert [r.state for r in _lines_of(caplog, "ctx_log_quiet")] == ["running", "done"]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- timeout


async def test_timeout_sets_the_signal_then_cancels_the_handler(app: App) -> None:
    state["started"] = asyncio.Event()
    await ctx_timeout_async.dispatch({})
    await asyncio.wait_for(state["started"].wait(), 1)
    ctx: JobContext = state["ctx"]
    assert ctx.signal.aborted is False
    await asyncio.wait_for(ctx.signal.wait(), 1)  # returns once the timeout fires
    assert ctx.signal.aborted is True
    assert isinstance(ctx.signal.reason, JobTimeoutError)
    await Queue.idle()
    assert state["aborted_when_cancelled"] is True
    # the attempt counts as failed (tries=1: final)
    assert isinstance(state["failed_error"], JobTimeoutError)
    assert "timed out after 0.05s" in str(state["failed_error"])
    [failed] = await Queue.failed()
    assert failed.name == "ctx_timeout_async"
    assert "JobTimeoutError" in failed.exception


async def test_sync_handler_is_signalled_and_fails_at_the_deadline(app: App) -> None:
    await ctx_timeout_sync.dispatch({})
    await Queue.idle()
    # the failure was settled while the thread was still running
    assert isinstance(state["sync_failed_error"], JobTimeoutError)
    assert state["sync_finished_at_failure"] is False
    assert len(await Queue.failed()) == 1
    # the thread itself saw the signal and then finished on its own
    for _ in range(200):
        if state.get("sync_finished"):
            break
        await asyncio.sleep(0.01)
    assert state["thread"] is True
    assert state["sync_saw_abort"] is True
    assert state["sync_finished"] is True


async def test_no_abort_when_the_job_finishes_in_time(app: App) -> None:
    await ctx_timeout_ok.dispatch({})
    await Queue.idle()
    assert state["ok_aborted"] is False
    assert await Queue.failed() == []


async def test_abort_signal_unit() -> None:
    signal = AbortSignal()
    assert not signal.aborted
    assert signal.reason is None
    waiter = asyncio.ensure_future(signal.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    first = JobTimeoutError("first")
    signal.abort(first)
    signal.abort(JobTimeoutError("second"))
    await asyncio.wait_for(waiter, 1)
    assert signal.aborted
    assert signal.reason is first
    await signal.wait()  # already set: returns at once


# --------------------------------------------------------------------------- release


async def test_release_does_not_consume_a_try(app: App) -> None:
    await ctx_release.dispatch({})
    await Queue.idle()
    attempts = state["attempts"]
    assert [a for a, _ in attempts] == [1, 1, 1]  # tries=1, released twice, never exhausted
    assert attempts[1][1] - attempts[0][1] >= 0.025  # the release delay was honoured
    assert attempts[2][1] - attempts[1][1] >= 0.025
    assert await Queue.failed() == []


async def test_release_then_failures_still_get_all_tries(app: App) -> None:
    await ctx_release_then_fail.dispatch({})
    await Queue.idle()
    assert state["attempts"] == [1, 1, 2]
    [failed] = await Queue.failed()
    assert failed.name == "ctx_release_then_fail"


async def test_release_from_middleware(app: App) -> None:
    await ctx_release_mw.dispatch({})
    await Queue.idle()
    assert state["mw"] == [1, 1]
    assert state["attempts"] == [1]


def test_release_validates_the_delay(make_app: Any) -> None:
    app = make_app()
    ctx = JobContext(
        id="x", name="n", attempt=1, tries=1, queue="default", connection="memory", app=app
    )
    assert not ctx.released
    ctx.release("1m")
    assert ctx.released
    assert ctx._release_delay == 60.0
    with pytest.raises(ValueError, match="release"):
        ctx.release("later")
