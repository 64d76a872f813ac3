"""The dashboard's Workflows pages over HTTP, on SQLite, PostgreSQL, MariaDB and Redis:
the runs with their state and wait, one run's steps (state, attempts, duration, result
size), filters, escaping, and one clear page for an unknown run or a bad filter.

The runs are made by one ``App`` and a real worker (as a worker process would) and the
dashboard reads them through another, as in production (``test_dashboard_http``'s
backends)."""

from __future__ import annotations

import html as html_lib
import json
import re
from typing import Any

from haze import App, Workflow, workflow
from test_dashboard_http import XSS, Backend, backend, client, drain

__all__ = ["backend"]  # the fixture, shared


def declined() -> None:
    raise ValueError("card declined")


@workflow(name="dash.flow")
async def flow(run: Any, who: str) -> Any:
    await run.step("fetch", lambda: {"who": who, "pad": "x" * 100})
    if who == "fails":
        await run.step("charge", declined, tries=2)
    if who == "waits":
        await run.wait_for_event(XSS, timeout="7d")
    return {"ok": who}


def _rows(page: str) -> dict[str, str]:
    return {
        m[1]: m[2] for m in re.finditer(r'<tr data-(?:id|step)="([^"]+)">(.*?)</tr>', page, re.S)
    }


def test_runs_list_and_run_pages(backend: Backend) -> None:
    async def make(app: App) -> list[str]:
        ids = [await Workflow.start(flow, who=w, id=f"run-{w}") for w in ("done", "fails", "waits")]
        await drain(app)
        return ids

    backend.run(make)
    c = client(backend)
    listing = c.get("/workflows")
    assert listing.status_code == 200
    rows = _rows(listing.text)
    assert "done" in rows["run-done"] and "failed" in rows["run-fails"]
    assert "waiting" in rows["run-waits"]
    assert "&lt;script&gt;alert(" in rows["run-waits"]  # the event it waits for, escaped
    assert "<script>alert" not in listing.text

    only = _rows(c.get("/workflows", params={"state": "failed"}).text)
    assert list(only) == ["run-fails"]
    assert _rows(c.get("/workflows", params={"name": "other"}).text) == {}

    page = c.get("/workflows/run-fails").text
    steps = {
        name: html_lib.unescape(re.sub(r"<[^>]+>", "|", row)) for name, row in _rows(page).items()
    }
    fetch = [cell for cell in steps["fetch"].split("|") if cell.strip()]
    charge = [cell for cell in steps["charge"].split("|") if cell.strip()]
    assert fetch[2:5] == ["step", "done", "1"], fetch  # kind, state, attempts
    assert fetch[5].endswith(" ms") or fetch[5].endswith(" s"), fetch  # its duration
    size = len(json.dumps({"who": "fails", "pad": "x" * 100}, separators=(",", ":")))
    assert fetch[6] == f"{size} B", fetch
    assert charge[3].startswith("failed: ValueError: card declined"), charge
    assert charge[4] == "2", charge
    assert "card declined" in page

    waits = c.get("/workflows/run-waits").text
    assert 'id="run-wait"' in waits and "&lt;script&gt;alert(" in waits
    assert "<script>alert" not in waits

    assert c.get("/workflows/no-such-run").status_code == 404
    bad = c.get("/workflows", params={"state": "asleep"})
    assert bad.status_code == 400 and "unknown run state" in bad.text
