"""Bounds checked at dispatch on every driver: delays (finite, at most 365 days), queue
names (1 to 255 characters) and message sizes (each driver's documented default, or the
connection's ``max_message_size``). Nothing is enqueued when one is refused."""

from __future__ import annotations

from typing import Any

import pytest
from haze import DelayTooLongError, PayloadTooLargeError, Queue, define_job
from haze._base.durations import MAX_DELAY

LOG: list[Any] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    LOG.clear()


@define_job(name="bd_record")
async def bd_record(payload: dict[str, Any]) -> None:
    LOG.append(payload.get("n"))


async def _nothing_queued(driver: Any, done: Any, queue: str = "default") -> None:
    await done()
    assert LOG == []
    assert await Queue.size(queue) == 0


# ============================================================================ delays


@pytest.mark.parametrize("delay", [1e308, MAX_DELAY + 1, "400d", "53w"])
async def test_a_delay_over_365_days_is_refused_at_dispatch(
    app: Any, driver: Any, done: Any, delay: Any
) -> None:
    with pytest.raises(DelayTooLongError, match="365 days"):
        await bd_record.dispatch({"n": 1}, delay=delay)
    with pytest.raises(DelayTooLongError, match="365 days"):
        bd_record.with_({"n": 2}).delay(delay)
    with pytest.raises(DelayTooLongError, match="365 days"):
        Queue.chain([bd_record.with_({"n": 3})]).delay(delay)
    await _nothing_queued(driver, done)


@pytest.mark.parametrize("delay", [float("inf"), float("-inf"), float("nan"), -1])
async def test_a_delay_that_is_not_a_finite_number_of_seconds_is_refused(
    app: Any, driver: Any, done: Any, delay: float
) -> None:
    with pytest.raises(ValueError, match="finite"):
        await bd_record.dispatch({"n": 1}, delay=delay)
    await _nothing_queued(driver, done)


def test_a_backoff_over_365_days_is_refused_when_the_job_is_defined() -> None:
    with pytest.raises(DelayTooLongError, match=r"backoff\[1\].*365 days"):
        define_job(name="bd_backoff", tries=3, backoff=[10, 1e308])(bd_record.handler)


@pytest.mark.requires("queued")
async def test_a_delay_of_365_days_is_accepted(app: Any, driver: Any, done: Any) -> None:
    if driver.id == "cloudflare":  # Cloudflare Queues' own cap is 12 hours
        with pytest.raises(DelayTooLongError, match="12-hour"):
            await bd_record.dispatch({"n": 1}, delay=MAX_DELAY)
        return
    if driver.id == "memory":
        # the in-process queue holds it on a timer: nothing to count but its id
        assert await bd_record.dispatch({"n": 1}, delay=MAX_DELAY)
        assert await Queue.clear() >= 0
        return
    await bd_record.dispatch({"n": 1}, delay=MAX_DELAY)
    assert await Queue.size() == 1
    if driver.id == "vercel":
        # sent in hops; the Queue API cannot reach a message before it is due, so
        # clear takes only the visible ones (the test's topics are its own)
        assert await Queue.clear() == 0
        return
    assert await Queue.clear() == 1
    await _nothing_queued(driver, done)


# ============================================================================ queue names


@pytest.mark.parametrize("bad", ["", "q" * 256, 5])
async def test_a_queue_name_must_have_1_to_255_characters(
    app: Any, driver: Any, done: Any, bad: Any
) -> None:
    with pytest.raises(ValueError, match="1 to 255 characters"):
        await bd_record.dispatch({"n": 1}, queue=bad)
    with pytest.raises(ValueError, match="1 to 255 characters"):
        bd_record.with_({"n": 2}).on_queue(bad)
    with pytest.raises(ValueError, match="1 to 255 characters"):
        Queue.chain([bd_record.with_({"n": 3})]).on_queue(bad)
    with pytest.raises(ValueError, match="queue"):
        define_job(name="bd_long_queue", queue=bad)(bd_record.handler)
    await _nothing_queued(driver, done)


async def test_a_queue_name_of_255_characters_is_accepted(app: Any, driver: Any, done: Any) -> None:
    if driver.id.startswith("sqs"):
        pytest.skip("an SQS queue name has at most 80 characters (SQS's own, lower cap)")
    name = "q" * 255
    await bd_record.dispatch({"n": 1}, queue=name)
    if driver.remote and driver.id != "cloudflare":  # its worker does not consume that queue
        assert await Queue.size(name) == 1
        assert await Queue.clear(name) == 1
    else:
        await done()
        assert LOG == [1]


# ============================================================================ message size


async def test_every_driver_has_a_default_max_message_size(
    app: Any, driver: Any, done: Any
) -> None:
    limit = app.driver("main").max_message_size
    assert isinstance(limit, int) and 0 < limit <= 4 * 1024 * 1024
    with pytest.raises(PayloadTooLargeError, match=rf"over the {limit}-byte limit"):
        await bd_record.dispatch({"n": 1, "blob": "x" * limit})
    with pytest.raises(PayloadTooLargeError, match=rf"over the {limit}-byte limit"):
        await Queue.bulk([bd_record.with_({"n": 2, "blob": "x" * limit})])
    await _nothing_queued(driver, done)


async def test_max_message_size_is_set_per_connection(
    make_app: Any, driver: Any, done: Any
) -> None:
    async with make_app(options={"max_message_size": 2000}) as app:
        assert app.driver("main").max_message_size == 2000
        with pytest.raises(PayloadTooLargeError, match="over the 2000-byte limit"):
            await bd_record.dispatch({"n": 1, "blob": "x" * 2000})
        with pytest.raises(PayloadTooLargeError, match="over the 2000-byte limit"):
            await Queue.bulk([bd_record.with_({"n": 2, "blob": "x" * 2000})])
        await _nothing_queued(driver, done)
        await bd_record.dispatch({"n": 3, "blob": "x" * 100})
        await done()
        assert LOG == [3]


# ============================================================================ text


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ({"n": 1, "name": "caf\udce9"}, r"payload\['name'\]"),  # surrogateescape'd bytes
        ({"n": 2, "rows": [["ok", "\ud83d"]]}, r"payload\['rows'\]\[0\]\[1\]"),  # half emoji
        ({"n": 3, "\udfff": 1}, r"payload key '\\udfff'"),
    ],
)
async def test_a_lone_surrogate_is_refused_at_dispatch_naming_its_path(
    app: Any, driver: Any, done: Any, payload: dict[str, Any], path: str
) -> None:
    with pytest.raises(TypeError, match=rf"{path} holds a lone surrogate"):
        await bd_record.dispatch(payload)
    with pytest.raises(TypeError, match=rf"{path} holds a lone surrogate"):
        await Queue.bulk([bd_record.with_(payload)])
    with pytest.raises(TypeError, match=r"lone surrogate"):
        await Queue.chain([bd_record.with_({"n": 4}), bd_record.with_(payload)]).dispatch()
    await _nothing_queued(driver, done)
    await bd_record.dispatch({"n": 5, "text": "emoji 🚀 and U+2028 \u2028 survive"})
    await done()
    assert LOG == [5]
