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
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from test_lambda_runtime import lam_app as _lam_app  # noqa: F401 - the module fixture
from test_lambda_runtime import outputs, runtime, scheduled_event

SCHEDULE_TEMPLATE = """
from haze import schedule

from app.job.lam_jobs import lam_ok

schedule(lam_ok.with_({{"k": "paris"}}).on_connection("database"),
         cron="{minute} {paris_hour} * * *", tz="Europe/Paris", name="paris")
schedule(lam_ok.with_({{"k": "hourly"}}).on_connection("database"), cron="{minute} * * * *",
         name="hourly")
"""


def this_minute() -> datetime:
    """The current UTC minute: a tick is only dispatched within the grace window of its
    time, so the schedules are written to be due now."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    if datetime.now(UTC).second >= 50:  # not across a minute's end mid-test
        now += timedelta(minutes=1)
        time.sleep((now - datetime.now(UTC)).total_seconds())
    return now


def schedules_due_at(lam_app: dict[str, Any], at: datetime) -> str:
    """Write config/schedule.py with "paris" (09:30-style, in Paris time) and "hourly"
    both due at ``at``; returns the EventBridge rule of both."""
    paris_hour = at.astimezone(ZoneInfo("Europe/Paris")).hour
    text = SCHEDULE_TEMPLATE.format(minute=at.minute, paris_hour=paris_hour)
    (lam_app["root"] / "config" / "schedule.py").write_text(text)
    return f"cron({at.minute} * * * ? *)"


def iso(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def lam_app(_lam_app: dict[str, Any]) -> dict[str, Any]:  # noqa: F811
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
    at = this_minute()
    rule = schedules_due_at(lam_app, at)
    with runtime(lam_app, "haze_lambda.schedule_handler") as api:
        # the Paris schedule's hour is Paris time: both schedules of the rule are due
        kind, response = api.invoke(rule_event(rule, iso(at)))
        assert kind == "response", response
        assert response == {
            "schedule": rule,
            "time": at.isoformat(),
            "dispatched": ["paris", "hourly"],
        }
        # The rule delivered twice: claimed in the store, dispatched once.
        kind, response = api.invoke(rule_event(rule, iso(at)))
        assert response["dispatched"] == []
        # EventBridge's time may carry seconds: the same minute, the same tick.
        kind, response = api.invoke(rule_event(rule, iso(at + timedelta(seconds=12))))
        assert response["dispatched"] == []
        assert queued(lam_app) == [
            ("lam_ok", "paris", at.isoformat()),
            ("lam_ok", "hourly", at.isoformat()),
        ]
        # A bad time is one clear error through the runtime.
        kind, error = api.invoke(rule_event(rule, "yesterday"))
        assert kind == "error"
        assert error["errorType"] == "ScheduleError"
        assert "'yesterday' is not an ISO 8601 time" in error["errorMessage"]
        # Any other EventBridge event still drains the database queue.
        kind, response = api.invoke(scheduled_event())
        assert kind == "response", response
        assert response["processed"] == 2
    ran = sorted(o["payload"]["k"] for o in outputs(lam_app) if o["job"] == "lam_ok")
    assert ran == ["hourly", "paris"]


def test_a_tick_outside_the_grace_window_is_skipped_and_logged(lam_app: dict[str, Any]) -> None:
    """A tick 5 hours late (an event stuck in Lambda's async queue) or a day early (a
    wrong clock, a replayed event) is not dispatched; the skip is logged."""
    at = this_minute()
    rule = schedules_due_at(lam_app, at)
    late, early = at - timedelta(hours=5), at + timedelta(days=1)
    with runtime(lam_app, "haze_lambda.schedule_handler") as api:
        for when, word in ((late, "late"), (early, "early")):
            kind, response = api.invoke(rule_event(rule, iso(when)))
            assert kind == "response", response
            assert response["dispatched"] == [], response
            assert response["skipped"] == word
    log = (lam_app["root"] / "haze_lambda_schedule_handler.log").read_text(errors="replace")
    skips = [line for line in log.splitlines() if "grace" in line]
    assert len(skips) == 2, log[-3000:]
    assert "late" in skips[0] and "early" in skips[1]
    assert not [j for j in queued(lam_app) if j[2] in (late.isoformat(), early.isoformat())]
