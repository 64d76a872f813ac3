"""Who may see the dashboard, and the CSRF tokens every action carries.

Access is denied unless ``authorize(request)`` returns true, or the app runs in a local
environment (``HAZE_ENV`` or else ``APP_ENV`` is ``local``) *and* the request comes from
a loopback address *and* names this machine in ``Host`` (``localhost``, ``127.0.0.1``,
``[::1]``: no DNS rebinding). A proxy in front of the dashboard makes every client look
local, so the environment variable alone never opens it.

CSRF: a double-submit token. The first page sets a random token in an ``HttpOnly``,
``SameSite=Strict`` cookie; every form repeats it in a hidden ``_csrf`` field (scripts
send ``X-CSRF-Token``). Tokens are signed with a key held by the server, so a token an
attacker planted in a cookie from a sibling subdomain does not validate either.

Failed sign-ins are limited per client address: a refused request that carried
credentials (an ``Authorization`` header) counts. Within a minute the first
``FREE_ATTEMPTS`` are answered at once, the next ones after a delay that doubles each
time, and from ``MAX_ATTEMPTS`` on every request of that client gets 429 with
``Retry-After`` until its minute is over, the right password included (so guessing
stops, and a lockout says nothing about the password). Behind a proxy every client has
the proxy's address: the limit then applies to all of them together.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import ipaddress
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "FREE_ATTEMPTS",
    "MAX_ATTEMPTS",
    "Guard",
    "SignInLimit",
    "basic_auth",
    "is_local_environment",
]

CSRF_COOKIE = "haze_csrf"
CSRF_FIELD = "_csrf"
CSRF_HEADER = "x-csrf-token"

log = logging.getLogger("haze.dashboard")

Authorize = Callable[["Request"], "bool | Awaitable[bool]"]


def is_local_environment() -> bool:
    """True when ``HAZE_ENV`` (or, when unset, ``APP_ENV``) is ``local``."""
    value = os.environ.get("HAZE_ENV") or os.environ.get("APP_ENV") or ""
    return value.strip().lower() == "local"


def _loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _local_host(request: Request) -> bool:
    """The Host header names this machine. A site whose name an attacker re-points at
    127.0.0.1 (DNS rebinding) reaches a loopback port from the user's own browser, with
    the attacker's name in Host: that must not count as local."""
    host = request.headers.get("host", "")
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]").lower()
    return name in ("localhost", "127.0.0.1", "::1") or name.endswith(".localhost")


#: Failed sign-ins a client gets each minute before its answers are delayed, and before
#: it is refused outright until the minute is over.
FREE_ATTEMPTS = 5
MAX_ATTEMPTS = 10
#: The first delay (seconds), doubled for each further failure, and the minute.
_FIRST_DELAY = 0.05
_WINDOW = 60.0
#: Clients remembered at most (the oldest windows are dropped first).
_MAX_CLIENTS = 10_000


class SignInLimit:
    """Failed sign-ins per client address in the current minute (see the module doc)."""

    def __init__(self) -> None:
        self._failures: dict[str, tuple[float, int]] = {}

    def locked(self, client: str) -> float:
        """Seconds until ``client`` may try again; 0 when it may now."""
        start, count = self._failures.get(client, (0.0, 0))
        left = start + _WINDOW - time.monotonic()
        return left if count >= MAX_ATTEMPTS and left > 0 else 0.0

    def failed(self, client: str) -> float:
        """Count a failure of ``client``; returns how long to wait before answering."""
        now = time.monotonic()
        start, count = self._failures.pop(client, (now, 0))
        if now - start >= _WINDOW:
            start, count = now, 0
        count += 1
        self._failures[client] = (start, count)  # re-inserted: the dict is oldest first
        while len(self._failures) > _MAX_CLIENTS:
            del self._failures[next(iter(self._failures))]
        return 0.0 if count <= FREE_ATTEMPTS else _FIRST_DELAY * 2 ** (count - FREE_ATTEMPTS - 1)

    def succeeded(self, client: str) -> None:
        self._failures.pop(client, None)


class Guard:
    """Access checks and CSRF tokens for one dashboard."""

    def __init__(self, authorize: Authorize | None, secret: bytes | None = None) -> None:
        self.authorize = authorize
        # A per-process key unless the caller derives one from the app key, so several
        # server processes behind one load balancer accept each other's tokens.
        self._secret = secret or secrets.token_bytes(32)
        #: A ``WWW-Authenticate`` value: refusals are 401 with it instead of 403.
        self.challenge: str | None = None
        self.sign_ins = SignInLimit()

    async def allowed(self, request: Request) -> bool:
        if self.authorize is not None:
            try:
                result: Any = self.authorize(request)
                if inspect.isawaitable(result):
                    result = await result
            except Exception:
                # A broken check denies; the traceback goes to the log, not the client.
                log.exception("haze dashboard: authorize(request) raised; request denied")
                result = False
            if result is True:
                return True
        client = request.client.host if request.client else None
        return is_local_environment() and _loopback(client) and _local_host(request)

    def new_token(self) -> str:
        nonce = secrets.token_hex(16)
        return f"{nonce}.{self._sign(nonce)}"

    def valid_token(self, token: str | None) -> bool:
        if not token or "." not in token:
            return False
        nonce, _, mac = token.partition(".")
        return hmac.compare_digest(mac, self._sign(nonce))

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._secret, b"haze:csrf:" + nonce.encode(), hashlib.sha256).hexdigest()

    def check_post(self, cookie: str | None, submitted: str | None) -> bool:
        """The submitted token equals the cookie's, and the server signed it."""
        if not cookie or not submitted:
            return False
        return hmac.compare_digest(cookie, submitted) and self.valid_token(cookie)


def basic_auth(user: str, password: str) -> Authorize:
    """An ``authorize`` that accepts HTTP Basic credentials equal to these."""
    import base64

    expected = hashlib.sha256(f"{user}:{password}".encode()).digest()

    def check(request: Request) -> bool:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            given = base64.b64decode(value.strip(), validate=True)
        except ValueError:
            return False
        # Compare digests so the comparison takes the same time whatever the length.
        return hmac.compare_digest(hashlib.sha256(given).digest(), expected)

    return check
