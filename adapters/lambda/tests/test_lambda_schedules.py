"""``haze_lambda.schedule_handler`` dispatching ``config/schedule.py`` under the real
``awslambdaric`` (the harness of test_lambda_runtime.py: a stand-in Runtime API, a
SQLite database queue and store).

The event is what the EventBridge rule ``haze_infra`` creates delivers: its input
transformer turns the scheduled event into ``{"haze_schedule": "cron(...)", "time":
<the event's time>}``. The same handler still drains a queue for any other event.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from typing import Any

import pytest
from test_lambda_runtime import lam_app as _lam_app  # noqa: F401 - the module fixture
from test_lambda_runtime import outputs, runtime, scheduled_event

SCHEDULE_PY = """
from haze import schedule

from app.job.lam_jobs import lam_ok

schedule(lam_ok.with_({"k": "paris"}).on_connection("database"), cron="30 9 * * *",
         tz="Europe/Paris", name="paris")
schedule(lam_ok.with_({"k": "hourly"}).on_connection("database"), cron="30 * * * *",
         name="hourly")
"""


@pytest.fixture(scope="module")
def lam_app(_lam_app: dict[str, Any]) -> dict[str, Any]:  # noqa: F811
    (_lam_app["root"] / "config" / "schedule.py").write_text(SCHEDULE_PY)
    return _lam_app


def rule_event(trigger: str, time: str) -> dict[str, Any]:
    """The input haze_infra's rule target sends: ``{"haze_schedule", "time": <time>}``."""
    return {"haze_schedule": trigger, "time": time}


def queued(lam_app: dict[str, Any]) -> list[tuple[str, Any, str]]:
    with contextlib.closing(sqlite3.connect(lam_app["db"])) as c:
        rows = c.execute("SELECT payload FROM jobs ORDER BY id").fetchall()
    out = []
    for (raw,) in rows:
        body = json.loads(raw)
        out.append((body["job"], body["payload"]["k"], body["meta"]["fire_at"]))
    return out


def test_schedule_rules_dispatch_the_schedules_due(lam_app: dict[str, Any]) -> None:
    with runtime(lam_app, "haze_lambda.schedule_handler") as api:
        # 07:30 UTC in July is 09:30 in Paris: both schedules of the rule are due.
        kind, response = api.invoke(rule_event("cron(30 * * * ? *)", "2026-07-01T07:30:00Z"))
        assert kind == "response", response
        assert response == {
            "schedule": "cron(30 * * * ? *)",
            "time": "2026-07-01T07:30:00+00:00",
            "dispatched": ["paris", "hourly"],
        }
        # The rule delivered twice: claimed in the store, dispatched once.
        kind, response = api.invoke(rule_event("cron(30 * * * ? *)", "2026-07-01T07:30:00Z"))
        assert response["dispatched"] == []
        # 08:30 UTC is 10:30 in Paris; EventBridge's time may carry seconds.
        kind, response = api.invoke(rule_event("cron(30 * * * ? *)", "2026-07-01T08:30:12Z"))
        assert response["dispatched"] == ["hourly"]
        assert queued(lam_app) == [
            ("lam_ok", "paris", "2026-07-01T07:30:00+00:00"),
            ("lam_ok", "hourly", "2026-07-01T07:30:00+00:00"),
            ("lam_ok", "hourly", "2026-07-01T08:30:00+00:00"),
        ]
        # A bad time is one clear error through the runtime.
        kind, error = api.invoke(rule_event("cron(30 * * * ? *)", "yesterday"))
        assert kind == "error"
        assert error["errorType"] == "ScheduleError"
        assert "'yesterday' is not an ISO 8601 time" in error["errorMessage"]
        # Any other EventBridge event still drains the database queue.
        kind, response = api.invoke(scheduled_event())
        assert kind == "response", response
        assert response["processed"] == 3
    ran = sorted(o["payload"]["k"] for o in outputs(lam_app) if o["job"] == "lam_ok")
    assert ran == ["hourly", "hourly", "paris"]
