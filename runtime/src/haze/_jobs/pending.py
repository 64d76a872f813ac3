"""A dispatch being prepared and its result: ``PendingDispatch``, ``DispatchResult``.

``job.with_(payload)`` is a pending dispatch: per-dispatch options (queue, connection,
delay, after-commit, group), a link for chains and callbacks, and ``dispatch()``, which
hands it to the current app's dispatcher.

>>> # result = await send_invoice.with_({"id": 1}).on_queue("emails").delay("5m").dispatch()
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from haze._base.blocking import blocking_method
from haze._base.crypto import seal_link, unseal_link
from haze._base.current import app_var
from haze._base.current import use_app as current_app
from haze._base.durations import Duration, parse_delay, parse_duration
from haze._base.message import check_group, check_queue_name
from haze._jobs import status
from haze._jobs.options import group_of
from haze._jobs.registry import get_job
from haze.contracts.app import use_app

if TYPE_CHECKING:
    from haze._jobs.definition import JobDefinition
    from haze._jobs.views import JobsApp

__all__ = ["DispatchResult", "PendingDispatch", "link_to_pending"]

P = TypeVar("P")
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """What a pending dispatch, chain or deferred dispatch returns.

    ``skipped``: a unique job already held the lock (``id`` is then the holder's id).
    ``deferred``: the enqueue waits for the outermost transaction commit.
    """

    id: str
    skipped: bool = False
    deferred: bool = False
    chain_id: str | None = None

    def __init__(
        self, id: str, skipped: bool = False, deferred: bool = False, chain_id: str | None = None
    ) -> None:
        # The generated frozen __init__ looks up object.__setattr__ once per field; one is
        # made per dispatch, and this halves its cost. Still frozen: __setattr__ raises.
        _set(self, "id", id)
        _set(self, "skipped", skipped)
        _set(self, "deferred", deferred)
        _set(self, "chain_id", chain_id)

    async def wait(self, timeout: Duration | None = None) -> status.JobStatus:
        """Wait until the job (tracked: ``track=True`` or ``keep_result``) is final and
        return its ``JobStatus``; ``TimeoutError`` after ``timeout``. A deferred dispatch
        waits for its commit too.

        >>> # status = await report.with_({"month": 11}).dispatch(); (await status.wait(60)).result
        """
        limit = None if timeout is None else parse_duration(timeout, "DispatchResult.wait(timeout)")
        app: JobsApp = use_app()
        return await status.wait_final(app.manager, self.id, limit, pending_ok=self.deferred)

    wait_blocking = blocking_method(wait)


_set = object.__setattr__


class _Dispatching(Coroutine[Any, Any, _R]):
    """A dispatch's coroutine that, dropped without being awaited, warns naming the job
    and the line that dispatched (Python's own warning names only ``dispatch``)."""

    __slots__ = ("_coro", "_job", "_line", "_used")

    def __init__(self, coro: Coroutine[Any, Any, _R], job: str, caller: FrameType) -> None:
        self._coro = coro
        self._job = job
        self._line = (caller.f_code.co_filename, caller.f_lineno)
        self._used = False

    def __await__(self) -> Generator[Any, None, _R]:
        self._used = True
        return self._coro.__await__()

    def send(self, value: Any) -> Any:
        self._used = True
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._used = True
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._used = True
        self._coro.close()

    def __del__(self) -> None:
        if self._used:
            return
        self._coro.close()  # not started: closing it silences Python's own warning
        warnings.warn_explicit(
            f"job {self._job!r}: dispatch() was never awaited, so nothing was queued; "
            "did you forget `await`?",
            RuntimeWarning,
            *self._line,
        )


class _Quick(_Dispatching[str]):
    """``job.dispatch(payload)`` with no option: awaited, a plain job on an in-process
    queue is queued in this one step (``JobDispatcher.quick``); anything else, and a
    coroutine driven by hand (``send``), takes the job's full dispatch. Made in
    ``JobDefinition.dispatch`` without an ``__init__`` frame; the caller's line is
    looked up only for the warning."""

    __slots__ = ("_code", "_definition", "_lasti", "_payload")

    _definition: JobDefinition[Any]
    _payload: Any
    _code: CodeType
    _lasti: int

    def __del__(self) -> None:
        if self._used:
            return
        code, lasti = self._code, self._lasti
        line = next((n for a, b, n in code.co_lines() if a <= lasti < b and n), None)
        warnings.warn_explicit(
            f"job {self._definition.name!r}: dispatch() was never awaited, so nothing was "
            "queued; did you forget `await`?",
            RuntimeWarning,
            code.co_filename,
            line or code.co_firstlineno,
        )

    # No __getattr__ making _coro on first read: a class with one has every attribute
    # read go through it (unspecialised), four per dispatch. send/throw/close make it.

    def _full(self) -> Coroutine[Any, Any, str]:
        """The full path's coroutine (a coroutine driven by hand), made on first use."""
        try:
            return self._coro
        except AttributeError:
            coro = self._coro = self._definition._dispatch(
                self._payload, None, None, None, None, None
            )
            return coro

    def send(self, value: Any) -> Any:
        self._used = True
        return self._full().send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._used = True
        return self._full().throw(typ, val, tb)

    def close(self) -> None:
        self._used = True
        try:
            coro = self._coro
        except AttributeError:
            return  # never started: nothing to close, nothing queued
        coro.close()

    def __await__(self) -> Generator[Any, None, str]:
        self._used = True
        # use_app() without its frame when an app is current (inside a job, a slot, or
        # ``async with app``)
        app: JobsApp = app_var.get()
        if app is None:
            app = current_app()
        job_id = app.manager.dispatcher.quick(self._definition, self._payload)
        if job_id is not None:
            return job_id
        coro = self._definition._dispatch(self._payload, None, None, None, None, None)
        return (yield from coro.__await__())


class PendingDispatch(Generic[P]):
    """A job with a payload and per-dispatch options, not yet queued.

    >>> # await send_invoice.with_({"invoice_id": 42}).on_queue("high").delay("1m").dispatch()
    """

    __slots__ = ("_after_commit", "_connection", "_delay", "_group", "_queue", "job", "payload")

    def __init__(self, job: JobDefinition[P], payload: P | None) -> None:
        self.job = job
        self.payload = payload
        self._queue: str | None = None
        self._connection: str | None = None
        self._delay: float | None = None
        self._after_commit: bool | None = None
        self._group: str | None = None

    def _set(
        self,
        *,
        delay: Duration | None = None,
        queue: str | None = None,
        connection: str | None = None,
        after_commit: bool | None = None,
        group: str | None = None,
    ) -> None:
        if delay is not None:
            self.delay(delay)
        if queue is not None:
            self.on_queue(queue)
        if connection is not None:
            self.on_connection(connection)
        if after_commit is not None:
            self.after_commit(after_commit)
        if group is not None:
            self.on_group(group)

    def on_queue(self, queue: str) -> PendingDispatch[P]:
        self._queue = check_queue_name(queue, "on_queue")
        return self

    def on_connection(self, connection: str) -> PendingDispatch[P]:
        if not isinstance(connection, str) or not connection:
            raise ValueError(f"on_connection: expected a connection name, got {connection!r}")
        self._connection = connection
        return self

    def delay(self, delay: Duration) -> PendingDispatch[P]:
        self._delay = parse_delay(delay, "delay")
        return self

    def after_commit(self, flag: bool = True) -> PendingDispatch[P]:
        if not isinstance(flag, bool):
            raise ValueError(f"after_commit: expected True or False, got {flag!r}")
        self._after_commit = flag
        return self

    def in_group(self, group: str) -> PendingDispatch[P]:
        """Put this dispatch in a tenant group (wins over ``define_job(group=...)``).

        Workers of the database and redis drivers take a queue's groups round-robin, so
        one tenant's backlog cannot starve the others; on SQS FIFO the group is the
        ``MessageGroupId``; elsewhere it keeps order only::

            await send_report.with_({"tenant": "t-42"}).in_group("t-42").dispatch()
        """
        self._group = check_group(group, "in_group")
        return self

    def on_group(self, group: str) -> PendingDispatch[P]:
        """The same as ``in_group`` (the name SQS FIFO users know)."""
        self._group = check_group(group, "on_group")
        return self

    def _resolved_group(self) -> str | None:
        """The tenant group this dispatch goes in: ``in_group``'s, else the job's."""
        if self._group is not None:
            return self._group
        group = self.job.group
        if group is None or isinstance(group, str):
            return group
        return group_of(self.job.name, group, self.payload)

    def to_link(self, app: JobsApp | None = None) -> dict[str, Any]:
        """The JSON form used in chains and callbacks (name, payload, explicit options).

        An ``encrypted`` job's link carries ``enc`` (encrypted with the key of ``app``,
        default: the current app) in place of ``payload``: links are stored with the
        chain, the batch or the failed job.
        """
        # A bad group fails the dispatch of the chain or batch holding this link, before
        # anything is queued, not the worker queueing it later (the rest would be lost).
        self._resolved_group()
        link: dict[str, Any] = {"job": self.job.name, "payload": self.job.to_wire(self.payload)}
        if self._queue is not None:
            link["queue"] = self._queue
        if self._connection is not None:
            link["connection"] = self._connection
        if self._delay:
            link["delay"] = self._delay
        if self._group is not None:
            link["group"] = self._group
        if self.job.encrypted:
            link = seal_link(app if app is not None else use_app(), link)
        return link

    def dispatch(self) -> Coroutine[Any, Any, DispatchResult]:
        """Queue it. Nothing is queued until it is awaited; one never awaited warns."""
        return _Dispatching(self._dispatch(), self.job.name, sys._getframe(1))

    async def _dispatch(self) -> DispatchResult:
        app: JobsApp = use_app()
        return await app.manager.dispatcher.dispatch(self)

    dispatch_blocking = blocking_method(dispatch)

    def __repr__(self) -> str:
        return f"<PendingDispatch {self.job.name} payload={self.payload!r}>"


def link_to_pending(link: dict[str, Any], app: JobsApp) -> PendingDispatch[Any]:
    """Rebuild a pending dispatch from its JSON link (chains, callbacks; the inverse of
    ``PendingDispatch.to_link``); an encrypted link is decrypted with ``app``'s key."""
    job = get_job(link["job"])
    payload = unseal_link(app, link) if "enc" in link else link.get("payload")
    p: PendingDispatch[Any] = PendingDispatch(job, job.from_wire(payload))
    if link.get("queue"):
        p._queue = link["queue"]
    if link.get("connection"):
        p._connection = link["connection"]
    if link.get("delay"):
        p._delay = float(link["delay"])
    if link.get("group"):
        p._group = link["group"]
    return p
