"""``haze build --preset vercel``, run: the function served by uvicorn, jobs landing on the
real Redis and worked off by ``haze queue:work``.

Real: the built ``dist/vercel/`` (``api/dispatch.py``, the vendored ``haze/``, the
bundled app), its ASGI ``app`` served by uvicorn from ``api/`` in a subprocess, HTTP
requests, the Redis server at 127.0.0.1:6379 (keys under a prefix unique to the test,
deleted afterwards) and a ``haze queue:work`` subprocess consuming it.
Stand-in: Vercel's Python runtime, which loads ``api/dispatch.py`` and serves its ASGI
``app`` (the shape Vercel documents for functions in ``/api``); uvicorn plays that part.
``vercel.json`` is checked against Vercel's documented ``functions`` keys, not deployed;
``requirements.txt`` is not installed (the packages come from this virtualenv).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from haze._base.errors import ConfigError
from haze.build import build
from preset_support import clean_env, lines_of, uvicorn, write_app
from services import server_missing

redis = pytest.importorskip("redis")

SECRET = "vercel-preset-secret"

CONFIG = {
    "config/redis.py": """\
        from haze import define_redis_config, env
        config = define_redis_config(
            default="default",
            connections={"default": {"url": env("REDIS_URL", "redis://127.0.0.1:6379/0")}},
        )
        """,
    "config/queue.py": """\
        from haze import define_queue_config, env
        config = define_queue_config(
            default=env("QUEUE_CONNECTION", "redis"),
            connections={
                "redis": {"driver": "redis", "prefix": env("REDIS_PREFIX", "haze")},
                "memory": {"driver": "memory"},
                "sync": {"driver": "sync"},
            },
        )
        """,
}


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"hz-vercel-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        client.ping()
    except redis.RedisError as e:
        server_missing("Redis", "127.0.0.1:6379", str(e))
    yield name
    keys = list(client.scan_iter(f"{name}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_the_function_dispatches_to_redis_and_a_worker_runs_it(tmp_path: Path, prefix: str) -> None:
    root = write_app(tmp_path / "site", CONFIG, name="vercel_write", timeout="10s")
    result = build(root, "vercel", tmp_path / "dist")
    dest = result.path
    config = json.loads((dest / "vercel.json").read_text())
    function = config["functions"]["api/dispatch.py"]
    assert function["maxDuration"] == 10
    assert function["includeFiles"] == "{config/**,app/**,haze/**}"
    requirements = (dest / "requirements.txt").read_text().splitlines()
    assert "bullmq>=3" in requirements and "redis>=6.2" in requirements
    assert (dest / "haze" / "integrations" / "http_dispatch.py").is_file()

    env = clean_env(REDIS_PREFIX=prefix, HAZE_HTTP_SECRET=SECRET)
    # The function imports the vendored haze, not this virtualenv's.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, sys; runpy.run_path('dispatch.py'); print(sys.modules['haze'].__file__)",
        ],
        cwd=dest / "api",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).is_relative_to(dest / "haze"), probe.stdout

    out = tmp_path / "ran.txt"
    server, base = uvicorn(dest / "api", "dispatch:app", env, "/api/dispatch")
    url = base + "/api/dispatch"
    try:

        def post(body: bytes, headers: dict[str, str]) -> httpx.Response:
            return httpx.post(url, content=body, headers=headers, timeout=30)

        bearer = {"authorization": f"Bearer {SECRET}"}
        job = json.dumps(
            {"job": "vercel_write", "payload": {"file": str(out), "tag": "bearer"}}
        ).encode()
        assert post(job, {}).status_code == 401
        assert post(job, {"authorization": "Bearer nope"}).status_code == 403
        bad = post(b"{not json", bearer)
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]
        unknown = post(b'{"job": "no_such_job"}', bearer)
        assert unknown.status_code == 404
        assert '"no_such_job"' in unknown.json()["error"]
        assert httpx.get(url, timeout=30).status_code == 405

        accepted = post(job, bearer)
        assert accepted.status_code == 202, accepted.text
        signed_body = json.dumps(
            {"job": "vercel_write", "payload": {"file": str(out), "tag": "hmac"}}
        ).encode()
        # the HMAC covers "{timestamp}.{body}"; a timestamp over 5 minutes old is refused
        now = int(time.time())
        stale = now - 301
        for ts, status in ((stale, 401), (now, 202)):
            mac = hmac.new(SECRET.encode(), f"{ts}.".encode() + signed_body, hashlib.sha256)
            headers = {"x-haze-timestamp": str(ts), "x-haze-signature": f"sha256={mac.hexdigest()}"}
            signed = post(signed_body, headers)
            assert signed.status_code == status, signed.text
        untimed = post(signed_body, {"x-haze-signature": headers["x-haze-signature"]})
        assert untimed.status_code == 401
        assert "X-Haze-Timestamp" in untimed.json()["error"]
    finally:
        server.kill()
    assert not lines_of(out), "the function must only dispatch"

    # A worker elsewhere (the app's own checkout here) consumes what the function queued.
    worked = subprocess.run(
        [
            sys.executable,
            "-m",
            "haze.cli",
            "--root",
            str(root),
            "queue:work",
            "--connection",
            "redis",
            "--stop-when-empty",
            "--sleep",
            "0.1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worked.returncode == 0, worked.stdout + worked.stderr
    assert sorted(lines_of(out)) == ["end bearer", "end hmac", "start bearer", "start hmac"]


def test_a_function_must_dispatch_to_a_queue_a_worker_can_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_app(tmp_path / "site", CONFIG, name="vercel_refuse")
    for connection, words in (("memory", "is lost"), ("sync", "inside the request")):
        monkeypatch.setenv("QUEUE_CONNECTION", connection)
        with pytest.raises(ConfigError, match=words) as caught:
            build(root, "vercel", tmp_path / "dist")
        assert "redis or database" in str(caught.value)


DB_CONFIG = {
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
            default="database", connections={"database": {"driver": "database"}}
        )
        """,
}


