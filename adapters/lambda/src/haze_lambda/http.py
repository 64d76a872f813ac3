"""``haze_lambda.http_handler``: dispatch a named job over HTTP (API Gateway HTTP API,
payload format 2.0, or a Lambda function URL, which uses the same format).

This module only turns the event into a request (method, lower-case headers, the body,
base64-decoded when API Gateway encoded it) and the answer into a proxy response. The
request body, the ``HAZE_HTTP_SECRET`` bearer or HMAC authentication and the status
codes are :mod:`haze.integrations.http_dispatch`'s, the same for every haze HTTP
entrypoint (the server and Vercel presets, the Cloudflare Worker's ``fetch()``).
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

from haze_lambda._boot import run

if TYPE_CHECKING:  # loaded on the first request, not at import (cold start)
    from haze import App
    from haze.integrations.http_dispatch import DispatchResponse

__all__ = ["http_handler"]

_WHERE = "haze_lambda.http_handler"


def _response(answer: DispatchResponse) -> dict[str, Any]:
    return {
        "statusCode": answer.status,
        "headers": answer.all_headers(),
        "body": answer.encoded().decode(),
        "isBase64Encoded": False,
    }


async def _handle(app: App, event: dict[str, Any]) -> dict[str, Any]:
    # The request rules live in haze.integrations.http_dispatch (shared with the server
    # and vercel presets); only the API Gateway event shape is handled here. Imported at
    # the first request, not with the handler (cold start, see _boot.check_settings).
    from haze.integrations.http_dispatch import (
        DispatchResponse,
        check_method,
        check_secret,
        dispatch_request,
    )

    http = (event.get("requestContext") or {}).get("http") or {}
    method = str(http.get("method") or event.get("httpMethod") or "")
    refused = check_method(method) or check_secret(_WHERE)
    if refused is not None:
        return _response(refused)
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    body = event.get("body") or ""
    if not isinstance(body, str):
        # a direct invoke (aws lambda invoke, the SDK) may pass the body as an object
        return _response(
            DispatchResponse(
                400,
                {
                    "error": f'the event\'s "body" must be a string (the JSON text of the '
                    f"request, as API Gateway and function URLs send it), got "
                    f"{type(body).__name__}"
                },
            )
        )
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
