"""What the jobs layer sees of the layers above it, as Protocols.

A job definition dispatches through the current app's engine, a job's context reports
progress to it, and ``job.batch()`` hands back the batch the job belongs to. The engine
and the batches live above this layer, so it names only what it calls: ``JobEngine``
(the part of ``QueueManager`` a job uses), ``JobsApp`` (an ``AppView`` with that
engine) and ``BatchView`` (what a job reads of its ``haze.Batch``). The composition
root checks that an ``App`` is a ``JobsApp``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from haze._jobs.status import StatusHost
from haze.contracts.app import AppView

if TYPE_CHECKING:
    from haze._jobs.context import JobContext
    from haze._jobs.definition import DispatchResult, JobDefinition, PendingDispatch

__all__ = ["BatchView", "JobDispatcher", "JobEngine", "JobsApp"]


class JobDispatcher(Protocol):
    async def dispatch(self, pending: PendingDispatch[Any]) -> DispatchResult:
        """Queue one pending dispatch."""

    def quick(self, job: JobDefinition[Any], payload: Any) -> str | None:
        """Queue ``job`` with ``payload`` and no option on the short path of a plain job;
        its id, or None when it must take ``dispatch``."""


class JobEngine(StatusHost, Protocol):
    """The part of the engine (``QueueManager``) that job definitions and contexts call."""

    @property
    def dispatcher(self) -> JobDispatcher: ...
    def report_progress(self, job: JobContext, value: Any) -> None: ...
    def scoped_key(self, kind: str, *parts: object) -> str: ...


JobsApp: TypeAlias = "AppView[JobEngine]"


class BatchView(Protocol):
    """A batch as a job sees it (``job.batch()``): a ``haze.Batch`` snapshot."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str | None: ...
    @property
    def total(self) -> int: ...
    @property
    def pending(self) -> int: ...
    @property
    def processed(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def finished_at(self) -> float | None: ...
    @property
    def cancelled_at(self) -> float | None: ...
    @property
    def created_at(self) -> float: ...
    @property
    def failed_job_ids(self) -> list[str]: ...
    @property
    def allows_failures(self) -> bool: ...
    @property
    def options(self) -> dict[str, Any]: ...
    @property
    def progress(self) -> int: ...
    @property
    def finished(self) -> bool: ...
    @property
    def cancelled(self) -> bool: ...
    def to_dict(self) -> dict[str, Any]: ...
    async def fresh(self) -> BatchView: ...
    async def cancel(self) -> None: ...
    async def add(self, jobs: Sequence[Any]) -> BatchView: ...
    def fresh_blocking(self) -> BatchView: ...
    def cancel_blocking(self) -> None: ...
    def add_blocking(self, jobs: Sequence[Any]) -> BatchView: ...
