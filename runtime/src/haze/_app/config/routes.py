"""The ``routes`` table of ``config/queue.py`` checked as the app starts: each row is
job-name glob -> ``{"queue": ..., "connection": ...}`` (one or both), and a mistake is
one ``ConfigError`` naming the row.

>>> # routes={"mail.*": {"queue": "mail"}, "reports.Nightly": {"connection": "sqs"}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from haze._app.config.checks import Checks
from haze._base.hints import did_you_mean
from haze._base.message import check_queue_name, redis_key_part_error
from haze._base.routes import JobRoute, JobRoutes

__all__ = ["validate_routes"]

_ROUTE_KEYS = ("queue", "connection")
_EXAMPLE = '{"queue": "mail"} or {"connection": "sqs"}'


def validate_routes(
    v: Checks, value: object, connections: Mapping[str, Mapping[str, Any]], default: str
) -> JobRoutes:
    """The checked table of ``routes`` (empty when the config has none)."""
    if value is None:
        return JobRoutes()
    if not isinstance(value, Mapping):
        raise v.fail(
            "routes",
            f"expected a dict of job-name pattern -> {_EXAMPLE}, got {type(value).__name__}",
        )
    return JobRoutes(
        tuple(_route(v, pattern, row, connections, default) for pattern, row in value.items())
    )


def _route(
    v: Checks,
    pattern: object,
    row: object,
    connections: Mapping[str, Mapping[str, Any]],
    default: str,
) -> JobRoute:
    if not isinstance(pattern, str) or not pattern.strip():
        raise v.fail(
            "routes",
            f"a route's pattern is a job name or a glob such as 'mail.*', got {pattern!r}",
        )
    key = f"routes[{pattern!r}]"
    if pattern != pattern.strip():
        raise v.fail(key, "a pattern cannot start or end with whitespace (no job name does)")
    if not isinstance(row, Mapping):
        raise v.fail(key, f"expected a dict such as {_EXAMPLE}, got {row!r}")
    for k in row:
        if k not in _ROUTE_KEYS:
            hint = did_you_mean(str(k), _ROUTE_KEYS)
            raise v.fail(f"{key}.{k}", f"unknown option{hint}; a route takes: queue, connection")
    queue, connection = row.get("queue"), row.get("connection")
    if queue is None and connection is None:
        raise v.fail(key, f"names neither a queue nor a connection: write {_EXAMPLE}")
    if connection is not None and (
        not isinstance(connection, str) or connection not in connections
    ):
        raise v.fail(
            f"{key}.connection",
            f"unknown queue connection {connection!r}"
            f"{did_you_mean(str(connection), connections)}; "
            f"connections: {', '.join(connections)}",
        )
    if queue is not None:
        try:
            check_queue_name(queue, "queue")
        except ValueError as e:
            raise v.fail(f"{key}.queue", str(e).removeprefix("queue: ")) from None
        target = connection or default
        if connections[target].get("driver") == "redis" and ":" in queue:
            raise v.fail(f"{key}.queue", redis_key_part_error("a queue name", queue))
    return JobRoute(pattern, queue=queue, connection=connection)
