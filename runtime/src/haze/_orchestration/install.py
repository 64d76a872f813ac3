"""Plug chains, batches and the config's queue limits into an app's engine.

The engine sits below this layer and never imports it; the app (the composition root)
calls :func:`install` once on the manager it builds.
"""

from __future__ import annotations

from haze._engine.hooks import Stage
from haze._engine.manager import QueueManager
from haze._orchestration.batches import BatchCount, BatchGuard
from haze._orchestration.chains import ChainCatch, ChainNext
from haze._orchestration.middleware import group_limits, queue_limits
from haze._orchestration.scheduling import TickEnd

__all__ = ["install"]


def install(manager: QueueManager) -> None:
    """Add the orchestration hooks to ``manager``: in each step the next link of a chain
    is dispatched before the batch counts the job, and a chain's ``catch`` runs after
    the job's lock and counters are released."""
    hooks = manager.hooks
    hooks.add(ChainNext(manager), Stage.CONTINUE)
    hooks.add(BatchCount(manager), Stage.COUNT)
    hooks.add(ChainCatch(manager), Stage.CALLBACK)
    hooks.add(TickEnd(manager), Stage.NOTIFY)
    hooks.guard(BatchGuard(manager))
    # Per-queue limits run before every other middleware (read when a job's pipeline is
    # first composed, so a config changed before then counts).
    manager.execution.middleware_sources.append(lambda: queue_limits(manager.app))
    manager.execution.middleware_sources.append(lambda: group_limits(manager.app))
