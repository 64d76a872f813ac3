"""The ``Queue`` facade: dispatch by job or name, chains, batches, failed jobs, testing.

Every method resolves the current app (``haze.use_app()``), so inside a job it acts
on the job's app.

>>> # await Queue.dispatch("send_invoice", {"invoice_id": 42}, delay=30)
>>> # await Queue.failed(); await Queue.retry(); await Queue.idle()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from haze import testing
from haze._app.app import use_app
from haze._base.blocking import blocking
from haze._base.durations import Duration, parse_duration
from haze._base.message import check_queue_name
from haze._engine.manager import QueueManager, events
from haze._jobs import status
from haze._jobs.definition import JobDefinition, PendingDispatch, get_job
from haze._jobs.status import JobStatus
from haze._orchestration import batches
from haze._orchestration.batches import Batch, PendingBatch
from haze._orchestration.chains import PendingChain
from haze.drivers import FailedJob

__all__ = ["Queue"]


def _manager() -> QueueManager:
    return use_app().manager


def _queue(queue: str | None, call: str) -> str | None:
    """``queue`` (None: the default one), or the ``ValueError`` a dispatch to it gets: a
    name no queue can have would otherwise be answered as an empty queue."""
    return None if queue is None else check_queue_name(queue, call)


async def _dispatch(
    job: JobDefinition[Any] | str,
    payload: Any = None,
    *,
    delay: Duration | None = None,
    queue: str | None = None,
    connection: str | None = None,
    after_commit: bool | None = None,
    group: str | None = None,
) -> str:
    """Dispatch a job by definition or registered name; returns the job id."""
    if isinstance(job, str):
        job = get_job(job)
    elif not isinstance(job, JobDefinition):
        raise TypeError(f"Queue.dispatch: expected a job or a job name, got {job!r}")
    return await job.dispatch(
        payload,
        delay=delay,
        queue=queue,
        connection=connection,
        after_commit=after_commit,
        group=group,
    )


async def _bulk(jobs: Sequence[PendingDispatch[Any]]) -> list[str]:
    """Queue many jobs with each driver's batch primitive; returns ids in order."""
    ids: list[str] = await _manager().bulk(list(jobs))
    return ids


async def _find_batch(batch_id: str) -> Batch | None:
    """The batch with this id, or None (unknown or expired)."""
    return await batches.find(_manager(), batch_id)


async def _failed(connection: str | None = None, queue: str | None = None) -> list[FailedJob]:
    """Failed jobs on a connection (default: the config default)."""
    jobs: list[FailedJob] = await _manager().failed(connection, _queue(queue, "Queue.failed"))
    return jobs


async def _retry(
    ids: str | Sequence[str] | None = None,
    *,
    connection: str | None = None,
    queue: str | None = None,
) -> list[str]:
    """Put failed jobs back (all when no id is given); a chain member continues its chain."""
    where = _queue(queue, "Queue.retry")
    done: list[str] = await _manager().retry(ids, connection=connection, queue=where)
    return done


async def _forget(id: str, *, connection: str | None = None) -> bool:
    """Delete one failed job."""
    return bool(await _manager().forget(id, connection))


async def _flush(*, connection: str | None = None, older_than: Duration | None = None) -> int:
    """Delete failed jobs (only those older than ``older_than`` when given)."""
    age = None if older_than is None else parse_duration(older_than, "older_than")
    return int(await _manager().flush(connection, age))


async def _idle() -> None:
    """Wait until the memory connections have nothing queued, delayed or running."""
    await _manager().idle()


async def _size(queue: str | None = None, *, connection: str | None = None) -> int:
    """Jobs waiting (ready and delayed) on a queue."""
    return int(await _manager().size(_queue(queue, "Queue.size"), connection))


async def _clear(queue: str | None = None, *, connection: str | None = None) -> int:
    """Delete the jobs waiting on a queue; returns how many."""
    return int(await _manager().clear(_queue(queue, "Queue.clear"), connection))


async def _status(id: str) -> JobStatus | None:
    """A tracked job's status record (``JobStatus``), or None: untracked, expired, or
    not a full job id (records are kept by full id).

    >>> # st = await Queue.status(job_id); st.state, st.progress
    """
    return await status.read(_manager(), id)


