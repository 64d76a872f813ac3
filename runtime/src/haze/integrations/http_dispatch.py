"""Dispatch a named job over HTTP: the request rules shared by every HTTP entrypoint.

``haze_lambda.http_handler`` (API Gateway / function URL), the ``server`` preset's
``POST /dispatch`` and the ``vercel`` preset's function all answer the same request
the same way; this module is that answer, independent of how the bytes arrived.

Request: ``POST`` with a JSON object body::

    {"job": "send_invoice", "payload": {"invoice_id": 42},
     "delay": "10m",          # optional: seconds or a duration string
     "queue": "emails",       # optional
     "group": "customer-7"}   # optional: SQS FIFO message group

A body with ``"event"`` instead sends a workflow event (``http_events``).

Authentication, with the secret in ``HAZE_HTTP_SECRET`` (compared in constant time):

- ``Authorization: Bearer <secret>``, or
- a signed request, so that the secret itself never travels::

      X-Haze-Timestamp: <unix seconds>
      X-Haze-Signature: sha256=<hex HMAC-SHA256 of "{timestamp}.{raw body}", keyed with
                        the secret>

  A timestamp more than 5 minutes from the server's clock (either way) is refused, so
  a captured request stops working 5 minutes after it was signed. :func:`signed_headers`
  makes both headers. Within those minutes a replay is still accepted: give the job a
  ``unique`` key when a second copy would matter.

Settings are read when the entrypoint starts (a bad value stops it with one line):
``HAZE_HTTP_SECRET``, ``HAZE_HTTP_JOBS`` and ``HAZE_HTTP_MAX_BODY`` (bytes, or a size
such as ``10MB``, ``512KiB``, ``1GiB``; KB = 1000 bytes, KiB = 1024).

The headers are judged before the body is read (:func:`check_head`): the method, the
credentials (a bearer token whole, a signed request's timestamp), then a declared
``Content-Length`` over the limit. Only then is the body read, under the limit, and a
signed request's HMAC checked against it: an unauthenticated or oversized request costs
no read.

Responses (JSON, ``{"error": "..."}`` on failure):

=====  ==============================================================================
202    ``{"id": ..., "job": ..., "skipped": bool, "deferred": bool}``
400    the body is not JSON (or nested too deeply), not an object, has no "job", an
       unknown key, a bad delay
401    no credentials (``WWW-Authenticate: Bearer``), or a signature without a valid
       ``X-Haze-Timestamp`` within 5 minutes
403    wrong bearer token or signature
404    no job by that name (or not in ``HAZE_HTTP_JOBS``, a comma-separated allowlist)
405    not a POST
408    the ASGI app (server and Vercel presets) did not receive the whole body within
       ``HAZE_HTTP_BODY_TIMEOUT`` (a duration, default 30 s)
413    the message is over the connection's size limit (or the body over
       ``HAZE_HTTP_MAX_BODY``, default 10 MiB)
500    ``HAZE_HTTP_SECRET`` is not set, ``HAZE_HTTP_MAX_BODY`` is not a size, or the
       queue connection is misconfigured
503    the queue tables are missing (the body says what to run), or the queue backend
       cannot be reached (nothing was queued: try again)
504    the SQL backend's connection died during the dispatch and whether the job was
       queued is unknown (``"id"`` names it): sending it again may run it twice
=====  ==============================================================================
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from haze._app.app import App, run_in_app
from haze._app.config import read_env
from haze._app.env import env_duration, env_size
from haze._base.errors import (
    BackendUnavailableError,
    ConfigError,
    DelayTooLongError,
    DispatchOutcomeUnknownError,
    PayloadTooLargeError,
    QueueTablesMissingError,
    UnknownJobError,
    UnknownQueueError,
)
from haze._base.json_text import MAX_PAYLOAD_DEPTH, too_deep
from haze._jobs.definition import PendingDispatch, get_job
from haze.api.health import queue_check
from haze.integrations.http_events import EVENT_KEYS, send_event_request

__all__ = [
    "DispatchApp",
    "DispatchResponse",
    "authorize",
    "check_head",
    "check_method",
    "check_secret",
    "dispatch_request",
    "max_body",
    "signed_headers",
]

log = logging.getLogger("haze.http")

#: The keys a dispatch body may carry.
KEYS = frozenset({"job", "payload", "delay", "queue", "group"})

DEFAULT_MAX_BODY = 10 * 1024 * 1024

#: Seconds the ASGI app waits for a whole body (``HAZE_HTTP_BODY_TIMEOUT``).
DEFAULT_BODY_TIMEOUT = 30.0

#: How far (seconds, either way) a signed request's ``X-Haze-Timestamp`` may be from now.
MAX_SKEW = 300


@dataclass
class DispatchResponse:
    """A status, a JSON body and extra headers, for the caller to put on its wire."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    def encoded(self) -> bytes:
        return json.dumps(self.body, ensure_ascii=False, separators=(",", ":")).encode()

    def all_headers(self) -> dict[str, str]:
        """The response headers, ``content-type`` included."""
        return {"content-type": "application/json", **self.headers}


