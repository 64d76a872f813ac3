"""The gate in front of every dashboard route: access control (with a lock-out after
failed sign-ins), the read-only switch and the CSRF check of every form post."""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from haze.dashboard._security import CSRF_COOKIE, CSRF_FIELD, CSRF_HEADER, Guard

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["MAX_FORM", "NO_STORE", "Gate", "Guarded", "plain"]

#: The largest form post read.
MAX_FORM = 256 * 1024
NO_STORE = {"Cache-Control": "no-store"}


class Guarded(Protocol):
    """What the gate reads of the dashboard behind it."""

    @property
    def guard(self) -> Guard: ...
    @property
    def read_only(self) -> bool: ...


class Gate:
    """Access control, CSRF and read-only checks in front of every route."""

    def __init__(self, inner: ASGIApp, dashboard: Guarded) -> None:
        self.inner = inner
        self.dashboard = dashboard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        request = Request(scope)
        guard = self.dashboard.guard
        client = request.client.host if request.client else ""
        wait = guard.sign_ins.locked(client)
        if wait:
            await PlainTextResponse(
                "Too many failed sign-ins from this address: try again in a minute.",
                status_code=429,
                headers={**NO_STORE, "Retry-After": str(math.ceil(wait))},
            )(scope, receive, send)
            return
        if not await guard.allowed(request):
            if "authorization" in request.headers:
                await asyncio.sleep(guard.sign_ins.failed(client))
            challenge = guard.challenge
            if challenge is not None:
                # Lets a browser ask for the password of `haze dashboard`'s basic auth.
                await PlainTextResponse(
                    "Unauthorized: sign in to use this dashboard.",
                    status_code=401,
                    headers={**NO_STORE, "WWW-Authenticate": challenge},
                )(scope, receive, send)
                return
            await plain(403, "Forbidden: this dashboard needs authorization.")(scope, receive, send)
            return
        if "authorization" in request.headers:
            guard.sign_ins.succeeded(client)
        if scope["method"] != "POST":
            await self.inner(scope, receive, send)
            return
        if self.dashboard.read_only:
            await plain(403, "Forbidden: this dashboard is read-only.")(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_FORM:
                await plain(413, "Request body too large.")(scope, receive, send)
                return
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        submitted = (form.get(CSRF_FIELD) or [""])[0] or request.headers.get(CSRF_HEADER)
        if not self.dashboard.guard.check_post(request.cookies.get(CSRF_COOKIE), submitted):
            await plain(403, "Forbidden: missing or invalid CSRF token; reload the page.")(
                scope, receive, send
            )
            return
        scope["haze.form"] = form
        await self.inner(scope, receive, send)


def plain(status: int, text: str) -> Response:
    return PlainTextResponse(text, status_code=status, headers=NO_STORE)
