"""The ``FailedJobStore`` protocol: where a queue connection keeps its final failures.

Every driver has one (``Driver.failed``). The layouts live in ``haze._failed``: memory,
a SQL ``failed_jobs`` table, and one key layout on a cache store; the redis driver keeps
BullMQ's own failed sets. ``haze._failed.failed_store`` picks one for a connection's
``failed_store`` option. A store that can count and page at the backend also declares
``FailedPages``: the dashboard then reads one page per request, never every failed job.
"""

from __future__ import annotations

import builtins
from typing import Protocol, runtime_checkable

from haze._base.message import FailedJob, Message

__all__ = ["FailedJob", "FailedJobStore", "FailedPages", "RetriesAtomically", "RetryClaims"]


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


@runtime_checkable
class RetryClaims(Protocol):
    """A failed store whose records a retry claims before it queues the job again: of
    several callers retrying one record at once, exactly one wins it.

    A retry is ``claim_retry`` → queue the job → ``retried``. The queued message carries
    the claim token, and its first run calls ``retried`` too, so a retry that died after
    queueing the job still leaves no failed record behind once the job runs. A claim
    holds for the ``lease`` seconds its caller asked for; after that it may be taken
    over (its caller died, perhaps before queueing).
    Every built-in store implements it; without it, ``retry`` reads, queues and forgets
    (two concurrent retries may then both queue the job).
    """

    async def claim_retry(self, id: str, token: str, lease: float) -> FailedJob | None:
        """The record ``id``, claimed with ``token`` for ``lease`` seconds; None when
        there is none, or another caller's claim on it still holds."""

    async def retried(self, id: str, token: str) -> bool:
        """Delete the record ``id`` claimed with ``token`` (its job is queued again) and
        end the claim. A record written after the claim (the job failed again) stays.
        True when a record was deleted."""


@runtime_checkable
class FailedPages(Protocol):
    """A failed-job store that counts and pages at the backend (the SQL table).

    ``queue``, ``since`` and ``until`` (``failed_at`` bounds, inclusive) narrow every
    call; None leaves that bound out.
    """

    async def count(
        self, queue: str | None = None, since: float | None = None, until: float | None = None
    ) -> int:
        """How many failed jobs match, without reading them."""

    async def counts(self) -> dict[str, int]:
        """Failed jobs per queue, without reading them."""

    async def page(
        self,
        queue: str | None = None,
        since: float | None = None,
        until: float | None = None,
        *,
        offset: int = 0,
        limit: int = 50,
        text: int | None = None,
    ) -> builtins.list[FailedJob]:
        """Up to ``limit`` matching jobs after the first ``offset``, newest first; each
        exception cut to its first ``text`` characters (None: whole)."""


@runtime_checkable
class RetriesAtomically(Protocol):
    """A failed store kept on its driver's own backend (the memory driver's, the database
    driver's table, the redis driver's BullMQ sets): it queues a claimed record's job
    and deletes the record in one atomic step.

    A retry is then ``claim_retry`` → ``requeue_claimed``: a process that dies between
    the two has queued nothing, and its record is retryable once the claim's lease
    ends; one that dies after has left the job queued and no record. Checked with
    ``isinstance``; the store queues on its own driver only.
    """

    async def requeue_claimed(self, id: str, token: str, body: str, message: Message) -> bool:
        """In one step: when the record ``id`` is still claimed with ``token``, queue
        ``body`` (``message``, no delay) on this store's driver, delete the record and
        end the claim. False, having written nothing, when the claim is not held."""
