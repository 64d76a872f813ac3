"""``haze build --preset vercel``: a Vercel Python function that dispatches jobs to a queue
a worker elsewhere consumes (the seed's table: like Lambda, ``redis`` or ``database``
with a consumer running somewhere else; Vercel has no queue trigger).

``dist/vercel/`` is the project to deploy (``cd dist/vercel && vercel deploy``)::

    api/dispatch.py      the function, served at /api/dispatch: an ASGI ``app``
    vercel.json          the function's maxDuration and the files it must include
    requirements.txt     the third-party packages of haze-jobs[<extras of the config>]
    haze/                haze itself, vendored (it is not on PyPI yet)
    config/ app/ database/ haze.config.py    the app

The function answers like ``haze_lambda.http_handler`` (see
:mod:`haze.integrations.http_dispatch`): ``POST`` a JSON body ``{"job", "payload",
"delay", "queue", "group"}`` with ``Authorization: Bearer $HAZE_HTTP_SECRET`` or a
signed request (``X-Haze-Timestamp`` and an ``X-Haze-Signature`` HMAC of
``"{timestamp}.{body}"``, refused when over 5 minutes old); 202 with the job id.

The default connection must be one another process consumes (``redis``, ``database``,
``sqs`` or ``cloudflare``): a ``sync`` job would run inside the request and a ``memory``
one would be lost with the function instance, so the build refuses them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from haze._app.app import App
from haze._base.errors import ConfigError
from haze.build import BuildContext, BuildResult
from haze.build._python import (
    app_jobs,
    app_requirements,
    driver_of,
    extra_requirements,
    extras_for,
    is_sqlite,
)
from haze.build._python import is_remote as _is_remote
from haze.build._vercel_queue import queue_function

__all__ = ["MAX_DURATION", "build"]

#: The function's ``maxDuration`` (seconds): a dispatch is one round trip to the queue.
MAX_DURATION = 10

FUNCTION = "api/dispatch.py"

DISPATCH_PY = '''\
"""The Vercel function made by `haze build --preset vercel` (rebuild rather than edit).

POST /api/dispatch with {{"job": "...", "payload": ...}} and Authorization: Bearer
$HAZE_HTTP_SECRET (or X-Haze-Timestamp and X-Haze-Signature: sha256=<HMAC of
"{{timestamp}}.{{body}}">, see haze.integrations.http_dispatch) dispatches the job to
the app's default connection; a worker elsewhere (`haze queue:work`) runs it.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# haze is vendored beside the app (it is not on PyPI yet): it must win over any other.
sys.path.insert(0, str(ROOT))

from haze.integrations.http_dispatch import DispatchApp  # noqa: E402

app = DispatchApp(root=ROOT, path=None, health_path=None, where="{function}")
'''


def build(ctx: BuildContext) -> BuildResult:
    app = ctx.app
    connection = app.queue_config.default
    driver = driver_of(app, connection)
    if not _is_remote(app, connection):
        raise ConfigError(
            f'the default connection "{connection}" is {driver}: from a Vercel function '
            + (
                "a sync job would run inside the request"
                if driver == "sync"
                else "a memory job is lost when the function instance stops"
            )
            + "; make the default (QUEUE_CONNECTION) a redis or database connection "
            "consumed by `haze queue:work` elsewhere (sqs and cloudflare work too)",
            source=app.queue_config.source,
            key="default",
        )
    dest = ctx.dest
    files = ctx.copy_app(dest)
    files.extend(ctx.vendor(["haze"], dest))
    extras = extras_for(app)
    requirements = [
        f"# Made by `haze build --preset vercel`: the dependencies of {_haze_jobs(extras)} "
        "(haze itself is vendored in haze/).",
        *extra_requirements(extras),
        *app_requirements(ctx.root),
    ]
    files.append(ctx.write("requirements.txt", "\n".join(requirements) + "\n"))
    files.append(ctx.write(FUNCTION, DISPATCH_PY.format(function=f"dist/vercel/{FUNCTION}")))
    config = _vercel_json(dest)
    consumer, entry, consumer_note = queue_function(
        ctx, config["functions"][FUNCTION]["includeFiles"]
    )
    files.extend(consumer)
    config["functions"].update(entry)
    files.append(ctx.write("vercel.json", json.dumps(config, indent=2) + "\n"))

    notes = [
        f"deploy: cd dist/vercel && vercel deploy; set HAZE_HTTP_SECRET (and the backend's "
        f"URL) in the project's environment; jobs go to {connection!r} ({driver})",
        "Vercel runs no worker: run `haze queue:work` on a server or the docker preset's "
        "image, against the same backend",
    ]
    if consumer_note:
        notes[1] = consumer_note
    notes.append(requirements_note(extras))
    if driver == "database" and is_sqlite(app, connection):
        notes.append(
            f'connection "{connection}" is SQLite as read now: a function\'s filesystem is '
            "not your worker's; set DATABASE_URL to PostgreSQL, MySQL or Turso on Vercel, "
            "and build with that DATABASE_URL set (or HAZE_BUILD_EXTRAS=postgres, mysql or "
            "libsql) so requirements.txt carries its driver"
        )
    notes.extend(_pinned_note(app))
    return BuildResult(preset=ctx.preset, path=dest, files=files, notes=notes)


def requirements_note(extras: list[str]) -> str:
    """What requirements.txt was derived from, and the variable that adds to it."""
    chosen = os.environ.get("HAZE_BUILD_EXTRAS", "").strip()
    given = f" and HAZE_BUILD_EXTRAS={chosen}" if chosen else ""
    return (
        f"requirements.txt: the dependencies of {_haze_jobs(extras)}, from the "
        f"app's connections as read now{given}; set HAZE_BUILD_EXTRAS=postgres,... (or "
        "the production URLs) when `haze build` runs, if production's environment picks "
        "other backends"
    )


def _haze_jobs(extras: list[str]) -> str:
    """``haze-jobs[postgres,redis]``, or plain ``haze-jobs`` when no extra is needed."""
    return f"haze-jobs[{','.join(extras)}]" if extras else "haze-jobs"


def _vercel_json(dest: Path) -> dict[str, Any]:
    """The function's settings; it ships the app's folders and haze.config.py."""
    bundled = [n for n in ("config", "app", "database", "haze") if (dest / n).is_dir()]
    if (dest / "haze.config.py").is_file():
        bundled.append("haze.config.py")
    include = "{" + ",".join(f"{n}/**" if (dest / n).is_dir() else n for n in bundled) + "}"
    return {
        "$schema": "https://openapi.vercel.sh/vercel.json",
        "functions": {FUNCTION: {"maxDuration": MAX_DURATION, "includeFiles": include}},
    }


def _pinned_note(app: App) -> list[str]:
    """A note on the jobs pinned to an in-process connection, if any."""
    pinned = sorted(
        j.name
        for j in app_jobs(app)
        if j.connection is not None
        and j.connection in app.queue_config.connections
        and not _is_remote(app, j.connection)
    )
    if not pinned:
        return []
    return [
        f"job(s) {', '.join(pinned)} are pinned to an in-process connection; dispatched "
        "from Vercel they would run in the request or be lost: set HAZE_HTTP_JOBS to "
        "the jobs the function may dispatch"
    ]
