"""Cloudflare D1: the REST API with httpx, or the Worker's D1 binding (the Cloudflare adapter).

``config/database.py``::

    "main": {"url": "d1://ACCOUNT_ID/DATABASE_ID", "api_token": env("CF_API_TOKEN"),
             "options": {"binding": "DB"}}

Outside a Worker every statement is one ``POST /accounts/{a}/d1/database/{id}/query``
with ``{"sql", "params"}`` (``Authorization: Bearer api_token``). The ``query`` endpoint is
used, not ``raw``: ``raw`` returns every number as a float. Rows come back as JSON
objects, in column order, and are turned into tuples. ``options.api_url`` points the
client at another base URL (a local stand-in in tests); ``options.timeout`` (default 30s).

Inside a Python Worker whose ``env`` is bound (``haze_cloudflare.bind_env``, done by
``QueueWorker``), the connector uses the binding named ``options.binding`` (default
``DB``) through the ``haze.bindings`` plugin ``d1`` (``haze._base.plugins``):
``prepare(sql).bind(...).all()/run()``, ``batch()`` for ``executemany``. So the
``database`` driver can dispatch from a Worker; consuming it needs a long-running worker
elsewhere (the seed's Edge rule).

D1 has no interactive transactions: ``transaction()`` runs its statements one by one,
each atomic on its own, and cannot roll back the earlier ones if a later one fails. The
queue driver's claim is a single ``UPDATE … RETURNING`` statement, so claiming stays
atomic.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from haze._base import plugins
from haze._base.durations import parse_duration
from haze._base.errors import ConfigError, DatabaseConnectionError, HazeError
from haze._base.http import LoopClient
from haze._base.urls import redact_url

__all__ = [
    "API_URL",
    "D1Connector",
    "D1Error",
    "D1Executor",
    "D1UnavailableError",
    "register_binding_executor",
]

API_URL = "https://api.cloudflare.com/client/v4"
Row = tuple[Any, ...]
Json = dict[str, Any]
_MAX_SAFE = 2**53


class D1Error(HazeError):
    """D1 refused a statement or could not be reached (the token is never shown)."""

    def __init__(
        self, connection: str, message: str, *, status: int | None = None, code: Any = None
    ):
        self.connection = connection
        self.status = status
        self.code = code
        detail = message if status is None else f"HTTP {status}: {message}"
        super().__init__(f"D1 connection {connection!r}: {detail}")


class D1AuthError(D1Error, ConfigError):
    """The REST API refused the token (HTTP 401 or 403): a configuration error, not an
    outage. Waiting does not fix a wrong or expired token, so a worker stops on it."""


class D1UnavailableError(D1Error, DatabaseConnectionError):
    """The D1 REST API could not be reached, or answered 502/503/504: an outage (a worker
    waits for it), not a refused statement."""


class D1Executor(Protocol):
    """Runs statements on one D1 database (the REST API or a Worker binding)."""

    async def query(self, sql: str, params: Sequence[Any]) -> tuple[list[Row], int]:
        """(rows, rows changed) of one statement."""

    async def batch(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run ``sql`` once per parameter row; the total of rows changed."""


#: The plugin (group ``haze.bindings``, name ``d1``) that reaches a Worker's D1 bindings:
#: (connection name, binding name) -> an executor, or None when no Worker env with that
#: binding is bound (then the REST API is used). The Cloudflare adapter provides it.
BINDINGS_GROUP = plugins.BINDINGS


def register_binding_executor(fn: Callable[[str, str], D1Executor | None]) -> None:
    """Install the Worker-binding lookup in this process (before the plugin's entry point)."""
    plugins.register(BINDINGS_GROUP, "d1", fn)


def _binding_lookup() -> Callable[[str, str], D1Executor | None] | None:
    lookup: Callable[[str, str], D1Executor | None] | None = plugins.find(BINDINGS_GROUP, "d1")
    return lookup


