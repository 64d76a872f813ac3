"""``queue:work --stop-when-empty`` and ``--once`` against a backend that never answered
(a closed port: what a stopped Redis or PostgreSQL looks like to a client) exit 1 with
one line, so a health probe or a CI step built on them can tell; and a worker that
stops while retries wait says how many and when the next is due."""

from __future__ import annotations

import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_procs import db_root


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def haze(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haze.cli", "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def app_on(root: Path, connection: str) -> Path:
    """An app whose default connection is ``connection`` on a closed port."""
    port = closed_port()
    (root / "config").mkdir(parents=True)
    (root / "config" / "database.py").write_text(
        "from haze import define_database_config\n"
        "config = define_database_config(default='main', connections={'main': "
        f"{{'url': 'postgresql://postgres@127.0.0.1:{port}/app'}}}})\n"
    )
    (root / "config" / "redis.py").write_text(
        "from haze import define_redis_config\n"
        "config = define_redis_config(connections={'default': "
        f"{{'url': 'redis://127.0.0.1:{port}/0', 'socket_connect_timeout': '1s'}}}})\n"
    )
    (root / "config" / "cache.py").write_text(
        "from haze import define_cache_config\n"
        "config = define_cache_config(default='memory', stores={'memory': {'driver': 'memory'}})\n"
    )
    (root / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        f"config = define_queue_config(default={connection!r}, store='memory', connections={{"
        "'redis': {'driver': 'redis', 'connection': 'default'},"
        "'database': {'driver': 'database', 'connection': 'main', 'sleep': '50ms',"
        " 'max_sleep': '200ms'}})\n"
    )
    return root


@pytest.mark.parametrize("connection", ["redis", "database"])
@pytest.mark.parametrize("flag", ["--stop-when-empty", "--once"])
def test_a_worker_that_never_reached_its_backend_exits_1(
    tmp_path: Path, connection: str, flag: str
) -> None:
    root = app_on(tmp_path / "app", connection)
    result = haze(root, "queue:work", flag)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert "Worker stopped after" not in result.stdout
    assert (
        f'Error: connection "{connection}" was never reachable, so no queue was read'
        in result.stderr
    ), result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1, result.stderr


def test_stop_when_empty_says_how_many_retries_wait_and_when(tmp_path: Path) -> None:
    root = db_root(tmp_path / "app")
    (root / "app" / "job").mkdir(parents=True)
    (root / "app" / "job" / "flaky.py").write_text(
        "from haze import define_job\n"
        "@define_job(tries=3, backoff=[30])\n"
        "async def flaky(payload: dict) -> None:\n"
        "    raise RuntimeError('not yet')\n"
    )
    (root / "main.py").write_text(
        "from pathlib import Path\n"
        "from haze import App\n"
        "from app.job.flaky import flaky\n"
        "with App(root=Path(__file__).parent):\n"
        "    flaky.dispatch_blocking({})\n"
        "    flaky.dispatch_blocking({})\n"
    )
    subprocess.run([sys.executable, "main.py"], cwd=root, check=True, timeout=60)
    result = haze(root, "queue:work", "--stop-when-empty")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "Worker stopped after 2 job(s).", lines
    waiting = lines[-2]
    assert waiting.startswith("2 job(s) wait for a retry or a delay; the next is due in "), waiting
    due = float(waiting.split("due in ")[1].split("s")[0])
    assert 25 <= due <= 30, waiting
    with sqlite3.connect(root / "q.db") as c:
        (count,) = c.execute("SELECT count(*) FROM jobs").fetchone()
    assert count == 2, "the retries wait in the queue"


def test_stop_when_empty_exits_1_when_its_backend_goes_away_mid_drain(tmp_path: Path) -> None:
    """A Redis that stops after the worker reached it: the failed claim is not an empty
    queue, so the drain must not end with status 0 while the jobs still wait."""
    server = shutil.which("redis-server")
    if server is None:  # the CI image has it (tests/services.py needs it too)
        pytest.skip("redis-server is not installed")
    port = closed_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import redis

        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "the private redis-server did not start"
                time.sleep(0.05)
        root = app_on(tmp_path / "app", "redis")
        config = root / "config" / "redis.py"
        config.write_text(config.read_text().replace(f":{port_of(config)}/", f":{port}/"))
        (root / "app" / "job").mkdir(parents=True)
        (root / "app" / "job" / "stopper.py").write_text(
            "import redis\n"
            "from haze import define_job\n"
            "@define_job\n"
            "async def stopper(payload: dict) -> None:\n"
            "    if payload['n'] == 0:  # the server goes away while the drain goes on\n"
            f"        try:\n            redis.Redis(port={port}).shutdown(nosave=True)\n"
            "        except redis.ConnectionError:\n            pass\n"
        )
        (root / "main.py").write_text(
            "from pathlib import Path\n"
            "from haze import App\n"
            "from app.job.stopper import stopper\n"
            "with App(root=Path(__file__).parent):\n"
            "    for n in range(5):\n"
            "        stopper.dispatch_blocking({'n': n})\n"
        )
        subprocess.run([sys.executable, "main.py"], cwd=root, check=True, timeout=60)
        result = haze(root, "queue:work", "--stop-when-empty")
    finally:
        proc.kill()
        proc.wait(10)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    assert 'connection "redis" became unreachable after 1 job(s)' in errors[0], errors
    assert "Worker stopped after" not in result.stdout


def port_of(config: Path) -> str:
    """The port in the ``redis://127.0.0.1:PORT/0`` URL that ``app_on`` wrote."""
    return config.read_text().split("127.0.0.1:")[1].split("/")[0]
