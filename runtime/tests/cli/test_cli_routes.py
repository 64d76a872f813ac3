"""``haze queue:routes`` on an app root: the table (pattern, queue, connection, the
registered jobs that take each route and where a definition's own option wins), its
``--json``, the line when there are none, and a bad route as one line."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from haze.cli import get_cli

pytestmark = pytest.mark.usefixtures("isolated_imports")


def haze(root: Path, *args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(get_cli(), ["--root", str(root), *args], env=env)


def app_root(root: Path, routes: str) -> str:
    """An app whose config has ``routes`` and three jobs named ``<uid>.…``."""
    uid = f"cr{uuid.uuid4().hex[:8]}"
    (root / "config").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(
        textwrap.dedent(
            f"""\
            from haze import define_queue_config
            config = define_queue_config(default="mem", connections={{
                "mem": {{"driver": "memory"}}, "side": {{"driver": "memory"}}}},
                routes={routes.replace("UID", uid)})
            """
        )
    )
    (root / "app" / "job").mkdir(parents=True)
    (root / "app" / "job" / "jobs.py").write_text(
        textwrap.dedent(
            f"""\
            from haze import define_job

            @define_job(name="{uid}.mail.welcome")
            async def welcome(payload): ...

            @define_job(name="{uid}.mail.vip", queue="vip")
            async def vip(payload): ...

            @define_job(name="{uid}.report")
            async def report(payload): ...
            """
        )
    )
    return uid


ROUTES = '{"UID.mail.*": {"queue": "mail", "connection": "side"}, "UID.none.*": {"queue": "x"}}'


def test_piped_tables_are_wide_unless_columns_says_otherwise(tmp_path: Path) -> None:
    """Output piped to a script or grep is one row a line, 200 columns wide, whatever
    terminal started it; an exported ``COLUMNS`` is the width asked for (80 at least)."""
    uid = app_root(tmp_path, ROUTES)
    wide = haze(tmp_path, "queue:routes", env={"COLUMNS": None, "LINES": None}).output
    assert f"{uid}.mail.vip (own queue vip wins)" in wide
    assert max(map(len, wide.splitlines())) > 80
    narrow = haze(tmp_path, "queue:routes", env={"COLUMNS": "80"}).output
    assert f"{uid}.mail.vip (own queue vip wins)" not in narrow
    assert max(map(len, narrow.splitlines())) <= 80
    # narrower than 80 counts as 80: tables that narrow cut ids to "…"
    assert haze(tmp_path, "queue:routes", env={"COLUMNS": "60"}).output == narrow


def test_queue_routes_prints_the_table_with_the_jobs_of_each_route(tmp_path: Path) -> None:
    uid = app_root(tmp_path, ROUTES)
    result = haze(tmp_path, "queue:routes")
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"{uid}.mail.*" in out and "mail" in out and "side" in out
    assert f"{uid}.mail.welcome" in out
    assert f"{uid}.mail.vip (own queue vip wins)" in out
    assert "no registered job" in out  # the "none" route
    assert f"{uid}.report" not in out  # no route takes it


def test_queue_routes_json(tmp_path: Path) -> None:
    uid = app_root(tmp_path, ROUTES)
    result = haze(tmp_path, "queue:routes", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["source"].endswith("queue.py")
    mail, none = data["routes"]
    assert (mail["pattern"], mail["queue"], mail["connection"]) == (f"{uid}.mail.*", "mail", "side")
    assert mail["jobs"] == [
        {"job": f"{uid}.mail.vip", "queue": "vip", "connection": "side", "own": ["queue"]},
        {"job": f"{uid}.mail.welcome", "queue": "mail", "connection": "side", "own": []},
    ]
    assert none == {"pattern": f"{uid}.none.*", "queue": "x", "connection": None, "jobs": []}


def test_queue_routes_without_routes_says_how_to_add_one(tmp_path: Path) -> None:
    app_root(tmp_path, "None")
    result = haze(tmp_path, "queue:routes")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("no routes: add routes=")


def test_queue_routes_with_a_route_to_an_unknown_connection_is_one_line(tmp_path: Path) -> None:
    app_root(tmp_path, '{"UID.*": {"connection": "sid"}}')
    result = haze(tmp_path, "queue:routes")
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert "unknown queue connection 'sid' (did you mean 'side'?)" in line, line
    assert "Traceback" not in result.output
