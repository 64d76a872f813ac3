"""``haze build --preset aws-lambda``: the app as an AWS Lambda deployment package.

Writes, under the output directory (``dist/``)::

    aws-lambda/handler.py      sqs, schedule, http and workflows: the haze_lambda handlers
    aws-lambda/config/ app/    the app (and database/, haze.config.py when present)
    aws-lambda/haze/ …         the vendored runtime and haze_lambda
    aws-lambda/**/__pycache__  bytecode of every module (this build's Python; hash-based,
                               so a read-only /var/task never compiles at a cold start)
    aws-lambda.zip             the same files, zipped (deterministic: sorted entries,
                               fixed timestamps), to upload as the function's code

Set the function's handler to ``handler.sqs`` (SQS trigger, with
``ReportBatchItemFailures``), ``handler.schedule`` (an EventBridge schedule draining a
``database`` or ``redis`` connection), ``handler.http`` (API Gateway HTTP API or a
function URL) or ``handler.workflows`` (a durable function running the app's workflows on
Lambda's own engine, for a ``"workflows": "native"`` sqs connection). The handlers boot
the app bundled beside ``handler.py``: the function's ``LAMBDA_TASK_ROOT``
(``HAZE_APP_ROOT``, when set, names another).

Only pure-Python haze code is bundled. Backend clients come from the Lambda runtime
(``boto3`` is part of AWS's Python runtimes) or from a layer: the build notes name the
packages the app's connections need that the runtime does not provide.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from haze._base.errors import ConfigError
from haze._orchestration.scheduling import bundle_packages, platform_triggers
from haze._workflows.lambda_runs import lambda_refusals
from haze.build import BuildContext, BuildResult, compile_bytecode, deterministic_zip
from haze.connectors import dialect_of

if TYPE_CHECKING:
    from haze._app.app import App

__all__ = ["HANDLER_SOURCE", "PACKAGES", "build", "third_party_packages"]

#: Packages vendored beside ``handler.py``.
PACKAGES = ("haze", "haze_lambda")

HANDLER_SOURCE = '''\
"""The AWS Lambda handlers of this haze app, written by `haze build --preset aws-lambda`.

Point the function's handler at one of:

    handler.sqs        an SQS trigger (enable ReportBatchItemFailures)
    handler.schedule   an EventBridge schedule that drains a database/redis connection,
                       or a rule of config/schedule.py (dispatches the schedules due)
    handler.http       an API Gateway HTTP API route or a function URL that dispatches
    handler.workflows  a durable function (durable configuration on) that runs the
                       app's workflows of "workflows": "native" sqs connections