_TOO_DEEP = (
    f"the body is nested too deeply (more than {MAX_PAYLOAD_DEPTH} levels of arrays/objects); "
    "send a flatter payload (ids instead of data)"
)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> DispatchResponse:
    return DispatchResponse(status, {"error": message}, headers or {})


def max_body() -> int:
    """The largest body accepted, in bytes (``HAZE_HTTP_MAX_BODY``, default 10 MiB).

    Raises ``ConfigError`` naming the variable and its value when it is not a size; each
    entrypoint calls it when it starts, so that error stops it there.
    """
    return env_size("HAZE_HTTP_MAX_BODY", DEFAULT_MAX_BODY)


def body_timeout() -> float:
    """Seconds the ASGI app waits for a request's whole body (``HAZE_HTTP_BODY_TIMEOUT``,
    default 30 s); ``ConfigError`` naming the variable when it is not a duration above 0."""
    wait = env_duration("HAZE_HTTP_BODY_TIMEOUT", DEFAULT_BODY_TIMEOUT)
    if wait <= 0:
        raw = read_env("HAZE_HTTP_BODY_TIMEOUT")
        raise ConfigError(
            f"environment variable HAZE_HTTP_BODY_TIMEOUT={raw!r}: must be more than 0 "
            "(0 would answer 408 to every request with a body); unset it for 30s"
        )
    return wait


def signed_headers(raw: bytes, secret: str, *, timestamp: int | None = None) -> dict[str, str]:
    """The ``X-Haze-Timestamp`` and ``X-Haze-Signature`` headers of a signed dispatch.

    ``raw`` is the exact body sent; ``timestamp`` defaults to now (a signature is
    accepted for 5 minutes either side of it).

    >>> body = b'{"job": "send_invoice", "payload": {"invoice_id": 42}}'
    >>> headers = signed_headers(body, "my-secret", timestamp=1764433200)
    >>> headers["x-haze-signature"][:7]
    'sha256='
    """
    ts = str(int(time.time()) if timestamp is None else int(timestamp))
    mac = hmac.new(secret.encode(), ts.encode() + b"." + raw, hashlib.sha256)
    return {"x-haze-timestamp": ts, "x-haze-signature": f"sha256={mac.hexdigest()}"}


def too_large(size: int, limit: int | None = None) -> DispatchResponse:
    limit = max_body() if limit is None else limit
    return _error(413, f"the body is {size} bytes, over the {limit}-byte limit")


def check_method(method: str) -> DispatchResponse | None:
    """None for a POST, else the 405 response."""
    method = method.upper()
    if method == "POST":
        return None
    return _error(
        405, f"use POST to dispatch a job (got {method or 'no method'})", {"allow": "POST"}
    )


def check_secret(where: str, secret: str | None = None) -> DispatchResponse | None:
    """None when the secret (default: ``HAZE_HTTP_SECRET``) is set, else the 500 response
    (and an error log)."""
    if secret if secret is not None else os.environ.get("HAZE_HTTP_SECRET"):
        return None
    log.error("%s: HAZE_HTTP_SECRET is not set; refusing requests", where)
    return _error(500, "the dispatch endpoint is not configured (HAZE_HTTP_SECRET is unset)")


def authorize(headers: Mapping[str, str], raw: bytes, secret: str) -> DispatchResponse | None:
    """None when the request is authenticated, else the 401/403 response.

    ``headers`` must have lower-case names.
    """
    return authorize_headers(headers, secret) or verify_signature(headers, raw, secret)


