"""The ``FailedJobStore`` protocol: where a queue connection keeps its final failures.

Every driver has one (``Driver.failed``). The layouts live in ``haze._failed``: memory,
a SQL ``failed_jobs`` table, and one key layout on a cache store; the redis driver keeps
BullMQ's own failed sets. ``haze._failed.failed_store`` picks one for a connection's
``failed_store`` option.
"""

from __future__ import annotations

import builtins
from typing import Protocol, runtime_checkable

from haze._kernel.message import FailedJob

__all__ = ["FailedJob", "FailedJobStore"]


@runtime_checkable
class FailedJobStore(Protocol):
    """Where final failures are kept for inspection and retry.

    ``record`` of an id already kept replaces it; ``list`` is oldest first.
    """

    async def record(self, job: FailedJob) -> None: ...
    async def list(self, queue: str | None = None) -> builtins.list[FailedJob]: ...
    async def find(self, id: str) -> FailedJob | None: ...
    async def forget(self, id: str) -> bool: ...
    async def flush(self, older_than: float | None = None) -> int:
        """Delete failed jobs (only those older than ``older_than`` seconds when given)."""