def encode_param(value: Any) -> Any:
    """A Python value as a D1 REST parameter (JSON)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return 1 if value else 0
    if isinstance(value, int):
        if not -_MAX_SAFE <= value <= _MAX_SAFE:
            raise OverflowError(f"{value} is too large for D1 (JavaScript numbers)")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"D1 cannot carry the float {value!r}")
        return value
    raise TypeError(
        f"cannot bind a {type(value).__name__} to a D1 statement over REST; use None, int, "
        "float or str"
    )


def _first_error(data: Any) -> str | None:
    errors = data.get("errors") if isinstance(data, dict) else None
    first = errors[0] if isinstance(errors, list) and errors else None
    return str(first.get("message")) if isinstance(first, dict) and first.get("message") else None


class _RestExecutor:
    """``POST /accounts/{account}/d1/database/{database}/query`` per statement."""

    def __init__(self, connector: D1Connector, token: str):
        self._c = connector
        self._http = LoopClient(
            what="the D1 backend (REST API)",
            extra="cloudflare",
            timeout=connector.timeout,
            headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
        )

    async def _post(self, payload: Json) -> list[Json]:
        url = self._c.endpoint
        body = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
        try:
            response = await self._http.get().post(url, content=body)
        except self._http.httpx.HTTPError as e:
            down = D1UnavailableError(self._c.name, f"cannot reach {url} ({type(e).__name__}: {e})")
            # No connection: the request never left. Any later failure leaves a request
            # the API may have passed on to D1, which runs it whether or not this client
            # still waits, so an empty lookup is no answer yet.
            connected = not isinstance(e, self._http.httpx.ConnectError)
            down.write = "unsettled" if connected else "unsent"
            raise down from None
        if response.status_code in (502, 503, 504):
            down = D1UnavailableError(
                self._c.name,
                f"{url} answered {response.reason_phrase or 'unavailable'}",
                status=response.status_code,
            )
            if response.status_code != 503:  # a gateway's: D1 may be running it still
                down.write = "unsettled"
            raise down
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code in (401, 403):
            raise D1AuthError(
                self._c.name,
                f"{_first_error(data) or response.reason_phrase}; the API refused the token: "
                f"set a valid connections.{self._c.name}.api_token in config/database.py (a "
                "Cloudflare API token with D1 edit permission on this account)",
                status=response.status_code,
            )
        if response.status_code >= 400 or not isinstance(data, dict) or not data.get("success"):
            errors = data.get("errors") if isinstance(data, dict) else None
            first = errors[0] if isinstance(errors, list) and errors else {}
            message = (
                str(first.get("message"))
                if isinstance(first, dict) and first
                else response.text[:300] or response.reason_phrase
            )
            raise D1Error(
                self._c.name,
                message,
                status=response.status_code,
                code=first.get("code") if isinstance(first, dict) else None,
            )
        results = data.get("result")
        if not isinstance(results, list):
            raise D1Error(self._c.name, f"unexpected response {str(data)[:200]!r}")
        for r in results:
            if isinstance(r, dict) and r.get("success") is False:
                raise D1Error(self._c.name, str(r.get("error") or r))
        return [r for r in results if isinstance(r, dict)]

    @staticmethod
    def _rows(result: Json) -> list[Row]:
        rows = result.get("results") or []
        return [tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in rows]

    @staticmethod
    def _changes(result: Json) -> int:
        meta = result.get("meta") or {}
        return int(meta.get("changes") or 0)

    async def query(self, sql: str, params: Sequence[Any]) -> tuple[list[Row], int]:
        results = await self._post({"sql": sql, "params": [encode_param(p) for p in params]})
        if not results:
            return [], 0
        return self._rows(results[-1]), self._changes(results[-1])

    async def batch(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        total = 0
        for params in rows:
            _, changes = await self.query(sql, params)
            total += changes
        return total

    async def close(self) -> None:
        await self._http.close()


class _Session:
    """Statements inside ``transaction()``: run one by one (D1 has no interactive ones)."""

    def __init__(self, connector: D1Connector):
        self._c = connector

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self._c.execute(sql, params)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        return await self._c.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return await self._c.fetchall(sql, params)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        return await self._c.fetchone(sql, params)


def d1_target(url: str, options: dict[str, Any], key: str) -> tuple[str, str | None, str]:
    """``(account or binding, database, binding)`` of a ``d1://`` URL.

    ``d1://ACCOUNT_ID/DATABASE_ID``: the REST API outside a Worker, the binding
    ``options.binding`` (default ``DB``) inside one. ``d1://BINDING``: the Worker's D1
    binding of that name, only (no REST: there is no database id).

    >>> d1_target("d1://DB", {}, "url")
    ('DB', None, 'DB')
    """
    parts = urlsplit(url)
    host = parts.netloc  # not .hostname: that lower-cases, and binding names are not
    path = parts.path.strip("/")
    if parts.scheme.lower() != "d1" or not host or "/" in path or "@" in host:
        raise ConfigError(
            f"bad D1 URL {redact_url(url, keep_user=False)!r}: use d1://ACCOUNT_ID/DATABASE_ID, "
            "or d1://BINDING inside a Worker",
            key=key,
        )
    if not path:
        return host, None, str(options.get("binding") or host)
    return host.lower(), path, str(options.get("binding") or "DB")


class D1Connector:
    """A D1 database: the Worker binding when one is bound, else the REST API."""

    dialect = "d1"

    def __init__(self, name: str, options: dict[str, Any], *, root: Path | None = None):
        self.name = name
        extra = options.get("options") or {}
        account, database, binding = d1_target(
            str(options["url"]), extra, f"connections.{name}.url"
        )
        self.account_id = account
        self.database_id = database
        self.binding: str = binding
        api_url = str(extra.get("api_url") or API_URL).rstrip("/")
        self.endpoint = f"{api_url}/accounts/{account}/d1/database/{database}/query"
        self.timeout = parse_duration(
            extra.get("timeout", 30), f"connections.{name}.options.timeout", allow_zero=False
        )
        self._token: str | None = options.get("api_token")
        self._rest: _RestExecutor | None = None

    def __repr__(self) -> str:
        return f"<D1Connector {self.name!r} {self.account_id}/{self.database_id}>"

    def executor(self) -> D1Executor:
        """The Worker's binding when bound, else the REST client."""
        lookup = _binding_lookup()
        if lookup is not None:
            ex = lookup(self.name, self.binding)
            if ex is not None:
                return ex
        if self._rest is None:
            if self.database_id is None:
                raise ConfigError(
                    f"d1://{self.binding} names the Worker's D1 binding {self.binding!r}, and "
                    "no Worker env with it is bound here; outside a Worker use "
                    "d1://ACCOUNT_ID/DATABASE_ID with api_token (the REST API)",
                    key=f"connections.{self.name}.url",
                )
            if not self._token:
                raise ConfigError(
                    f"D1 over REST needs api_token (no D1 binding {self.binding!r} is bound "
                    "here; inside a Worker, bind the env with haze_cloudflare.bind_env)",
                    key=f"connections.{self.name}.api_token",
                )
            self._rest = _RestExecutor(self, self._token)
        return self._rest

    # -- Session ----------------------------------------------------------------

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        _, changes = await self.executor().query(sql, params)
        return changes

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        if not rows:
            return 0
        return await self.executor().batch(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        rows, _ = await self.executor().query(sql, params)
        return rows

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    @asynccontextmanager
    async def transaction(self, *, immediate: bool = False) -> AsyncIterator[_Session]:
        """Statements run one by one; see the module docstring (no rollback on D1)."""
        yield _Session(self)

    async def close(self) -> None:
        if self._rest is not None:
            await self._rest.close()