def authorize_headers(headers: Mapping[str, str], secret: str) -> DispatchResponse | None:
    """What the headers alone decide, before any body is read: the whole check of a
    bearer token, and the form and timestamp of a signed request (its HMAC covers the
    body: :func:`verify_signature`). None: go on; else the 401/403 response."""
    authorization = headers.get("authorization")
    signature = headers.get("x-haze-signature")
    if authorization:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _error(
                401,
                'the Authorization header must be "Bearer <token>"',
                {"www-authenticate": "Bearer"},
            )
        if hmac.compare_digest(token.strip().encode(), secret.encode()):
            return None
        return _error(403, "the bearer token is not valid")
    if signature:
        algorithm, _, given = signature.strip().partition("=")
        if algorithm.lower() != "sha256" or not given:
            return _error(401, 'X-Haze-Signature must be "sha256=<hex HMAC of {timestamp}.{body}>"')
        stamp = (headers.get("x-haze-timestamp") or "").strip()
        if not stamp:
            return _error(
                401,
                "a signed request needs X-Haze-Timestamp: <unix seconds>, and the signature "
                'covers "{timestamp}.{body}"',
            )
        if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
            return _error(401, f"X-Haze-Timestamp must be whole Unix seconds, got {stamp[:40]!r}")
        skew = int(stamp) - time.time()
        if abs(skew) > MAX_SKEW:
            return _error(
                401,
                f"X-Haze-Timestamp is {abs(skew):.0f}s {'ahead of' if skew > 0 else 'behind'} "
                "the server's clock; a signed request is accepted for 5 minutes either way "
                "(sign each request when it is sent)",
            )
        return None
    return _error(
        401,
        "authentication required: send Authorization: Bearer <token>, or X-Haze-Timestamp "
        "and X-Haze-Signature: sha256=<hmac>",
        {"www-authenticate": "Bearer"},
    )


def verify_signature(
    headers: Mapping[str, str], raw: bytes, secret: str
) -> DispatchResponse | None:
    """The body half of a signed request (a bearer request has none): None when the HMAC
    matches, else the 403. Run after :func:`authorize_headers` accepted the headers."""
    if headers.get("authorization") or not headers.get("x-haze-signature"):
        return None
    given = headers["x-haze-signature"].strip().partition("=")[2]
    stamp = (headers.get("x-haze-timestamp") or "").strip()
    expected = signed_headers(raw, secret, timestamp=int(stamp))["x-haze-signature"]
    if hmac.compare_digest(f"sha256={given.strip().lower()}".encode(), expected.encode()):
        return None
    return _error(403, "the signature does not match the timestamp and body")


def check_head(
    method: str,
    headers: Mapping[str, str],
    *,
    where: str = "haze",
    secret: str | None = None,
    size: int | None = None,
) -> DispatchResponse | None:
    """Everything decided before the body is read: the method, the secret being set,
    the credentials in the headers, then the body's size (``size``, or the declared
    ``Content-Length``) against ``HAZE_HTTP_MAX_BODY``. None: read the body (under the
    limit) and go on with :func:`dispatch_request`; else the response to send at once,
    so an unauthenticated or oversized request is never read."""
    if secret is None:
        secret = os.environ.get("HAZE_HTTP_SECRET", "")
    refused = check_method(method) or check_secret(where, secret)
    if refused is not None:
        return refused
    try:
        limit = max_body()
    except ConfigError as e:
        log.error("%s: %s", where, e)
        return _error(500, f"the dispatch endpoint is misconfigured: {e}")
    denied = authorize_headers(headers, secret)
    if denied is not None:
        return denied
    if size is None:
        declared = (headers.get("content-length") or "").strip()
        size = int(declared) if declared.isdigit() else None
    if size is not None and size > limit:
        return too_large(size, limit)
    return None


async def dispatch_request(
    app: App,
    method: str,
    headers: Mapping[str, str],
    raw: bytes,
    *,
    where: str = "haze",
    secret: str | None = None,
) -> DispatchResponse:
    """Answer one dispatch request: method, secret, size, authentication, body, dispatch.

    ``headers`` must have lower-case names; ``where`` names the entrypoint in logs;
    ``secret`` is ``HAZE_HTTP_SECRET`` from the environment unless given (a Cloudflare
    Worker reads its secrets from bindings). The app must be the current one
    (``run_in_app``) when a job's code could look it up.
    """
    if secret is None:
        secret = os.environ.get("HAZE_HTTP_SECRET", "")
    refused = check_head(method, headers, where=where, secret=secret, size=len(raw))
    if refused is None:
        refused = verify_signature(headers, raw, secret)
    if refused is not None:
        return refused
    data = _body(raw)
    if isinstance(data, DispatchResponse):
        return data
    if "event" in data:
        return DispatchResponse(*await send_event_request(app, data, where))
    name = data.get("job")
    if not isinstance(name, str) or not name:
        return _error(400, 'the body needs "job": the name of a job')
    pending = _pending(name, data)
    if isinstance(pending, DispatchResponse):
        return pending
    return await _dispatched(app, name, pending, where)


