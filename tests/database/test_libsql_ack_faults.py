"""Server errors between a worker and a real ``sqld``: no finished job runs again.

A small HTTP proxy sits between the worker's libSQL connector and the session's
``sqld``. While faults are on, it answers ``500`` to about 30 % of the Hrana pipeline
requests without forwarding them (the server never sees those), and forwards the rest.
Claims, heartbeats and acks all fail at random then; every job must still run exactly
once, and every row must be deleted well inside ``retry_after``: a failed ack is kept
and sent again instead of leaving its row claimed until the lease runs out.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from haze import App, JobContext, Queue, define_database_config, define_job, define_queue_config
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables

pytestmark = pytest.mark.timeout(120)

RUNS: collections.Counter[str] = collections.Counter()
_names = itertools.count()


@define_job(name="lsq_ack_fault_count")
async def lsq_ack_fault_count(payload: dict[str, Any], job: JobContext) -> None:
    RUNS[payload["k"]] += 1


class FaultyProxy:
    """HTTP/1.1 in front of ``upstream``: a pipeline request fails with a 500 (not
    forwarded) with probability ``fail_rate``; everything else is forwarded."""

    def __init__(self, upstream: str, seed: int) -> None:
        self.upstream = upstream
        self.fail_rate = 0.0
        self.failed = 0
        self.forwarded = 0
        self._random = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._client = httpx.AsyncClient(base_url=upstream, timeout=30.0)

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
        await self._client.aclose()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                length = int({k.lower(): v for k, v in headers.items()}.get("content-length", 0))
                body = await reader.readexactly(length) if length else b""
                status, payload = await self._answer(method, path, headers, body)
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(payload)}\r\n\r\n".encode("latin-1")
                    + payload
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes]:
        if path.endswith("/pipeline") and self._random.random() < self.fail_rate:
            self.failed += 1
            return 500, b'{"error":"injected by the test proxy"}'
        self.forwarded += 1
        keep = {k: v for k, v in headers.items() if k.lower() in ("authorization", "content-type")}
        response = await self._client.request(method, path, headers=keep, content=body)
        return response.status_code, response.content


@contextlib.asynccontextmanager
async def proxied_app(sqld_url: str) -> AsyncIterator[tuple[App, FaultyProxy, str]]:
    proxy = FaultyProxy(sqld_url, seed=35)
    await proxy.start()
    n = next(_names)
    jobs, failed = f"lsq_ackf_{os.getpid()}_{n}", f"lsq_ackff_{os.getpid()}_{n}"
    app = App(
        queue=define_queue_config(
            default="db",
            connections={
                "db": {
                    "driver": "database",
                    "connection": "main",
                    "table": jobs,
                    "failed_table": failed,
                    "retry_after": "60s",
                }
            },
        ),
        database=define_database_config(default="main", connections={"main": {"url": proxy.url}}),
    )
    try:
        async with app:
            await ensure_queue_tables(app)
            try:
                yield app, proxy, jobs
            finally:
                proxy.fail_rate = 0.0
                with contextlib.suppress(Exception):
                    await app.database().execute(f"DROP TABLE IF EXISTS {jobs}")
                    await app.database().execute(f"DROP TABLE IF EXISTS {failed}")
    finally:
        await proxy.stop()


async def test_every_job_runs_once_and_its_row_goes_while_sqld_answers_500(
    sqld_url: str,
) -> None:
    RUNS.clear()
    n = 150
    async with proxied_app(sqld_url) as (app, proxy, table):
        await Queue.bulk([lsq_ack_fault_count.with_({"k": f"j{i}"}) for i in range(n)])
        proxy.fail_rate = 0.3
        worker = Worker(app, "db", ["default"], 4, sleep=0.05, max_sleep=0.2)
        worker.start()
        began = time.monotonic()
        try:
            # Well inside retry_after (60 s): a dropped ack would leave its row until then.
            while len(RUNS) < n or await _rows(app, table, proxy):
                assert time.monotonic() - began < 30, (len(RUNS), proxy.failed)
                await asyncio.sleep(0.1)
        finally:
            await worker.stop()
        assert proxy.failed >= 20, "the proxy failed too few requests to test anything"
        assert dict(RUNS) == {f"j{i}": 1 for i in range(n)}


async def _rows(app: App, table: str, proxy: FaultyProxy) -> int:
    """The rows left in ``table``, read past the faults."""
    rate, proxy.fail_rate = proxy.fail_rate, 0.0
    try:
        row = await app.database().fetchone(f"SELECT COUNT(*) FROM {table}")
    finally:
        proxy.fail_rate = rate
    return int(row[0]) if row else 0
