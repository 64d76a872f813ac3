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
        try:
            await _settle(self._queue().send(to_js(body), to_js(_options(delay))))
        except Exception:
            _refuse_unsafe_integers(body.get("payload"), _where(body))
            raise

    async def send_batch(self, items: Sequence[tuple[dict[str, Any], int]]) -> None:
        q = self._queue()
        for chunk in _rt._chunks(items):
            messages = [{"body": body, **_options(delay)} for body, delay in chunk]
            try:
                await _settle(q.sendBatch(to_js(messages)))
            except Exception:
                for body, _ in chunk:
                    _refuse_unsafe_integers(body.get("payload"), _where(body))
                raise


_JS_SAFE = 2**53 - 1


def _where(body: dict[str, Any]) -> str:
    return f'job "{body.get("job")}": payload'


def _refuse_unsafe_integers(value: Any, path: str = "payload") -> None:
    """After a send the binding refused: one line when a body held an integer that
    JavaScript's numbers cannot carry (it becomes a BigInt, which a JSON queue message
    cannot hold), instead of the bare ``JsException``."""
    if isinstance(value, dict):
        for k, v in value.items():
            _refuse_unsafe_integers(v, f"{path}[{k!r}]")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _refuse_unsafe_integers(v, f"{path}[{i}]")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > _JS_SAFE:
        # a page of digits helps no one: past 30 of them, their count
        shown = value if value.bit_length() < 100 else f"an int of about {_digits(value)} digits"
        raise ValueError(
            f"{path} is {shown}, past the integers JavaScript carries exactly (±2**53 - 1): "
            "a Cloudflare queue cannot send it; send it as a string"
        )


def _digits(n: int) -> int:
    return int(abs(n).bit_length() * 0.30103) + 1


def binding_producer(name: str) -> BindingProducer | None:
    """A producer on the Queue binding ``name`` of the bound env, or None (not bound)."""
    return BindingProducer(name) if binding(name) is not None else None
