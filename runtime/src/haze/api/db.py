"""The ``Db`` facade: transactions on ``config/database.py`` connections, with after-commit hooks.

>>> # async with Db.transaction() as tx:            # the default connection
>>> #     await tx.execute("INSERT INTO orders (id) VALUES (?)", (1,))
>>> #     await send_receipt.dispatch({"order_id": 1})   # after_commit job: queued after COMMIT
>>> #     async with Db.transaction():               # nested: a SAVEPOINT
>>> #         ...

Nested blocks are savepoints: hooks registered inside a savepoint that rolls back are
dropped, those inside a released savepoint wait for the outermost commit, which
fires them (after the COMMIT succeeded, before ``Db.transaction()`` returns).
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from haze import transactions
from haze._app.app import use_app
from haze.connectors import Session

__all__ = ["Db"]


class _Level:
    """One transaction level (the outermost one or a savepoint) and its hooks."""

    __slots__ = ("callbacks", "connection", "parent", "session")

    def __init__(self, connection: str, session: Session, parent: _Level | None) -> None:
        self.connection = connection
        self.session = session
        self.parent = parent
        self.callbacks: list[Callable[[], Any]] = []

    def on_commit(self, callback: Callable[[], Any]) -> None:
        self.callbacks.append(callback)


_current: contextvars.ContextVar[_Level | None] = contextvars.ContextVar("haze_db_tx", default=None)


def _provider() -> transactions.Transaction | None:
    return _current.get()


transactions.register_provider(_provider)


class _Savepoint:
    """Statements inside a savepoint run on the outer transaction's session."""

    def __init__(self, session: Session) -> None:
        self._s = session

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self._s.execute(sql, params)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        return await self._s.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await self._s.fetchall(sql, params)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        return await self._s.fetchone(sql, params)


class Db:
    """Database facade over the current app's connections."""

    @staticmethod
    @asynccontextmanager
    async def transaction(connection: str | None = None) -> AsyncIterator[Session]:
        """A transaction (or, nested on the same connection, a savepoint)."""
        app = use_app()
        name = connection or app.database_config.default
        outer = _current.get()
        while outer is not None and outer.connection != name:
            outer = outer.parent
        if outer is None:
            async with _outermost(app, name) as session:
                yield session
            return
        depth = 0
        level: _Level | None = outer
        while level is not None:
            depth += 1
            level = level.parent
        savepoint = f"haze_sp_{depth}"
        await outer.session.execute(f"SAVEPOINT {savepoint}")
        inner = _Level(name, outer.session, _current.get())
        token = _current.set(inner)
        try:
            yield _Savepoint(outer.session)
        except BaseException:
            _current.reset(token)
            await outer.session.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
            raise  # the savepoint's hooks are dropped with it
        _current.reset(token)
        await outer.session.execute(f"RELEASE SAVEPOINT {savepoint}")
        (_current.get() or outer).callbacks.extend(inner.callbacks)

    @staticmethod
    def connection(name: str | None = None) -> Any:
        """The connector of a ``config/database.py`` connection (``execute``/``fetchall``…)."""
        return use_app().database(name)


@asynccontextmanager
async def _outermost(app: Any, name: str) -> AsyncIterator[Session]:
    connector = app.database(name)
    level: _Level | None = None
    token: contextvars.Token[_Level | None] | None = None
    async with connector.transaction() as session:
        level = _Level(name, session, _current.get())
        token = _current.set(level)
        try:
            yield session
        finally:
            _current.reset(token)
    # COMMIT succeeded (the context manager raised otherwise): run the hooks now.
    transactions.fire(level.callbacks)
    await transactions.wait_pending()
