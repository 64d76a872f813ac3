"""The envelope of a message on Vercel Queues, as the ``vercel`` driver sends and reads
it: the SDK transport that keeps the raw bytes, and the ``attempts`` and ``meta.due``
a re-send or a hop rewrites."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from haze._base.message import Message, envelope_of


class _Body:
    """The SDK transport of a haze envelope: JSON text out, the raw bytes back (a body
    that is not JSON still arrives, and fails as a job instead of breaking the poll)."""

    content_type = "application/json"

    def serialize(self, value: bytes) -> bytes:
        return value

    async def deserialize(self, payload: AsyncIterator[bytes], *, content_type: str) -> bytes:
        chunks = bytearray()
        async for chunk in payload:
            chunks.extend(chunk)
        return bytes(chunks)


def rewrite(body: str, *, attempts: int | None = None, due: float | None = None) -> str:
    """``body`` with another ``attempts`` offset (None: kept) and ``meta.due`` (None:
    removed)."""
    data = envelope_of(body)
    if data is None:
        return body
    if attempts is not None:
        if attempts > 0:
            data["attempts"] = attempts
        else:
            data.pop("attempts", None)
    meta = dict(data.get("meta") or {})
    if due is not None:
        meta["due"] = round(due, 3)
    else:
        meta.pop("due", None)
    if meta:
        data["meta"] = meta
    else:
        data.pop("meta", None)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def due_of(message: Message | None) -> float | None:
    """``meta.due`` of a message sent in hops (None: none, or not a number)."""
    if message is None or not message.meta:
        return None
    due = message.meta.get("due")
    try:
        return float(due) if due is not None else None
    except (TypeError, ValueError):
        return None
