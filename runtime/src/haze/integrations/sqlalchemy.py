"""After-commit dispatch for SQLAlchemy ``Session``, ``AsyncSession`` and ``Connection``.

``transaction_scope(target)`` makes a session or connection the current haze
transaction scope in this context (a ``contextvars`` scope, so it follows the task or
thread). Inside it, ``after_commit`` jobs and ``haze.after_commit(fn)`` callbacks wait
for the *outermost* commit of that target's transaction and are dropped on rollback.
The scope does not begin a transaction itself; when the target is not in a transaction
(an autobegin session that has not run anything yet, say) they happen at once::

    from sqlalchemy.orm import Session
    from haze.integrations.sqlalchemy import transaction_scope

    with Session(engine) as session, transaction_scope(session):
        with session.begin():
            session.add(order)
            await send_receipt.dispatch({"order_id": 42})    # after_commit=True job
            with session.begin_nested():                     # a savepoint
                await notify.with_({"id": 42}).after_commit().dispatch()
        # COMMIT happened: both jobs are queued now (notify too: its savepoint was
        # released; had it been rolled back, notify would have been dropped)

    async with AsyncSession(async_engine) as session, transaction_scope(session):
        async with session.begin():
            await audit.dispatch({"id": 42}, after_commit=True)

    with engine.begin() as conn, transaction_scope(conn):    # Core Connection
        conn.execute(orders.insert(), {...})
        after_commit(lambda: print("committed"))

The scope is both a ``with`` and an ``async with`` context manager; the async form
also starts an ``AsyncConnection`` that was not started yet. It accepts a ``Session``,
``AsyncSession``, ``Connection``, ``AsyncConnection`` or a ``scoped_session`` /
``async_scoped_session`` (resolved to its current session). Scopes nest: the innermost
one whose target is in a transaction wins.

Semantics (Laravel's ``afterCommit``): a callback registered inside a savepoint that
is rolled back is dropped; one inside a released savepoint moves to the enclosing level
and waits for the outermost commit; the outermost commit runs every remaining callback
in registration order; the outermost rollback (or closing the session/connection with
the transaction open) drops them all. Callback errors are logged, never raised: the
commit has already happened. Callbacks run *after* the database ``COMMIT`` succeeded:

- ``Session``/``AsyncSession``: on ``SessionEvents.after_transaction_end`` of the root
  transaction, right after ``after_commit``; ``after_commit`` also fires for a released
  savepoint, so haze notes which transaction committed and, at its end, moves (released
  savepoint), fires (root) or drops (anything that ended without committing).
- ``Connection``: Core has no after-commit event (``ConnectionEvents.commit`` runs
  *before* the ``COMMIT``, see sqlalchemy/sqlalchemy#4943), so haze mirrors the
  savepoint stack with ``ConnectionEvents`` (``begin``, ``savepoint``,
  ``release_savepoint``, ``rollback_savepoint``, ``rollback``, ``commit``) and wraps
  the engine dialect's public ``Dialect.do_commit(dbapi_connection)`` to run the
  callbacks collected at ``commit`` once the DBAPI ``commit()`` has returned. A failed
  ``COMMIT`` drops them. Two-phase transactions are not supported. Do not run SQL on the
  same connection inside a callback: for a Core connection it runs while SQLAlchemy is
  still finishing the commit.

Timing: under ``AsyncSession``/``AsyncConnection`` (SQLAlchemy's greenlet), async
callbacks such as the deferred enqueue are awaited inline, so ``await
session.commit()`` returns after the jobs are queued. With a sync session inside a
running event loop they are scheduled on the loop (``await Queue.idle()`` waits for
them); with no loop they run to completion before ``commit()`` returns.

Why no global ``install(sessionmaker)``: haze's dispatch has no handle on the session
it is called "inside", so a global hook would have to guess the current session from
where its transaction began (a context variable set from a session event). That guess
goes wrong for autobegin sessions that outlive a request, for a transaction begun in a
child task (``gather``/``TaskGroup`` copy the context), and with two sessions open at
once, which would silently turn after-commit dispatch into immediate dispatch. An
explicit scope is one line in the place that owns the session (a FastAPI dependency, a
Flask ``before_request``, a unit of work), so that is the only API.
"""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from collections.abc import Callable
from contextvars import ContextVar, Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from haze._base.errors import MissingDependencyError
from haze.transactions import fire, register_provider

try:
    from sqlalchemy import event
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session, SessionTransaction, scoped_session
except ImportError as exc:  # pragma: no cover - exercised only without sqlalchemy
    raise MissingDependencyError("the SQLAlchemy integration", "sqlalchemy", "sqlalchemy") from exc

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

__all__ = ["TransactionScope", "transaction_scope"]

log = logging.getLogger("haze")

Callback = Callable[[], Any]
T = TypeVar("T")


# ==================================================================== firing


