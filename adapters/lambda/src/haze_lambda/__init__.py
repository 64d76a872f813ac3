"""haze on AWS Lambda: three handlers ``(event, context)`` for one deployed app.

- ``haze_lambda.sqs_handler``: an SQS trigger; runs the records through the job
  pipeline and returns ``{"batchItemFailures": [...]}`` (see ``haze_lambda.sqs``).
- ``haze_lambda.schedule_handler``: an EventBridge schedule; drains a ``database`` or
  ``redis`` connection for a bounded time (Lambda has no trigger for those queues).
- ``haze_lambda.http_handler``: an API Gateway HTTP API (v2) route or function URL;
  dispatches a named job, authenticated by a bearer token or an HMAC signature.

Each boots the app at ``HAZE_APP_ROOT`` (or the bundled app) once per execution
environment and runs on one persistent event loop (see ``haze_lambda._boot``).
``dist/aws-lambda/handler.py`` (``haze build --preset aws-lambda``) re-exports them as
``sqs``, ``schedule`` and ``http``.
"""

from __future__ import annotations

from ._boot import app_root, boot, reset, run
from .http import http_handler
from .schedule import schedule_handler
from .sqs import sqs_handler

__all__ = ["app_root", "boot", "http_handler", "reset", "run", "schedule_handler", "sqs_handler"]
