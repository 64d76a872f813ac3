"""limit_concurrency in one process (memory connection and store): what the contract suite
(tests/contract/test_concurrency_limit.py) cannot set up on every driver."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from haze import App, JobContext, Queue, define_job, define_queue_config, limit_concurrency


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
