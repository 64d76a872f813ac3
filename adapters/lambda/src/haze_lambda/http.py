"""``haze_lambda.http_handler``: dispatch a named job over HTTP (API Gateway HTTP API,
payload format 2.0, or a Lambda function URL, which uses the same format).

Request: ``POST`` with a JSON object body::

    {"job": "send_invoice", "payload": {"invoice_id": 42},
     "delay": "10m",          # optional: seconds or a duration string
     "queue": "emails",       # optional
     "group": "customer-7"}   # optional: SQS FIFO message group

Authentication, with the secret in ``HAZE_HTTP_SECRET`` (compared in constant time):

- ``Authorization: Bearer <secret>``, or
- ``X-Haze-Signature: sha256=<hex HMAC-SHA256 of the raw body, keyed with the secret>``
  (the secret itself never travels; note that a captured request can be replayed, so
  put a nonce or a unique key in the payload when that matters).

Responses (JSON, ``{"error": "..."}`` on failure):

=====  ==============================================================================
202    ``{"id": ..., "job": ..., "skipped": bool, "deferred": bool}``
400    the body is not JSON, not an object, has no "job", an unknown key, a bad delay
401    no credentials (``WWW-Authenticate: Bearer``)
403    wrong bearer token or signature
404    no job by that name (or not in ``HAZE_HTTP_JOBS``, a comma-separated allowlist)
405    not a POST
413    the message is over the connection's size limit (or the body over
       ``HAZE_HTTP_MAX_BODY``, default 10 MiB)
500    ``HAZE_HTTP_SECRET`` is not set, or the queue connection is misconfigured
=====  ==============================================================================
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
from typing import Any

from haze import App
from haze.errors import (
    ConfigError,
    DelayTooLongError,
    PayloadTooLargeError,
    UnknownJobError,
)
from haze.jobs import PendingDispatch, get_job

from ._boot import run

__all__ = ["http_handler"]

log = logging.getLogger("haze.lambda")

_KEYS = {"job", "payload", "delay", "queue", "group"}


def _response(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "statusCode": status,
        "headers": {"content-type": "application/json", **(headers or {})},
        "body": json.dumps(body, ensure_ascii=False, separators=(",", ":")),
        "isBase64Encoded": False,
    }


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return _response(status, {"error": message}, headers)


def _authorize(headers: dict[str, str], raw: bytes, secret: str) -> dict[str, Any] | None:
    """None when the request is authenticated, else the 401/403 response."""
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
            return _error(401, 'X-Haze-Signature must be "sha256=<hex HMAC of the body>"')
        expected = hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
        if hmac.compare_digest(given.strip().lower().encode(), expected.encode()):
            return None
        return _error(403, "the body signature does not match")
    return _error(
        401,
        "authentication required: send Authorization: Bearer <token> or "
        "X-Haze-Signature: sha256=<hmac>",
        {"www-authenticate": "Bearer"},
    )


async def _handle(app: App, event: dict[str, Any]) -> dict[str, Any]:
    http = (event.get("requestContext") or {}).get("http") or {}
    method = str(http.get("method") or event.get("httpMethod") or "").upper()
    if method != "POST":
        return _error(
            405, f"use POST to dispatch a job (got {method or 'no method'})", {"allow": "POST"}
        )
    secret = os.environ.get("HAZE_HTTP_SECRET")
    if not secret:
        log.error("haze_lambda.http_handler: HAZE_HTTP_SECRET is not set; refusing requests")
        return _error(500, "the dispatch endpoint is not configured (HAZE_HTTP_SECRET is unset)")
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    body = event.get("body") or ""
    try:
        raw = (
            base64.b64decode(body, validate=True)
            if event.get("isBase64Encoded")
            else (body.encode("utf-8"))
        )
    except (binascii.Error, ValueError):
        return _error(400, "the body is marked isBase64Encoded but is not valid base64")
    limit = int(os.environ.get("HAZE_HTTP_MAX_BODY") or 10 * 1024 * 1024)
    if len(raw) > limit:
        return _error(413, f"the body is {len(raw)} bytes, over the {limit}-byte limit")
    denied = _authorize(headers, raw, secret)
    if denied is not None:
        return denied
    try:
        data = json.loads(raw)
    except ValueError as e:
        return _error(400, f"the body is not valid JSON: {e}")
    if not isinstance(data, dict):
        return _error(400, f"the body must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        return _error(
            400, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_KEYS))}"
        )
    name = data.get("job")
    if not isinstance(name, str) or not name:
        return _error(400, 'the body needs "job": the name of a job')
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
        if data.get("queue") is not None:
            if not isinstance(data["queue"], str):
                raise ValueError(f'"queue" must be a string, got {data["queue"]!r}')
            pending.on_queue(data["queue"])
        if data.get("group") is not None:
            if not isinstance(data["group"], str):
                raise ValueError(f'"group" must be a string, got {data["group"]!r}')
            pending.on_group(data["group"])
    except ValueError as e:
        return _error(400, str(e))
    try:
        result = await app.manager.dispatch(pending)
    except PayloadTooLargeError as e:
        return _error(413, str(e))
    except ConfigError as e:
        log.error("haze_lambda.http_handler: cannot dispatch %s: %s", name, e)
        return _error(500, f"the queue connection is misconfigured: {e}")
    except (DelayTooLongError, TypeError, ValueError) as e:
        return _error(400, str(e))
    return _response(
        202, {"id": result.id, "job": name, "skipped": result.skipped, "deferred": result.deferred}
    )


def http_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda handler for an API Gateway HTTP API (v2) route: dispatch a job."""
    return run(lambda app: _handle(app, event or {}))
