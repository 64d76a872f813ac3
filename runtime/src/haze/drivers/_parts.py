"""A bulk send made of several backend calls (chunks, one send per message, one queue
after another): when a call fails after others went through, the caller must learn
which messages were queued, or a batch counts queued jobs as lost (and never ends) or
runs its callbacks before jobs that are still to come. Shared by the drivers whose
``enqueue_many`` takes more than one call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence

from haze._base.describe import error_line, error_text
from haze._base.errors import DispatchIncompleteError, DispatchOutcomeUnknownError
from haze._base.message import Message

__all__ = ["Item", "Stop", "counts", "in_parts", "incomplete", "outcome_unknown", "side_by_side"]

#: (body, message, delay) of one message of an ``enqueue_many``.
Item = tuple[str, Message, float]


async def in_parts(
    parts: Sequence[Sequence[Item]],
    send: Callable[[Sequence[Item]], Awaitable[None]],
    connection: str,
) -> None:
    """``send`` each part, one after the other. A part that fails when an earlier one
    was queued raises ``DispatchIncompleteError`` naming its messages (as ``unknown``
    when its send could not tell whether they were queued) and those of the later parts
    (not sent); a first part that fails raises its own error (nothing was queued, or
    ``DispatchOutcomeUnknownError``: they may be)."""
    queued = 0
    for i, part in enumerate(parts):
        try:
            await send(part)
        except Exception as e:
            after = [m for p in parts[i + 1 :] for m in p]
            if not queued and isinstance(e, DispatchOutcomeUnknownError) and after:
                raise DispatchOutcomeUnknownError(
                    f"{e}; the {len(after)} messages after them were not sent", e.job_ids
                ) from e
            if not queued and not isinstance(e, DispatchIncompleteError):
                raise
            raise incomplete([(e, part, after)], queued, connection) from e
        queued += len(part)


#: a send that failed: its error, the messages it refused (all of them, or those a
#: ``DispatchIncompleteError`` names) and those not sent after it
Stop = tuple[Exception, Sequence[Item], Sequence[Item]]


def incomplete(stops: Sequence[Stop], queued: int, connection: str) -> DispatchIncompleteError:
    """The error for a bulk send that queued ``queued`` messages besides those the
    ``stops`` name as not queued, or as may be queued (a send that lost its reply)."""
    failed: dict[str, str] = {}
    unknown: list[str] = []
    for error, refused, after in stops:
        why = error_line(error)
        if isinstance(error, DispatchIncompleteError):
            failed |= error.failed
            unknown += error.unknown
            queued += len(refused) - len(error.failed) - len(error.unknown)
        elif isinstance(error, DispatchOutcomeUnknownError):
            maybe = set(error.job_ids)
            unknown += [m.id for _, m, _ in refused if m.id in maybe]
            failed |= {m.id: why for _, m, _ in refused if m.id not in maybe}
        else:
            failed |= {m.id: why for _, m, _ in refused}
        failed |= {m.id: f"not sent after: {why}" for _, m, _ in after}
    first = error_line(stops[0][0])
    error = DispatchIncompleteError(
        f'connection "{connection}" {counts(queued, failed, unknown)} ({first})',
        failed=failed,
        unknown=unknown,
    )
    error.__cause__ = stops[0][0]
    return error


def counts(queued: int, failed: Collection[str], unknown: Collection[str]) -> str:
    """How a bulk send ended, in words (the middle of a ``DispatchIncompleteError``)."""
    total = queued + len(failed) + len(unknown)
    said = f"queued {queued} of {total} messages; {len(failed)} were not queued"
    if not unknown:
        return said
    return (
        f"{said} and {len(unknown)} may be queued (their send lost its reply): look those "
        "up by id (Queue.status) before dispatching them again, or they may run twice"
    )


async def side_by_side(
    runs: Sequence[Sequence[Item]],
    send: Callable[[str, Message, float], Awaitable[None]],
    connection: str,
) -> None:
    """``send`` each message, the ``runs`` side by side and each run in order; a send
    that fails stops its run (the later ones would overtake it). When some were sent,
    the others are raised in one ``DispatchIncompleteError``; when none was, the first
    send's own error."""
    sent = [0]

    async def in_order(run: Sequence[Item]) -> None:
        for i, (body, message, delay) in enumerate(run):
            try:
                await send(body, message, delay)
            except Exception as e:
                raise _Stopped(e, run[i:]) from e
            sent[0] += 1

    results = await asyncio.gather(*(in_order(r) for r in runs), return_exceptions=True)
    stops: list[_Stopped] = []
    for result in results:
        if isinstance(result, _Stopped):
            stops.append(result)
        elif isinstance(result, BaseException):
            raise result  # cancelled, or the process is stopping
    maybe = [s for s in stops if isinstance(s.error, DispatchOutcomeUnknownError)]
    if stops and not sent[0] and (not maybe or stops == maybe[:1]):
        raise stops[0].error  # nothing was queued (or one send may have): its own error
    if stops:
        parts = [(s.error, s.unsent[:1], s.unsent[1:]) for s in stops]
        raise incomplete(parts, sent[0], connection)


class _Stopped(Exception):
    """A run's sends stopped at ``unsent[0]``, which ``error`` refused."""

    def __init__(self, error: Exception, unsent: Sequence[Item]) -> None:
        super().__init__(str(error))
        self.error = error
        self.unsent = unsent


def outcome_unknown(
    connection: str, write: str, ids: Sequence[str], seconds: float, error: BaseException
) -> DispatchOutcomeUnknownError:
    """The error of a dispatch whose ``write`` (``"database INSERT"``, ``"Redis add"``)
    of ``ids`` lost its connection before the reply, when the backend could not be asked
    within ``seconds`` whether it was written."""
    what = f"job {ids[0]}" if len(ids) == 1 else f"{len(ids)} jobs ({ids[0]} first)"
    return DispatchOutcomeUnknownError(
        f"queue connection {connection!r} lost its connection during the {write} of "
        f"{what}, and the server could not tell within {seconds:g} s whether it was "
        f"written ({error_text(error)}): it may be queued, so dispatching it again may "
        "run it twice",
        job_ids=ids,
    )
