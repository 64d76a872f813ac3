"""The consumer function of ``haze build --preset vercel`` for an app with a ``vercel``
connection: ``api/queue.py`` (Vercel Queues push mode) and its ``vercel.json`` entry."""

from __future__ import annotations

import math
from typing import Any

from haze._app.app import App
from haze.build import BuildContext
from haze.drivers.vercel import _sdk

__all__ = ["QUEUE_FUNCTION", "QUEUE_MAX_DURATION", "queue_function"]

QUEUE_FUNCTION = "api/queue.py"
#: The consumer's ``maxDuration`` (seconds): Vercel's default ceiling with Fluid compute;
#: a job's ``timeout`` must fit in it (raise it on plans that allow more).
QUEUE_MAX_DURATION = 300

QUEUE_PY = '''\
"""The Vercel Queues consumer made by `haze build --preset vercel` (rebuild rather than edit).

Vercel calls it for each message of the topics its trigger in vercel.json names; it runs
the job through haze and settles the message (acknowledged on success, retried through
the message's visibility with the job's backoff, released without using a try, failed
into the failed store). See haze.integrations.vercel_queue.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# haze is vendored beside the app (it is not on PyPI yet): it must win over any other.
sys.path.insert(0, str(ROOT))

from haze.integrations.vercel_queue import QueueFunction  # noqa: E402

app = QueueFunction(root=ROOT{connection})
'''


def vercel_connections(app: App) -> list[str]:
    return [n for n, o in app.queue_config.connections.items() if o.get("driver") == "vercel"]


def queue_function(ctx: BuildContext, include: str) -> tuple[list[Any], dict[str, Any], str]:
    """Write ``api/queue.py`` for the app's vercel connection; returns the files, its
    ``functions`` entry and a note (nothing when the app has no vercel connection)."""
    names = vercel_connections(ctx.app)
    if not names:
        return [], {}, ""
    default = ctx.app.queue_config.default
    name = default if default in names else names[0]
    options = ctx.app.queue_config.connections[name]
    template = str(options.get("topic") or "haze-{queue}")
    # The group as the SDK names it on the wire ("haze_workers" is "haze__workers"), the
    # name the poll workers and the function's subscriber read as.
    group = str(_sdk().sanitize_name(str(options.get("consumer_group") or "haze")))
    retry_after = math.ceil(float(options.get("retry_after") or 300))  # as the driver rounds
    chosen = "" if len(names) == 1 else f", connection={name!r}"
    files = [ctx.write(QUEUE_FUNCTION, QUEUE_PY.format(connection=chosen))]
    pattern = template.split("{queue}")[0] + "*"
    trigger = {
        "type": "queue/v2beta",
        "topic": pattern,
        "consumer": group,
        "retryAfterSeconds": retry_after,
    }
    entry = {
        "maxDuration": QUEUE_MAX_DURATION,
        "includeFiles": include,
        "experimentalTriggers": [trigger],
    }
    note = (
        f"{QUEUE_FUNCTION}: Vercel Queues calls it for each message of connection {name!r} "
        f"(topics {pattern}, consumer group {group!r}); "
        "set failed_store on the connection so final failures outlive the function"
    )
    return files, {QUEUE_FUNCTION: entry}, note