async def _dispatched(
    app: App, name: str, pending: PendingDispatch[Any], where: str
) -> DispatchResponse:
    """The 202 of a dispatch, or the status its error means."""
    try:
        result = await app.manager.dispatch(pending)
    except PayloadTooLargeError as e:
        return _error(413, str(e))
    except UnknownQueueError as e:
        # the caller's mistake: named without the backend's address (an SQS URL holds
        # the account id)
        log.warning("%s: cannot dispatch %s: %s", where, name, e)
        return _error(404, f'there is no queue "{e.queue}" on connection "{e.connection}"')
    except QueueTablesMissingError as e:  # what /health says too: not a bug, a step to run
        log.error("%s: cannot dispatch %s: %s", where, name, e)
        return _error(503, str(e))
    except ConfigError as e:
        log.error("%s: cannot dispatch %s: %s", where, name, e)
        return _error(500, f"the queue connection is misconfigured: {e}")
    except DispatchOutcomeUnknownError as e:
        # Not "nothing was queued": a caller that retries on a 503 would queue it twice.
        log.error("%s: cannot dispatch %s: %s", where, name, e)
        return DispatchResponse(
            504,
            {
                "error": "the queue backend's connection died during the dispatch and it "
                "could not tell whether the job was queued: it may be, so sending it "
                "again may run it twice",
                "id": e.job_ids[0] if e.job_ids else None,
            },
            {},
        )
    except BackendUnavailableError as e:
        # An outage, not a bug: one line in the log, and a status the caller can retry
        # on. The body names no URL: the error's message holds where the backend is.
        log.error("%s: cannot dispatch %s: %s: %s", where, name, type(e).__name__, e)
        return _error(
            503,
            f"the queue backend is unavailable ({type(e).__name__}); nothing was queued, "
            "try again later",
        )
    except (DelayTooLongError, TypeError, ValueError) as e:
        return _error(400, str(e))
    except RecursionError:
        # json.loads has a lower depth limit than encoding the message: a payload just
        # under it can still be too deep to encode.
        return _error(400, _TOO_DEEP)
    return DispatchResponse(
        202, {"id": result.id, "job": name, "skipped": result.skipped, "deferred": result.deferred}
    )


def _body(raw: bytes) -> dict[str, Any] | DispatchResponse:
    """The request's JSON object, or the 400 that says what is wrong with it."""
    try:
        # decoded first: json.loads(bytes) would guess UTF-16 or UTF-32 from the bytes
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return _error(400, f"the body is not UTF-8 text (byte {e.start} is not valid UTF-8)")
    # Parsing deeper JSON recurses: CPython raises RecursionError, and Pyodide (a
    # Cloudflare Worker) can overflow the JavaScript stack and abort.
    if too_deep(text):
        return _error(400, _TOO_DEEP)
    try:
        data = json.loads(text)
    except ValueError as e:
        return _error(400, f"the body is not valid JSON: {e}")
    except RecursionError:
        return _error(400, _TOO_DEEP)
    if not isinstance(data, dict):
        return _error(400, f"the body must be a JSON object, got {type(data).__name__}")
    allowed = EVENT_KEYS if "event" in data else KEYS
    unknown = sorted(set(data) - allowed)
    if unknown:
        return _error(
            400, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )
    return data


def _pending(name: str, data: dict[str, Any]) -> PendingDispatch[Any] | DispatchResponse:
    """The dispatch the body asks for, or the 404/400 that refuses it."""
    allow = os.environ.get("HAZE_HTTP_JOBS")
    allowed = {j.strip() for j in allow.split(",") if j.strip()} if allow else None
    try:
        if allowed is not None and name not in allowed:
            raise UnknownJobError(name)
        job = get_job(name)
    except UnknownJobError:
        return _error(404, f'no job named "{name}" can be dispatched here')
    pending: PendingDispatch[Any] = PendingDispatch(job, data.get("payload"))
    try:
        if data.get("delay") is not None:
            pending.delay(data["delay"])
        for key, setter in (("queue", pending.on_queue), ("group", pending.on_group)):
            value = data.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise ValueError(f'"{key}" must be a string, got {value!r}')
            setter(value)
    except ValueError as e:
        return _error(400, str(e))
    return pending


