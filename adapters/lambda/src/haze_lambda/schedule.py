"""``haze_lambda.schedule_handler``: drain a database or Redis queue from an EventBridge
schedule.

Lambda has no trigger for haze's ``database`` and ``redis`` queues (nothing pushes
their jobs to a function), so a schedule (an EventBridge rule ``rate(1 minute)`` or an
EventBridge Scheduler schedule) invokes this handler, which runs a ``haze.worker.Worker``
on the connection with ``stop_when_empty`` and a time budget:

    max_time = min(remaining time of the invocation - margin, configured max_time)

The worker stops claiming when the queues are empty or the budget is spent, and waits
for the jobs it is running (give jobs a ``timeout`` below the margin: a job still running
when Lambda kills the invocation is reclaimed after the connection's ``retry_after``).

Settings, from the event's ``detail`` (an EventBridge Scheduler input or a rule's
constant input may also put them at the top level), else the environment:

- ``connection`` / ``HAZE_SCHEDULE_CONNECTION``: default: the app's default connection
- ``queues`` / ``HAZE_SCHEDULE_QUEUES`` (comma-separated): default: the connection's
- ``max_time`` / ``HAZE_SCHEDULE_MAX_TIME``: a duration; default: no cap but the deadline
- ``concurrency`` / ``HAZE_SCHEDULE_CONCURRENCY``: default: the connection's
- ``HAZE_SCHEDULE_MARGIN``: time kept back before the deadline, default ``10s``

The environment's values are read when the function boots: a bad one fails the boot with
one line naming the variable and its value.

An event with ``haze_schedule`` is a rule of ``config/schedule.py`` instead: the
handler dispatches the schedules due (see :func:`schedule_handler`), it drains nothing.

The response counts what ran: ``{"connection", "queues", "processed", "outcomes":
{"done": n, "retry": n, ...}, "max_time", "stopped": "empty" | "time"}``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on the first invocation, not at import (cold start)
    from haze import App

from haze_lambda._boot import run

__all__ = ["schedule_handler"]

log = logging.getLogger("haze.lambda")

_DRAINABLE = ("database", "redis")


def _setting(event: dict[str, Any], key: str) -> Any:
    detail = event.get("detail")
    if isinstance(detail, dict) and detail.get(key) is not None:
        return detail[key]
    if event.get(key) is not None:
        return event[key]
    return None


def _budget(event: dict[str, Any], context: Any) -> float | None:
    """Seconds the drain may run: ``max_time``, cut to the invocation's time left less
    ``HAZE_SCHEDULE_MARGIN`` (None: no limit)."""
    from haze.driver_api import env_duration, parse_duration

    configured = _setting(event, "max_time")
    cap: float | None = (
        parse_duration(configured, "max_time")
        if configured is not None
        else env_duration("HAZE_SCHEDULE_MAX_TIME", -1.0)
    )
    if cap is not None and cap < 0:
        cap = None
    margin = env_duration("HAZE_SCHEDULE_MARGIN", 10.0)
    budget = cap
    get_remaining = getattr(context, "get_remaining_time_in_millis", None)
    if get_remaining is not None:
        left = float(get_remaining()) / 1000.0 - margin
        budget = left if budget is None else min(budget, left)
    return budget


def _concurrency(app: App, event: dict[str, Any], connection: str) -> int:
    from haze.contracts.driver import Concurrent
    from haze.driver_api import env

    driver = app.driver(connection)
    return int(
        _setting(event, "concurrency")
        or env("HAZE_SCHEDULE_CONCURRENCY", 0)
        or (driver.concurrency if isinstance(driver, Concurrent) else 1)
        or 1
    )


async def _drain(app: App, event: dict[str, Any], context: Any) -> dict[str, Any]:
    connection = app.connection_name(
        _setting(event, "connection") or os.environ.get("HAZE_SCHEDULE_CONNECTION") or None
    )
    kind = app.queue_config.connections[connection]["driver"]
    if kind not in _DRAINABLE:
        raise ValueError(
            f"haze_lambda.schedule_handler drains database and redis connections; connection "
            f'"{connection}" uses the {kind} driver (an sqs connection uses sqs_handler, a '
            "memory or sync connection has nothing to drain from Lambda)"
        )
    queues = _setting(event, "queues") or os.environ.get("HAZE_SCHEDULE_QUEUES") or None
    if isinstance(queues, str):
        queues = [q.strip() for q in queues.split(",") if q.strip()]
    budget = _budget(event, context)
    result: dict[str, Any] = {
        "connection": connection,
        "queues": queues,
        "processed": 0,
        "outcomes": {},
        "max_time": budget,
    }
    if budget is not None and budget <= 0:
        result["stopped"] = "time"
        return result
    concurrency = _concurrency(app, event, connection)
    outcomes: dict[str, int] = {}

    def on_job(job: Any, outcome: str, seconds: float) -> None:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    started = time.monotonic()
    from haze.driver_api import Worker

    worker = Worker(
        app, connection, queues, concurrency, max_time=budget, stop_when_empty=True, on_job=on_job
    )
    processed = await worker.run()
    elapsed = time.monotonic() - started
    result.update(
        processed=processed,
        outcomes=outcomes,
        seconds=round(elapsed, 3),
        stopped="time" if budget is not None and elapsed >= budget else "empty",
    )
    return result


async def _dispatch_schedules(app: App, trigger: str, when: Any) -> dict[str, Any]:
    from datetime import UTC, datetime

    from haze.driver_api import MISFIRE_GRACE, ScheduleError, dispatch_trigger

    if when is None:
        at = datetime.now(UTC)
    else:
        try:
            at = datetime.fromisoformat(str(when).replace("Z", "+00:00"))
        except ValueError:
            raise ScheduleError(
                f"haze_lambda.schedule_handler: the event's time {when!r} is not an ISO 8601 "
                'time; the rule\'s input should carry "time": <time> (haze_infra writes it)'
            ) from None
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
    answer: dict[str, Any] = {"schedule": str(trigger), "time": at.isoformat()}
    # The scheduler's misfire grace: a tick older than it was missed (and its claim in
    # the store may be gone, so a late copy could run it twice); one ahead of the clock
    # is not due yet.
    off = datetime.now(UTC).timestamp() - at.timestamp()
    if abs(off) > MISFIRE_GRACE:
        word = "late" if off > 0 else "early"
        log.warning(
            "haze_lambda.schedule_handler: skipped the tick of %s at %s: it arrived %.0fs "
            "%s, outside the %gs grace window (an event held in Lambda's retry queue, or "
            "a clock that is off)",
            trigger,
            at.isoformat(),
            abs(off),
            word,
            MISFIRE_GRACE,
        )
        return {**answer, "dispatched": [], "skipped": word}
    fired = await dispatch_trigger(app, "eventbridge", str(trigger), at)
    return {**answer, "dispatched": fired}


def schedule_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda handler for an EventBridge schedule.

    An event carrying ``haze_schedule`` (the rules ``haze_infra`` creates for
    ``config/schedule.py``: ``{"haze_schedule": "cron(0 9 * * ? *)", "time": <time>}``)
    dispatches the app's schedules of that rule that are due at ``time``; the answer is
    ``{"schedule", "time", "dispatched": [names]}``; a ``time`` more than the
    scheduler's grace window (60 s) from now is skipped with a warning
    (``"skipped": "late"`` or ``"early"``). Any other event drains a
    database/redis connection (see the module docstring).
    """
    event = event or {}
    trigger = _setting(event, "haze_schedule")
    if trigger is not None:
        when = _setting(event, "time")
        return run(lambda app: _dispatch_schedules(app, trigger, when))
    return run(lambda app: _drain(app, event, context))
