"""Several connections' failed jobs read as one store (the failover connection's)."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence

from haze._base.message import FailedJob
from haze.contracts.failed import FailedJobStore, RetryClaims

__all__ = ["FailedJobsUnion"]


class FailedJobsUnion:
    """Records go to the first store; reads and deletes go to every distinct one.

    ``stores`` is called on each use: a member connection's store may be made lazily.
    """

    def __init__(self, stores: Callable[[], Sequence[FailedJobStore]]) -> None:
        self._all = stores

    async def record(self, job: FailedJob) -> None:
        await self._all()[0].record(job)

    async def list(self, queue: str | None = None) -> builtins.list[FailedJob]:
        out: builtins.list[FailedJob] = []
        for store in self._stores():
            out.extend(await store.list(queue))
        return sorted(out, key=lambda f: f.failed_at)

    async def find(self, id: str) -> FailedJob | None:
        for store in self._stores():
            found = await store.find(id)
            if found is not None:
                return found
        return None

    async def claim_retry(self, id: str, token: str, lease: float) -> FailedJob | None:
        # The first store that keeps the record is the one whose claim counts.
        for store in self._stores():
            found = await store.find(id)
            if found is not None:
                if not isinstance(store, RetryClaims):
                    return found  # a store without claims: retried as before, unclaimed
                return await store.claim_retry(id, token, lease)
        return None

    async def retried(self, id: str, token: str) -> bool:
        done = False
        for store in self._stores():
            if isinstance(store, RetryClaims):
                done = await store.retried(id, token) or done
            else:
                done = await store.forget(id) or done
        return done

    async def forget(self, id: str) -> bool:
        forgot = False
        for store in self._stores():
            forgot = await store.forget(id) or forgot
        return forgot

    async def flush(self, older_than: float | None = None) -> int:
        return sum([await store.flush(older_than) for store in self._stores()])

    def _stores(self) -> builtins.list[FailedJobStore]:
        # Two connections on one backend may share a store object: read it once.
        seen: builtins.list[FailedJobStore] = []
        for store in self._all():
            if all(store is not s for s in seen):
                seen.append(store)
        return seen