# --------------------------------------------------------------------------- ASGI

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class DispatchApp:
    """A dependency-free ASGI app: ``POST <path>`` dispatches a job (the rules above),
    ``GET <health_path>`` answers :func:`haze.queue_check` (200 when ok, else 503).

    ``path=None`` dispatches on every path (a Vercel function owns its route).
    Give it an entered ``App`` (the ``server`` preset: ``run_in_server`` enters it on
    the lifespan), or a ``root`` and the app is built on first request, once per event
    loop: connections opened on one loop cannot be used from another, and a serverless
    host may not keep one loop for the life of the process.
    """

    def __init__(
        self,
        app: App | None = None,
        *,
        root: str | os.PathLike[str] | None = None,
        path: str | None = "/dispatch",
        health_path: str | None = "/health",
        where: str = "haze",
    ) -> None:
        if (app is None) == (root is None):
            raise TypeError("DispatchApp needs exactly one of app= or root=")
        max_body()  # a bad HAZE_HTTP_MAX_BODY stops the server here, not every request
        body_timeout()
        self._fixed = app
        self._root = root
        self._per_loop: tuple[asyncio.AbstractEventLoop, App] | None = None
        self.path = path
        self.health_path = health_path
        self.where = where

    def app(self) -> App:
        """The haze app serving this request's event loop."""
        if self._fixed is not None:
            return self._fixed
        loop = asyncio.get_running_loop()
        if self._per_loop is None or self._per_loop[0] is not loop:
            self._per_loop = (loop, App(root=self._root))
        return self._per_loop[1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _ack_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = str(scope.get("path") or "/")
        method = str(scope.get("method") or "")
        app = self.app()
        answer: DispatchResponse
        if self.health_path is not None and path == self.health_path:
            answer = await run_in_app(app, lambda: _health(method))
        elif self.path is None or path == self.path:
            answer = await self._dispatch(app, scope, receive, method)
        else:
            answer = _error(404, f"nothing at {path}; POST a job to {self.path}")
        body = answer.encoded()
        headers_out = [(k.encode(), v.encode()) for k, v in answer.all_headers().items()]
        headers_out.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": answer.status, "headers": headers_out})
        await send({"type": "http.response.body", "body": body})

    async def _dispatch(
        self, app: App, scope: Scope, receive: Receive, method: str
    ) -> DispatchResponse:
        """Refuse from the headers when they decide (credentials, a declared size over
        the limit: nothing is read), else read the body under the limit and dispatch."""
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []
        }
        refused = check_head(method, headers, where=self.where)
        if refused is not None:
            return refused
        limit = max_body()
        wait = body_timeout()
        try:
            # A forged signature passes the header check (its HMAC needs the body): without
            # a deadline a client that trickles its body, or stops, holds the connection.
            async with asyncio.timeout(wait):
                raw = await _read_body(receive, limit)
        except _Disconnected:
            return _error(400, "the client disconnected before its body arrived; not dispatched")
        except TimeoutError:
            return _error(
                408,
                f"the body did not arrive within {wait:g}s (HAZE_HTTP_BODY_TIMEOUT); send "
                "the whole body at once",
            )
        if raw is None:
            return too_large(limit + 1, limit)
        return await run_in_app(
            app, lambda: dispatch_request(app, method, headers, raw, where=self.where)
        )


async def _health(method: str) -> DispatchResponse:
    if method.upper() not in ("GET", "HEAD"):
        return _error(405, f"use GET for the health check (got {method})", {"allow": "GET"})
    report = await queue_check()
    return DispatchResponse(200 if report.ok else 503, report.to_dict())


class _Disconnected(Exception):
    """The client hung up before its whole body arrived."""


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None once it grows past ``limit`` (the rest is not read).
    Raises ``_Disconnected`` when the client hangs up first: the part that arrived is
    not the request (it may even parse), and the client saw no answer, so it will retry."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body") or b""
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def _ack_lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
