"""Failed jobs in this process's memory: the memory driver's, the fallback of a
connection without a shared ``failed_store``, and the sync driver's none."""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Callable

from haze._base.message import FailedJob, Message

__all__ = ["MemoryFailedJobs", "NoFailedJobs", "QueueFailedJobs", "WarningFailedJobs"]


class MemoryFailedJobs:
    """Failed jobs kept in a dict, newest last."""

    def __init__(self) -> None:
        self._jobs: dict[str, FailedJob] = {}
        #: id -> (token, claim's end, the record claimed) of retries in progress
        self._claims: dict[str, tuple[str, float, FailedJob]] = {}

    async def record(self, job: FailedJob) -> None:
        self._jobs.pop(job.id, None)
        self._jobs[job.id] = job

    async def claim_retry(self, id: str, token: str, lease: float) -> FailedJob | None:
        job = self._jobs.get(id)
        if job is None:
            return None
        held = self._claims.get(id)
        now = time.monotonic()
        if held is not None and held[2] is job and now < held[1]:
            return None
        self._claims[id] = (token, now + lease, job)
        return job

    async def retried(self, id: str, token: str) -> bool:
        held = self._claims.get(id)
        if held is None or held[0] != token:
            return False
        del self._claims[id]
        if self._jobs.get(id) is not held[2]:
            return False  # recorded again after the claim: the job failed again
        del self._jobs[id]
        return True

    async def list(self, queue: str | None = None) -> builtins.list[FailedJob]:
        return [j for j in self._jobs.values() if queue is None or j.queue == queue]

    async def find(self, id: str) -> FailedJob | None:
        return self._jobs.get(id)

    async def forget(self, id: str) -> bool:
        return self._jobs.pop(id, None) is not None

    async def flush(self, older_than: float | None = None) -> int:
        if older_than is None:
            n = len(self._jobs)
            self._jobs.clear()
            return n
        cutoff = time.time() - older_than
        old = [k for k, j in self._jobs.items() if j.failed_at < cutoff]
        for k in old:
            del self._jobs[k]
        return len(old)


class QueueFailedJobs(MemoryFailedJobs):
    """The memory driver's own failed jobs: a retry queues the job with ``push`` and
    deletes the record in one step (``RetriesAtomically``; nothing awaits in between)."""

    def __init__(self, push: Callable[[str, Message], None]) -> None:
        super().__init__()
        self._push = push

    async def requeue_claimed(self, id: str, token: str, body: str, message: Message) -> bool:
        held = self._claims.get(id)
        if held is None or held[0] != token or self._jobs.get(id) is not held[2]:
            return False
        self._push(body, message)
        del self._claims[id]
        del self._jobs[id]
        return True


class WarningFailedJobs(MemoryFailedJobs):
    """The memory fallback of a remote connection: warns once, on the first failure it
    keeps, that other processes cannot see it (on the driver's own logger)."""

    def __init__(self, connection: str, why: str, log: logging.Logger) -> None:
        super().__init__()
        self.connection = connection
        self.why = why
        self._log = log
        self._warned = False

    async def record(self, job: FailedJob) -> None:
        if not self._warned:
            self._warned = True
            self._log.warning(
                'Connection "%s" keeps failed jobs in the memory of this process (%s): they '
                "are lost when it exits, and other processes (haze queue:failed, other "
                "Lambda containers or Worker isolates) cannot see them. Set failed_store to "
                "a database connection (D1 in a Worker) or a redis/database cache store.",
                self.connection,
                self.why,
            )
        await super().record(job)


class NoFailedJobs:
    """Keeps nothing: the ``sync`` driver raises a failure to the caller instead."""

    async def record(self, job: FailedJob) -> None:
        return None

    async def list(self, queue: str | None = None) -> builtins.list[FailedJob]:
        return []

    async def find(self, id: str) -> FailedJob | None:
        return None

    async def forget(self, id: str) -> bool:
        return False

    async def claim_retry(self, id: str, token: str, lease: float) -> FailedJob | None:
        return None

    async def retried(self, id: str, token: str) -> bool:
        return False

    async def flush(self, older_than: float | None = None) -> int:
        return 0
