"""One side of bench/profile_enqueue.py: N single enqueues (or PINGs), each call timed.

    python enqueue_profile.py haze N asyncio|uvloop [cprofile]   # bench/.venvs/haze
    python enqueue_profile.py huey N - [cprofile]                 # bench/.venvs/huey
    python enqueue_profile.py ping-sync N -                       # blocking socket PING
    python enqueue_profile.py ping-async N asyncio|uvloop         # asyncio protocol PING
    python enqueue_profile.py haze-pg N asyncio|uvloop [cprofile] # BENCH_PG_DSN
    python enqueue_profile.py pg-async N asyncio|uvloop           # psycopg async, no haze
    python enqueue_profile.py pg-lean N asyncio|uvloop            # haze's lean execute alone
    python enqueue_profile.py pg-sync N -                         # psycopg sync, no haze

Prints one ``RESULT {json}`` line: per-call latencies (µs) as percentiles, CPU per call,
garbage collections and their time inside the window, and a cProfile top list if asked.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import io
import os
import pstats
import socket
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from records import emit  # noqa: E402
from redis_common import REDIS_URL  # noqa: E402

WARMUP = 500
PG_DSN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/haze_bench")
_gc = {"n": 0, "ns": 0, "t0": 0}


def _gc_cb(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc["t0"] = time.perf_counter_ns()
    else:
        _gc["n"] += 1
        _gc["ns"] += time.perf_counter_ns() - _gc["t0"]


def _summary(lat: array[int], cpu: float, wall: float, prof: cProfile.Profile | None) -> None:
    xs = sorted(lat)
    n = len(xs)

    def q(p: float) -> float:
        return xs[min(n - 1, int(n * p))] / 1000

    p50 = q(0.5)
    out: dict[str, Any] = {
        "n": n,
        "rate": n / wall,
        "p10": q(0.1),
        "p50": p50,
        "p90": q(0.9),
        "p99": q(0.99),
        "max": xs[-1] / 1000,
        "mean": sum(xs) / n / 1000,
        "cpu_us": cpu / n * 1e6,
        # share of calls slower than twice the median: the slow mode of a bimodal run
        "slow_share": sum(1 for x in xs if x > 2000 * p50) / n,
        "gc_collections": _gc["n"],
        "gc_ms": _gc["ns"] / 1e6,
        "load": os.getloadavg()[0],
    }
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(
            int(os.environ.get("BENCH_PROFILE_TOP", "14"))
        )
        out["profile"] = s.getvalue()
    emit(**out)


def _timed(call: Callable[[], Any], n: int, profile: bool) -> None:
    for _ in range(WARMUP):
        call()
    lat = array("q", bytes(8 * n))
    prof = cProfile.Profile() if profile else None
    gc.callbacks.append(_gc_cb)
    c0, w0 = time.process_time(), time.perf_counter()
    if prof:
        prof.enable()
    pc = time.perf_counter_ns
    for i in range(n):
        t = pc()
        call()
        lat[i] = pc() - t
    if prof:
        prof.disable()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    gc.callbacks.remove(_gc_cb)
    _summary(lat, cpu, wall, prof)


async def _atimed(call: Callable[[], Any], n: int, profile: bool) -> None:
    for _ in range(WARMUP):
        await call()
    lat = array("q", bytes(8 * n))
    prof = cProfile.Profile() if profile else None
    gc.callbacks.append(_gc_cb)
    c0, w0 = time.process_time(), time.perf_counter()
    if prof:
        prof.enable()
    pc = time.perf_counter_ns
    for i in range(n):
        t = pc()
        await call()
        lat[i] = pc() - t
    if prof:
        prof.disable()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    gc.callbacks.remove(_gc_cb)
    _summary(lat, cpu, wall, prof)


def _run(coro_fn: Callable[[], Any], loop: str) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(coro_fn())
    else:
        asyncio.run(coro_fn())


def haze(n: int, loop: str, profile: bool) -> None:
    async def go() -> None:
        from haze import App, Queue

        app = App(root=HERE / "redis_app")
        await app.__aenter__()
        await Queue.size("bench")
        from app.job.noop import noop

        await _atimed(lambda: noop.dispatch({"t": time.time()}), n, profile)
        await app.__aexit__(None, None, None)

    _run(go, loop)


def haze_pg(n: int, loop: str, profile: bool) -> None:
    """haze's database driver on PostgreSQL (bench/peers/app, ``BENCH_DB_URL``)."""
    os.environ["BENCH_DB_URL"] = PG_DSN

    async def go() -> None:
        from haze import App
        from haze.connectors.migrations import ensure_queue_tables

        sys.path.insert(0, str(HERE / "app"))
        app = App(root=HERE / "app")
        await app.__aenter__()
        await ensure_queue_tables(app)
        from app.job.noop import noop

        await _atimed(lambda: noop.dispatch({"t": time.time()}), n, profile)
        await app.__aexit__(None, None, None)

    _run(go, loop)


