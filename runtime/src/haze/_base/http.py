"""An ``httpx.AsyncClient`` bound to the running event loop (libSQL, D1, Cloudflare REST).

An ``AsyncClient``'s connection pool belongs to the loop that opened it: reusing it from
another loop (a second ``asyncio.run``, a test's fresh loop, a Lambda invocation) fails
inside httpx. So a new loop gets a new client and the old one is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING

from haze._base.deps import require

if TYPE_CHECKING:
    import httpx

__all__ = ["LoopClient"]


class LoopClient:
    """One ``httpx.AsyncClient`` at a time, for the loop it was made on.

    Importing httpx happens here, so a missing one raises ``MissingDependencyError``
    naming ``haze-jobs[extra]`` when the caller is built; ``httpx`` is the module (for its
    exception classes).
    """

    def __init__(self, *, what: str, extra: str, timeout: float, headers: Mapping[str, str]):
        self.httpx: ModuleType = require("httpx", what=what, extra=extra)
        self.timeout = timeout
        self.headers = headers
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> httpx.AsyncClient:
        """The client for the running loop (a new loop, or a closed client, gets a new one)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop or self._client.is_closed:
            client: httpx.AsyncClient = self.httpx.AsyncClient(
                timeout=self.timeout, headers=self.headers
            )
            self._client, self._loop = client, loop
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        loop, self._loop = self._loop, None
        if client is None or client.is_closed:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is loop:
            await client.aclose()
        # a client from another (finished) loop cannot be closed from here; drop it
