"""The ``cloudflare`` queue driver, with producers through the Worker's Queue binding.

The driver itself (REST producer, HTTP pull consumer, settling deliveries, the failed
store) lives in the runtime, ``haze.drivers.cloudflare``, so ``haze-jobs[cloudflare]`` alone
runs ``haze queue:work --connection cloudflare`` in a container. This module adds what
only exists inside a Worker: ``env[binding].send(body, {delaySeconds, contentType})`` and
``sendBatch([...])``. ``binding_producer`` is the ``haze.bindings`` plugin ``cloudflare``
(see ``haze_cloudflare._plugins``): the driver uses the binding whenever the bound env
(``bind_env``) has it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from haze.drivers import cloudflare as _rt
from haze.drivers.cloudflare import (
    DEFAULT_MAX_MESSAGE_SIZE,
    MAX_DELAY_SECONDS,
    CloudflareDriver,
    CloudflareError,
    delay_seconds,
)

from haze_cloudflare._js import binding, to_js

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "MAX_DELAY_SECONDS",
    "BindingProducer",
    "CloudflareDriver",
    "CloudflareError",
    "binding_producer",
    "delay_seconds",
]


async def _settle(value: Any) -> Any:
    """Await a JS promise (or a coroutine from a Python stand-in); pass other values."""
    if inspect.isawaitable(value):
        return await value
    return value


def _options(delay: int) -> dict[str, Any]:
    # contentType "json": readable by HTTP pull consumers too (the default, v8, is not)
    opts: dict[str, Any] = {"contentType": "json"}
    if delay:
        opts["delaySeconds"] = delay
    return opts


class BindingProducer:
    """``send``/``sendBatch`` on the Queue binding ``name`` of the bound Worker env."""

    def __init__(self, name: str):
        self.name = name

    def _queue(self) -> Any:
        q = binding(self.name)
        if q is None:
            raise CloudflareError(f"the Worker env has no Queue binding {self.name!r}")
        return q

    async def send(self, body: dict[str, Any], delay: int) -> None:
        await _settle(self._queue().send(to_js(body), to_js(_options(delay))))

    async def send_batch(self, items: Sequence[tuple[dict[str, Any], int]]) -> None:
        q = self._queue()
        for chunk in _rt._chunks(items):
            messages = [{"body": body, **_options(delay)} for body, delay in chunk]
            await _settle(q.sendBatch(to_js(messages)))


def binding_producer(name: str) -> BindingProducer | None:
    """A producer on the Queue binding ``name`` of the bound env, or None (not bound)."""
    return BindingProducer(name) if binding(name) is not None else None
