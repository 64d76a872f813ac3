"""Worker signals kept in the queue store: ``queue:restart``, ``queue:pause``/``continue``.

Workers started by ``haze queue:work`` read them about once a second, so every worker
process that shares the store (redis or database) follows them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from haze._engine.view import EngineApp

__all__ = ["pause", "paused_queues", "request_restart", "restart_requested_at", "resume"]

_RESTART = "haze:worker:restart"


def _pause_key(connection: str, queue: str) -> str:
    return f"haze:worker:paused:{connection}:{queue}"


async def request_restart(app: EngineApp) -> float:
    """Ask every worker to stop after its running jobs (a supervisor restarts it)."""
    now = time.time()
    await app.queue_store.put(_RESTART, now)
    return now


async def restart_requested_at(app: EngineApp) -> float | None:
    value = await app.queue_store.get(_RESTART)
    return None if value is None else float(value)


async def pause(app: EngineApp, connection: str, queue: str) -> None:
    """Workers stop claiming from ``connection:queue`` until ``resume``."""
    await app.queue_store.put(_pause_key(connection, queue), time.time())


async def resume(app: EngineApp, connection: str, queue: str) -> bool:
    return await app.queue_store.delete(_pause_key(connection, queue))


async def paused_queues(app: EngineApp, connection: str, queues: Sequence[str]) -> set[str]:
    if not queues:
        return set()
    values = await app.queue_store.get_many([_pause_key(connection, q) for q in queues])
    return {q for q, v in zip(queues, values, strict=True) if v is not None}