def _greenlet_await() -> Callable[[Any], Any] | None:
    """SQLAlchemy's ``await_`` when running inside its greenlet (async engines), else None."""
    try:
        from sqlalchemy.util import concurrency
    except ImportError:  # pragma: no cover
        return None
    in_greenlet = getattr(concurrency, "in_greenlet", None)
    await_ = getattr(concurrency, "await_", None) or getattr(concurrency, "await_only", None)
    if in_greenlet is None or await_ is None:
        return None
    try:
        inside = bool(in_greenlet())
    except ImportError:  # greenlet is not installed: no async engine can be running
        return None
    return await_ if inside else None


def _fire(callbacks: list[Callback]) -> None:
    """Run after-commit callbacks; inside SQLAlchemy's greenlet, await async ones inline."""
    await_ = _greenlet_await()
    if await_ is None:
        fire(callbacks)
        return
    for cb in callbacks:
        try:
            result = cb()
            if inspect.isawaitable(result):
                await_(result)
        except Exception:
            log.exception("after-commit callback %r failed", cb)


class _Level:
    """What the provider returns: one transaction level of a tracked target."""

    __slots__ = ("_add",)

    def __init__(self, add: Callable[[Callback], None]) -> None:
        self._add = add

    def on_commit(self, callback: Callback) -> None:
        self._add(callback)


# ==================================================================== sessions


class _SessionTracker:
    """Callbacks per ``SessionTransaction`` (the root and each savepoint) of one session."""

    def __init__(self, session: Session) -> None:
        self._session = weakref.ref(session)
        self._pending: dict[SessionTransaction, list[Callback]] = {}
        self._committed: SessionTransaction | None = None
        event.listen(session, "after_commit", self._after_commit)
        event.listen(session, "after_transaction_end", self._after_transaction_end)

    def current(self) -> _Level | None:
        session = self._session()
        if session is None:
            return None
        tx = session.get_nested_transaction() or session.get_transaction()
        if tx is None:
            return None
        return _Level(lambda cb: self._pending.setdefault(tx, []).append(cb))

    def _after_commit(self, session: Session) -> None:
        # Fires for the root commit and for each released savepoint, just before that
        # transaction's after_transaction_end; the committing one is the innermost.
        self._committed = session.get_nested_transaction() or session.get_transaction()

    def _after_transaction_end(self, session: Session, tx: SessionTransaction) -> None:
        committed = tx is self._committed
        if committed:
            self._committed = None
        callbacks = self._pending.pop(tx, None)
        if not callbacks:
            return
        if not committed:
            log.debug("rolled back: dropped %d after-commit callback(s)", len(callbacks))
            return
        parent = tx.parent
        while parent is not None and not (parent.nested or parent.parent is None):
            parent = parent.parent
        if parent is not None:  # a released savepoint: wait for the enclosing level
            self._pending.setdefault(parent, []).extend(callbacks)
        else:
            _fire(callbacks)


# ==================================================================== connections

_committing: dict[int, tuple[Any, list[Callback]]] = {}
_lock = threading.RLock()
_HOOKED = "_haze_after_commit_hooked"


def _hook_dialect(dialect: Dialect) -> None:
    """Wrap ``dialect.do_commit`` so callbacks collected at ``commit`` run after COMMIT."""
    with _lock:
        if getattr(dialect, _HOOKED, False):
            return
        original = dialect.do_commit

        def do_commit(dbapi_connection: Any) -> None:
            entry = _committing.pop(id(dbapi_connection), None)
            original(dbapi_connection)  # raises on a failed COMMIT: the callbacks are dropped
            if entry is not None and entry[0] is dbapi_connection:
                _fire(entry[1])

        dialect.do_commit = do_commit  # type: ignore[method-assign]
        setattr(dialect, _HOOKED, True)


def _nested_depth(connection: Connection) -> int:
    depth = 0
    tx: Any = connection.get_nested_transaction()
    while tx is not None and depth < 10_000:
        depth += 1
        if not hasattr(tx, "_previous_nested"):  # unknown layout: count the innermost only
            break
        tx = tx._previous_nested
    return depth


