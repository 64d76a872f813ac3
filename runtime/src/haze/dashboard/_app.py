"""The dashboard's ASGI app: Starlette routes rendering Jinja2 templates (autoescaped).

Every request passes :class:`_Gate` first: access (403 unless allowed), then for a POST
the CSRF token and ``read_only`` (403 whatever the path). Handlers only read the
parsed form the gate left in ``request.state.form``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route

import haze.dashboard._data as _data
from haze._app.app import App, run_in_app, use_app
from haze._engine.control import pause, resume
from haze._engine.otel import prometheus_text
from haze._kernel.crypto import keyed_digest
from haze._kernel.durations import format_age
from haze._kernel.errors import BackendUnavailableError, HazeError
from haze._kernel.ids import short_id
from haze._orchestration.batches import KEEP_JOB_IDS, find, jobs
from haze._runners.presence import LEASE, SHORT_LEASE, live_workers
from haze.dashboard._gate import NO_STORE, Gate, plain
from haze.dashboard._security import CSRF_COOKIE, CSRF_FIELD, Authorize, Guard

if TYPE_CHECKING:
    from starlette.types import ASGIApp

__all__ = ["build"]

log = logging.getLogger("haze.dashboard")

_HERE = Path(__file__).parent
_STATIC = {
    "haze.css": ("text/css; charset=utf-8", _HERE / "static" / "haze.css"),
    "haze.js": ("text/javascript; charset=utf-8", _HERE / "static" / "haze.js"),
}
#: Largest POST body read (forms hold ids and filters, never payloads).
_FLASH_COOKIE = "haze_flash"
#: Pages load only the dashboard's own files, and no other site may frame them.
_PAGE_HEADERS = {
    **NO_STORE,
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def _fmt_time(ts: float | None) -> str:
    if not ts:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _first_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else ""


def _page_number(value: str) -> int:
    """``?page=`` of a list: a whole number from 1 (else one line saying so)."""
    if not value.isdigit() or int(value) < 1 or len(value) > 9:
        raise ValueError(f"page: expected a page number from 1, got {value[:20]!r}")
    return int(value)


class Dashboard:
    """State shared by the routes of one ``create_app`` call."""

    def __init__(
        self,
        app: App | None,
        authorize: Authorize | None,
        read_only: bool,
        base_path: str,
        connection: str | None = None,
    ) -> None:
        self._app = app
        self.read_only = read_only
        self.base_path = base_path
        #: Show only this connection (``haze dashboard --connection``).
        self.connection = connection
        secret = None
        if app is not None and app.key:
            # Several dashboard processes with one app key accept each other's tokens;
            # the digest cannot be turned back into the key.
            secret = keyed_digest(app, "haze-dashboard-csrf").encode()
        self.guard = Guard(authorize, secret)
        self.failed_counts = _data.FailedCounts()
        env = Environment(
            loader=FileSystemLoader(str(_HERE / "templates")),
            autoescape=select_autoescape(default=True, default_for_string=True),
        )
        env.filters["when"] = _fmt_time
        env.filters["short"] = short_id
        env.filters["first_line"] = _first_line
        env.filters["sparkline"] = _data.sparkline
        env.filters["seconds"] = _data.seconds
        env.filters["age"] = format_age
        env.filters["pretty"] = lambda v: json.dumps(v, indent=2, sort_keys=True, default=str)
        self.env = env

    @property
    def app(self) -> App:
        if self._app is not None:
            return self._app
        return use_app()

    async def call(self, fn: Callable[[App], Awaitable[Any]]) -> Any:
        """Run ``fn(app)`` with the haze app current (batch methods read it)."""
        app = self.app
        return await run_in_app(app, lambda: fn(app))

    # -- rendering -------------------------------------------------------------

    def url(self, request: Request, path: str, **params: Any) -> str:
        root: str = request.scope.get("root_path", "")
        query = {k: v for k, v in params.items() if v not in (None, "")}
        return root + path + (("?" + urlencode(query, doseq=True)) if query else "")

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        token = request.cookies.get(CSRF_COOKIE)
        fresh = not self.guard.valid_token(token)
        if fresh or token is None:
            token = self.guard.new_token()
        flash = _read_flash(request)
        body = self.env.get_template(template).render(
            url=lambda path, **p: self.url(request, path, **p),
            csrf_field=CSRF_FIELD,
            csrf_token=token,
            read_only=self.read_only,
            flash=flash.get("done", ""),
            flash_error=flash.get("error", ""),
            path=request.url.path,
            connections=[
                n
                for n, o in self.app.queue_config.connections.items()
                if o.get("driver") not in ("sync", "failover") and self.connection in (None, n)
            ],
            **context,
        )
        response = HTMLResponse(body, status_code=status, headers=_PAGE_HEADERS)
        if flash:
            response.delete_cookie(
                _FLASH_COOKIE, path=request.scope.get("root_path", "") or "/", httponly=True
            )
        if fresh:
            response.set_cookie(
                CSRF_COOKIE,
                token,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path=request.scope.get("root_path", "") or "/",
            )
        return response

    def back(self, request: Request, fallback: str, **flash: str) -> RedirectResponse:
        """303 to the form's ``next`` (a path inside the dashboard) or ``fallback``; the
        ``done``/``error`` message rides in a short-lived cookie, so no link can make the
        dashboard show a text of someone else's choosing."""
        target = _form(request, "next")
        root: str = request.scope.get("root_path", "")
        if not _inside(target, root):
            target = self.url(request, fallback)
        response = RedirectResponse(target, status_code=303)
        message = {k: v for k, v in flash.items() if k in ("done", "error") and v}
        if message:
            value = base64.urlsafe_b64encode(json.dumps(message).encode()).decode()
            response.set_cookie(
                _FLASH_COOKIE,
                value,
                max_age=60,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path=root or "/",
            )
        return response

    async def unreadable(self, request: Request, error: Exception) -> Response:
        """A page whose data the backend did not give (a refused token, an outage,
        missing tables): one line saying why and what to fix, not a bare 500."""
        message = _data.reason(self.app, error)
        log.warning("haze dashboard: %s cannot be shown: %s", request.url.path, message)
        status = 503 if isinstance(error, BackendUnavailableError) else 500
        section = request.url.path[len(request.scope.get("root_path", "")) :].strip("/")
        return self.render(
            request,
            "error.html",
            status,
            title="Cannot read the queues",
            message=message,
            page=section.split("/", 1)[0] or "overview",
        )

    # -- pages -------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        rows = await self.call(lambda app: _data.overview(app, self.connection, self.failed_counts))
        if request.query_params.get("partial"):
            return self.render(request, "_overview_table.html", rows=rows, now=time.time())
        # Runtime per job is read once per page load, not on every refresh.
        runtime_error = ""
        try:
            runtimes = await self.call(lambda app: _data.job_runtimes(app, self.connection))
        except Exception as e:
            runtimes, runtime_error = None, _data.reason(self.app, e)
        return self.render(
            request,
            "overview.html",
            rows=rows,
            runtimes=runtimes,
            runtime_error=runtime_error,
            now=time.time(),
            page="overview",
        )

    async def failed(self, request: Request) -> Response:
        q = request.query_params
        connection = q.get("connection") or self.connection or self.app.queue_config.default
        try:
            self.app.connection_name(connection)
            flt = _data.FailedFilter(
                connection=connection,
                queue=q.get("queue", ""),
                job=q.get("job", ""),
                exception=q.get("exception", ""),
                since=q.get("since", ""),
                until=q.get("until", ""),
            )
            number = _page_number(q.get("page", "1"))
        except (ValueError, HazeError) as e:
            return self.render(request, "error.html", 400, message=str(e), page="failed")
        jobs, total = await self.call(lambda app: _data.failed_page(app, flt, number))
        return self.render(
            request,
            "failed.html",
            jobs=jobs,
            total=total,
            number=number,
            pages=max(1, -(-total // _data.PAGE_SIZE)),
            flt=flt,
            page="failed",
        )

    async def failed_detail(self, request: Request) -> Response:
        connection = request.path_params["connection"]
        job_id = request.path_params["job_id"]
        try:
            self.app.connection_name(connection)
        except HazeError as e:
            return self.render(request, "error.html", 404, message=str(e), page="failed")
        job = await self.call(lambda app: _data.find_failed(app, connection, job_id))
        if job is None:
            message = (
                f'no failed job "{job_id}" on connection "{connection}" (retried or forgotten?)'
            )
            return self.render(request, "error.html", 404, message=message, page="failed")
        encrypted = _data.is_encrypted(job)
        payload: Any = job.payload
        exception = job.exception
        decrypted = False
        decrypt_error = ""
        if encrypted and request.query_params.get("decrypt"):
            try:
                payload, exception = _data.decrypted(self.app, job)
                decrypted = True
            except HazeError as e:
                decrypt_error = str(e)
        return self.render(
            request,
            "failed_detail.html",
            job=job,
            attempts=_data.attempts(job),
            chain_links=_data.chain_links(job),
            encrypted=encrypted,
            decrypted=decrypted,
            decrypt_error=decrypt_error,
            can_decrypt=bool(self.app.key),
            payload=payload,
            exception=exception,
            page="failed",
        )

    async def failed_action(self, request: Request) -> Response:
        action = request.path_params["action"]
        if action not in ("retry", "forget"):
            return _no_action(action)
        self.failed_counts.clear()
        connection = _form(request, "connection") or self.app.queue_config.default
        try:
            self.app.connection_name(connection)
            ids = _form_list(request, "id")
            if not ids and _form(request, "all") == "1":
                flt = _data.FailedFilter(
                    connection=connection,
                    queue=_form(request, "queue"),
                    job=_form(request, "job"),
                    exception=_form(request, "exception"),
                    since=_form(request, "since"),
                    until=_form(request, "until"),
                )
                jobs = await self.call(lambda app: _data.failed_jobs(app, flt))
                ids = [j.id for j in jobs]
        except (ValueError, HazeError) as e:
            return self.back(request, "/failed", error=str(e))
        if action == "retry":
            done = await self.call(lambda app: _retry(app, connection, ids))
            return self.back(request, "/failed", done=f"Retried {done} failed job(s).")
        forgotten = await self.call(lambda app: _forget(app, connection, ids))
        return self.back(request, "/failed", done=f"Forgot {forgotten} failed job(s).")

    async def batches(self, request: Request) -> Response:
        batches = await self.call(_data.recent_batches)
        return self.render(request, "batches.html", batches=batches, page="batches")

    async def batch_detail(self, request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        batch = await self.call(lambda app: find(app.manager, batch_id))
        if batch is None:
            message = f'no batch "{batch_id}" (unknown, pruned or expired)'
            return self.render(request, "error.html", 404, message=message, page="batches")
        members, ended = await self.call(lambda app: jobs(app.manager, batch_id))
        return self.render(
            request,
            "batch_detail.html",
            batch=batch,
            members=members,
            ended=ended,
            keep=KEEP_JOB_IDS,
            page="batches",
        )

    async def batch_action(self, request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        action = request.path_params["action"]
        if action not in ("cancel", "retry"):
            return _no_action(action)
        self.failed_counts.clear()
        batch = await self.call(lambda app: find(app.manager, batch_id))
        if batch is None:
            return self.back(request, "/batches", error=f'no batch "{batch_id}"')
        where = f"/batches/{batch_id}"
        if action == "cancel":
            await self.call(lambda app: batch.cancel())
            return self.back(request, where, done="Batch cancelled.")
        connection = batch.options.get("connection") or self.app.queue_config.default
        ids = list(batch.failed_job_ids)
        done = await self.call(lambda app: _retry(app, connection, ids))
        return self.back(request, where, done=f"Retried {done} failed job(s) of the batch.")

    async def workers(self, request: Request) -> Response:
        found = await self.call(live_workers)
        if found is not None and self.connection is not None:
            found = [w for w in found if w.get("connection") == self.connection]
        return self.render(
            request,
            "workers.html",
            workers=found,
            lease=LEASE,
            short_lease=SHORT_LEASE,
            now=time.time(),
            page="workers",
        )

    async def jobs(self, request: Request) -> Response:
        token = request.query_params.get("id", "").strip()
        decrypt = bool(request.query_params.get("decrypt"))
        found = None
        error = ""
        if token:
            try:
                found = await self.call(lambda app: _data.lookup(app, token, decrypt=decrypt))
            except HazeError as e:  # an ambiguous short id
                error = str(e)
        return self.render(
            request,
            "jobs.html",
            token=token,
            found=found,
            error=error,
            decrypt=decrypt,
            can_decrypt=bool(self.app.key),
            page="jobs",
        )

    async def queue_action(self, request: Request) -> Response:
        action = request.path_params["action"]
        if action not in ("pause", "continue"):
            return _no_action(action)
        connection, queue = _form(request, "connection"), _form(request, "queue")
        try:
            self.app.connection_name(connection)
            if not queue or len(queue) > 255:
                raise ValueError("a queue name of 1-255 characters is required")
        except (ValueError, HazeError) as e:
            return self.back(request, "/", error=str(e))
        if not _data.shared_store(self.app):
            return self.back(
                request,
                "/",
                error="workers read pause signals from a store they share; this app's queue "
                "store is local to each process (configure a redis or database store)",
            )
        if action == "pause":
            await self.call(lambda app: pause(app, connection, queue))
            return self.back(request, "/", done=f'Paused "{queue}" on "{connection}".')
        await self.call(lambda app: resume(app, connection, queue))
        return self.back(request, "/", done=f'Resumed "{queue}" on "{connection}".')

    async def metrics(self, request: Request) -> Response:
        rows = await self.call(lambda app: _data.overview(app, self.connection, self.failed_counts))
        # Queue gauges only: job counters and histograms are per process, and this
        # process runs no jobs (each worker's own /metrics or OTel exporter has them).
        return PlainTextResponse(
            prometheus_text(None, rows),
            media_type="text/plain; version=0.0.4; charset=utf-8",
            headers=NO_STORE,
        )

    async def static(self, request: Request) -> Response:
        entry = _STATIC.get(request.path_params["name"])
        if entry is None:
            return PlainTextResponse("not found", status_code=404)
        media, path = entry
        return Response(path.read_bytes(), media_type=media)


async def _retry(app: App, connection: str, ids: list[str]) -> int:
    done = 0
    for job_id in ids:
        try:
            done += len(await app.manager.retry([job_id], connection=connection))
        except LookupError:
            pass  # retried or forgotten by someone else meanwhile
    return done


async def _forget(app: App, connection: str, ids: list[str]) -> int:
    return sum([bool(await app.manager.forget(i, connection)) for i in ids])


def _inside(target: str, root: str) -> bool:
    """``target`` is a plain path of this dashboard (no scheme, host or backslash trick)."""
    if not target or "\\" in target or "%5c" in target.lower() or any(c < " " for c in target):
        return False
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or target.startswith("//"):
        return False
    return parts.path == root or parts.path.startswith(root + "/")


def _read_flash(request: Request) -> dict[str, str]:
    raw = request.cookies.get(_FLASH_COOKIE)
    if not raw:
        return {}
    try:
        value = json.loads(base64.urlsafe_b64decode(raw.encode()))
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: str(v)[:500] for k, v in value.items() if k in ("done", "error")}


def _form(request: Request, name: str) -> str:
    values: list[str] = request.scope.get("haze.form", {}).get(name) or [""]
    return values[0].strip()


def _form_list(request: Request, name: str) -> list[str]:
    values: list[str] = request.scope.get("haze.form", {}).get(name) or []
    return [v.strip() for v in values if v.strip()]


def _no_action(action: str) -> Response:
    # Each handler's last branch is one of its actions: any other name must not reach it.
    return plain(404, f"Not found: the dashboard has no action {action[:40]!r} here.")


def _closing(d: Dashboard) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await d.app.stop()

    return lifespan


def build(
    app: App | None,
    authorize: Authorize | None,
    read_only: bool,
    base_path: str,
    *,
    connection: str | None = None,
    challenge: str | None = None,
    close_app: bool = False,
) -> ASGIApp:
    """The dashboard's ASGI app (see :func:`haze.dashboard.create_app`); ``connection``,
    ``challenge`` (a ``WWW-Authenticate`` value for 401s) and ``close_app`` (close the
    app's connections at the server's lifespan shutdown) serve ``haze dashboard``."""
    d = Dashboard(app, authorize, read_only, base_path, connection)
    d.guard.challenge = challenge
    routes = [
        Route("/", d.overview),
        Route("/failed", d.failed),
        Route("/failed/{connection}/{job_id}", d.failed_detail),
        Route("/failed/{action:str}", d.failed_action, methods=["POST"]),
        Route("/batches", d.batches),
        Route("/batches/{batch_id}", d.batch_detail),
        Route("/batches/{batch_id}/{action}", d.batch_action, methods=["POST"]),
        Route("/workers", d.workers),
        Route("/jobs", d.jobs),
        Route("/queues/{action}", d.queue_action, methods=["POST"]),
        Route("/metrics", d.metrics),
        Route("/static/{name}", d.static),
    ]
    lifespan = _closing(d) if close_app else None
    mounted = [Mount(base_path, routes=routes)] if base_path else routes
    starlette = Starlette(
        routes=mounted, lifespan=lifespan, exception_handlers={HazeError: d.unreadable}
    )
    return Gate(starlette, d)
