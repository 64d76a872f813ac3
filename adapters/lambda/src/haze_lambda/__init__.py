"""haze on AWS Lambda: three handlers ``(event, context)`` for one deployed app.

- ``haze_lambda.sqs_handler``: an SQS trigger; runs the records through the job
  pipeline and returns ``{"batchItemFailures": [...]}`` (see ``haze_lambda.sqs``).
- ``haze_lambda.schedule_handler``: an EventBridge schedule; drains a ``database`` or
  ``redis`` connection for a bounded time (Lambda has no trigger for those queues).
- ``haze_lambda.http_handler``: an API Gateway HTTP API (v2) route or function URL;
  dispatches a named job, authenticated by a bearer token or an HMAC signature
  with a timestamp (refused when over 5 minutes old).

Each boots the app at ``HAZE_APP_ROOT`` (or the bundled app) once per execution
environment and runs on one persistent event loop (see ``haze_lambda._boot``).
- ``haze_lambda.workflow_handler``: a durable function (AWS durable execution SDK)
  running the app's workflows on Lambda's own engine (``haze_lambda.workflows``).

``dist/aws-lambda/handler.py`` (``haze build --preset aws-lambda``) re-exports them as
``sqs``, ``schedule``, ``http`` and ``workflows``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from haze_lambda._boot import app_root, boot, reset, run
    from haze_lambda.http import http_handler
    from haze_lambda.schedule import schedule_handler
    from haze_lambda.sqs import sqs_handler
    from haze_lambda.workflows import workflow_handler

__all__ = [
    "app_root",
    "boot",
    "http_handler",
    "reset",
    "run",
    "schedule_handler",
    "sqs_handler",
    "workflow_handler",
]

# A Lambda handler string names one of these; only its module (and what it uses) is
# loaded, on first access (cold start).
_LAZY = {
    "app_root": "_boot",
    "boot": "_boot",
    "reset": "_boot",
    "run": "_boot",
    "http_handler": "http",
    "schedule_handler": "schedule",
    "sqs_handler": "sqs",
    "workflow_handler": "workflows",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