class _ConnectionTracker:
    """A mirror of one Core connection's savepoint stack: a callback list per level."""

    def __init__(self, connection: Connection) -> None:
        self._connection = weakref.ref(connection)
        self._levels: list[list[Callback]] = []
        if connection.in_transaction():
            self._levels = [[] for _ in range(1 + _nested_depth(connection))]
        _hook_dialect(connection.engine.dialect)
        event.listen(connection, "begin", self._begin)
        event.listen(connection, "savepoint", self._savepoint)
        event.listen(connection, "release_savepoint", self._release_savepoint)
        event.listen(connection, "rollback_savepoint", self._rollback_savepoint)
        event.listen(connection, "rollback", self._rollback)
        event.listen(connection, "commit", self._commit)

    def current(self) -> _Level | None:
        connection = self._connection()
        if connection is None or not self._levels or not connection.in_transaction():
            return None
        return _Level(self._levels[-1].append)

    def _begin(self, connection: Connection) -> None:
        self._levels = [[]]

    def _savepoint(self, connection: Connection, name: str | None) -> None:
        if self._levels:
            self._levels.append([])

    def _release_savepoint(self, connection: Connection, name: str, context: Any) -> None:
        if len(self._levels) > 1:
            released = self._levels.pop()
            self._levels[-1].extend(released)

    def _rollback_savepoint(self, connection: Connection, name: str, context: Any) -> None:
        if len(self._levels) > 1:
            dropped = self._levels.pop()
            if dropped:
                log.debug("savepoint rolled back: dropped %d callback(s)", len(dropped))

    def _rollback(self, connection: Connection) -> None:
        self._levels = []

    def _commit(self, connection: Connection) -> None:
        # Runs *before* the DBAPI COMMIT; the wrapped do_commit fires them once it succeeds.
        callbacks = [cb for level in self._levels for cb in level]
        self._levels = []
        if callbacks:
            dbapi_connection = connection.connection
            _committing[id(dbapi_connection)] = (dbapi_connection, callbacks)


# ==================================================================== the scope

_Tracker = _SessionTracker | _ConnectionTracker
_trackers: weakref.WeakKeyDictionary[Any, _Tracker] = weakref.WeakKeyDictionary()
_scopes: ContextVar[tuple[_Tracker, ...]] = ContextVar("haze_sqlalchemy_scopes", default=())


def _provider() -> _Level | None:
    for tracker in reversed(_scopes.get()):
        level = tracker.current()
        if level is not None:
            return level
    return None


register_provider(_provider)


def _tracker_for(target: Session | Connection) -> _Tracker:
    with _lock:
        tracker = _trackers.get(target)
        if tracker is None:
            tracker = _trackers[target] = (
                _SessionTracker(target)
                if isinstance(target, Session)
                else _ConnectionTracker(target)
            )
        return tracker


def _resolve(target: Any) -> Session | Connection | None:
    """The sync Session/Connection behind ``target``; None for a not-started AsyncConnection."""
    if isinstance(target, scoped_session):
        target = target()
    if isinstance(target, (Session, Connection)):
        return target
    try:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
    except ImportError:  # greenlet missing: no async objects can exist
        pass
    else:
        if isinstance(target, async_scoped_session):
            target = target()
        if isinstance(target, AsyncSession):
            return target.sync_session
        if isinstance(target, AsyncConnection):
            return target.sync_connection
    raise TypeError(
        "transaction_scope: expected a Session, AsyncSession, Connection, AsyncConnection "
        f"or scoped_session, got {target!r}"
    )


class TransactionScope(Generic[T]):
    """Makes a session or connection the current haze transaction scope (see module doc).

    ``with`` / ``async with`` return the target itself. Reusable and re-entrant.
    """

    __slots__ = ("_target", "_tokens")

    def __init__(self, target: T) -> None:
        self._target = target
        self._tokens: list[tuple[Token[tuple[_Tracker, ...]], _Tracker]] = []
        if not isinstance(target, (Session, Connection, scoped_session)):
            _resolve(target)  # fail early on a wrong type (an unstarted connection is fine)

    def _push(self) -> T:
        resolved = _resolve(self._target)
        if resolved is None:
            raise RuntimeError(
                "transaction_scope: this AsyncConnection is not started; use "
                "'async with transaction_scope(conn)' or 'async with engine.connect() as conn'"
            )
        tracker = _tracker_for(resolved)
        self._tokens.append((_scopes.set((*_scopes.get(), tracker)), tracker))
        return self._target

    def _pop(self) -> None:
        token, tracker = self._tokens.pop()
        try:
            _scopes.reset(token)
        except ValueError:  # left in another context (an async generator fixture, say)
            stack = list(_scopes.get())
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] is tracker:
                    del stack[i]
                    break
            _scopes.set(tuple(stack))

    def __enter__(self) -> T:
        return self._push()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._pop()

    async def __aenter__(self) -> T:
        start = getattr(self._target, "start", None)
        if getattr(self._target, "sync_connection", True) is None and start is not None:
            await start()  # an AsyncConnection from engine.connect() not entered yet
        return self._push()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._pop()

    def __repr__(self) -> str:
        return f"<TransactionScope {self._target!r}>"


def transaction_scope(target: T) -> TransactionScope[T]:
    """Make ``target`` (Session, AsyncSession, Connection, AsyncConnection or a scoped
    session) the transaction scope for after-commit dispatch in this context.

    >>> # with Session(engine) as s, transaction_scope(s), s.begin():
    >>> #     await send_receipt.dispatch({"order_id": 1})   # queued after COMMIT
    """
    return TransactionScope(target)
