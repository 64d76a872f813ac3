"""Support for ``test_redis_faults.py``: a private redis-server, worker processes, run logs.

Each test starts its own ``redis-server`` on a free port with a temp dir (never the shared
server on 6379: other suites and benchmarks use it, and these tests kill and restart the
server). Workers are ``python -m haze.cli --root tests/drivers/redis_fault_app queue:work``
processes; their jobs (``redis_fault_app/app/job/rfx_jobs.py``) append one line per start
and end to a runs file (O_APPEND), so a test counts runs per job key across processes,
kills and restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from haze import App, define_queue_config
from worker_procs import WorkerProcs

APP = Path(__file__).parent / "redis_fault_app"
REDIS_SERVER = shutil.which("redis-server")

needs_redis_server = pytest.mark.skipif(
    REDIS_SERVER is None and not os.environ.get("CI"),
    reason="redis-server is not installed (the fault tests run their own server)",
)

# The worker app's job module, loaded once here too so this process can dispatch its jobs.
_spec = importlib.util.spec_from_file_location(
    "rfx_jobs_in_tests", APP / "app" / "job" / "rfx_jobs.py"
)
assert _spec is not None and _spec.loader is not None
jobs_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs_module)
rfx_record = jobs_module.rfx_record
rfx_slow_first = jobs_module.rfx_slow_first


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def until(what: str, pred: Any, within: float, poll: float = 0.05) -> None:
    """Poll ``pred()`` (sync or async) until true; ``TimeoutError`` naming ``what`` after
    ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        ok = pred()
        if asyncio.iscoroutine(ok):
            ok = await ok
        if ok:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached within {within}s")
        await asyncio.sleep(poll)


# --------------------------------------------------------------------------- redis-server


class RedisServer:
    """A redis-server of this test only. ``aof=True`` runs it the way docs/redis.md tells
    users to for durability: ``appendonly yes`` and ``appendfsync always``."""

    def __init__(self, tmp: Path, *, aof: bool = False) -> None:
        self.port = free_port()
        self.dir = tmp / "redis-data"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.aof = aof
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, within: float = 30.0) -> None:
        assert REDIS_SERVER is not None, "redis-server is not installed"
        args = [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--logfile",
            str(self.dir / f"redis-{self.starts}.log"),
            "--maxmemory-policy",
            "noeviction",
        ]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        self.starts += 1
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        import redis

        deadline = time.monotonic() + within
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {self.log()}")
            try:
                client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
                try:
                    if client.ping():
                        return
                finally:
                    client.close()
            except (redis.ConnectionError, redis.BusyLoadingError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server did not answer on {self.port}: {self.log()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: what a crash or an OOM kill does; whatever was not persisted is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def log(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-2000:] for p in sorted(self.dir.glob("redis-*.log"))
        )


# --------------------------------------------------------------------------- workers


class Harness(WorkerProcs):
    """The private server, the dispatching app, the runs file and the worker processes."""

    def __init__(self, tmp: Path, *, retry_after: str = "30s", aof: bool = False) -> None:
        super().__init__(tmp, APP)
        self.server = RedisServer(tmp, aof=aof)
        self.prefix = "rfx"
        self.retry_after = retry_after
        self.app: App | None = None

    def make_app(self) -> App:
        return App(
            queue=define_queue_config(
                default="r",
                connections={
                    "r": {
                        "driver": "redis",
                        "url": self.server.url,
                        "prefix": self.prefix,
                        "queues": ["default"],
                        "retry_after": self.retry_after,
                    }
                },
            )
        )

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            RFX_REDIS_URL=self.server.url,
            RFX_PREFIX=self.prefix,
            RFX_RETRY_AFTER=self.retry_after,
            RFX_RUNS_FILE=str(self.runs_file),
            PYTHONUNBUFFERED="1",
            COLUMNS="200",
        )
        return env

    def cli(self, *args: str, within: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run one ``haze`` command against the worker app (e.g. ``queue:failed``)."""
        return subprocess.run(
            [sys.executable, "-m", "haze.cli", "--root", str(APP), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=within,
            cwd=self.tmp,
            stdin=subprocess.DEVNULL,
        )

    def start_worker(self, *args: str) -> subprocess.Popen[bytes]:
        # idle waits and the outage backoff: 0.2 s doubling up to 1 s
        return self.spawn("r", "default", ["--sleep", "0.2", *args], self.env())

    async def state(self) -> dict[str, int]:
        """How many jobs each BullMQ list/set of the ``default`` queue holds."""
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(self.server.url, decode_responses=True)
        try:
            base = f"{self.prefix}:default:"
            async with client.pipeline(transaction=False) as pipe:
                pipe.llen(base + "wait")
                pipe.llen(base + "active")
                pipe.zcard(base + "delayed")
                pipe.zcard(base + "failed")
                pipe.zcard(base + "completed")
                wait, active, delayed, failed, completed = await pipe.execute()
        finally:
            await client.aclose()
        return {
            "wait": wait,
            "active": active,
            "delayed": delayed,
            "failed": failed,
            "completed": completed,
        }


@contextlib.asynccontextmanager
async def harness(
    tmp: Path, *, retry_after: str = "30s", aof: bool = False
) -> AsyncIterator[Harness]:
    h = Harness(tmp, retry_after=retry_after, aof=aof)
    h.server.start()
    previous = os.environ.get("RFX_RUNS_FILE")
    os.environ["RFX_RUNS_FILE"] = str(h.runs_file)  # for jobs this process runs itself
    try:
        h.app = h.make_app()
        async with h.app:
            yield h
    finally:
        h.kill_all()
        h.server.kill()
        if previous is None:
            os.environ.pop("RFX_RUNS_FILE", None)
        else:
            os.environ["RFX_RUNS_FILE"] = previous
