"""Queueing a batch's jobs (``Queue.batch(...).dispatch()``, ``Batch.add``), so that the
batch ends consistent whatever fails on the way.

Every job is checked first (queue name, payload, size, delay; a chain's links too):
one that would be refused refuses the batch before anything is sent. The jobs then go
``DISPATCH_CHUNK`` at a time. A send that fails before any job was queued raises its
own error, and the batch is dropped (nothing of it runs). Once some were queued, the
batch has to end when they do: the jobs not queued are counted as failed (the ones a
driver named by id one by one, the rest in one step), the sends stop at the first
error that is not a ``DispatchIncompleteError``, and the caller gets a
``DispatchIncompleteError`` naming how many went out and the batch's id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from haze._base.describe import error_line
from haze._base.errors import DispatchIncompleteError, DispatchOutcomeUnknownError
from haze._base.message import Message, encode_payload, new_id
from haze._engine.manager import QueueManager
from haze._jobs.definition import PendingDispatch
from haze._orchestration import batch_settle, batch_unknown
from haze._orchestration.batch_records import (
    DISPATCH_CHUNK,
    _chain_links,
    _key,
    _store,
    check_link_queues,
)

Item = PendingDispatch[Any] | list[PendingDispatch[Any]]

__all__ = ["Sending", "check_items", "dispatch_items", "finish", "size"]


def size(item: Item) -> int:
    """Jobs ``item`` adds to the batch (a chain: each of its links)."""
    return len(item) if isinstance(item, list) else 1


def check_items(
    manager: QueueManager, batch_id: str, items: Sequence[Item], options: dict[str, Any]
) -> None:
    """Raise what sending ``items`` would raise for one of them, sending nothing: a
    batch is refused whole, before its first job goes out (or runs, on ``sync``)."""
    conn, queue = options.get("connection"), options.get("queue")
    dispatcher = manager.dispatcher
    for item in items:
        if isinstance(item, list):
            links = _chain_links(manager, item, queue, conn)
            check_link_queues(manager, links[1:])
            for link in links[1:]:
                if "payload" in link:  # the head's message carries the others' payloads
                    encode_payload(link["payload"], link["job"])
            item = item[0]
        dispatcher.check(item, queue=queue, connection=conn, batch_id=batch_id)


@dataclass
class Sending:
    """How far a batch's dispatch got."""

    total: int
    sent: int = 0  # jobs queued (or run, on sync)
    unsent: int = 0  # jobs counted as failed without being queued
    failed: dict[str, str] = field(default_factory=dict)  # their ids, when they had one
    unknown: list[str] = field(default_factory=list)  # may be queued: their send lost its reply
    error: BaseException | None = None  # the first send that failed
    job_error: BaseException | None = None  # sync: the first job that ran and failed
    lost: BaseException | None = None  # counting the unsent failed too
    cancelled: bool = False  # the caller was cancelled: no send after the one in flight

    @property
    def touched(self) -> bool:
        """Something of the batch went out or was counted: it must now end."""
        return self.sent > 0 or self.unsent > 0 or bool(self.unknown)

    def incomplete(self, batch_id: str) -> DispatchIncompleteError:
        assert self.error is not None
        why = error_line(self.error)
        counted = (
            "count as failed jobs of the batch, which ends when the queued ones do"
            if self.lost is None
            else f"could not be counted ({error_line(self.lost)}): the batch will not end"
        )
        maybe = (
            f"; {len(self.unknown)} more may be queued (their send lost its reply): they "
            "stay pending and run if they were, and count as failed (skipped if they come "
            "later) once the batch's other jobs have ended; look those up by id before "
            "dispatching them again"
            if self.unknown
            else ""
        )
        error = DispatchIncompleteError(
            f'batch "{batch_id}": {self.sent} of {self.total} jobs were queued; '
            f"{self.unsent} were not and {counted}{maybe}; dispatch those again once the "
            f"cause is fixed ({why})",
            failed=self.failed,
            unsent=self.unsent,
            batch_id=batch_id,
            unknown=self.unknown,
        )
        error.__cause__ = self.error
        return error


class _Stop(Exception):
    """A send failed after the batch was touched: stop sending."""


