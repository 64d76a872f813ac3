"""A unique lock whose release went on in the background (its store was unreachable when
the dispatch failed) is finished, or named, when the app stops: a release dropped with
the event loop leaves the key blocked for its whole ``for`` with no job to release it.

The store's outage is injected into the real in-process store's ``delete`` (an outage
that ends on cue cannot be had from a real server here); the store itself is real.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from haze import App, BackendUnavailableError, define_queue_config
from haze._engine import locks as locks_module


def _app() -> App:
    conn = {"driver": "memory"}
    return App(queue=define_queue_config(default="memory", connections={"memory": conn}))


def _failing(store: Any, monkeypatch: pytest.MonkeyPatch, times: int) -> None:
    real = store.delete
    left = [times]

    async def delete(key: str, owner: Any = None) -> Any:
        if left[0] > 0:
            left[0] -= 1
            raise BackendUnavailableError("the lock store is down (injected)")
        return await real(key, owner=owner)

    monkeypatch.setattr(store, "delete", delete)


async def test_a_pending_release_is_finished_when_the_app_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(locks_module, "RELEASE_SECONDS", 0.05)
    app = _app()
    async with app:
        store = app.manager.stores.state()
        await store.add("haze:unique:stop-test", "m1", 3600)
        _failing(store, monkeypatch, times=12)  # about 0.5 s of backed-off tries
        await app.manager.locks._release("haze:unique:stop-test", "m1")
        assert await store.get("haze:unique:stop-test") == "m1"  # going on in the background
    assert await store.get("haze:unique:stop-test") is None


async def test_a_release_that_cannot_finish_by_the_stop_is_named(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(locks_module, "RELEASE_SECONDS", 0.05)
    monkeypatch.setattr(locks_module, "STOP_RELEASE_SECONDS", 0.2)
    app = _app()
    async with app:
        store = app.manager.stores.state()
        await store.add("haze:unique:stuck", "m2", 3600)
        _failing(store, monkeypatch, times=10_000)
        await app.manager.locks._release("haze:unique:stuck", "m2")
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("haze:unique:stuck" in line and "expires" in line for line in lines), lines