They boot the app bundled beside this file (config/, app/job/) once per execution
environment; set HAZE_APP_ROOT to use another. See haze_lambda for their settings.
"""

from haze_lambda import http_handler as http
from haze_lambda import schedule_handler as schedule
from haze_lambda import sqs_handler as sqs
from haze_lambda import workflow_handler as workflows

__all__ = ["http", "schedule", "sqs", "workflows"]
'''

#: Packages AWS's Python runtimes already provide.
_IN_RUNTIME = {"boto3"}


def third_party_packages(ctx: BuildContext) -> dict[str, list[str]]:
    """pip requirement -> the connections/stores of the app that need it (not bundled)."""
    app = ctx.app
    need: dict[str, list[str]] = {}

    def add(requirement: str, who: str) -> None:
        need.setdefault(requirement, []).append(who)

    for name, options in app.queue_config.connections.items():
        driver = options["driver"]
        if driver == "sqs":
            add("boto3", f"queue connection {name!r}")
        elif driver == "redis":
            add("haze-jobs[redis] (bullmq, redis)", f"queue connection {name!r}")
        elif driver == "cloudflare":
            add("httpx", f"queue connection {name!r}")
    for name, store in app.cache_config.stores.items():
        if store.get("driver") == "redis":
            add("redis", f"cache store {name!r}")
    for name, conn in app.database_config.connections.items():
        scheme = urlsplit(str(conn.get("url") or "")).scheme.lower().split("+")[0]
        requirement = {
            "postgresql": "psycopg[binary,pool]",
            "postgres": "psycopg[binary,pool]",
            "mysql": "aiomysql",
            "mariadb": "aiomysql",
            "libsql": "httpx",
            "https": "httpx",
            "d1": "httpx",
        }.get(scheme)
        if requirement is not None:
            add(requirement, f"database {name!r}")
    return need


def sqlite_warnings(app: App) -> list[str]:
    """One warning per database connection that is a SQLite file as the build reads it:
    every Lambda instance has its own copy of the code and /tmp, so a queue, store or
    failed-jobs table there is seen by one instance only."""
    return [
        f"warning: database {name!r} is a SQLite file as read now; on Lambda it is not "
        "shared between instances (each has its own disk, and the code folder is "
        "read-only), so what one dispatches no other sees: set its URL to PostgreSQL, "
        "MySQL or Turso in the function's environment"
        for name, options in app.database_config.connections.items()
        if dialect_of(str(options.get("url") or "")) == "sqlite"
    ]


def native_workflows(ctx: BuildContext) -> list[str]:
    """The sqs connections whose workflows run on Lambda durable functions; a workflow
    there that needs a rule Lambda cannot honour stops the build with one line."""
    app = ctx.app
    native = [
        name
        for name, options in app.queue_config.connections.items()
        if options.get("driver") == "sqs" and options.get("workflows") == "native"
    ]
    if native:
        app.discover()  # the workflows register when their modules load
        refused = lambda_refusals(app)
        if refused:
            raise ConfigError(refused[0], key="--preset")
    return native


def build(ctx: BuildContext) -> BuildResult:
    """Write the package and its zip (see the module docstring)."""
    files = [ctx.write("handler.py", HANDLER_SOURCE)]
    files += ctx.copy_app(ctx.dest)
    # Checked before anything is zipped: a schedule no EventBridge rule can express
    # stops the build with one line naming it.
    rules = platform_triggers("eventbridge", ctx.root)
    native = native_workflows(ctx)
    durable = ("aws_durable_execution_sdk_python",) if native else ()
    files += ctx.vendor((*PACKAGES, *durable, *bundle_packages(ctx.root)), ctx.dest)
    files += compile_bytecode(ctx.dest)
    archive = deterministic_zip(ctx.dest, ctx.out / f"{ctx.preset}.zip")
    files.append(archive)
    notes = [
        f"upload {archive} as the function's code; handler: handler.sqs, handler.schedule "
        "or handler.http (runtime python3.11 or later)",
    ]
    if rules:
        notes.append(
            "EventBridge rules (UTC) for config/schedule.py, each targeting handler.schedule "
            'with the input {"haze_schedule": "<rule>", "time": <time>} (haze_infra creates '
            "them): " + "; ".join(f"{rule} -> {', '.join(names)}" for rule, names in rules.items())
        )
    if native:
        notes.append(
            f"workflows of {', '.join(native)} run on Lambda durable functions: a function "
            "with handler handler.workflows and a durable configuration (haze_infra makes "
            "it); the AWS durable execution SDK is bundled"
        )
    notes.append(
        f"bytecode compiled for Python {sys.version_info.major}.{sys.version_info.minor} "
        "(this build's): a function on that runtime imports it instead of compiling on "
        "each cold start; build with the runtime's Python to match it"
    )
    notes.extend(sqlite_warnings(ctx.app))
    for requirement, users in sorted(third_party_packages(ctx).items()):
        if requirement in _IN_RUNTIME:
            notes.append(f"{requirement} ({', '.join(users)}) comes with the Lambda Python runtime")
        else:
            notes.append(
                f"{requirement} ({', '.join(users)}) is not bundled: add it to the function "
                "as a Lambda layer (Linux wheels for the function's architecture)"
            )
    return BuildResult(preset=ctx.preset, path=ctx.dest, files=files, notes=notes)