async def dispatch_items(
    calls: batch_settle.BatchCalls,
    manager: QueueManager,
    batch_id: str,
    items: Sequence[Item],
    options: dict[str, Any],
) -> Sending:
    """Queue ``items`` as jobs of the batch (see the module docstring); raises the
    first send's own error only when nothing was queued or counted.

    A caller cancelled meanwhile (a timeout around the dispatch) waits for the send in
    flight, whose outcome could not be known otherwise; the jobs after it count as
    failed and ``state.cancelled`` says so (the caller lists the batch, then raises
    ``CancelledError``). Nothing queued: the ``CancelledError`` is raised here."""
    state = Sending(sum(size(i) for i in items))

    def stop() -> None:
        state.cancelled = True  # _dispatch stops before its next send

    sending = asyncio.ensure_future(_dispatch(calls, manager, batch_id, items, options, state))
    if not await finish(sending, stop):
        return sending.result()
    if sending.cancelled() or sending.exception() is not None:
        raise asyncio.CancelledError  # nothing of the batch went out
    state.cancelled = True  # even when it all went out: the caller raises CancelledError
    return sending.result()


async def finish(task: asyncio.Future[Any], on_cancel: Callable[[], None] | None = None) -> bool:
    """Wait for ``task`` to end even when the caller is cancelled meanwhile (calling
    ``on_cancel`` then): whether it was. A store write or a send cut off half-way
    leaves counts no one can tell apart."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():  # the caller's, not the task's own
                cancelled = True
                if on_cancel is not None and not task.done():
                    on_cancel()
        except Exception:
            pass  # the task's own error: the caller reads it
    return cancelled


async def _dispatch(
    calls: batch_settle.BatchCalls,
    manager: QueueManager,
    batch_id: str,
    items: Sequence[Item],
    options: dict[str, Any],
    state: Sending,
) -> Sending:
    conn = options.get("connection")
    run: list[PendingDispatch[Any]] = []  # plain jobs for queue drivers: one bulk per chunk
    done = 0  # jobs of ``items`` sent or counted so far
    try:
        for item in items:
            head = item[0] if isinstance(item, list) else item
            target = manager.dispatcher.resolve(head, queue=options.get("queue"), connection=conn)
            if not isinstance(item, list) and not manager.app.driver(target[0]).inline:
                run.append(item)
                if len(run) >= DISPATCH_CHUNK:
                    done += await _flush(calls, manager, batch_id, run, options, state)
                continue
            done += await _flush(calls, manager, batch_id, run, options, state)
            await _one(calls, manager, batch_id, item, options, state)
            done += size(item)
        await _flush(calls, manager, batch_id, run, options, state)
    except _Stop:
        await _count(calls, manager, batch_id, state, state.total - done, None)
    if state.unknown:
        # after every send: the jobs that may be queued are voided if nothing else of
        # the batch is pending (no other job will settle and look)
        try:
            await batch_settle.settle_unknown(calls, manager, batch_id)
        except Exception as e:
            state.lost = state.lost or e
    return state


async def _flush(
    calls: batch_settle.BatchCalls,
    manager: QueueManager,
    batch_id: str,
    run: list[PendingDispatch[Any]],
    options: dict[str, Any],
    state: Sending,
) -> int:
    """Send the plain jobs gathered so far in one bulk; how many there were."""
    n = len(run)
    if not n:
        return 0
    _stop_if_cancelled(state)
    try:
        await manager.dispatcher.bulk(
            run, queue=options.get("queue"), connection=options.get("connection"), batch_id=batch_id
        )
        state.sent += n
    except DispatchIncompleteError as e:
        # The jobs not queued never run: counted as failed now, so the batch still
        # ends (and its catch/finally run) when the queued ones do. Those that may be
        # queued stay pending (batch_unknown).
        state.sent += n - e.unsent - len(e.unknown)
        state.error = state.error or e
        await _maybe_queued(
            manager, batch_id, state, e.unknown, _connections(manager, run, options)
        )
        await _count(calls, manager, batch_id, state, e.unsent, e)
    except DispatchOutcomeUnknownError as e:
        # the first send of this run lost its reply: its jobs may be queued, the run's
        # others were not sent (they have no id here)
        state.error = state.error or e
        conns = _connections(manager, run, options)
        await _maybe_queued(manager, batch_id, state, list(e.job_ids), conns)
        await _count(calls, manager, batch_id, state, n - len(e.job_ids), None)
    except Exception as e:
        if not state.touched:
            raise  # nothing of the batch went out: the caller sees the send's own error
        state.error = state.error or e
        raise _Stop from e
    finally:
        run.clear()
    return n


async def _one(
    calls: batch_settle.BatchCalls,
    manager: QueueManager,
    batch_id: str,
    item: Item,
    options: dict[str, Any],
    state: Sending,
) -> None:
    """A chain, or a job of an inline (``sync``) connection: one dispatch with its id
    chosen here, so a failure can tell a job that ran and failed (counted by its run)
    from one that never ran."""
    queue, conn = options.get("queue"), options.get("connection")
    mid = new_id()
    _stop_if_cancelled(state)
    try:
        if isinstance(item, list):
            links = _chain_links(manager, item, queue, conn)
            await calls.start_links(manager, links, new_id(), None, batch_id=batch_id, id=mid)
        else:
            await manager.dispatcher.dispatch(
                item, queue=queue, connection=conn, batch_id=batch_id, id=mid
            )
    except Exception as e:
        if await _ran(manager, batch_id, mid, state):
            # sync runs the job inside dispatch(): it ran, failed and was counted. The
            # rest are dispatched so the batch reaches its end (they are skipped once
            # it is cancelled); the first failure is raised to the caller at the end.
            state.sent += size(item)
            state.job_error = state.job_error or e
            return
        if not state.touched:
            raise
        state.error = state.error or e
        raise _Stop from e
    state.sent += size(item)


def _stop_if_cancelled(state: Sending) -> None:
    """Before a send: stop when the caller was cancelled meanwhile."""
    if not state.cancelled:
        return
    if not state.touched:
        raise asyncio.CancelledError
    state.error = state.error or asyncio.CancelledError(
        "the batch's dispatch was cancelled before these jobs were sent"
    )
    raise _Stop


async def _ran(manager: QueueManager, batch_id: str, mid: str, state: Sending) -> bool:
    """Whether job ``mid`` of the batch ran and was counted (only an inline run can have)."""
    try:
        return await _store(manager).get(_key(batch_id, f"done:{mid}")) is not None
    except Exception as e:
        state.lost = state.lost or e  # unknown: not counted again, the batch may not end
        return True


def _connections(
    manager: QueueManager, run: list[PendingDispatch[Any]], options: dict[str, Any]
) -> list[str]:
    """The connections a bulk of ``run`` went out on (the batch looks its jobs whose
    send lost its reply up on them)."""
    queue, conn = options.get("queue"), options.get("connection")
    targets = (manager.dispatcher.resolve(p, queue=queue, connection=conn) for p in run)
    return list(dict.fromkeys(t[0] for t in targets))


async def _maybe_queued(
    manager: QueueManager,
    batch_id: str,
    state: Sending,
    job_ids: list[str],
    connections: list[str],
) -> None:
    """Note jobs whose send lost its reply: pending, neither queued nor failed."""
    if not job_ids:
        return
    state.unknown += job_ids
    store = _store(manager)
    try:
        record = await store.get(_key(batch_id))
        ttl = record["options"].get("ttl") if record is not None else None
        await batch_unknown.record(store, batch_id, job_ids, connections, ttl)
    except Exception as e:
        state.lost = state.lost or e


async def _count(
    calls: batch_settle.BatchCalls,
    manager: QueueManager,
    batch_id: str,
    state: Sending,
    n: int,
    error: DispatchIncompleteError | None,
) -> None:
    """Count ``n`` jobs that were not queued as failed: those ``error`` names one by one
    (their ids are listed with the batch's failed jobs), the others, which never had an
    id, in one step (``settle_unsent``)."""
    named = error.failed if error is not None else {}
    cause = state.error if error is None else error
    state.unsent += n
    state.failed |= named
    try:
        for job_id in named:
            unsent = Message(id=job_id, job="", payload=None, batch_id=batch_id)
            await batch_settle.settle(calls, manager, unsent, "failed", cause)
        if n > len(named):
            assert cause is not None
            await batch_settle.settle_unsent(calls, manager, batch_id, n - len(named), cause)
    except Exception as e:
        state.lost = state.lost or e
