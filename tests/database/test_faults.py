"""The database driver under real faults, with real worker processes.

Workers are ``python -m haze.cli --root tests/database/apps/faults queue:work …``
processes. Their jobs (``apps/faults/app/job/dbx_fault_jobs.py``) append one line per
start and end to a runs file (O_APPEND), so the test counts runs per job key across
processes, kills and restarts. Everything is bounded in time and marked ``slow``.

- a worker SIGKILLed mid-job: the job runs again after ``retry_after``, every backend;
- 5,000 jobs through 3 workers x concurrency 8 while a random worker is SIGKILLed and
  restarted every few seconds: nothing is lost; the at-least-once duplicates are counted
  and reported (printed, a junit property, ``kill_report.json`` under the test's tmp
  dir); with no kills every job runs exactly once;
- a database that goes away (a TCP proxy in front of the server is stopped) and one that
  is unreachable when the worker starts: a clear logged error, the same worker process
  retrying, and every job run once the database is back;
- SIGTERM drains: running jobs finish, exit code 0, queued jobs stay queued;
- the DatabaseStore's add/increment stay atomic across processes (SQLite, PostgreSQL).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.util
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from harness import BACKENDS, backend_url, mysql_database, pg_database
from haze import App, Queue, define_database_config, define_queue_config
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables
from worker_procs import WorkerProcs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

APPS = Path(__file__).parent / "apps"
APP = APPS / "faults"
_names = itertools.count()

# The worker app's job module, loaded once here too so this process can dispatch its jobs.
_spec = importlib.util.spec_from_file_location(
    "dbx_fault_jobs_in_tests", APP / "app" / "job" / "dbx_fault_jobs.py"
)
assert _spec is not None and _spec.loader is not None
jobs_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs_module)
dbx_fault_record = jobs_module.dbx_fault_record
dbx_fault_slow_first = jobs_module.dbx_fault_slow_first


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --------------------------------------------------------------------------- backends


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    # A throwaway database: commits skip the WAL fsync wait. Workers are killed here,
    # never the server, so this changes speed only, not what the tests can see.
    yield from pg_database("dbx_flt", "ALTER DATABASE {db} SET synchronous_commit = off")


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    yield from mysql_database("dbx_flt")


# --------------------------------------------------------------------------- harness


class Harness(WorkerProcs):
    """Queue tables for one test, the dispatching app, the runs file and worker processes."""

    def __init__(self, url: str, tmp: Path, retry_after: str = "90s"):
        n = next(_names)
        super().__init__(tmp, APP)
        self.url = url
        self.jobs = f"dbx_fjobs_{os.getpid()}_{n}"
        self.failed = f"dbx_ffailed_{os.getpid()}_{n}"
        self.retry_after = retry_after
        self.app = App(
            queue=define_queue_config(
                default="db",
                connections={
                    "db": {
                        "driver": "database",
                        "connection": "main",
                        "table": self.jobs,
                        "failed_table": self.failed,
                        "retry_after": retry_after,
                    }
                },
            ),
            database=define_database_config(default="main", connections={"main": {"url": url}}),
        )

    # -- the worker processes ------------------------------------------------------

    def env(self, url: str | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DBX_DB_URL=url or self.url,
            DBX_TABLE=self.jobs,
            DBX_FAILED_TABLE=self.failed,
            DBX_RETRY_AFTER=self.retry_after,
            DBX_RUNS_FILE=str(self.runs_file),
            DBX_SLEEP="100ms",
            DBX_MAX_SLEEP="500ms",
            PYTHONUNBUFFERED="1",
            COLUMNS="200",
        )
        return env

    def start_worker(self, *args: str, url: str | None = None) -> subprocess.Popen[bytes]:
        return self.spawn("db", "default", args, self.env(url))

    async def table_rows(self) -> list[tuple[Any, ...]]:
        return await self.app.database().fetchall(
            f"SELECT id, attempts, reserved_at FROM {self.jobs} ORDER BY id"
        )

    async def failed_rows(self) -> list[tuple[Any, ...]]:
        return await self.app.database().fetchall(f"SELECT uuid, exception FROM {self.failed}")


@contextlib.asynccontextmanager
async def harness(url: str, tmp: Path, retry_after: str = "90s") -> AsyncIterator[Harness]:
    h = Harness(url, tmp, retry_after)
    previous = os.environ.get("DBX_RUNS_FILE")
    os.environ["DBX_RUNS_FILE"] = str(h.runs_file)  # for jobs this process runs itself
    async with h.app:
        await ensure_queue_tables(h.app)
        try:
            yield h
        finally:
            h.kill_all()
            with contextlib.suppress(Exception):
                await h.app.database().execute(f"DROP TABLE IF EXISTS {h.jobs}")
                await h.app.database().execute(f"DROP TABLE IF EXISTS {h.failed}")
            if previous is None:
                os.environ.pop("DBX_RUNS_FILE", None)
            else:
                os.environ["DBX_RUNS_FILE"] = previous


ALL = BACKENDS
DBG = ["-v"] if os.environ.get("DBX_VERBOSE_WORKERS") else []


# =========================================================================== SIGKILL mid-job


@pytest.mark.parametrize("kind", ALL)
async def test_job_of_a_sigkilled_worker_runs_again_after_retry_after(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    async with harness(backend_url(request, kind, tmp_path), tmp_path, retry_after="3s") as h:
        await dbx_fault_slow_first.dispatch({"k": "a", "sleep": 60})
        first = h.start_worker("--concurrency", "2")
        await h.wait_ready(first)
        deadline = time.monotonic() + 30
        while not h.counts("start")["a"]:
            assert time.monotonic() < deadline, h.log(first)
            await asyncio.sleep(0.05)
        [(_, _, _, _, started)] = h.events()
        first.send_signal(signal.SIGKILL)
        assert await h.wait_exit(first) == -signal.SIGKILL
        [(_, attempts, reserved)] = await h.table_rows()
        assert attempts == 1 and reserved is not None, "the row stays claimed by the dead worker"
        [(last_beat,)] = await h.app.database().fetchall(
            f"SELECT COALESCE(heartbeat_at, reserved_at) FROM {h.jobs}"
        )
        assert float(last_beat) >= float(reserved) and float(last_beat) <= time.time()

        second = h.start_worker("--concurrency", "2")
        await h.wait_ready(second)
        await h.wait_ended({"a"}, within=40, procs=[second])
        runs = [(e, a, t) for e, k, a, _, t in h.events() if k == "a"]
        assert [(e, a) for e, a, _ in runs] == [("start", 1), ("start", 2), ("end", 2)]
        # not before retry_after (3 s) had passed since the dead worker's last heartbeat
        assert runs[1][2] - float(last_beat) >= 2.95
        assert runs[0][2] == started
        second.send_signal(signal.SIGTERM)
        assert await h.wait_exit(second) == 0
        assert await h.table_rows() == [] and await h.failed_rows() == []


# =========================================================================== kill storm


def _report(tmp_path: Path, record_property: Any, capsys: Any, data: dict[str, Any]) -> None:
    for k, v in data.items():
        record_property(k, v)
    (tmp_path / "kill_report.json").write_text(json.dumps(data, indent=2))
    with capsys.disabled():
        print(f"\n[dbx kill report] {json.dumps(data)}")


#: (backend, kills): 5,000 jobs each. MariaDB runs the storm only (time budget).
STORM = [
    ("sqlite", True),
    ("sqlite", False),
    ("postgres", True),
    ("postgres", False),
    ("mariadb", True),
]


@pytest.mark.parametrize(
    ("kind", "kills"), STORM, ids=[f"{k}-{'kills' if x else 'nokills'}" for k, x in STORM]
)
async def test_five_thousand_jobs_three_workers_random_sigkills(
    request: pytest.FixtureRequest,
    kind: str,
    kills: bool,
    tmp_path: Path,
    record_property: Any,
    capsys: Any,
) -> None:
    total, workers, concurrency = 5000, 3, 8
    rng = random.Random(20260101)
    async with harness(backend_url(request, kind, tmp_path), tmp_path, retry_after="3s") as h:
        keys = {str(i) for i in range(total)}
        # 30 ms a job: the run lasts long enough (>= 7 s on a fast machine) for the storm
        await Queue.bulk([dbx_fault_record.with_({"k": i, "sleep": 0.03}) for i in range(total)])
        live = [h.start_worker("--concurrency", str(concurrency), *DBG) for _ in range(workers)]
        for p in live:
            await h.wait_ready(p)
        started = time.monotonic()
        killed = 0
        deadline = started + 150
        next_kill = started + rng.uniform(1.0, 2.0)
        while True:
            ended = [(k, pid) for e, k, _, pid, _ in h.events() if e == "end"]
            done_keys = {k for k, _ in ended}
            if keys <= done_keys:
                break
            assert time.monotonic() < deadline, (
                f"{len(keys - done_keys)} of {total} jobs unfinished after 150 s"
            )
            for p in live:
                assert p.poll() is None, f"worker {p.pid} died on its own:\n{h.log(p)}"
            working_pids = {pid for _, pid in ended}
            ready = [p for p in live if p.pid in working_pids]
            # kill a worker that is running jobs, never the last one (a restart takes
            # seconds: the banner, then connecting, then the first claim)
            if kills and time.monotonic() >= next_kill and len(ready) >= 2:
                victim = ready[rng.randrange(len(ready))]  # a worker that is working
                live.remove(victim)
                victim.send_signal(signal.SIGKILL)
                await h.wait_exit(victim)
                killed += 1
                fresh = h.start_worker("--concurrency", str(concurrency), *DBG)
                live.append(fresh)
                next_kill = time.monotonic() + rng.uniform(1.5, 3.0)
            await asyncio.sleep(0.2)
        elapsed = time.monotonic() - started
        # A worker killed after a job's end line but before its ack leaves the row under
        # a lease that lapses retry_after (3 s) later; the live workers run it again then.
        # The run can end sooner than that (a CI run left 8 such rows on MariaDB).
        deadline = time.monotonic() + 30
        while await h.table_rows():
            assert time.monotonic() < deadline, await h.table_rows()
            await asyncio.sleep(0.2)
        for p in live:
            await h.wait_ready(p)  # a SIGTERM before its handlers are in would just kill it
            p.send_signal(signal.SIGTERM)
        codes = [await h.wait_exit(p) for p in live]

        starts, ends = h.counts("start"), h.counts("end")
        assert set(starts) == keys and set(ends) == keys, "no job is lost"
        assert await h.table_rows() == [], "nothing left in the jobs table"
        assert await h.failed_rows() == [], "no job failed"
        assert codes == [0] * workers, "SIGTERM: clean exits"
        data = {
            "backend": kind,
            "jobs": total,
            "workers": workers,
            "concurrency": concurrency,
            "kills": killed,
            "seconds": round(elapsed, 1),
            "duplicate_runs": sum(starts.values()) - total,  # extra starts (reruns)
            "jobs_run_more_than_once": sum(1 for n in starts.values() if n > 1),
            "jobs_completed_more_than_once": sum(1 for n in ends.values() if n > 1),
        }
        _report(tmp_path, record_property, capsys, data)
        if not kills:
            assert data["duplicate_runs"] == 0 and max(ends.values()) == 1, (
                "with no kills every job runs exactly once"
            )
        else:
            assert killed >= 2, "the storm killed too few workers to mean anything"


# =========================================================================== outages


class Proxy:
    """A TCP forwarder in front of a database server: ``stop()`` makes the database go
    away (listener closed, every open connection aborted); ``start()`` brings it back on
    the same port."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.port = _free_port()
        self.server: asyncio.base_events.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for w in list(self.writers):
            w.transport.abort()
        self.writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self.writers.update({writer, up_w})

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                w.transport.abort()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        self.writers.difference_update({writer, up_w})


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


