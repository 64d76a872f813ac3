"""``haze dashboard``: what it refuses, in one line each (serving it is covered by the
browser tests, which start it as a process with a password)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from haze.cli import get_cli


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "queue.py").write_text(
        textwrap.dedent("""\
            from haze import define_queue_config
            config = define_queue_config(default="main", connections={"main": {"driver": "memory"}})
            """)
    )
    return tmp_path


def run(root: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    base = {"HAZE_ENV": "", "APP_ENV": "", "HAZE_DASHBOARD_PASSWORD": ""}
    result = CliRunner().invoke(
        get_cli(), ["--root", str(root), "dashboard", *args], env={**base, **(env or {})}
    )
    return result.exit_code, result.output


def test_refuses_to_serve_a_dashboard_nobody_may_open(root: Path) -> None:
    code, out = run(root)
    assert code == 1
    assert "the dashboard would refuse every request" in out
    assert "HAZE_DASHBOARD_PASSWORD" in out and "HAZE_ENV=local" in out
    assert "Traceback" not in out


def test_unknown_connection_and_bad_port_are_one_line(root: Path) -> None:
    code, out = run(root, "--connection", "nope", env={"HAZE_ENV": "local"})
    assert code == 1
    assert "unknown queue connection 'nope'" in out
    code, out = run(root, "--port", "0", env={"HAZE_ENV": "local"})
    assert code == 2
    assert "--port" in out


def test_queue_work_refuses_a_bad_metrics_retention_at_start(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "database.py").write_text(
        "from haze import define_database_config\n"
        f"config = define_database_config(default='db', connections={{'db': {{'url': 'sqlite:///{db}'}}}})\n"
    )
    (tmp_path / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        "config = define_queue_config(default='main', connections={'main': {'driver': 'database'}})\n"
    )
    for value, message in (("lots", "HAZE_METRICS_RETENTION='lots'"), ("10s", "from 1m to 7d")):
        result = CliRunner().invoke(
            get_cli(),
            ["--root", str(tmp_path), "queue:work", "--stop-when-empty"],
            env={"HAZE_METRICS_RETENTION": value},
        )
        assert result.exit_code == 1, result.output
        assert message in result.output
        assert "Traceback" not in result.output
