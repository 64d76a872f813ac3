"""The ``failover`` connection: dispatch goes to the first listed connection that can take
the job, and workers consume the real connections.

The main test is all real processes: an app whose ``main`` connection is
``failover: [redis, sqlite]`` with its Redis on a loopback port nothing listens on. A
script dispatches (one job, then a bulk of three); the jobs land in the SQLite table; then
``haze queue:work --connection sqlite --stop-when-empty`` runs them, each job appending a
line to a file. The in-process tests use the live Redis: the first connection takes the
job when it is up, and a payload error is raised rather than failed over.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from haze import (
    App,
    BackendUnavailableError,
    ConfigError,
    PayloadTooLargeError,
    Queue,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze.connectors.migrations import ensure_queue_tables
from redis_spec import REDIS_URL, needs_redis

pytestmark = pytest.mark.timeout(120)


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("HAZE_APP_ROOT", None)
    e.update(PYTHONUNBUFFERED="1", COLUMNS="200")
    return e


def write_app(root: Path, redis_port: int) -> Path:
    files = {
        "config/queue.py": """
            from haze import define_queue_config
            config = define_queue_config(
                default="main",
                connections={
                    "main": {"driver": "failover", "connections": ["redis", "sqlite"]},
                    "redis": {"driver": "redis", "connection": "default"},
                    "sqlite": {"driver": "database", "connection": "local"},
                },
                store="memory",
            )
        """,
        "config/redis.py": f"""
            from haze import define_redis_config
            config = define_redis_config(default="default", connections={{
                "default": {{"url": "redis://127.0.0.1:{redis_port}/0"}}}})
        """,
        "config/database.py": """
            from haze import define_database_config
            config = define_database_config(default="local", connections={
                "local": {"url": "sqlite:///storage/queue.db"}})
        """,
        "app/job/record.py": """
            import os
            from haze import define_job

            @define_job(name="failover_record")
            async def failover_record(payload: dict) -> None:
                with open(os.environ["FAILOVER_RUNS"], "a") as f:
                    f.write(payload["k"] + "\\n")
        """,
        "dispatch.py": """
            import asyncio
            from haze import App, Queue

            async def main() -> None:
                async with App(root="."):
                    from app.job.record import failover_record
                    await failover_record.dispatch({"k": "single"})
                    await Queue.bulk([failover_record.with_({"k": f"bulk{i}"}) for i in range(3)])

            asyncio.run(main())
        """,
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


async def make_tables(root: Path) -> None:
    async with App(root=root) as app:
        await ensure_queue_tables(app, "sqlite")


def test_a_dead_redis_fails_over_to_sqlite_and_a_sqlite_worker_runs_the_jobs(
    tmp_path: Path,
) -> None:
    root = write_app(tmp_path / "app", dead_port())
    asyncio.run(make_tables(root))
    runs = tmp_path / "runs.txt"
    e = {**env(), "FAILOVER_RUNS": str(runs)}

    sent = subprocess.run(
        [sys.executable, "dispatch.py"], capture_output=True, text=True, env=e, cwd=root, timeout=60
    )
    assert sent.returncode == 0, sent.stderr
    assert "Traceback" not in sent.stderr, sent.stderr
    warnings = [line for line in sent.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1, sent.stderr  # one per outage, not one per dispatch
    assert "'redis' is unavailable" in warnings[0] and "'main'" in warnings[0], warnings

    with sqlite3.connect(root / "storage" / "queue.db") as db:
        bodies = [r[0] for r in db.execute("SELECT payload FROM jobs ORDER BY id")]
    assert len(bodies) == 4, bodies

    def haze(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "haze.cli", "--root", str(root), *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=root, timeout=60)

    refused = haze("queue:work", "--connection", "main", "--stop-when-empty")
    assert refused.returncode == 1, refused
    assert "Traceback" not in refused.stderr, refused.stderr
    assert "failover connection" in refused.stderr and "--connection" in refused.stderr

    worked = haze("queue:work", "--connection", "sqlite", "--stop-when-empty")
    assert worked.returncode == 0, worked.stderr
    assert sorted(runs.read_text().split()) == ["bulk0", "bulk1", "bulk2", "single"]
    with sqlite3.connect(root / "storage" / "queue.db") as db:
        assert db.execute("SELECT COUNT(*) FROM jobs").fetchone() == (0,)


@define_job(name="failover_probe")
async def failover_probe(payload: dict[str, Any]) -> None:
    return None


def failover_app(tmp_path: Path, redis: dict[str, Any]) -> App:
    return App(
        queue=define_queue_config(
            default="main",
            connections={
                "main": {"driver": "failover", "connections": ["redis", "sqlite"]},
                "redis": {"driver": "redis", **redis},
                "sqlite": {"driver": "database", "connection": "local"},
            },
            store="memory",
        ),
        database=define_database_config(
            default="local", connections={"local": {"url": f"sqlite:///{tmp_path}/q.db"}}
        ),
    )


@needs_redis
async def test_a_reachable_first_connection_takes_the_job(
    tmp_path: Path, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = failover_app(tmp_path, {"url": REDIS_URL, "prefix": redis_prefix})
    async with app:
        await ensure_queue_tables(app, "sqlite")
        await failover_probe.dispatch({})
        await Queue.bulk([failover_probe.with_({}) for _ in range(2)])
        assert await app.driver("redis").size("default") == 3
        assert await app.driver("sqlite").size("default") == 0
        assert await app.driver("main").size("default") == 3
    assert not [r for r in caplog.records if r.name.startswith("haze") and r.levelno >= 30]


@needs_redis
async def test_a_payload_error_is_raised_not_failed_over(tmp_path: Path, redis_prefix: str) -> None:
    # The smallest limit of the listed connections applies: a message too large for
    # Redis here would not be "rescued" by SQLite.
    app = failover_app(
        tmp_path, {"url": REDIS_URL, "prefix": redis_prefix, "max_message_size": 1000}
    )
    async with app:
        await ensure_queue_tables(app, "sqlite")
        with pytest.raises(PayloadTooLargeError):
            await failover_probe.dispatch({"blob": "x" * 2000})
        with pytest.raises(TypeError):
            await failover_probe.dispatch({"not json": object()})
        assert await app.driver("redis").size("default") == 0
        assert await app.driver("sqlite").size("default") == 0


async def test_every_connection_down_is_one_error_naming_each(tmp_path: Path) -> None:
    port = dead_port()
    app = App(
        queue=define_queue_config(
            default="main",
            connections={
                "main": {"driver": "failover", "connections": ["redis", "pg"]},
                "redis": {"driver": "redis", "url": f"redis://127.0.0.1:{port}/0"},
                "pg": {"driver": "database", "connection": "pg"},
            },
            store="memory",
        ),
        database=define_database_config(
            default="pg",
            connections={"pg": {"url": f"postgresql://postgres@127.0.0.1:{dead_port()}/x"}},
        ),
    )
    async with app:
        with pytest.raises(BackendUnavailableError) as info:
            await failover_probe.dispatch({})
    message = str(info.value)
    assert "\n" not in message
    assert "'main'" in message and "'redis'" in message and "'pg'" in message


def test_a_failover_connection_lists_real_connections() -> None:
    with pytest.raises(ConfigError, match="failover connection itself"):
        App(
            queue=define_queue_config(
                connections={
                    "a": {"driver": "failover", "connections": ["b"]},
                    "b": {"driver": "failover", "connections": ["m"]},
                    "m": {"driver": "memory"},
                }
            )
        )


failover_ran: list[int] = []


@define_job(name="failover_local")
async def failover_local(payload: dict[str, int]) -> None:
    failover_ran.append(payload["n"])


@pytest.mark.parametrize("last", ["memory", "sync"])
async def test_an_in_process_last_connection_runs_the_job_here(
    last: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Laravel's own example ends a failover list with "sync": run it now rather than lose it.
    failover_ran.clear()
    app = App(
        queue=define_queue_config(
            default="main",
            connections={
                "main": {"driver": "failover", "connections": ["redis", "local"]},
                "redis": {"driver": "redis", "url": f"redis://127.0.0.1:{dead_port()}/0"},
                "local": {"driver": last},
            },
            store="memory",
        )
    )
    caplog.set_level(logging.INFO, logger="haze.drivers.failover")
    async with app:
        await failover_local.dispatch({"n": 1})
        await Queue.bulk([failover_local.with_({"n": 2}), failover_local.with_({"n": 3})])
        await Queue.idle()
    assert sorted(failover_ran) == [1, 2, 3]
    moved = [r.getMessage() for r in caplog.records if r.name == "haze.drivers.failover"]
    assert sum("'redis' is unavailable" in m for m in moved) == 1, moved
    assert sum("went to connection 'local'" in m for m in moved) == 2, moved