OUTAGE = ["postgres", "mariadb", "libsql"]


@pytest.mark.parametrize("kind", OUTAGE)
async def test_database_down_at_start_and_mid_run_logs_and_retries(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    url = backend_url(request, kind, tmp_path)
    parts = urlsplit(url)
    proxy = Proxy((parts.hostname or "127.0.0.1", parts.port or 0))
    async with harness(url, tmp_path, retry_after="5s") as h:
        await Queue.bulk([dbx_fault_record.with_({"k": f"a{i}"}) for i in range(5)])
        # 1. unreachable when the worker starts: nothing listens on the proxy's port
        worker = h.start_worker("--concurrency", "2", url=_via(url, proxy.port))
        try:
            await h.wait_ready(worker)
            await asyncio.sleep(2.5)
            assert worker.poll() is None, f"the worker gave up:\n{h.log(worker)}"
            log = h.log(worker)
            assert "is unavailable" in log, log
            assert str(proxy.port) in log or "connect" in log.lower(), log
            assert h.events() == []
            # 2. the database comes up: the same process runs the queued jobs
            await proxy.start()
            await h.wait_ended({f"a{i}" for i in range(5)}, within=60, procs=[worker])
            assert "reachable again" in h.log(worker)
            deadline = time.monotonic() + 30
            while await h.table_rows():  # the last acks (a job's end line comes first)
                assert time.monotonic() < deadline, await h.table_rows()
                await asyncio.sleep(0.05)
            # 3. it goes away mid-run (connections cut, port closed) while jobs arrive
            await proxy.stop()
            await Queue.bulk([dbx_fault_record.with_({"k": f"b{i}"}) for i in range(5)])
            await asyncio.sleep(3)
            assert worker.poll() is None, f"the worker crashed:\n{h.log(worker)}"
            assert h.log(worker).count("is unavailable") >= 2, h.log(worker)
            # 4. back again: the jobs dispatched during the outage run
            await proxy.start()
            await h.wait_ended({f"b{i}" for i in range(5)}, within=90, procs=[worker])
            worker.send_signal(signal.SIGTERM)
            assert await h.wait_exit(worker, within=60) == 0, h.log(worker)
        finally:
            await proxy.stop()
        assert len(h.procs) == 1, "one worker process throughout (no crash loop)"
        assert set(h.counts("end")) == {f"a{i}" for i in range(5)} | {f"b{i}" for i in range(5)}
        assert await h.table_rows() == [] and await h.failed_rows() == []


# =========================================================================== SIGTERM drain


@pytest.mark.parametrize("kind", ALL)
async def test_sigterm_drains_running_jobs_and_exits_zero(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    async with harness(backend_url(request, kind, tmp_path), tmp_path) as h:
        await Queue.bulk(
            [dbx_fault_record.with_({"k": f"slow{i}", "sleep": 2.0}) for i in range(3)]
        )
        await Queue.bulk([dbx_fault_record.with_({"k": f"queued{i}"}) for i in range(4)])
        worker = h.start_worker("--concurrency", "3")
        await h.wait_ready(worker)
        deadline = time.monotonic() + 30
        while len(h.counts("start")) < 3:
            assert time.monotonic() < deadline, h.log(worker)
            await asyncio.sleep(0.02)
        worker.send_signal(signal.SIGTERM)
        assert await h.wait_exit(worker) == 0, h.log(worker)
        assert set(h.counts("end")) == {f"slow{i}" for i in range(3)}, "running jobs finished"
        assert set(h.counts("start")) == {f"slow{i}" for i in range(3)}, "nothing claimed after"
        rows = await h.table_rows()
        assert [(a, r) for _, a, r in rows] == [(0, None)] * 4, "queued jobs stay queued"
        assert "waiting for 3 running job(s)" in h.log(worker)
        # nothing lost: another worker runs the rest
        await Worker(h.app, "db", ["default"], 2, sleep=0.05, stop_when_empty=True).run()
        assert set(h.counts("end")) == (
            {f"slow{i}" for i in range(3)} | {f"queued{i}" for i in range(4)}
        )


# =========================================================================== the store, processes


def _contender(
    url: str, table: str, i: int, increments: int, locks: int, go: Path
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            str(APPS / "store_race.py"),
            url,
            table,
            str(i),
            str(increments),
            str(locks),
            str(go),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_database_store_add_and_increment_are_atomic_across_processes(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    url = backend_url(request, kind, tmp_path)
    table = f"dbx_store_race_{os.getpid()}_{next(_names)}"
    procs_n, increments, locks = 4, 150, 40
    go = tmp_path / "go"
    procs = [_contender(url, table, i, increments, locks, go) for i in range(procs_n)]
    try:
        await asyncio.sleep(1.0)  # let them connect and create the table
        go.touch()
        outs = []
        for p in procs:
            deadline = time.monotonic() + 120
            while p.poll() is None:
                assert time.monotonic() < deadline, "a store contender hung"
                await asyncio.sleep(0.05)
            out, err = p.communicate()
            assert p.returncode == 0, err.decode()
            outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    seen = sorted(v for o in outs for v in o["seen"])
    assert seen == list(range(1, procs_n * increments + 1)), "every increment got its own value"
    won = collections.Counter(k for o in outs for k in o["won"])
    assert set(won) == {f"race:lock:{k}" for k in range(locks)}
    assert set(won.values()) == {1}, "each add() had exactly one winner across processes"

    from haze.stores.database import DatabaseStore

    app = App(database=define_database_config(default="main", connections={"main": {"url": url}}))
    store = DatabaseStore("race", {"driver": "database", "connection": "main", "table": table}, app)
    try:
        assert await store.get("race:counter") == procs_n * increments
        owners = {o["index"]: set(o["won"]) for o in outs}
        for k in range(locks):
            holder = await store.get(f"race:lock:{k}")
            assert f"race:lock:{k}" in owners[int(holder.split("-")[1])]
    finally:
        await app.database().execute(f"DROP TABLE IF EXISTS {table}")
        await app.database().close()
