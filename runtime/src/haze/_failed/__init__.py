"""Failed-job stores: one layout per backend kind, and the one ``failed_store`` resolver.

- ``MemoryFailedJobs`` (and its warning fallback ``WarningFailedJobs``, and the sync
  driver's ``NoFailedJobs``): this process's memory;
- ``SqlFailedJobs``: a ``failed_jobs`` table on the queue tables' ``.sql`` blocks (the
  database driver's own, and a ``failed_store`` database connection's);
- ``StoreFailedJobs``: one atomic key layout on a cache store (redis, database, kv);
- ``FailedJobsUnion``: several connections' stores read as one (failover).

The redis driver keeps its failures in BullMQ's failed sets (``RedisFailedJobs``): that
layout belongs to BullMQ, so it stays with the driver. ``failed_store`` picks the store
for a connection's ``failed_store`` option.
"""

from __future__ import annotations

from haze._failed.memory import (
    MemoryFailedJobs,
    NoFailedJobs,
    QueueFailedJobs,
    WarningFailedJobs,
)
from haze._failed.resolve import FailedStoreHost, failed_store, failed_target
from haze._failed.sql import SqlFailedJobs, failed_row
from haze._failed.store import StoreFailedJobs
from haze._failed.union import FailedJobsUnion

__all__ = [
    "FailedJobsUnion",
    "FailedStoreHost",
    "MemoryFailedJobs",
    "NoFailedJobs",
    "QueueFailedJobs",
    "SqlFailedJobs",
    "StoreFailedJobs",
    "WarningFailedJobs",
    "failed_row",
    "failed_store",
    "failed_target",
]
