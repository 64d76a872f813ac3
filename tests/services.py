"""The test services (PostgreSQL, MySQL/MariaDB, Redis) as the tests use them.

Whether a server answers, and what a test does when it does not: locally it skips; under
``CI=true`` it fails, naming the server and how to start it, because CI runs every test
(Dramatiq's ``check_redis``). A throwaway PostgreSQL database for one test module, and
removing what a run left under a Redis key prefix, and a Redis database leased whole.

>>> # require_server("Redis", REDIS_URL)      in a test or fixture: skip, or fail in CI
>>> # @needs_server("PostgreSQL", PG_URL)     the same as a mark (checked at test setup)
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Iterator
from typing import NoReturn
from urllib.parse import urlsplit

import pytest

#: CI runs every test: a missing server fails the test instead of skipping it.
CI = os.environ.get("CI", "").strip().lower() == "true"

#: How to start each server (scripts/test starts the installed ones: scripts/_services.sh).
HOW_TO_START = {
    "PostgreSQL": "pg_ctlcluster <version> main start, or scripts/test (starts it when installed)",
    "MySQL/MariaDB": "start-stop-daemon --start --background --exec /usr/sbin/mariadbd, or "
    "scripts/test (starts it when installed)",
    "Redis": "redis-server --port 6379 --save '' --daemonize yes, or scripts/test (starts it "
    "when installed)",
}

_MARK = "needs_server"


def reachable(url: str) -> bool:
    """Whether something accepts a TCP connection at the URL's host and port."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), 0.5):
            return True
    except OSError:
        return False


def server_missing(server: str, where: str, detail: str = "") -> NoReturn:
    """Skip the test because ``server`` does not answer at ``where``; fail it under CI=true."""
    how = HOW_TO_START.get(server, f"start {server}")
    message = f"no {server} at {where}{f' ({detail})' if detail else ''}: start it with {how}"
    if CI:
        pytest.fail(f"{message}. CI=true: the tests need every server", pytrace=False)
    pytest.skip(message)


def tool_missing(message: str) -> NoReturn:
    """Skip the test for a missing tool (Node.js, npm); fail it under CI=true."""
    if CI:
        pytest.fail(f"{message}. CI=true: the tests need every tool", pytrace=False)
    pytest.skip(message)


def require_server(server: str, url: str) -> None:
    """Go on only when ``server`` answers at ``url`` (see :func:`server_missing`)."""
    if not reachable(url):
        server_missing(server, url)


def needs_server(server: str, url: str) -> pytest.MarkDecorator:
    """A mark: :func:`require_server` runs when the test is set up (tests/conftest.py)."""
    return getattr(pytest.mark, _MARK)(server, url)


def check_marked_servers(item: pytest.Item) -> None:
    """:func:`require_server` for each ``needs_server`` mark on ``item``."""
    for mark in item.iter_markers(_MARK):
        require_server(*mark.args)


@contextlib.contextmanager
def throwaway_pg_database(admin_url: str, name: str, *settings: str) -> Iterator[str]:
    """A fresh database ``name`` next to ``admin_url`` (its URL), dropped afterwards.

    ``settings`` are ``ALTER DATABASE <name> SET ...`` clauses, e.g. ``"synchronous_commit
    = off"``. Both drops force out connections (left by killed workers, or by an
    earlier run that died)."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
        for setting in settings:
            c.execute(f"ALTER DATABASE {name} SET {setting}")
    yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(admin_url, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def delete_redis_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``<prefix>:`` (in chunks: a storm leaves many)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        for i in range(0, len(keys), 500):
            await client.delete(*keys[i : i + 500])
    finally:
        await client.aclose()


#: The Redis databases a test leases whole (``leased_redis_db``), for an app whose keys
#: have no prefix or a test that flushes: no test names them otherwise (bench/ owns 9).
LEASED_REDIS_DBS = range(10, 16)
_LEASE_KEY = "haze-test:lease"


@contextlib.contextmanager
def leased_redis_db(server: str = "redis://127.0.0.1:6379", wait: float = 300) -> Iterator[str]:
    """The URL of a Redis database no other process uses meanwhile (another worker, or
    another run on the same server): the first of ``LEASED_REDIS_DBS`` whose lease key
    this process sets, emptied before and flushed after. The lease expires, so a run that
    was killed frees its database within the hour."""
    import redis

    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
    deadline = time.monotonic() + wait
    while True:
        for db in LEASED_REDIS_DBS:
            client = redis.Redis.from_url(f"{server}/{db}")
            try:
                if client.set(_LEASE_KEY, owner, nx=True, ex=3600):
                    for key in [k for k in client.scan_iter() if k != _LEASE_KEY.encode()]:
                        client.delete(key)
                    try:
                        yield f"{server}/{db}"
                    finally:
                        client.flushdb()  # the lease with the rest
                    return
            finally:
                client.close()
        if time.monotonic() > deadline:
            pytest.fail(f"every Redis database of {list(LEASED_REDIS_DBS)} stayed leased")
        time.sleep(0.5)
