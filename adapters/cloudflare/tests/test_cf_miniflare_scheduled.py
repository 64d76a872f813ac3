"""Cron Triggers on Miniflare/workerd (wrangler@4.86.0): ``/cdn-cgi/handler/scheduled``
fires the consumer Worker's ``scheduled()``, which relays ``controller.cron`` and
``controller.scheduledTime`` to ``haze_cloudflare.QueueWorker.scheduled()`` in Pyodide
(Python Workers do not run in workerd offline: see test_cf_miniflare.py). The ticks are
claimed in Miniflare's real D1 and the jobs go through the real local queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cf_build import haze_wheels, miniflare_node, run_miniflare
from test_cf_scheduled import _package_wheel

pytestmark = pytest.mark.pyodide

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    node = miniflare_node()
    out = tmp_path_factory.mktemp("cf-mf-sched")
    wheels = [
        *haze_wheels(tmp_path_factory),
        _package_wheel(out, "cronsim"),
        _package_wheel(out, "tzdata"),
    ]
    result = run_miniflare(node, wheels, HERE / "cf_miniflare_scheduled.py", 240)
    if "error" in result["python"]:
        pytest.fail(f"the scenario raised inside Pyodide:\n{result['python']['error']}")
    return result


def test_workerd_passes_the_trigger_to_scheduled(run: dict[str, Any]) -> None:
    assert [a["status"] for a in run["python"]["answers"]] == [200, 200, 200, 200]
    got = [(s["cron"], s["scheduledTime"]) for s in run["scheduled"]]
    assert got == [
        ("30 * * * *", 1782891000000),
        ("30 * * * *", 1782891000000),
        ("30 * * * *", 1782894600000),
        ("*/15 * * * *", 1796114700000),
    ]


def test_each_due_schedule_is_dispatched_and_run_once(run: dict[str, Any]) -> None:
    assert run["python"]["fired"] == [
        {"cron": "30 * * * *", "names": ["paris", "hourly"]},
        {"cron": "30 * * * *", "names": []},
        {"cron": "30 * * * *", "names": ["hourly"]},
        {"cron": "*/15 * * * *", "names": ["quarter"]},
    ]
    assert sorted(map(tuple, run["python"]["runs"])) == sorted(
        [
            ("paris", "2026-07-01T07:30:00+00:00"),
            ("hourly", "2026-07-01T07:30:00+00:00"),
            ("hourly", "2026-07-01T08:30:00+00:00"),
            ("quarter", "2026-12-01T08:45:00+00:00"),
        ]
    )
    # the claims are rows of the real D1 database
    assert sum(k["key"].startswith("haze:schedule:") for k in run["d1"]["cache_keys"]) >= 4
