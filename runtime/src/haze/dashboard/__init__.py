"""The haze web dashboard (extra ``haze-jobs[dashboard]``): queues, failed jobs, batches.

An ASGI app to mount in any Starlette or FastAPI app, or to serve alone with
``haze dashboard``. Pages are rendered on the server; a few lines of the dashboard's
own JavaScript refresh the overview. Nothing is fetched from a CDN.

Access is denied unless ``authorize(request)`` returns True, or the process runs with
``HAZE_ENV=local`` (or ``APP_ENV=local``) and the request comes from a loopback
address. Every action is a POST carrying a CSRF token; ``read_only=True`` hides and
refuses them all.

>>> from fastapi import FastAPI                                     # doctest: +SKIP
>>> from haze import App
>>> from haze.dashboard import create_app
>>> haze_app = App(root=".")                                        # doctest: +SKIP
>>> api = FastAPI()                                                 # doctest: +SKIP
>>> api.mount("/haze", create_app(haze_app,                         # doctest: +SKIP
...     authorize=lambda request: request.headers.get("x-user") == "admin"))
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from haze._base.deps import require

try:
    from haze.dashboard._app import build
except ModuleNotFoundError as error:  # no haze-jobs[dashboard]: create_app says what to install
    if (error.name or "").split(".")[0] not in ("starlette", "jinja2"):
        raise

if TYPE_CHECKING:
    from haze._app.app import App

__all__ = ["create_app"]


def create_app(
    app: App | None = None,
    *,
    authorize: Callable[[Any], bool | Awaitable[bool]] | None = None,
    read_only: bool = False,
    base_path: str = "",
) -> Any:
    """The dashboard as an ASGI app.

    ``app``: the haze app to show (default: the current app at each request).
    ``authorize(request)``: sync or async; only ``True`` lets the request in.
    ``read_only``: no pause, retry, forget or cancel (hidden, and refused with 403).
    ``base_path``: a path prefix when the dashboard is served alone behind a proxy
    that does not strip it (``"/haze"``); leave it empty when mounting it.

    >>> dashboard = create_app(read_only=True)  # doctest: +SKIP
    """
    require("starlette", what="haze.dashboard", extra="dashboard")
    require("jinja2", what="haze.dashboard", extra="dashboard")
    if authorize is not None and not callable(authorize):
        raise TypeError(f"create_app(authorize=...): expected a callable, got {authorize!r}")
    base_path = base_path.rstrip("/")
    if base_path and not base_path.startswith("/"):
        raise ValueError(
            f"create_app(base_path=...): expected a path like '/haze', got {base_path!r}"
        )
    return build(app, authorize, read_only, base_path)
