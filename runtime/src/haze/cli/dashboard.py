"""``haze dashboard``: serve the web dashboard with uvicorn.

Who may use it: with ``HAZE_DASHBOARD_PASSWORD`` set (user ``HAZE_DASHBOARD_USER``,
default ``haze``), anyone who signs in with HTTP Basic auth; otherwise only requests
from this machine, and only when ``HAZE_ENV`` (or ``APP_ENV``) is ``local``. To put it
behind your own login, mount ``haze.dashboard.create_app(authorize=...)`` in your app.
"""

from __future__ import annotations

import os

import click

from haze._base.deps import require
from haze.cli._core import State, cli, connection_option, console

try:
    from haze.dashboard._app import build
except ModuleNotFoundError as error:  # no haze-jobs[dashboard]: the command says what to install
    if (error.name or "").split(".")[0] not in ("starlette", "jinja2"):
        raise
from haze.dashboard._security import basic_auth, is_local_environment

__all__ = ["dashboard"]

_LOOPBACK = ("127.0.0.1", "::1", "localhost")


@cli.command("dashboard", short_help="Serve the web dashboard (queues, failed jobs, batches).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="TCP port."
)
@connection_option("Show only this connection (default: every connection).")
@click.option("--read-only", is_flag=True, help="Hide and refuse every action.")
@click.pass_obj
def dashboard(state: State, host: str, port: int, connection: str | None, read_only: bool) -> None:
    """Serve the dashboard at http://HOST:PORT/ until interrupted (Ctrl-C)."""
    for package in ("starlette", "jinja2", "uvicorn"):
        require(package, what="haze dashboard", extra="dashboard")
    import uvicorn

    app = state.app()
    if connection is not None:
        connection = app.connection_name(connection)
    password = os.environ.get("HAZE_DASHBOARD_PASSWORD")
    user = os.environ.get("HAZE_DASHBOARD_USER") or "haze"
    out = console()
    if password:
        authorize = basic_auth(user, password)
        challenge: str | None = 'Basic realm="haze dashboard", charset="UTF-8"'
        who = f'sign in as "{user}" with HAZE_DASHBOARD_PASSWORD'
    else:
        authorize, challenge = None, None
        if not is_local_environment():
            raise click.ClickException(
                "the dashboard would refuse every request: set HAZE_DASHBOARD_PASSWORD "
                "(HTTP Basic auth, user HAZE_DASHBOARD_USER or 'haze'), or HAZE_ENV=local to "
                "open it to this machine only"
            )
        if host not in _LOOPBACK:
            out.print(
                f"[yellow]Listening on {host}, but without HAZE_DASHBOARD_PASSWORD only "
                "requests from this machine are allowed.[/]"
            )
        who = "requests from this machine (HAZE_ENV=local)"
    # close_app: the app's connections (opened by the pages, on uvicorn's event loop)
    # are closed on that loop when the server shuts down (its lifespan's shutdown).
    asgi = build(
        app, authorize, read_only, "", connection=connection, challenge=challenge, close_app=True
    )
    shown = f"[{host}]" if ":" in host else host
    out.print(f"haze dashboard on http://{shown}:{port}/ ({who}); Ctrl-C stops it.")
    uvicorn.run(asgi, host=host, port=port, log_level="warning", lifespan="on")