def test_requirements_carry_the_driver_of_the_apps_database_and_name_the_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_app(tmp_path / "site", DB_CONFIG, name="vercel_db_write")
    monkeypatch.delenv("HAZE_BUILD_EXTRAS", raising=False)
    # the URL production uses, visible to the build: its driver is in requirements.txt
    monkeypatch.setenv("DATABASE_URL", "postgresql://app@db.example.com:5432/app")
    result = build(root, "vercel", tmp_path / "pg")
    assert "psycopg[binary,pool]" in (result.path / "requirements.txt").read_text()
    (note,) = [n for n in result.notes if n.startswith("requirements.txt:")]
    assert "haze-jobs[postgres]" in note and "HAZE_BUILD_EXTRAS" in note, note
    # SQLite as read now: the note says the function needs a server database, and how
    # to get its driver into requirements.txt
    monkeypatch.delenv("DATABASE_URL")
    result = build(root, "vercel", tmp_path / "lite")
    assert "psycopg" not in (result.path / "requirements.txt").read_text()
    (sqlite,) = [n for n in result.notes if "is SQLite as read now" in n]
    assert "HAZE_BUILD_EXTRAS=postgres" in sqlite, sqlite
    # no extra needed: the plain distribution, not an empty "haze-jobs[]"
    text = (result.path / "requirements.txt").read_text()
    (note,) = [n for n in result.notes if n.startswith("requirements.txt:")]
    assert "[]" not in text and "[]" not in note, (text, note)
    assert "the dependencies of haze-jobs " in text and "haze-jobs," in note, (text, note)
    # the override adds what the environment at build time does not show
    monkeypatch.setenv("HAZE_BUILD_EXTRAS", "postgres")
    result = build(root, "vercel", tmp_path / "extras")
    assert "psycopg[binary,pool]" in (result.path / "requirements.txt").read_text()
    assert any("HAZE_BUILD_EXTRAS=postgres" in n for n in result.notes), result.notes
