"""``haze build --preset server``, run: ``uvicorn app:app`` in ``dist/server``.

Real: the built ``dist/server/`` (its ``app.py`` and the bundled app in ``haze_app/``),
uvicorn in a subprocess (its environment has no pytest in it, since ``run_in_server``
stays off under pytest), HTTP requests to it, the in-server worker on a SQLite queue, and
SIGTERM to uvicorn. Not exercised: installing ``requirements.txt`` (the docker preset's
test installs the same kind of file into a fresh virtualenv); uvicorn and haze come
from this virtualenv.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from haze.build import build
from haze.integrations.http_dispatch import signed_headers
from preset_support import clean_env, lines_of, make_queue_tables, uvicorn, wait_until, write_app

posix = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

SECRET = "server-preset-secret"

#: uvicorn (0.29+) re-raises the signal it caught after a graceful shutdown.
CLEAN_EXIT = (0, -signal.SIGTERM)

CONFIG = {
    "config/database.py": """\
        from haze import define_database_config, env
        config = define_database_config(
            default="main",
            connections={"main": {"url": env("DATABASE_URL", "sqlite:///storage/app.db")}},
        )
        """,
    "config/queue.py": """\
        from haze import define_queue_config
        config = define_queue_config(
            default="database",
            connections={"database": {"driver": "database", "sleep": 0.05, "max_sleep": 0.2}},
            run_in_server=True,
        )
        """,
}


@posix
def test_uvicorn_serves_dispatch_and_health_and_drains_the_worker(tmp_path: Path) -> None:
    root = write_app(tmp_path / "site", CONFIG, name="server_write", timeout="10s")
    make_queue_tables(root)
    result = build(root, "server", tmp_path / "dist")
    dest = result.path
    assert (dest / "app.py").is_file()
    assert (dest / "haze_app" / "app" / "job" / "server_write.py").is_file()
    requirements = (dest / "requirements.txt").read_text()
    assert "uvicorn" in requirements and "--find-links ./wheels" in requirements
    assert any("at least 15s" in n for n in result.notes), result.notes

    env = clean_env(
        DATABASE_URL=f"sqlite:///{tmp_path / 'queue.db'}",
        HAZE_HTTP_SECRET=SECRET,
        HAZE_HTTP_MAX_BODY="10MB",
    )
    migrated = subprocess.run(
        [sys.executable, "-m", "haze.cli", "--root", "haze_app", "db:migrate"],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr

    server, base = uvicorn(dest, "app:app", env, "/health")
    out = tmp_path / "ran.txt"
    try:
        health = httpx.get(base + "/health", timeout=30)
        assert health.status_code == 200, health.text
        assert health.json()["reachable"] is True

        job = {"job": "server_write", "payload": {"file": str(out), "tag": "quick"}}
        denied = httpx.post(base + "/dispatch", json=job, timeout=30)
        assert denied.status_code == 401
        assert "authentication required" in denied.json()["error"]
        bearer = {"authorization": f"Bearer {SECRET}"}
        unknown = httpx.post(base + "/dispatch", json={"job": "nope"}, headers=bearer, timeout=30)
        assert unknown.status_code == 404
        assert httpx.get(base + "/elsewhere", timeout=30).status_code == 404

        raw_job = json.dumps(job).encode()
        stale = signed_headers(raw_job, SECRET, timestamp=int(time.time()) - 301)
        replayed = httpx.post(base + "/dispatch", content=raw_job, headers=stale, timeout=30)
        assert replayed.status_code == 401
        assert "X-Haze-Timestamp" in replayed.json()["error"]
        signed = signed_headers(raw_job, SECRET)
        accepted = httpx.post(base + "/dispatch", content=raw_job, headers=signed, timeout=30)
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["job"] == "server_write"
        assert wait_until(lambda: "end quick" in lines_of(out), 60), server.output

        slow = {"job": "server_write", "payload": {"file": str(out), "tag": "slow", "seconds": 3}}
        raw = json.dumps(slow).encode()
        assert httpx.post(base + "/dispatch", content=raw, headers=bearer, timeout=30).is_success
        assert wait_until(lambda: "start slow" in lines_of(out), 60), server.output
        server.proc.send_signal(signal.SIGTERM)
        code = server.wait(timeout=90)
    finally:
        server.kill()
    assert code in CLEAN_EXIT, server.output
    assert lines_of(out) == ["start quick", "end quick", "start slow", "end slow"]
