"""The Worker entry's ``scheduled()`` (Cron Triggers) inside REAL Pyodide under Node.js.

Real: Pyodide, the haze, haze_cloudflare, cronsim and tzdata wheels (the build vendors
cronsim and tzdata into the bundle the same way), the app's config/schedule.py loaded by
the generated entry, the JS controller object. Stand-in: Cloudflare's Queue binding and
KV (``cf_queue_sim.js``, as in test_cf_pyodide.py). Miniflare's own scheduled trigger is
driven in test_cf_miniflare.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cf_build import haze_wheels, pure_wheel, pyodide_node, run_pyodide

pytestmark = pytest.mark.pyodide

HERE = Path(__file__).resolve().parent


def _package_wheel(out: Path, module: str, name: str | None = None) -> Path:
    """A wheel of an installed pure-Python package (its files as installed here)."""
    imported = __import__(module)
    src = Path(imported.__file__).parent
    files = {
        f"{module}/{p.relative_to(src).as_posix()}": p.read_bytes()
        for p in sorted(src.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }
    return pure_wheel(out, name or module, files)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    node = pyodide_node()
    out = tmp_path_factory.mktemp("cf-sched")
    wheels = [
        *haze_wheels(tmp_path_factory),
        _package_wheel(out, "cronsim"),
        _package_wheel(out, "tzdata"),
        _package_wheel(out, "cf_sched_app"),
    ]
    script = out / "cf_scheduled.py"
    sim = (HERE / "cf_queue_sim.js").read_text()
    script.write_text(
        f"SIM_JS = {json.dumps(sim)}\n" + (HERE / "cf_scheduled_scenarios.py").read_text()
    )
    result: dict[str, Any] = run_pyodide(node, script, 180, wheels)
    if not result["scheduled"]["ok"]:
        pytest.fail(f"scheduled() raised inside Pyodide:\n{result['scheduled']['error']}")
    return result


def test_triggers_of_the_app(outcome: dict[str, Any]) -> None:
    assert outcome["triggers"]["value"] == {
        "30 * * * *": ["paris", "hourly"],
        "*/15 * * * *": ["quarter"],
    }


def test_scheduled_dispatches_the_schedules_due_in_their_zone(outcome: dict[str, Any]) -> None:
    v = outcome["scheduled"]["value"]
    assert v["fired"] == {
        "summer": ["paris", "hourly"],
        "again": [],
        "later": ["hourly"],
        "winter": ["paris", "hourly"],
        "quarter": ["quarter"],
        "unknown": [],
    }
    expected = [
        ["paris", "2026-07-01T07:30:00+00:00"],
        ["hourly", "2026-07-01T07:30:00+00:00"],
        ["hourly", "2026-07-01T08:30:00+00:00"],
        ["paris", "2026-12-01T08:30:00+00:00"],
        ["hourly", "2026-12-01T08:30:00+00:00"],
        ["quarter", "2026-12-01T08:45:00+00:00"],
    ]
    assert v["sends"] == expected
    assert sorted(v["ran"]) == sorted(expected)  # queue() ran each dispatched job once
    assert v["left"] == 0