async def _wait(id: str, timeout: Duration | None = None) -> JobStatus:
    """Wait until a tracked job is ``done``, ``failed`` or ``cancelled``; returns its
    ``JobStatus``. ``TimeoutError`` after ``timeout``; ``UntrackedJobError`` when the job
    has no record.

    >>> # st = await Queue.wait(job_id, timeout="1m"); st.result
    """
    limit = None if timeout is None else parse_duration(timeout, "Queue.wait(timeout)")
    return await status.wait_final(_manager(), id, limit)


async def _cancel(id: str) -> bool:
    """Cancel a job: a queued or delayed one never runs; a running one has ``job.signal``
    aborted (within about a second, on any worker) and ends ``cancelled`` if it stops.
    False when its status record says it already ended; True otherwise (an untracked
    job's state is unknown, so True).

    >>> # await Queue.cancel(job_id)
    """
    return await status.cancel(_manager(), id)


class Queue:
    """The queue facade (all static)."""

    dispatch = staticmethod(_dispatch)
    dispatch_blocking = staticmethod(blocking(_dispatch))
    bulk = staticmethod(_bulk)
    bulk_blocking = staticmethod(blocking(_bulk))
    find_batch = staticmethod(_find_batch)
    find_batch_blocking = staticmethod(blocking(_find_batch))
    failed = staticmethod(_failed)
    failed_blocking = staticmethod(blocking(_failed))
    retry = staticmethod(_retry)
    retry_blocking = staticmethod(blocking(_retry))
    forget = staticmethod(_forget)
    forget_blocking = staticmethod(blocking(_forget))
    flush = staticmethod(_flush)
    flush_blocking = staticmethod(blocking(_flush))
    idle = staticmethod(_idle)
    idle_blocking = staticmethod(blocking(_idle))
    size = staticmethod(_size)
    size_blocking = staticmethod(blocking(_size))
    clear = staticmethod(_clear)
    clear_blocking = staticmethod(blocking(_clear))
    status = staticmethod(_status)
    status_blocking = staticmethod(blocking(_status))
    wait = staticmethod(_wait)
    wait_blocking = staticmethod(blocking(_wait))
    cancel = staticmethod(_cancel)
    cancel_blocking = staticmethod(blocking(_cancel))

    @staticmethod
    def chain(jobs: Sequence[Any]) -> PendingChain:
        """Run jobs one after another: ``Queue.chain([a.with_(p), b.with_(p)]).dispatch()``."""
        return PendingChain(jobs)

    @staticmethod
    def batch(jobs: Sequence[Any]) -> PendingBatch:
        """Dispatch jobs as one tracked batch: ``Queue.batch([...]).then(cb).dispatch()``."""
        return PendingBatch(jobs)

    @staticmethod
    def on(event: str, fn: Callable[..., Any] | None = None) -> Any:
        """Listen to a queue event (``before``, ``after``, ``failing``, ``looping``,
        ``worker_idle``, ``queue_busy``, ``progress``); usable as a decorator."""
        if fn is None:
            return lambda f: events.on(event, f)
        return events.on(event, fn)

    @staticmethod
    def off(event: str, fn: Callable[..., Any]) -> None:
        """Remove a listener added with ``Queue.on(event, fn)`` (nothing when it is not
        listening). With no ``before`` or ``after`` listener left, plain jobs on an
        in-process queue take their short path again.

        >>> def log_start(job): print("start", job.id)
        >>> Queue.on("before", log_start)  # doctest: +ELLIPSIS
        <function log_start at ...>
        >>> Queue.off("before", log_start)
        """
        events.off(event, fn)

    @staticmethod
    def fake() -> testing.FakeQueue:
        """Record the current app's dispatches instead of queueing them (see
        ``haze.testing``); called before any app is entered, the fake also covers the
        apps entered until ``Queue.restore()``."""
        return testing.install()

    @staticmethod
    def restore() -> None:
        """Undo ``Queue.fake()`` (on every app it faked)."""
        testing.uninstall()
