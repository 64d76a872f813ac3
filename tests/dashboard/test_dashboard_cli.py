"""``haze dashboard``: what it refuses, in one line each (serving it is covered by the
browser tests, which start it as a process with a password)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from haze.cli import get_cli

sys.path.insert(0, str(Path(__file__).parent.parent / "drivers"))
from redis_spec import REDIS_URL, delete_prefix, redis_reachable, unique_prefix
from services import server_missing


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


def test_closes_the_apps_connections_when_stopped(tmp_path: Path) -> None:
    # The dashboard's app opens its Redis connections on the first page; Ctrl-C must
    # close them (an unclosed one shows as a ResourceWarning when the process exits).
    if not redis_reachable():
        server_missing("Redis", REDIS_URL)
    prefix = unique_prefix("dashcli")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        "config = define_queue_config(default='main', connections={'main': "
        f"{{'driver': 'redis', 'url': {REDIS_URL!r}, 'prefix': {prefix!r}}}}})\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {**os.environ, "HAZE_ENV": "local", "PYTHONWARNINGS": "always::ResourceWarning"}
    env.pop("HAZE_DASHBOARD_PASSWORD", None)
    haze = Path(sys.executable).with_name("haze")
    proc = subprocess.Popen(
        [str(haze), "--root", str(tmp_path), "dashboard", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                for path in ("/", "/failed", "/workers"):
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                        assert r.status == 200
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "did not start"
                time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        delete_prefix(prefix)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "unclosed" not in text.lower(), text
    assert "Traceback" not in text, text
