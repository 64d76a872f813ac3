"""limit_concurrency in one process (memory connection and store): what the contract suite
(tests/contract/test_concurrency_limit.py) cannot set up on every driver."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from haze import (
    App,
    ConfigError,
    JobContext,
    Queue,
    define_job,
    define_queue_config,
    limit_concurrency,
)


@define_job(name="lc_store_down", middleware=[limit_concurrency(1, expire_after="30s")])
async def lc_store_down(payload: dict, job: JobContext) -> None:
    payload["ran"] = True


async def test_a_slot_that_cannot_be_given_back_leaves_the_run_done(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store fails on the give-back: the run stays done (not retried: it ran), and
    the slot frees itself when its lease runs out."""
    app = App(queue=define_queue_config(connections={"m": {"driver": "memory"}}))
    async with app:
        store = app.queue_store
        real_delete = store.delete

        async def failing_delete(key: str, owner: Any = None) -> bool:
            if ":conc:" in key:
                raise ConnectionError("store unreachable")
            return await real_delete(key, owner)

        monkeypatch.setattr(store, "delete", failing_delete)
        with caplog.at_level(logging.WARNING, logger="haze"):
            await lc_store_down.dispatch({})
            await Queue.idle()
        assert await Queue.failed() == []
        assert "could not give back concurrency slot" in caplog.text
        ttl = await store.ttl("haze:mw:conc:job:lc_store_down:slot:0")
        assert ttl is not None
        assert 0 < ttl <= 30


@pytest.mark.parametrize("expire_after", ["500ms", 0.2, "999ms"])
def test_a_sub_second_expire_after_is_refused_in_one_line(expire_after: object) -> None:
    # renewed every third of it, such a lease lapses under a store's latency: the slot
    # would go to another job while this one still runs (the limit silently not held)
    with pytest.raises(ConfigError) as info:
        limit_concurrency(2, expire_after=expire_after)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("limit_concurrency(2): expire_after must be at least 1s")


def test_a_bad_limit_concurrency_option_is_a_config_error() -> None:
    for bad in ({"max": 0}, {"max": 2, "key": 5}, {"max": 2, "release_after": True}):
        max_ = bad.pop("max")
        with pytest.raises(ConfigError, match=r"limit_concurrency\("):
            limit_concurrency(max_, **bad)  # type: ignore[arg-type]
