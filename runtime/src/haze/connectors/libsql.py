"""libSQL / Turso over HTTP: the Hrana pipeline protocol ("Hrana over HTTP" v2) with httpx.

No native client and no threads: every call is one ``POST /v2/pipeline`` on a shared
``httpx.AsyncClient``, so producers work from Lambda, Vercel or any asyncio loop.

URLs: ``libsql://db-org.turso.io`` means HTTPS (add ``?tls=0`` for plain HTTP), and
``http://127.0.0.1:8080`` / ``https://…`` are used as given (a local ``sqld``). The
token comes from ``auth_token`` (or an ``authToken`` query parameter) and is sent as
``Authorization: Bearer …``; it never appears in errors or ``repr``.

- A single statement is one pipeline request, ``[execute, close]``: its own stream.
- ``transaction()`` keeps one stream open by carrying the server's *baton* from request
  to request. ``BEGIN`` (or ``BEGIN IMMEDIATE``) travels with the first statement in a
  Hrana batch whose step runs only if ``BEGIN`` succeeded; ``COMMIT``/``ROLLBACK`` go with
  ``close``. So the queue's claim (``BEGIN IMMEDIATE`` + ``UPDATE … RETURNING``) is
  atomic and costs two round trips.
- Values travel typed: ``{"type": "integer", "value": "42"}`` (integers as strings),
  ``float``, ``text``, ``blob`` (base64) and ``null``; rows come back as Python values.

``sqld`` holds a write transaction for at most about five seconds before another
stream may take the lock over, so keep transactions short (the queue's are).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from haze._base.durations import parse_duration
from haze._base.errors import ConfigError, DatabaseConnectionError, HazeError
from haze._base.http import LoopClient
from haze._base.urls import redact_url

if TYPE_CHECKING:
    import httpx

__all__ = [
    "LibSQLAuthError",
    "LibSQLBusyError",
    "LibSQLConnector",
    "LibSQLError",
    "LibSQLUnavailableError",
    "decode_value",
    "encode_value",
]

log = logging.getLogger("haze.connectors.libsql")

Row = tuple[Any, ...]
Json = dict[str, Any]
_T = TypeVar("_T")

#: Hrana over HTTP version 2: served by sqld and by Turso.
PIPELINE_PATH = "/v2/pipeline"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_CLOSE: Json = {"type": "close"}


class LibSQLError(HazeError):
    """The libSQL server refused a request, or could not be reached.

    ``connection`` and ``url`` (never the token) say which database; ``code`` is the
    server's error code (``"SQLITE_CONSTRAINT"``…) and ``status`` the HTTP status, when
    there is one.
    """

    def __init__(
        self,
        connection: str,
        url: str,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
    ):
        self.connection = connection
        self.url = url
        self.server_message = message
        self.code = code
        self.status = status
        #: the index of the batch step that failed (the steps before it ran)
        self.step = 0
        detail = message
        if code:
            detail = f"{detail} [{code}]"
        if status is not None:
            detail = f"HTTP {status}: {detail}"
        super().__init__(f"libSQL connection {connection!r} ({url}): {detail}")


class LibSQLUnavailableError(LibSQLError, DatabaseConnectionError):
    """The libSQL server could not be reached, or its gateway answered 502/503/504: an
    outage (a worker waits for it), not a refused statement."""


class LibSQLAuthError(LibSQLError, ConfigError):
    """The server refused the token (HTTP 401 or 403): a configuration error, not an
    outage. Waiting does not fix a wrong or expired token, so a worker stops on it."""


class LibSQLBusyError(LibSQLUnavailableError):
    """The database stayed locked (``SQLITE_BUSY``/``SQLITE_LOCKED``) through every retry
    within ``busy_timeout``: unavailable for now, as a locked SQLite file is."""


#: gateway answers that mean "the server behind it is down", not "your request is wrong"
_UNAVAILABLE_STATUS = {502, 503, 504}
#: result codes of a lock held by another stream (SQLITE_BUSY_SNAPSHOT, … included)
_BUSY_CODES = ("SQLITE_BUSY", "SQLITE_LOCKED")
#: the first and the longest pause between two tries of a statement that found the
#: database locked (doubling, with jitter so competing streams do not retry in step)
_BUSY_FIRST, _BUSY_MAX = 0.01, 0.5
#: sqld hands a write lock over after about five seconds: a lock held much longer
#: than that is not a transient one
_DEFAULT_BUSY_TIMEOUT = 10.0


def _busy(e: LibSQLError) -> bool:
    return bool(e.code) and str(e.code).startswith(_BUSY_CODES)


# --------------------------------------------------------------------------- values


def encode_value(value: Any) -> Json:
    """A Python value as a Hrana value."""
    if value is None:
        return {"type": "null"}
    if isinstance(value, bool):
        return {"type": "integer", "value": "1" if value else "0"}
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise OverflowError(f"{value} does not fit in a 64-bit SQLite INTEGER")
        return {"type": "integer", "value": str(value)}
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"libSQL over HTTP cannot carry the float {value!r}")
        return {"type": "float", "value": value}
    if isinstance(value, str):
        return {"type": "text", "value": value}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"type": "blob", "base64": base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(
        f"cannot bind a {type(value).__name__} to a libSQL statement; use None, int, float, "
        "str or bytes"
    )


def decode_value(value: Json) -> Any:
    """A Hrana value as a Python value (``None``, ``int``, ``float``, ``str``, ``bytes``)."""
    kind = value.get("type")
    if kind == "null":
        return None
    if kind == "integer":
        return int(value["value"])
    if kind == "float":
        return float(value["value"])
    if kind == "text":
        return str(value["value"])
    if kind == "blob":
        data = str(value.get("base64") or "")
        data += "=" * (-len(data) % 4)  # sqld omits the padding
        if "-" in data or "_" in data:
            return base64.urlsafe_b64decode(data)
        return base64.b64decode(data)
    raise ValueError(f"unknown libSQL value type {kind!r}")


def _stmt(sql: str, params: Sequence[Any], *, want_rows: bool) -> Json:
    return {"sql": sql, "args": [encode_value(p) for p in params], "want_rows": want_rows}


def _chain(stmts: Sequence[Json]) -> Json:
    """A batch whose steps each run only if the previous one succeeded."""
    steps: list[Json] = []
    for i, stmt in enumerate(stmts):
        step: Json = {"stmt": stmt}
        if i:
            step["condition"] = {"type": "ok", "step": i - 1}
        steps.append(step)
    return {"type": "batch", "batch": {"steps": steps}}


def _affected(results: Sequence[Json | None]) -> int:
    return sum(int((r or {}).get("affected_row_count") or 0) for r in results)


def _rows(result: Json) -> list[Row]:
    return [tuple(decode_value(v) for v in row) for row in result.get("rows") or ()]


# --------------------------------------------------------------------------- URLs


def _parse_url(url: str) -> tuple[str, str | None]:
    """(HTTP base URL without query or credentials, token from ``?authToken=``).

    A ``ValueError`` shows the URL without its credentials (the token may be anywhere)."""
    shown = redact_url(url, keep_user=False)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    query = dict(parse_qsl(parts.query))
    if scheme == "libsql":
        scheme = "http" if query.get("tls") == "0" else "https"
    elif scheme not in ("http", "https"):
        raise ValueError(f"bad libSQL URL {shown!r}: use libsql://, https:// or http://")
    if not parts.hostname:
        raise ValueError(f"bad libSQL URL {shown!r}: no host")
    try:
        port = parts.port
    except ValueError as e:
        raise ValueError(f"bad libSQL URL {shown!r}: {e}") from None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host if port is None else f"{host}:{port}"
    base = urlunsplit((scheme, netloc, parts.path.rstrip("/"), "", ""))
    return base, query.get("authToken") or None


# --------------------------------------------------------------------------- sessions


class _Transaction:
    """Statements on one Hrana stream, tied together by the baton."""

    def __init__(self, connector: LibSQLConnector, begin: str):
        self._c = connector
        self._begin: str | None = begin  # sent with the first statement
        self._baton: str | None = None
        self._base_url: str | None = None
        self._opened = False
        self._finished = False
        self._lock = asyncio.Lock()  # requests on a stream must be serial

    async def _send(self, requests: list[Json], *, close: bool = False) -> list[Json]:
        if self._finished:
            raise LibSQLError(self._c.name, self._c.url, "the transaction is already finished")
        if close:
            requests = [*requests, _CLOSE]
        try:
            baton, base_url, results = await self._c._pipeline(
                requests, baton=self._baton, base_url=self._base_url
            )
        except BaseException:
            self._finished = True  # the stream is gone (HTTP error) or in an unknown state
            raise
        self._opened = True
        self._baton, self._base_url = baton, base_url or self._base_url
        if close or baton is None:
            self._finished = True
        return results

    async def _run(self, stmts: list[Json]) -> list[Json]:
        """Run statements in order (stopping at the first error); their results."""
        async with self._lock:
            begin, self._begin = self._begin, None
            if begin is not None:
                return await self._begin_with(begin, stmts)
            if len(stmts) == 1:
                [result] = await self._send([{"type": "execute", "stmt": stmts[0]}])
                return [self._c._execute_result(result)]
            [result] = await self._send([_chain(stmts)])
            return self._c._batch_results(result, len(stmts))

    async def _begin_with(self, begin: str, stmts: list[Json]) -> list[Json]:
        """The first request: ``BEGIN`` and the first statements. A ``BEGIN`` that found
        the database locked opened nothing, so it is sent again (``_retry_busy``)."""
        steps = [{"sql": begin, "want_rows": False}, *stmts]

        async def send() -> Json:
            [result] = await self._send([_chain(steps)])
            return result

        def read(result: Json) -> list[Json]:
            return self._c._batch_results(result, len(steps))[1:]

        return await self._c._retry_busy(
            send, read, begin, retryable=lambda e: e.step == 0 and not self._finished
        )

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        [result] = await self._run([_stmt(sql, params, want_rows=False)])
        return int(result.get("affected_row_count") or 0)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        if not rows:
            return 0
        results = await self._run([_stmt(sql, p, want_rows=False) for p in rows])
        return sum(int(r.get("affected_row_count") or 0) for r in results)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        [result] = await self._run([_stmt(sql, params, want_rows=True)])
        return _rows(result)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def _commit(self) -> None:
        async with self._lock:
            if not self._opened:
                return  # nothing ran: no stream was opened
            if self._finished:
                raise LibSQLError(
                    self._c.name,
                    self._c.url,
                    "the server closed the transaction's stream before COMMIT",
                )
            [result, _] = await self._send(
                [{"type": "execute", "stmt": {"sql": "COMMIT", "want_rows": False}}], close=True
            )
            self._c._execute_result(result)

    async def _rollback(self) -> None:
        if not self._opened or self._finished:
            return
        try:
            await self._send(
                [{"type": "execute", "stmt": {"sql": "ROLLBACK", "want_rows": False}}], close=True
            )
        except Exception as e:  # the server rolls back a stream that is closed or expires
            log.debug("libSQL %r: rollback failed: %s", self._c.name, e)


# --------------------------------------------------------------------------- connector


class LibSQLConnector:
    """A libSQL / Turso database over Hrana-over-HTTP (``haze-jobs[libsql]``: httpx)."""

    dialect = "libsql"

    def __init__(self, name: str, options: dict[str, Any], *, root: Path | None = None):
        self.name = name
        raw_url = str(options["url"])
        try:
            self.url, url_token = _parse_url(raw_url)
        except ValueError as e:
            raise ConfigError(str(e), key=f"connections.{name}.url") from None
        token = options.get("auth_token") or url_token
        self._headers = {"content-type": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        extra = options.get("options") or {}
        key = f"connections.{name}.options.timeout"
        try:
            self.timeout = parse_duration(extra.get("timeout", 30), key, allow_zero=False)
        except ValueError as e:  # read at first use: one line, not the CLI's traceback
            raise ConfigError(str(e).removeprefix(f"{key}: "), key=key) from None
        busy = options.get("busy_timeout")
        #: seconds a statement is tried again while the database is locked
        self.busy_timeout = _DEFAULT_BUSY_TIMEOUT if busy is None else int(busy) / 1000
        self._http = LoopClient(
            what="the libSQL backend", extra="libsql", timeout=self.timeout, headers=self._headers
        )

    def __repr__(self) -> str:
        return f"<LibSQLConnector {self.name!r} {self.url}>"

    # -- HTTP -------------------------------------------------------------------

    def _error(self, message: str, **kw: Any) -> LibSQLError:
        return LibSQLError(self.name, self.url, message, **kw)

    async def _pipeline(
        self, requests: list[Json], *, baton: str | None = None, base_url: str | None = None
    ) -> tuple[str | None, str | None, list[Json]]:
        """One ``POST /v2/pipeline``: (next baton, base URL, one result per request)."""
        body = json.dumps(
            {"baton": baton, "requests": requests}, separators=(",", ":"), allow_nan=False
        ).encode()
        endpoint = (base_url or self.url).rstrip("/") + PIPELINE_PATH
        try:
            # httpx's timeout bounds each read, not the whole answer: a server that
            # trickles bytes would hold the request (and a stopping worker) for ever
            async with asyncio.timeout(self.timeout):
                response = await self._http.get().post(endpoint, content=body)
        except (TimeoutError, self._http.httpx.TimeoutException) as e:
            down = self._timed_out(requests, e)
            down.write = "unsettled"  # the server may be running it still
            raise down from None
        except self._http.httpx.HTTPError as e:
            down = LibSQLUnavailableError(
                self.name, self.url, f"cannot reach the server ({type(e).__name__}: {e})"
            )
            # No connection: the request never left. Any later failure (a write error
            # too: the bytes may be out) leaves a request sqld may have read, and sqld
            # runs what it read whether or not the client is still there (a write
            # waiting for the lock runs after the cut), so an empty lookup is no answer.
            connected = not isinstance(e, self._http.httpx.ConnectError)
            down.write = "unsettled" if connected else "unsent"
            raise down from None
        if response.status_code in _UNAVAILABLE_STATUS:
            down = LibSQLUnavailableError(
                self.name, self.url, self._http_message(response), status=response.status_code
            )
            if response.status_code != 503:  # a gateway's: sqld may be running it still
                down.write = "unsettled"
            raise down
        if response.status_code in (401, 403):
            raise self._refused(response)
        if response.status_code != 200:
            raise self._error(self._http_message(response), status=response.status_code)
        try:
            data = response.json()
            results = data["results"]
        except (ValueError, KeyError, TypeError):
            raise self._error(
                f"not a Hrana pipeline response: {response.text[:200]!r}",
                status=response.status_code,
            ) from None
        if not isinstance(results, list) or len(results) != len(requests):
            raise self._error("the server answered a different number of requests")
        return data.get("baton"), data.get("base_url"), results

    def _timed_out(self, requests: list[Json], e: BaseException) -> LibSQLUnavailableError:
        """No answer within ``timeout``: logged every time (a stuck server accepts
        connections and answers nothing, so each try is news), then an outage error
        the caller handles as any other (a worker tries again with backoff)."""
        stmts = [r["stmt"]["sql"] for r in requests if r.get("type") == "execute"]
        steps = [r["batch"]["steps"][-1]["stmt"]["sql"] for r in requests if r.get("batch")]
        what = " ".join(((stmts or steps or ["a request"])[0]).split())[:60]
        message = f"no answer within {self.timeout:g}s ({type(e).__name__}) to {what!r}"
        log.warning(
            "libSQL connection %r (%s): %s; the request failed and is tried again by its caller",
            self.name,
            self.url,
            message,
        )
        return LibSQLUnavailableError(self.name, self.url, message)

    def _refused(self, response: httpx.Response) -> LibSQLAuthError:
        """401/403: one line naming the setting to fix (the token itself never shown)."""
        what = "refused the token" if "authorization" in self._headers else "wants a token"
        return LibSQLAuthError(
            self.name,
            self.url,
            f"{self._http_message(response)}; the server {what}: set a valid "
            f"connections.{self.name}.auth_token in config/database.py (or authToken= in "
            "its URL)",
            status=response.status_code,
        )

    def _http_message(self, response: httpx.Response) -> str:
        try:
            data = response.json()
            message = str(data.get("error") or data.get("message") or data)
        except (ValueError, AttributeError):
            message = response.text.strip()[:500] or response.reason_phrase
        if response.status_code in (401, 403) and "authorization" not in self._headers:
            message += " (no auth_token is configured for this connection)"
        return message

    def _ok(self, result: Json) -> Json:
        if result.get("type") == "error":
            error = result.get("error") or {}
            raise self._error(str(error.get("message") or "unknown error"), code=error.get("code"))
        if result.get("type") != "ok":
            raise self._error(f"unexpected pipeline result {result!r}")
        response: Json = result["response"]
        return response

    def _execute_result(self, result: Json) -> Json:
        response: Json = self._ok(result)["result"]
        return response

    def _batch_results(self, result: Json, n: int) -> list[Json]:
        batch = self._ok(result)["result"]
        errors = batch.get("step_errors") or []
        for step, error in enumerate(errors):
            if error:
                failed = self._error(
                    str(error.get("message") or "unknown error"), code=error.get("code")
                )
                failed.step = step
                raise failed
        results = batch.get("step_results") or []
        if len(results) != n or any(r is None for r in results):
            raise self._error("a batch step did not run")
        return list(results)

    async def _single(self, request: Json) -> Json:
        """One request on its own stream: ``[request, close]``."""
        _, _, results = await self._pipeline([request, _CLOSE])
        return results[0]

    async def _statement(self, stmt: Json) -> Json:
        """One statement on its own stream, tried again while the database is locked."""
        request = {"type": "execute", "stmt": stmt}
        return await self._retry_busy(
            lambda: self._single(request), self._execute_result, stmt["sql"]
        )

    async def _retry_busy(
        self,
        send: Callable[[], Awaitable[Json]],
        read: Callable[[Json], _T],
        sql: str,
        *,
        retryable: Callable[[LibSQLError], bool] = lambda e: True,
    ) -> _T:
        """``read(await send())``, sent again while it fails with SQLITE_BUSY/LOCKED.

        A statement that found the database locked did nothing, so sending it again is
        safe. Pauses double from 10 ms to 0.5 s, for ``busy_timeout`` in all; then
        ``LibSQLBusyError``, the outage error a worker waits out."""
        pause, tries = _BUSY_FIRST, 0
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                return read(await send())
            except LibSQLError as e:
                if not _busy(e) or not retryable(e):
                    raise
                tries += 1
                if time.monotonic() + pause > deadline:
                    raise LibSQLBusyError(
                        self.name,
                        self.url,
                        f"{e.server_message}; still locked after {tries} tries in "
                        f"{self.busy_timeout:g}s (busy_timeout)",
                        code=e.code,
                    ) from None
                log.debug(
                    "libSQL %r: %s on %.60s; trying again in %.3fs", self.name, e.code, sql, pause
                )
                await asyncio.sleep(pause * (0.5 + random.random() / 2))
                pause = min(pause * 2, _BUSY_MAX)

    # -- Session ----------------------------------------------------------------

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        result = await self._statement(_stmt(sql, params, want_rows=False))
        return int(result.get("affected_row_count") or 0)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Each row in turn on one stream, stopping at the first error (like ``sqlite3``);
        inside ``transaction()`` all of them or none. Rows that found the database
        locked are sent again (the ones before them are done)."""
        left = [_stmt(sql, p, want_rows=False) for p in rows]
        done = 0

        def read(result: Json) -> int:
            nonlocal left, done
            try:
                return done + _affected(self._batch_results(result, len(left)))
            except LibSQLError as e:
                ran = (self._ok(result)["result"].get("step_results") or [])[: e.step]
                done += _affected(ran)
                left = left[e.step :]
                raise

        if not left:
            return 0
        return await self._retry_busy(lambda: self._single(_chain(left)), read, sql)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return _rows(await self._statement(_stmt(sql, params, want_rows=True)))

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    @asynccontextmanager
    async def transaction(self, *, immediate: bool = False) -> AsyncIterator[_Transaction]:
        """One stream held by its baton, opened with ``BEGIN IMMEDIATE`` whatever
        ``immediate`` says: a deferred transaction that reads, then writes after another
        stream committed fails with SQLITE_BUSY midway, where it cannot be tried again;
        one that takes the write lock at ``BEGIN`` waits for it instead."""
        del immediate  # every libSQL transaction is immediate (see above)
        tx = _Transaction(self, "BEGIN IMMEDIATE")
        try:
            yield tx
        except BaseException:
            await tx._rollback()
            raise
        await tx._commit()

    async def close(self) -> None:
        await self._http.close()
