"""The test services (PostgreSQL, Redis) as the process-level fault tests use them.

Shared by the suites that run real worker processes or CLI commands against them:
whether a service answers (the test skips otherwise), a throwaway PostgreSQL database for
one test module, and removing what a run left under its Redis key prefix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def reachable(url: str) -> bool:
    """Whether something accepts a TCP connection at the URL's host and port."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), 0.5):
            return True
    except OSError:
        return False


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
