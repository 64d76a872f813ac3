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
import json
from typing import Any

from haze import App
from haze.integrations.http_dispatch import (
    DispatchResponse,
    check_method,
    check_secret,
    dispatch_request,
)

from ._boot import run

__all__ = ["http_handler"]

_WHERE = "haze_lambda.http_handler"


def _response(answer: DispatchResponse) -> dict[str, Any]:
    return {
        "statusCode": answer.status,
        "headers": answer.all_headers(),
        "body": json.dumps(answer.body, ensure_ascii=False, separators=(",", ":")),
        "isBase64Encoded": False,
    }


async def _handle(app: App, event: dict[str, Any]) -> dict[str, Any]:
    # The request rules live in haze.integrations.http_dispatch (shared with the server
    # and vercel presets); only the API Gateway event shape is handled here.
    http = (event.get("requestContext") or {}).get("http") or {}
    method = str(http.get("method") or event.get("httpMethod") or "")
    refused = check_method(method) or check_secret(_WHERE)
    if refused is not None:
        return _response(refused)
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    body = event.get("body") or ""
    try:
        raw = (
            base64.b64decode(body, validate=True)
            if event.get("isBase64Encoded")
            else (body.encode("utf-8"))
        )
    except (binascii.Error, ValueError):
        return _response(
            DispatchResponse(
                400, {"error": "the body is marked isBase64Encoded but is not valid base64"}
            )
        )
    return _response(await dispatch_request(app, method, headers, raw, where=_WHERE))


def http_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda handler for an API Gateway HTTP API (v2) route: dispatch a job."""
    return run(lambda app: _handle(app, event or {}))