#: raw_pg.py's INSERT with its NOTIFY: the like-for-like statement of haze's enqueue
PG_INSERT_NOTIFY = (
    "WITH j AS (INSERT INTO raw_jobs (body) VALUES (%s) RETURNING id) "
    "SELECT pg_notify('raw_jobs', '') FROM j"
)


def pg_async(n: int, loop: str, profile: bool) -> None:
    import json

    import psycopg

    async def go() -> None:
        c = await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True)
        await c.execute("CREATE TABLE IF NOT EXISTS raw_jobs (id BIGSERIAL PRIMARY KEY, body TEXT)")
        cur = c.cursor()
        await _atimed(
            lambda: cur.execute(PG_INSERT_NOTIFY, (json.dumps({"t": time.time()}),)), n, profile
        )
        await c.close()

    _run(go, loop)


def pg_lean(n: int, loop: str) -> None:
    """haze's lean execute (haze.connectors.postgres_lean) alone: no dispatch around it."""
    import json

    import psycopg
    from haze.connectors.postgres_lean import LeanStatements

    async def go() -> None:
        c = await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True)
        await c.execute("CREATE TABLE IF NOT EXISTS raw_jobs (id BIGSERIAL PRIMARY KEY, body TEXT)")
        lean = LeanStatements()
        sql = PG_INSERT_NOTIFY.replace("%s", "?")
        await _atimed(lambda: lean.execute(c, sql, (json.dumps({"t": time.time()}),)), n, False)
        await c.close()

    _run(go, loop)


def pg_sync(n: int) -> None:
    import json

    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS raw_jobs (id BIGSERIAL PRIMARY KEY, body TEXT)")
        _timed(lambda: c.execute(PG_INSERT_NOTIFY, (json.dumps({"t": time.time()}),)), n, False)


def huey(n: int, profile: bool) -> None:
    from redis_huey import huey as h
    from redis_huey import noop

    h.storage.conn.ping()
    _timed(lambda: noop(time.time()), n, profile)


def _hostport() -> tuple[str, int]:
    from urllib.parse import urlsplit

    u = urlsplit(REDIS_URL)
    return u.hostname or "127.0.0.1", u.port or 6379


def ping_sync(n: int) -> None:
    s = socket.create_connection(_hostport())
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def ping() -> None:
        s.sendall(b"*1\r\n$4\r\nPING\r\n")
        s.recv(64)

    _timed(ping, n, False)


def ping_async(n: int, loop: str) -> None:
    class P(asyncio.Protocol):
        fut: asyncio.Future[bytes] | None = None

        def connection_made(self, t: Any) -> None:
            self.t = t

        def data_received(self, data: bytes) -> None:
            if self.fut is not None and not self.fut.done():
                self.fut.set_result(data)

    async def go() -> None:
        lp = asyncio.get_running_loop()
        _, p = await lp.create_connection(P, *_hostport())

        def ping() -> asyncio.Future[bytes]:
            p.fut = lp.create_future()
            p.t.write(b"*1\r\n$4\r\nPING\r\n")
            return p.fut

        await _atimed(ping, n, False)

    _run(go, loop)


if __name__ == "__main__":
    who, count, loop_name, *rest = sys.argv[1:]
    prof_on = bool(rest and rest[0] == "cprofile")
    if who == "haze":
        haze(int(count), loop_name, prof_on)
    elif who == "huey":
        huey(int(count), prof_on)
    elif who == "haze-pg":
        haze_pg(int(count), loop_name, prof_on)
    elif who == "pg-async":
        pg_async(int(count), loop_name, prof_on)
    elif who == "pg-lean":
        pg_lean(int(count), loop_name)
    elif who == "pg-sync":
        pg_sync(int(count))
    elif who == "ping-sync":
        ping_sync(int(count))
    elif who == "ping-async":
        ping_async(int(count), loop_name)
    else:
        raise SystemExit(f"unknown side {who!r}")
