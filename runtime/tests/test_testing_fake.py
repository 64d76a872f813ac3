"""Queue.fake(): recording, assertions, drain() through the real pipeline, the fixture."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest
from haze import App, JobContext, Queue, define_job, define_queue_config, run_in_app
from haze import testing as haze_testing
from haze.testing import FakeQueue

events: list[Any] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    events.clear()


async def global_mw(payload: Any, job: JobContext, call_next: Any) -> Any:
    events.append(("global", job.name))
    return await call_next()


async def job_mw(payload: Any, job: JobContext, call_next: Any) -> Any:
    events.append(("job-mw", job.name))
    return await call_next()


@pytest.fixture
async def mw_app() -> Any:
    app = App(
        queue=define_queue_config(
            default="memory",
            connections={"memory": {"driver": "memory"}, "sync": {"driver": "sync"}},
            middleware=[global_mw],
        )
    )
    async with app:
        yield app


@define_job(name="fake_send_invoice", middleware=[job_mw])
async def fake_send_invoice(payload: dict, job: JobContext) -> None:
    events.append(("handle", payload["invoice_id"], job.attempt))
    if payload.get("follow_up"):
        await fake_reminder.dispatch({"invoice_id": payload["invoice_id"]})


@define_job(name="fake_reminder")
async def fake_reminder(payload: dict) -> None:
    events.append(("reminder", payload["invoice_id"]))


@define_job(name="fake_flaky", tries=3, backoff="exponential")
async def fake_flaky(payload: dict, job: JobContext) -> None:
    events.append(("flaky", job.attempt))
    if job.attempt < payload["succeed_on"]:
        raise RuntimeError(f"attempt {job.attempt}")


@define_job(name="fake_minutes", tries=3, backoff="5m")
async def fake_minutes(payload: dict, job: JobContext) -> None:
    raise RuntimeError("always")


@fake_minutes.on_failed
async def _fake_minutes_failed(payload: dict, error: BaseException, job: JobContext) -> None:
    events.append(("failed", job.attempt, str(error)))


@define_job(name="fake_list", tries=4, backoff=[10, 60])
async def fake_list(payload: dict, job: JobContext) -> None:
    raise RuntimeError("always")


@define_job(name="fake_releaser")
async def fake_releaser(payload: dict, job: JobContext) -> None:
    events.append(("releaser", job.attempt))
    if sum(1 for e in events if e[0] == "releaser") < 3:
        job.release("10m")  # drain() ignores the delay


def retry_delays(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [
        r.getMessage().split("retrying in ")[1].split(":")[0]
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith(f'Job "{name}" failed')
    ]


async def test_fake_records_instead_of_running(mw_app: App) -> None:
    fake = Queue.fake()
    job_id = await fake_send_invoice.dispatch({"invoice_id": 42}, delay="10m", queue="high")
    await Queue.dispatch("fake_send_invoice", {"invoice_id": 0}, connection="sync")
    assert events == []  # nothing ran, not even on sync
    assert await Queue.size("high") == 0  # nothing reached the real connection
    fake.assert_dispatched(fake_send_invoice)
    fake.assert_dispatched("fake_send_invoice", lambda p: p["invoice_id"] > 0)
    fake.assert_dispatched(
        fake_send_invoice, lambda p, rec: rec.queue == "high" and rec.delay == 600
    )
    fake.assert_dispatched(fake_send_invoice, times=2)
    fake.assert_not_dispatched(fake_reminder)
    fake.assert_not_dispatched(fake_send_invoice, lambda p: p["invoice_id"] == 7)
    fake.assert_count(2)
    rec = fake.dispatched[0]
    assert (rec.name, rec.payload, rec.message.id) == (
        "fake_send_invoice",
        {"invoice_id": 42},
        job_id,
    )
    assert rec.connection == "memory"
    assert fake.dispatched[1].connection == "sync"
    Queue.restore()


async def test_fake_assertions_raise_assertion_error(mw_app: App) -> None:
    fake = Queue.fake()
    await fake_send_invoice.dispatch({"invoice_id": 1})
    with pytest.raises(AssertionError, match="fake_reminder"):
        fake.assert_dispatched(fake_reminder)
    with pytest.raises(AssertionError):
        fake.assert_dispatched(fake_send_invoice, lambda p: p["invoice_id"] == 2)
    with pytest.raises(AssertionError):
        fake.assert_not_dispatched("fake_send_invoice")
    with pytest.raises(AssertionError, match="expected 3"):
        fake.assert_count(3)
    with pytest.raises(AssertionError):
        fake.assert_nothing_dispatched()
    with pytest.raises(AssertionError):
        fake.assert_dispatched(fake_send_invoice, times=2)
    Queue.restore()


async def test_drain_runs_recorded_jobs_in_order_through_middleware(mw_app: App) -> None:
    fake = Queue.fake()
    await fake_send_invoice.dispatch({"invoice_id": 1, "follow_up": True}, delay="1h")
    await fake_send_invoice.dispatch({"invoice_id": 2})
    assert await fake.drain() == 2
    assert events == [
        ("global", "fake_send_invoice"),
        ("job-mw", "fake_send_invoice"),
        ("handle", 1, 1),
        ("global", "fake_send_invoice"),
        ("job-mw", "fake_send_invoice"),
        ("handle", 2, 1),
    ]
    # jobs dispatched while draining are recorded, not run; drain again to go on
    fake.assert_dispatched(fake_reminder, lambda p: p["invoice_id"] == 1)
    fake.assert_count(3)
    events.clear()
    assert await fake.drain() == 1
    assert events == [("global", "fake_reminder"), ("reminder", 1)]
    assert await fake.drain() == 0
    Queue.restore()


async def test_drain_runs_retries_and_logs_exponential_backoff(
    mw_app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="haze.job")
    fake = Queue.fake()
    await fake_flaky.dispatch({"succeed_on": 3})
    assert await fake.drain() == 3
    assert [e for e in events if e[0] == "flaky"] == [("flaky", 1), ("flaky", 2), ("flaky", 3)]
    assert retry_delays(caplog, "fake_flaky") == ["2s", "4s"]  # 2**1, 2**2
    assert fake.failed == []
    Queue.restore()


async def test_drain_final_failure_calls_failed_and_keeps_the_job(
    mw_app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="haze.job")
    fake = Queue.fake()
    await fake_minutes.dispatch({})
    await fake_list.dispatch({})
    assert await fake.drain() == 7
    assert retry_delays(caplog, "fake_minutes") == ["300s", "300s"]
    assert retry_delays(caplog, "fake_list") == ["10s", "60s", "60s"]
    assert [e for e in events if e[0] == "failed"] == [("failed", 3, "always")]
    assert sorted(f.name for f in fake.failed) == ["fake_list", "fake_minutes"]
    Queue.restore()


async def test_drain_honours_release_without_consuming_tries(mw_app: App) -> None:
    fake = Queue.fake()
    await fake_releaser.dispatch({})
    assert await fake.drain() == 3
    assert [e for e in events if e[0] == "releaser"] == [("releaser", 1)] * 3
    assert fake.failed == []
    Queue.restore()


async def test_restore_goes_back_to_the_real_connections(mw_app: App) -> None:
    fake = Queue.fake()
    await fake_reminder.dispatch({"invoice_id": 1})
    Queue.restore()
    assert haze_testing._active_fake is None
    await fake_reminder.dispatch({"invoice_id": 2})
    await Queue.idle()
    assert events == [("global", "fake_reminder"), ("reminder", 2)]
    fake.assert_count(1)  # the old fake saw only the first one


async def test_a_new_fake_starts_empty(mw_app: App) -> None:
    first = Queue.fake()
    await fake_reminder.dispatch({"invoice_id": 1})
    second = Queue.fake()
    assert second is not first
    second.assert_count(0)
    Queue.restore()


async def test_queue_fake_fixture(queue_fake: FakeQueue, mw_app: App) -> None:
    assert isinstance(queue_fake, FakeQueue)
    assert haze_testing._active_fake is queue_fake
    await fake_send_invoice.dispatch({"invoice_id": 5})
    queue_fake.assert_dispatched(fake_send_invoice, lambda p: p["invoice_id"] == 5)
    queue_fake.assert_count(1)
    assert events == []


def test_queue_fake_fixture_restores_after_the_test() -> None:
    assert haze_testing._active_fake is None


def test_pytest_plugin_is_registered_via_entry_point(pytestconfig: pytest.Config) -> None:
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="pytest11") if ep.name == "haze"]
    assert [ep.value for ep in eps] == ["haze.testing.pytest_plugin"]
    import haze.testing.pytest_plugin

    assert pytestconfig.pluginmanager.is_registered(haze.testing.pytest_plugin)


async def test_fake_ignores_the_unique_lock_store_of_the_app(mw_app: App) -> None:
    @define_job(name="fake_unique_job", unique=True)
    async def fake_unique_job(payload: dict) -> None:
        events.append("unique ran")

    fake = Queue.fake()
    await fake_unique_job.dispatch({})
    res = await fake_unique_job.with_({}).dispatch()
    assert res.skipped is True
    fake.assert_pushed_unique(fake_unique_job)
    fake.assert_skipped(fake_unique_job)
    assert await fake.drain() == 1
    assert events == [("global", "fake_unique_job"), "unique ran"]
    # the lock was released by drain(): a new dispatch is recorded again
    assert (await fake_unique_job.with_({}).dispatch()).skipped is False
    Queue.restore()


def _memory_app() -> App:
    return App(
        queue=define_queue_config(default="memory", connections={"memory": {"driver": "memory"}})
    )


async def test_each_app_has_its_own_fake() -> None:
    first, second = _memory_app(), _memory_app()
    async with first, second:
        fake_first = await run_in_app(first, Queue.fake)
        fake_second = await run_in_app(second, Queue.fake)
        assert (first.recorder, second.recorder) == (fake_first, fake_second)
        await run_in_app(first, lambda: fake_reminder.dispatch({"invoice_id": 1}))
        await run_in_app(second, lambda: fake_reminder.dispatch({"invoice_id": 2}))
        fake_first.assert_dispatched(fake_reminder, lambda p: p["invoice_id"] == 1, times=1)
        fake_second.assert_dispatched(fake_reminder, lambda p: p["invoice_id"] == 2, times=1)
        assert await fake_first.drain() == 1  # through its own app, whichever is current
        assert events == [("reminder", 1)]
        Queue.restore()
        assert (first.recorder, second.recorder) == (None, None)
        await run_in_app(first, lambda: fake_reminder.dispatch({"invoice_id": 3}))
        await run_in_app(first, Queue.idle)
        assert events == [("reminder", 1), ("reminder", 3)]
        fake_first.assert_count(1)


async def test_a_fake_made_before_any_app_fakes_the_app_entered_later() -> None:
    fake = Queue.fake()
    app = _memory_app()
    async with app:
        assert app.recorder is fake
        await fake_reminder.dispatch({"invoice_id": 1})
    fake.assert_count(1)
    Queue.restore()
    assert app.recorder is None
    assert events == []


async def test_a_fake_of_one_app_leaves_another_app_alone() -> None:
    faked, real = _memory_app(), _memory_app()
    async with faked, real:
        fake = await run_in_app(faked, Queue.fake)
        await run_in_app(real, lambda: fake_reminder.dispatch({"invoice_id": 7}))
        await run_in_app(real, Queue.idle)
        assert events == [("reminder", 7)]
        fake.assert_nothing_dispatched()
        Queue.restore()


def test_the_engine_does_not_import_the_test_helpers() -> None:
    code = (
        "import sys, haze._engine.manager, haze._orchestration.chains, "
        "haze._orchestration.batches, haze._app.app\n"
        "print(sorted(m for m in sys.modules if m.startswith(('haze.testing', 'haze.drivers.memory'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
