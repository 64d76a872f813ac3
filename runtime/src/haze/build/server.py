"""``haze build --preset server``: an ASGI app that dispatches over HTTP and, with
``run_in_server``, runs the queue worker inside the web server.

``dist/server/``::

    app.py               ASGI ``app``: POST /dispatch, GET /health; the worker follows
                         the server's lifespan (haze.integrations.asgi.run_in_server)
    requirements.txt     haze-jobs[<extras of the config>] from wheels/, and uvicorn
    wheels/haze-*.whl    the haze that ran the build (haze is not on PyPI yet)
    haze_app/            the app: config/, app/, database/, haze.config.py

Run it with ``uvicorn app:app`` from ``dist/server`` (or any ASGI server). The bundled
app sits in ``haze_app/`` because a top-level ``app/`` package would shadow ``app.py``:
``import app`` finds the package first.

``POST /dispatch`` takes the body and authentication of ``haze_lambda.http_handler``
(:mod:`haze.integrations.http_dispatch`; the secret is ``HAZE_HTTP_SECRET``).
``GET /health`` is ``haze.queue_check()`` on the default connection: 200, or 503 when the
connection does not answer.
"""

from __future__ import annotations

from haze._base.errors import ConfigError
from haze._base.hints import DISTRIBUTION
from haze.build import BuildContext, BuildResult
from haze.build._python import (
    app_jobs,
    app_requirements,
    driver_of,
    extras_for,
    longest_timeout,
    pack_wheel,
    stop_timeout,
)

__all__ = ["APP_DIR", "build"]

#: Where the bundled app goes under ``dist/server/``.
APP_DIR = "haze_app"

UVICORN = "uvicorn>=0.30"

APP_PY = '''\
"""The ASGI entrypoint made by `haze build --preset server` (rebuild rather than edit).

    uvicorn app:app --host 0.0.0.0 --port 8000

POST /dispatch dispatches a job ({{"job": ..., "payload": ...}}; Authorization: Bearer
$HAZE_HTTP_SECRET, or X-Haze-Timestamp and X-Haze-Signature: see
haze.integrations.http_dispatch), GET /health reports the queue connection.
With run_in_server in config/queue.py, a queue worker starts with the server and drains
(finishes its running jobs) when the server shuts down on SIGTERM.
"""

from pathlib import Path

from haze import App
from haze.integrations.asgi import run_in_server
from haze.integrations.http_dispatch import DispatchApp

ROOT = Path(__file__).resolve().parent / "{app_dir}"

haze_app = App(root=ROOT)
app = run_in_server(DispatchApp(haze_app, where="dist/server/app.py"), haze_app)
'''


def build(ctx: BuildContext) -> BuildResult:
    app = ctx.app
    connection = app.queue_config.default
    driver = driver_of(app, connection)
    if driver == "sync" and app.queue_config.run_in_server is not None:
        raise ConfigError(
            f'run_in_server is on but the default connection "{connection}" is sync: jobs run '
            "inside dispatch() and the in-server worker has nothing to consume; use a "
            "memory, redis or database connection",
            source=app.queue_config.source,
            key="run_in_server",
        )
    dest = ctx.dest
    files = ctx.copy_app(dest / APP_DIR)
    files.append(pack_wheel(DISTRIBUTION, dest / "wheels"))
    extras = extras_for(app)
    spec = f"{DISTRIBUTION}[{','.join(extras)}]" if extras else DISTRIBUTION
    from importlib.metadata import version

    requirements = [
        "# Made by `haze build --preset server`.",
        "--find-links ./wheels",
        f"{spec}=={version(DISTRIBUTION)}",
        UVICORN,
        *app_requirements(ctx.root),
    ]
    files.append(ctx.write("requirements.txt", "\n".join(requirements) + "\n"))
    files.append(ctx.write("app.py", APP_PY.format(app_dir=APP_DIR)))

    notes = [
        "run it: cd dist/server && pip install -r requirements.txt && "
        "HAZE_HTTP_SECRET=... uvicorn app:app --host 0.0.0.0 --port 8000",
        f"POST /dispatch (bearer HAZE_HTTP_SECRET) dispatches to {connection!r}; "
        "GET /health reports it",
        f"haze commands on the bundle: haze --root dist/server/{APP_DIR} db:migrate",
    ]
    settings = app.queue_config.run_in_server
    if settings is None:
        notes.append(
            "run_in_server is off in config/queue.py: this server only dispatches; set "
            "run_in_server=True to run a worker inside it, or run `haze queue:work` elsewhere"
        )
    else:
        worker_connection = app.connection_name(settings.get("connection"))
        stop = stop_timeout(
            longest_timeout(app_jobs(app), worker_connection, app.queue_config.routes)
        )
        if stop is not None:
            notes.append(
                f"on SIGTERM the in-server worker waits for its running jobs: give the "
                f"platform's stop/grace period at least {stop}s (the longest job + 5 s)"
            )
    return BuildResult(preset=ctx.preset, path=dest, files=files, notes=notes)
