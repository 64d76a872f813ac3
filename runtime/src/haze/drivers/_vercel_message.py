"""The envelope of a message on Vercel Queues, as the ``vercel`` driver sends and reads
it: the SDK transport that keeps the raw bytes (a re-send or a hop rewrites ``attempts``
and ``meta.due`` with ``haze.drivers._hops``)."""

from __future__ import annotations

from collections.abc import AsyncIterator


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
