"""D1 through the Worker's binding, so the ``database`` driver can dispatch from a Worker.

``haze.connectors.d1.D1Connector`` (a ``d1://ACCOUNT/DATABASE`` connection) asks
``binding_executor``, the ``haze.bindings`` plugin ``d1`` (see ``haze_cloudflare._plugins``),
for an executor over the binding named by the connection's ``options.binding`` (default
``DB``) whenever a Worker env is bound; otherwise it uses the REST API.

Statements: ``env.DB.prepare(sql).bind(*params).all()`` for rows (and for rows changed,
``meta.changes``), ``.run()`` for writes, ``env.DB.batch([...])`` for ``executemany`` (one
implicit transaction on D1). Parameters cross with ``None`` as JS ``null`` (``undefined``
is not a SQL value); SQL NULL comes back as ``jsnull`` and is read as ``None``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from haze_cloudflare._js import binding, js_null, to_js, to_py

__all__ = ["BindingExecutor", "binding_executor"]

Row = tuple[Any, ...]


async def _settle(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _param(value: Any) -> Any:
    if value is None:
        return js_null()
    if isinstance(value, bool):
        return 1 if value else 0
    if isinstance(value, (bytes, bytearray, memoryview)):
        return to_js(bytes(value))
    return value


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _changes(result: Any) -> int:
    meta = _get(result, "meta")
    if meta is None:
        return 0
    value = to_py(_get(meta, "changes"))
    return int(value or 0)


def _rows(result: Any) -> list[Row]:
    rows = to_py(_get(result, "results")) or []
    return [tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in rows]


class BindingExecutor:
    """Statements on a D1 binding (``prepare``/``bind``/``all``/``run``/``batch``)."""

    def __init__(self, db: Any):
        self.db = db

    def _stmt(self, sql: str, params: Sequence[Any]) -> Any:
        stmt = self.db.prepare(sql)
        if params:
            stmt = stmt.bind(*[_param(p) for p in params])
        return stmt

    async def query(self, sql: str, params: Sequence[Any]) -> tuple[list[Row], int]:
        result = await _settle(self._stmt(sql, params).all())
        return _rows(result), _changes(result)

    async def run(self, sql: str, params: Sequence[Any]) -> int:
        return _changes(await _settle(self._stmt(sql, params).run()))

    async def batch(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        statements = [self._stmt(sql, params) for params in rows]
        results = await _settle(self.db.batch(to_js(statements)))
        return sum(_changes(r) for r in results)


def binding_executor(connection: str, name: str) -> BindingExecutor | None:
    """An executor over the D1 binding ``name`` of the bound env, or None (not bound)."""
    db = binding(name)
    return BindingExecutor(db) if db is not None else None
