"""The memory connection: in-process consumers, timers, priority, failed jobs, idle, exit."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from haze import App, FailedJob, JobContext, Queue, define_job, define_queue_config

log: list[Any] = []
gate: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _clear() -> None:
    log.clear()
    gate.clear()


def memory_app(**options: Any) -> App:
    return App(queue=define_queue_config(connections={"memory": {"driver": "memory", **options}}))


# --------------------------------------------------------------------------- jobs


@define_job(name="mem_track")
async def mem_track(payload: dict, job: JobContext) -> None:
    gate["running"] = gate.get("running", 0) + 1
    gate["max"] = max(gate.get("max", 0), gate["running"])
    try:
        await asyncio.sleep(payload.get("sleep", 0.03))
    finally:
        gate["running"] -= 1


@define_job(name="mem_barrier")
async def mem_barrier(payload: dict) -> None:
    gate["arrived"] = gate.get("arrived", 0) + 1
    if gate["arrived"] == payload["n"]:
        gate["all_here"].set()
    await asyncio.wait_for(gate["all_here"].wait(), 1)
    log.append("through")


@define_job(name="mem_order")
async def mem_order(payload: dict, job: JobContext) -> None:
    if payload.get("block"):
        await gate["unblock"].wait()
    log.append((job.queue, payload["i"]))


@define_job(name="mem_at")
async def mem_at(payload: dict, job: JobContext) -> None:
    log.append((payload.get("i"), job.attempt, time.monotonic()))


def _flaky(name: str, backoff: Any, tries: int = 3) -> Any:
    @define_job(name=name, tries=tries, backoff=backoff)
    async def flaky(payload: dict, job: JobContext) -> None:
        log.append((job.attempt, time.monotonic()))
        if job.attempt < payload.get("succeed_on", 99):
            raise RuntimeError(f"attempt {job.attempt}")

    return flaky


mem_backoff_number = _flaky("mem_backoff_number", 0.05)
mem_backoff_string = _flaky("mem_backoff_string", "50ms")
mem_backoff_list = _flaky("mem_backoff_list", ["40ms", "80ms"], tries=4)
mem_backoff_exp = _flaky("mem_backoff_exp", "exponential", tries=2)


@define_job(name="mem_fails", tries=2)
async def mem_fails(payload: dict, job: JobContext) -> None:
    log.append(("run", payload["i"], job.attempt))
    if not gate.get("fixed"):
        raise ValueError(f"broken {payload['i']}")


@define_job(name="mem_slow")
async def mem_slow(payload: dict) -> None:
    gate["started"].set()
    await asyncio.sleep(payload["sleep"])
    log.append(("finished", payload["i"]))


# --------------------------------------------------------------------------- concurrency


async def test_concurrency_defaults_to_one() -> None:
    async with memory_app():
        for _ in range(3):
            await mem_track.dispatch({"sleep": 0.02})
        await Queue.idle()
    assert gate["max"] == 1


async def test_concurrency_n_runs_n_at_once() -> None:
    gate["all_here"] = asyncio.Event()
    async with memory_app(concurrency=3):
        for _ in range(3):
            await mem_barrier.dispatch({"n": 3})
        await Queue.idle()
    assert log == ["through"] * 3  # all three were running together at the barrier


async def test_concurrency_is_a_ceiling() -> None:
    async with memory_app(concurrency=2):
        for _ in range(5):
            await mem_track.dispatch({"sleep": 0.02})
        await Queue.idle()
    assert gate["max"] == 2


# --------------------------------------------------------------------------- timers


async def test_delay_uses_a_timer() -> None:
    async with memory_app():
        start = time.monotonic()
        await mem_at.dispatch({"i": "late"}, delay="60ms")
        await mem_at.dispatch({"i": "now"})
        assert await Queue.size() == 2
        await Queue.idle()
    assert [i for i, _, _ in log] == ["now", "late"]
    assert log[1][2] - start >= 0.055


async def test_delayed_jobs_run_in_due_order() -> None:
    async with memory_app():
        await mem_at.dispatch({"i": 3}, delay=0.09)
        await mem_at.dispatch({"i": 1}, delay=0.03)
        await mem_at.dispatch({"i": 2}, delay="60ms")
        await Queue.idle()
    assert [i for i, _, _ in log] == [1, 2, 3]


@pytest.mark.parametrize(
    ("job", "gaps"),
    [
        (mem_backoff_number, [0.05, 0.05]),
        (mem_backoff_string, [0.05, 0.05]),
        (mem_backoff_list, [0.04, 0.08, 0.08]),  # the last entry repeats
    ],
    ids=["number", "string", "list"],
)
async def test_backoff_forms_delay_the_retries(job: Any, gaps: list[float]) -> None:
    async with memory_app():
        await job.dispatch({})
        await Queue.idle()
        [failed] = await Queue.failed()
    assert [a for a, _ in log] == list(range(1, len(gaps) + 2))
    for (_, before), (_, after), gap in zip(log, log[1:], gaps, strict=False):
        assert after - before >= gap * 0.9
    assert failed.name == job.name


async def test_retry_until_success() -> None:
    async with memory_app():
        await mem_backoff_string.dispatch({"succeed_on": 2})
        await Queue.idle()
        assert await Queue.failed() == []
    assert [a for a, _ in log] == [1, 2]


async def test_exponential_backoff_schedules_two_seconds_before_retry_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    async with memory_app():
        await mem_backoff_exp.dispatch({})
        for _ in range(100):
            if log:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.02)
        # the retry waits on a 2 s timer
        assert await Queue.size() == 1
        assert len(log) == 1
        await Queue.clear()
    assert 'Job "mem_backoff_exp" failed (attempt 1/2), retrying in 2s' in caplog.text


async def test_the_retry_log_says_the_wait_a_whole_second_driver_really_applies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # SQS and Cloudflare delays are whole seconds: a 50 ms backoff waits 1 s there, and
    # the log must say so (the driver's delay_step; memory stands in for them here).
    caplog.set_level(logging.WARNING)
    app = memory_app()
    async with app:
        app.driver("memory").delay_step = 1.0  # type: ignore[attr-defined]
        await mem_backoff_string.dispatch({"succeed_on": 2})
        await Queue.idle()
    assert 'Job "mem_backoff_string" failed (attempt 1/3), retrying in 1s' in caplog.text


# --------------------------------------------------------------------------- priority


async def test_queues_option_sets_the_priority_order() -> None:
    gate["unblock"] = asyncio.Event()
    async with memory_app(queues=["high", "default", "low"]):
        await mem_order.dispatch({"i": 0, "block": True}, queue="default")
        await asyncio.sleep(0.02)  # the single consumer is now busy with the blocker
        await mem_order.dispatch({"i": 1}, queue="low")
        await mem_order.dispatch({"i": 2}, queue="other")
        await mem_order.dispatch({"i": 3}, queue="default")
        await mem_order.dispatch({"i": 4}, queue="high")
        await mem_order.dispatch({"i": 5}, queue="low")
        gate["unblock"].set()
        await Queue.idle()
    assert log == [
        ("default", 0),
        ("high", 4),
        ("default", 3),
        ("low", 1),
        ("low", 5),
        ("other", 2),
    ]


async def test_without_queues_option_every_queue_is_consumed() -> None:
    async with memory_app():
        for q in ("a", "b", "c"):
            await mem_order.dispatch({"i": q}, queue=q)
        await Queue.idle()
    assert sorted(log) == [("a", "a"), ("b", "b"), ("c", "c")]


# --------------------------------------------------------------------------- failed jobs


async def test_failed_jobs_are_kept_and_can_be_retried() -> None:
    async with memory_app():
        ids = [await mem_fails.dispatch({"i": i}, queue="q1" if i else "q0") for i in range(3)]
        await Queue.idle()
        failed = await Queue.failed()
        assert [f.id for f in failed] == ids
        f0 = failed[0]
        assert isinstance(f0, FailedJob)
        assert (f0.name, f0.connection, f0.queue, f0.payload) == (
            "mem_fails",
            "memory",
            "q0",
            {"i": 0},
        )
        assert "ValueError: broken 0" in f0.exception
        assert f0.failed_at > 0
        assert [f.id for f in await Queue.failed(queue="q1")] == ids[1:]

        gate["fixed"] = True
        log.clear()
        assert await Queue.retry(ids[1]) == [ids[1]]
        await Queue.idle()
        assert log == [("run", 1, 1)]  # a retried job starts again with all its tries
        assert [f.id for f in await Queue.failed()] == [ids[0], ids[2]]

        assert await Queue.retry() == [ids[0], ids[2]]
        await Queue.idle()
        assert sorted(log) == [("run", 0, 1), ("run", 1, 1), ("run", 2, 1)]
        assert await Queue.failed() == []

        with pytest.raises(LookupError):
            await Queue.retry("no-such-id")


async def test_forget_and_flush() -> None:
    async with memory_app():
        ids = [await mem_fails.dispatch({"i": i}) for i in range(3)]
        await Queue.idle()
        assert await Queue.forget(ids[0]) is True
        assert await Queue.forget(ids[0]) is False
        assert [f.id for f in await Queue.failed()] == ids[1:]
        assert await Queue.flush(older_than="1h") == 0
        assert await Queue.flush() == 2
        assert await Queue.failed() == []


async def test_retry_with_a_failing_job_fails_again_with_fresh_tries() -> None:
    async with memory_app():
        job_id = await mem_fails.dispatch({"i": 9})
        await Queue.idle()
        log.clear()
        await Queue.retry([job_id])
        await Queue.idle()
        assert log == [("run", 9, 1), ("run", 9, 2)]
        assert [f.id for f in await Queue.failed()] == [job_id]


# --------------------------------------------------------------------------- idle


async def test_idle_waits_for_delayed_backoff_released_and_running() -> None:
    async with memory_app(concurrency=2):
        await mem_at.dispatch({"i": "delayed"}, delay="40ms")
        await mem_backoff_string.dispatch({"succeed_on": 2})
        await mem_track.dispatch({"sleep": 0.05})
        await mem_releaser.dispatch({})
        await Queue.idle()
        assert await Queue.size() == 0
        assert gate.get("running") == 0
    kinds = {entry[0] if isinstance(entry, tuple) else entry for entry in log}
    assert "delayed" in kinds
    assert 2 in kinds  # the backoff retry ran (attempt 2)
    assert "released-again" in log


@define_job(name="mem_releaser")
async def mem_releaser(payload: dict, job: JobContext) -> None:
    if not gate.get("released"):
        gate["released"] = True
        job.release("30ms")
        return
    log.append("released-again")


async def test_idle_returns_at_once_when_nothing_is_queued() -> None:
    async with memory_app():
        await asyncio.wait_for(Queue.idle(), 1)


async def test_size_and_clear() -> None:
    async with memory_app():
        gate["unblock"] = asyncio.Event()
        await mem_order.dispatch({"i": 0, "block": True}, queue="busy")
        await asyncio.sleep(0.01)
        await mem_order.dispatch({"i": 1}, queue="q")
        await mem_order.dispatch({"i": 2}, queue="q", delay="1h")
        assert await Queue.size("q") == 2
        assert await Queue.clear("q") == 2
        assert await Queue.size("q") == 0
        gate["unblock"].set()
        await Queue.idle()
    assert log == [("busy", 0)]


@define_job(name="mem_plain")
async def mem_plain(payload: dict) -> None:
    log.append(payload["i"])
    if payload.get("stop"):
        gate["worker"].request_stop()


async def test_plain_jobs_run_in_a_burst_are_each_counted_by_the_worker() -> None:
    async with memory_app() as app:
        for i in range(5):
            await mem_plain.dispatch({"i": i})
        await Queue.idle()
        worker: Any = app.manager.local.workers["memory"]
        assert log == [0, 1, 2, 3, 4]
        assert worker.processed == 5
        assert worker._delivery.outcomes["done"] == 5


async def test_a_worker_stopped_by_a_plain_job_runs_none_after_it() -> None:
    async with memory_app() as app:
        await mem_plain.dispatch({"i": -1})  # starts the consumer
        await Queue.idle()
        first: Any = app.manager.local.workers["memory"]
        gate["worker"] = first
        for i in range(5):
            await mem_plain.dispatch({"i": i, "stop": i == 1})
        await asyncio.sleep(0.05)
        assert log == [-1, 0, 1], "the stopped worker ran no job after the one that stopped it"
        assert first.processed == 3
        await Queue.idle()  # a new consumer runs the rest
        assert log == [-1, 0, 1, 2, 3, 4]


# --------------------------------------------------------------------------- app exit


async def test_exit_waits_for_running_jobs_and_warns_once_about_lost_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="haze")
    gate["started"] = asyncio.Event()
    start = time.monotonic()
    async with memory_app():
        await mem_slow.dispatch({"i": 1, "sleep": 0.1})
        await asyncio.wait_for(gate["started"].wait(), 1)
        await mem_slow.dispatch({"i": 2, "sleep": 0})  # queued behind the running one
        await mem_slow.dispatch({"i": 3, "sleep": 0}, delay="10m")  # delayed
        await mem_slow.dispatch({"i": 4, "sleep": 0}, delay="1h")
    elapsed = time.monotonic() - start
    assert log == [("finished", 1)]  # the running job finished; the rest did not start
    assert elapsed < 60  # the delayed jobs were not waited for
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert "3 queued or delayed" in msg
    assert '"memory"' in msg


async def test_exit_without_lost_jobs_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="haze")
    async with memory_app():
        await mem_at.dispatch({"i": 1})
        await Queue.idle()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert len(log) == 1
