"""Fixtures for the driver tests: a real Redis, one key prefix per test, cleaned up."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from haze import App, define_queue_config
from redis_spec import REDIS_URL, delete_prefix, unique_prefix


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A fresh BullMQ key prefix; every key under it is deleted after the test."""
    prefix = unique_prefix("d")
    try:
        yield prefix
    finally:
        delete_prefix(prefix + ":")


@pytest.fixture
def redis_app(
    redis_prefix: str,
) -> Callable[..., contextlib.AbstractAsyncContextManager[App]]:
    """``async with redis_app(**options) as app:`` -- an entered app whose default
    connection ``"r"`` is a redis connection on this test's prefix."""

    @contextlib.asynccontextmanager
    async def factory(**options: Any) -> AsyncIterator[App]:
        conn = {"driver": "redis", "url": REDIS_URL, "prefix": redis_prefix, **options}
        app = App(queue=define_queue_config(default="r", connections={"r": conn}))
        async with app:
            yield app

    return factory
