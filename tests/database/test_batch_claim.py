"""Batched claims and completions of the database driver, on real backends.

A worker whose driver implements ``BatchConsumer`` (the database driver does) fills its
free slots with one claim statement (``FOR UPDATE SKIP LOCKED LIMIT n`` on PostgreSQL
and MariaDB, one ``UPDATE … RETURNING`` on SQLite and libSQL) and sends its acks in
batches: buffered, then deleted in one statement every few milliseconds, before its next
claim, and at once when it stops.

- statements are counted by wrapping the connector's calls (no server-side statistics);
- ``ack_many`` deletes only the rows still owned by their (id, reserved_at), and says
  which; a worker whose batched ack finds the lease lost still logs the warning;
- a slot whose folded ack+claim found nothing waits without claiming that queue again
  (a dispatch meanwhile still wakes it), and a claim never waits for a timed flush in
  flight; a worker that stops while an ack keeps failing names the job in one line;
- real ``haze queue:work`` processes (``apps/batch``): SIGTERM flushes the buffered acks
  (no row of a finished job is left), and a SIGKILL right after a job finished (its ack
  still buffered) runs again only jobs whose rows were still there: at-least-once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import importlib.util
import itertools
import json
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import haze._workers.worker as haze_worker
import pytest
from harness import BACKENDS, backend_url, mysql_database, pg_database
from haze import App, JobContext, Queue, define_database_config, define_job, define_queue_config
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables
from haze.contracts.driver import BatchConsumer
from worker_procs import WorkerProcs

pytestmark = [pytest.mark.timeout(180)]

APP = Path(__file__).parent / "apps" / "batch"
_names = itertools.count()

_spec = importlib.util.spec_from_file_location(
    "dbx_batch_jobs_in_tests", APP / "app" / "job" / "dbx_batch_jobs.py"
)
assert _spec is not None and _spec.loader is not None
proc_jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(proc_jobs)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    yield from pg_database("dbx_bcl")


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    yield from mysql_database("dbx_bcl")


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, request.param, tmp_path)


@contextlib.asynccontextmanager
async def open_app(db_url: str, **options: Any) -> AsyncIterator[tuple[App, str]]:
    n = next(_names)
    jobs, failed = f"dbx_bcj_{os.getpid()}_{n}", f"dbx_bcf_{os.getpid()}_{n}"
    conn = {"driver": "database", "connection": "main", "table": jobs, "failed_table": failed}
    app = App(
        queue=define_queue_config(default="db", connections={"db": {**conn, **options}}),
        database=define_database_config(default="main", connections={"main": {"url": db_url}}),
    )
    async with app:
        await ensure_queue_tables(app)
        try:
            yield app, jobs
        finally:
            with contextlib.suppress(Exception):
                await app.database().execute(f"DROP TABLE IF EXISTS {jobs}")
                await app.database().execute(f"DROP TABLE IF EXISTS {failed}")


async def until(predicate: Any, within: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.005)


# --------------------------------------------------------------------------- in-process jobs

STARTED: list[Any] = []
ENDED: list[Any] = []
GATE: dict[str, asyncio.Event] = {}


@define_job(name="dbx_bc_hold", tries=3)
async def dbx_bc_hold(payload: dict[str, Any], job: JobContext) -> None:
    """Starts, then waits for the test's gate when ``hold`` is set."""
    STARTED.append(payload["k"])
    if payload.get("hold"):
        await GATE["open"].wait()
    ENDED.append(payload["k"])


@pytest.fixture(autouse=True)
def _reset() -> None:
    STARTED.clear()
    ENDED.clear()
    GATE.clear()


class StatementSpy:
    """Records every statement sent through a connector (and its transactions), with the
    number of rows each ``fetchall`` returned."""

    def __init__(self, db: Any) -> None:
        self.calls: list[tuple[str, int | None]] = []
        self.transactions = 0
        for name in ("execute", "fetchall", "fetchone"):
            setattr(db, name, self._wrap(getattr(db, name)))
        real_tx = db.transaction
        spy = self

        @contextlib.asynccontextmanager
        async def transaction(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            spy.transactions += 1
            async with real_tx(*args, **kwargs) as session:
                yield spy._session(session)

        db.transaction = transaction

    def _wrap(self, fn: Any) -> Any:
        async def call(sql: str, params: Any = ()) -> Any:
            result = await fn(sql, params)
            self.calls.append((sql, len(result) if isinstance(result, list) else None))
            return result

        return call

    def _session(self, session: Any) -> Any:
        wrapped = {n: self._wrap(getattr(session, n)) for n in ("execute", "fetchall", "fetchone")}
        return type("Session", (), {n: staticmethod(fn) for n, fn in wrapped.items()})()

    def matching(self, sql: str) -> list[int | None]:
        """Row counts of the statements that are ``sql`` (up to its first ``{`` slot)."""
        head = sql.split("{", 1)[0]
        return [rows for text, rows in self.calls if text.startswith(head)]


def _claim_sql(driver: Any) -> str:
    return str(driver.sql["claim_many_select" if driver.dialect == "mysql" else "claim_many"])


def _ack_sql(driver: Any) -> str:
    return str(driver.sql["ack_many_delete" if driver.dialect == "mysql" else "ack_many"])


# --------------------------------------------------------------------------- in-process


async def test_the_database_driver_is_a_batch_consumer(db_url: str) -> None:
    async with open_app(db_url) as (app, _):
        assert isinstance(app.driver("db"), BatchConsumer)
        worker = Worker(app, "db", ["default"], 2)
        assert worker._batch is app.driver("db")


async def test_a_worker_fills_its_free_slots_with_one_claim_statement(db_url: str) -> None:
    n = 6
    async with open_app(db_url) as (app, _):
        driver: Any = app.driver("db")
        GATE["open"] = asyncio.Event()
        await Queue.bulk([dbx_bc_hold.with_({"k": i, "hold": True}) for i in range(n)])
        await Queue.bulk([dbx_bc_hold.with_({"k": i}) for i in range(n, 2 * n)])
        spy = StatementSpy(app.database())
        flushes: list[int] = []
        real_ack_many = driver.ack_many

        async def ack_many(jobs: Any) -> Any:
            flushes.append(len(jobs))
            return await real_ack_many(jobs)

        driver.ack_many = ack_many
        real_ack_and_claim = driver.ack_and_claim
        folded: list[int] = []

        async def ack_and_claim(jobs: Any, queue: str, limit: int) -> Any:
            if driver.dialect in ("postgres", "mysql"):  # elsewhere it calls ack_many
                flushes.append(len(jobs))
            folded.append(len(jobs))
            return await real_ack_and_claim(jobs, queue, limit)

        driver.ack_and_claim = ack_and_claim
        worker = Worker(app, "db", ["default"], n, sleep=0.05)
        worker.start()
        try:
            await until(lambda: len(STARTED) == n)
            await asyncio.sleep(0.2)  # no slot is free: no other claim may go out
            assert spy.matching(_claim_sql(driver)) == [n], spy.calls
            assert sorted(STARTED) == list(range(n))
            GATE["open"].set()
            await until(lambda: len(ENDED) == 2 * n)
        finally:
            await worker.stop()
        assert sorted(ENDED) == list(range(2 * n))
        assert await app.database().fetchall(f"SELECT id FROM {driver.table}") == []
        # Every ack went out in a batch (alone or inside the next claim); none through the
        # one-row ack.
        assert sum(flushes) == 2 * n, flushes
        assert spy.matching(driver.sql["ack"]) == []
        assert folded, "the acks buffered before the second claim ride in it"
        if driver.dialect == "postgres":  # one statement for both
            assert len(spy.matching(driver.sql["ack_claim_many"])) == len(folded)
            assert len(spy.matching(_ack_sql(driver))) == len(flushes) - len(folded)
        else:
            assert len(spy.matching(_ack_sql(driver))) == len(flushes)
        if driver.dialect == "mysql":  # a folded ack shares its claim's transaction
            claims = len(spy.matching(_claim_sql(driver)))
            assert spy.transactions == claims + len(flushes) - len(folded), spy.calls
        # The first wave ended in one loop turn: its acks left together, except at most
        # the one of the slot that reached its next claim first (sent before that claim).
        assert max(flushes) >= n - 1, flushes
        assert worker.leases_lost == 0


async def test_acks_wait_in_the_buffer_and_stopping_sends_them(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No timed flush in this test: only the next claim or the stop may send the acks.
    monkeypatch.setattr(haze_worker, "ACK_FLUSH_INTERVAL", 3600.0)
    async with open_app(db_url) as (app, table):
        GATE["open"] = asyncio.Event()
        await Queue.bulk([dbx_bc_hold.with_({"k": i, "hold": True}) for i in range(3)])
        worker = Worker(app, "db", ["default"], 3, sleep=0.05)
        worker.start()
        db = app.database()
        await until(lambda: len(STARTED) == 3)
        worker.request_stop()  # the slots end after these jobs: no claim will flush
        GATE["open"].set()
        await until(lambda: len(ENDED) == 3)
        await asyncio.sleep(0.1)
        assert len(await db.fetchall(f"SELECT id FROM {table}")) == 3, "acked one by one"
        await worker.stop()
        assert await db.fetchall(f"SELECT id FROM {table}") == []


async def test_reserve_many_shares_one_token_and_ack_many_says_which_rows_were_owned(
    db_url: str,
) -> None:
    async with open_app(db_url, retry_after=60) as (app, table):
        driver: Any = app.driver("db")
        await Queue.bulk([dbx_bc_hold.with_({"k": i}) for i in range(6)])
        first = await driver.reserve_many(["default"], 4, 0)
        second = await driver.reserve_many(["default"], 4, 0)
        assert [j.message.payload["k"] for j in first] == [0, 1, 2, 3]
        assert [j.message.payload["k"] for j in second] == [4, 5]
        assert len({j.token[1] for j in first}) == 1, "one token per claim"
        assert first[0].token[1] != second[0].token[1]
        assert all(j.attempt == 1 for j in first + second)
        assert await driver.reserve_many(["default"], 4, 0) == []
        # Another worker takes over rows 1 and 4 (their lease passed to it).
        db = app.database()
        for job in (first[1], second[0]):
            await db.execute(
                f"UPDATE {table} SET reserved_at = ? WHERE id = ?",
                (job.token[1] + 1000.0, job.token[0]),
            )
        owned = await driver.ack_many([*first, *second])
        assert owned == [True, False, True, True, False, True]
        left = await db.fetchall(f"SELECT id FROM {table} ORDER BY id")
        assert [int(r[0]) for r in left] == sorted([first[1].token[0], second[0].token[0]])
        assert await driver.ack_many([]) == []


async def test_ack_and_claim_acks_the_owned_rows_and_claims_the_next_ones(db_url: str) -> None:
    async with open_app(db_url, retry_after=60) as (app, table):
        driver: Any = app.driver("db")
        await Queue.bulk([dbx_bc_hold.with_({"k": i}) for i in range(7)])
        first = await driver.reserve_many(["default"], 3, 0)
        db = app.database()
        # Another worker took row 1 over: its ack must report the loss and leave the row.
        await db.execute(
            f"UPDATE {table} SET reserved_at = ? WHERE id = ?",
            (first[1].token[1] + 1000.0, first[1].token[0]),
        )
        owned, claimed = await driver.ack_and_claim(first, "default", 3)
        assert owned == [True, False, True]
        assert [j.message.payload["k"] for j in claimed] == [3, 4, 5]
        assert len({j.token[1] for j in claimed}) == 1, "one token per claim"
        assert claimed[0].token[1] != first[0].token[1]
        assert all(j.attempt == 1 for j in claimed)
        left = {int(r[0]) for r in await db.fetchall(f"SELECT id FROM {table}")}
        assert first[0].token[0] not in left and first[2].token[0] not in left
        assert first[1].token[0] in left
        # Nothing to ack: a plain claim; nothing ready: acks alone.
        owned, more = await driver.ack_and_claim([], "default", 5)
        assert owned == [] and [j.message.payload["k"] for j in more] == [6]
        owned, none = await driver.ack_and_claim([*claimed, *more], "default", 5)
        assert owned == [True] * 4 and none == []
        assert [int(r[0]) for r in await db.fetchall(f"SELECT id FROM {table}")] == [
            first[1].token[0]
        ]


async def test_a_claim_never_takes_a_row_it_is_acking(db_url: str) -> None:
    # A row whose lease ran out looks claimable; if it is also in the acks, the claim
    # must not take it (one statement would both delete and update it on PostgreSQL).
    async with open_app(db_url, retry_after=60) as (app, table):
        driver: Any = app.driver("db")
        await Queue.bulk([dbx_bc_hold.with_({"k": i}) for i in range(2)])
        jobs = await driver.reserve_many(["default"], 2, 0)
        db = app.database()
        old = jobs[0].token[1] - 3600.0
        await db.execute(
            f"UPDATE {table} SET reserved_at = ?, heartbeat_at = ? WHERE id = ?",
            (old, old, jobs[0].token[0]),
        )
        stale = dataclasses.replace(jobs[0], token=(jobs[0].token[0], old))
        owned, claimed = await driver.ack_and_claim([stale], "default", 5)
        assert owned == [True] and claimed == []
        assert [int(r[0]) for r in await db.fetchall(f"SELECT id FROM {table}")] == [
            jobs[1].token[0]
        ]


async def test_an_ack_whose_row_is_already_gone_is_not_a_lost_lease(db_url: str) -> None:
    # An ack sent again (its first answer lost, or the worker's fallback after a failed
    # ack_and_claim whose ack had committed) finds its rows deleted: done, not a lost
    # lease. Only a row still there under another worker's claim is one.
    async with open_app(db_url, retry_after=60) as (app, table):
        driver: Any = app.driver("db")
        db = app.database()
        await Queue.bulk([dbx_bc_hold.with_({"k": i}) for i in range(3)])
        jobs = await driver.reserve_many(["default"], 3, 0)
        assert await driver.ack_many(jobs[:2]) == [True, True]
        assert await driver.ack_many(jobs[:2]) == [True, True]
        assert await driver.ack(jobs[0]) is True
        owned, claimed = await driver.ack_and_claim(jobs[:2], "default", 5)
        assert owned == [True, True] and claimed == []
        taken = jobs[2].token[0]
        await db.execute(
            f"UPDATE {table} SET reserved_at = reserved_at + 1000 WHERE id = ?", (taken,)
        )
        assert await driver.ack(jobs[2]) is False
        assert await driver.ack_many([jobs[0], jobs[2]]) == [True, False]
        owned, claimed = await driver.ack_and_claim([jobs[1], jobs[2]], "default", 5)
        assert owned == [True, False] and claimed == []
        assert [int(r[0]) for r in await db.fetchall(f"SELECT id FROM {table}")] == [taken]


async def test_a_batched_ack_that_finds_the_lease_lost_still_warns(
    db_url: str, caplog: Any
) -> None:
    async with open_app(db_url, retry_after=60) as (app, table):
        GATE["open"] = asyncio.Event()
        job_id = await dbx_bc_hold.dispatch({"k": "lost", "hold": True})
        await dbx_bc_hold.dispatch({"k": "kept"})
        worker = Worker(app, "db", ["default"], 1, sleep=0.05)
        worker.start()
        db = app.database()
        try:
            await until(lambda: "lost" in STARTED)
            # Another worker took the job over: its row carries that worker's reserved_at.
            await db.execute(f"UPDATE {table} SET reserved_at = reserved_at + 1000")
            with caplog.at_level(logging.WARNING):
                GATE["open"].set()
                await until(lambda: "kept" in ENDED)
                await until(lambda: worker.leases_lost == 1)
        finally:
            await worker.stop()
        lost = [r for r in caplog.records if "no longer owned" in r.getMessage()]
        assert len(lost) == 1, [r.getMessage() for r in caplog.records]
        assert '"dbx_bc_hold"' in lost[0].getMessage() and str(job_id) in lost[0].getMessage()
        assert "completion was not recorded" in lost[0].getMessage()
        # the taken-over row is the other worker's now: left alone
        assert len(await db.fetchall(f"SELECT id FROM {table}")) == 1


def _claims(spy: StatementSpy, driver: Any) -> int:
    """Claim statements sent: plain claims, and acks folded into a claim."""
    folded = driver.sql.get("ack_claim_many")
    return len(spy.matching(_claim_sql(driver))) + (len(spy.matching(folded)) if folded else 0)


async def test_a_lost_lease_keeps_the_offloaded_payload_for_the_new_owner(
    db_url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "offload"
    offload = {"to": f"file://{folder}", "over": 100}
    async with open_app(db_url, retry_after=60, offload=offload) as (app, table):
        GATE["open"] = asyncio.Event()
        await dbx_bc_hold.dispatch({"k": "lost", "hold": True, "blob": "x" * 1000})
        assert len(os.listdir(folder)) == 1
        worker = Worker(app, "db", ["default"], 1, sleep=0.05)
        worker.start()
        db = app.database()
        try:
            await until(lambda: "lost" in STARTED)
            # another worker took the job over: this one's ack is not recorded...
            await db.execute(f"UPDATE {table} SET reserved_at = reserved_at + 1000")
            GATE["open"].set()
            await until(lambda: worker.leases_lost == 1)
        finally:
            await worker.stop()
        assert len(os.listdir(folder)) == 1  # ...and it leaves the payload alone
        # the new owner's lease runs out too: a third worker runs it, with its payload
        await db.execute(
            f"UPDATE {table} SET reserved_at = reserved_at - 5000, heartbeat_at = NULL"
        )
        worker = Worker(app, "db", ["default"], 1, sleep=0.05)
        worker.start()
        try:
            await until(lambda: ENDED == ["lost", "lost"])
            await until(lambda: not os.listdir(folder))  # its ack deleted the object
        finally:
            await worker.stop()
        assert not await db.fetchall(f"SELECT id FROM {table}")


async def test_going_idle_costs_one_claim_after_the_folded_one(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Acks leave only with claims here: the finished job's ack rides in the next claim.
    monkeypatch.setattr(haze_worker, "ACK_FLUSH_INTERVAL", 3600.0)
    async with open_app(db_url) as (app, table):
        driver: Any = app.driver("db")
        await dbx_bc_hold.dispatch({"k": "only"})
        spy = StatementSpy(app.database())
        worker = Worker(app, "db", ["default"], 1, sleep=5.0)  # no poll in this test
        worker.start()
        try:
            await until(lambda: ENDED == ["only"])
            await asyncio.sleep(0.3)  # the slot folded its ack into a claim, then waits
            # the claim that found the job, then the folded one that found nothing: the
            # slot waits now, without claiming the same queue once more
            assert _claims(spy, driver) == 2, spy.calls
            assert await app.database().fetchall(f"SELECT id FROM {table}") == []
        finally:
            await worker.stop()


async def test_a_dispatch_during_the_folded_claim_still_ends_the_wait(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(haze_worker, "ACK_FLUSH_INTERVAL", 3600.0)
    async with open_app(db_url) as (app, _):
        driver: Any = app.driver("db")
        await dbx_bc_hold.dispatch({"k": "first"})
        real = driver.ack_and_claim

        async def ack_and_claim(jobs: Any, queue: str, limit: int) -> Any:
            result = await real(jobs, queue, limit)
            if not STARTED[1:]:  # committed after the fold's claim looked: it must wake
                await dbx_bc_hold.dispatch({"k": "second"})
            return result

        driver.ack_and_claim = ack_and_claim
        worker = Worker(app, "db", ["default"], 1, sleep=5.0)
        worker.start()
        try:
            await until(lambda: "first" in ENDED)
            # well before the 5 s idle wait would end
            await until(lambda: ENDED == ["first", "second"], within=2.0)
        finally:
            await worker.stop()


async def test_a_claim_does_not_wait_for_a_timed_ack_flush_in_flight(db_url: str) -> None:
    async with open_app(db_url) as (app, table):
        driver: Any = app.driver("db")
        await Queue.bulk([dbx_bc_hold.with_({"k": i}) for i in range(3)])
        one, two = await driver.reserve_many(["default"], 2, 0)
        held, release = asyncio.Event(), asyncio.Event()
        real = driver.ack_many

        async def ack_many(jobs: Any) -> Any:
            if not held.is_set():  # the timed flush: its round trip takes long
                held.set()
                await release.wait()
            return await real(jobs)

        driver.ack_many = ack_many
        # idle on another queue: "default"'s last job is for the claim below
        worker = Worker(app, "db", ["other"], 1, sleep=5.0)
        worker.start()
        try:
            await until(lambda: worker._fetch_idle)  # its slot is in its idle wait
            worker._ack_later(one)
            await until(held.is_set)  # the timed flush of the first ack is in flight
            worker._ack_later(two)
            # a slot's claim: it does not wait for the flush in flight (nor fold the ack
            # finished since into it): the slot claims at once, the ack waits its turn
            assert await asyncio.wait_for(worker._flush_acks(claim=("default", 1)), 5) is None
            assert worker._acks == [two]
            release.set()
            await until(lambda: not worker._acks and not worker._flushes)
            left = [int(r[0]) for r in await app.database().fetchall(f"SELECT id FROM {table}")]
            assert one.token[0] not in left and two.token[0] not in left and len(left) == 1
        finally:
            release.set()
            await worker.stop()
        assert worker.leases_lost == 0


async def test_a_worker_that_stops_while_its_ack_keeps_failing_names_the_job(
    db_url: str, caplog: Any
) -> None:
    async with open_app(db_url) as (app, table):
        driver: Any = app.driver("db")

        async def broken(*args: Any) -> Any:
            raise RuntimeError("injected: every ack fails")

        for name in ("ack", "ack_many", "ack_and_claim"):
            setattr(driver, name, broken)
        job_id = await dbx_bc_hold.dispatch({"k": "x"})
        worker = Worker(app, "db", ["default"], 1, sleep=0.05)
        worker.start()
        await until(lambda: ENDED == ["x"])
        with caplog.at_level(logging.WARNING):
            await worker.stop()  # tries for a while, then says which job will run again
        lines = [r.getMessage() for r in caplog.records if "not recorded" in r.getMessage()]
        assert len(lines) == 1 and str(job_id) in lines[0], lines
        assert "retry_after" in lines[0] and "\n" not in lines[0]
        assert not any(r.exc_info for r in caplog.records)
        # still claimed: it runs again once its claim expires
        assert len(await app.database().fetchall(f"SELECT id FROM {table}")) == 1


# --------------------------------------------------------------------------- processes

PROC_BACKENDS = ["sqlite", "postgres", "mariadb"]


class Procs(WorkerProcs):
    def __init__(self, url: str, tmp: Path, table: str, failed: str, retry_after: str):
        super().__init__(tmp, APP)
        self.url, self.table, self.failed, self.retry_after = url, table, failed, retry_after

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.update(
            DBX_DB_URL=self.url,
            DBX_TABLE=self.table,
            DBX_FAILED_TABLE=self.failed,
            DBX_RETRY_AFTER=self.retry_after,
            DBX_RUNS_FILE=str(self.runs_file),
            PYTHONUNBUFFERED="1",
        )
        env.pop("PYTEST_CURRENT_TEST", None)
        return self.spawn("db", "default", args, env)

    def events(self) -> list[tuple[str, str, int, int]]:
        if not self.runs_file.exists():
            return []
        out = []
        for line in self.runs_file.read_text().splitlines():
            event, key, attempt, pid, _ = line.split()
            out.append((event, key, int(attempt), int(pid)))
        return out

    def count(self, event: str) -> collections.Counter[str]:
        return collections.Counter(k for e, k, _, _ in self.events() if e == event)


@contextlib.asynccontextmanager
async def proc_rig(
    request: pytest.FixtureRequest, kind: str, tmp: Path, retry_after: str
) -> AsyncIterator[tuple[App, Procs]]:
    url = backend_url(request, kind, tmp)
    async with open_app(url, retry_after=retry_after) as (app, table):
        driver: Any = app.driver("db")
        procs = Procs(url, tmp, table, driver.failed_table, retry_after)
        try:
            yield app, procs
        finally:
            procs.kill_all()


async def _keys_left(app: App, table: str) -> list[str]:
    rows = await app.database().fetchall(f"SELECT payload FROM {table} ORDER BY id")
    return [str(json.loads(r[0])["payload"]["k"]) for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("kind", PROC_BACKENDS)
async def test_sigterm_flushes_the_buffered_acks(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    async with proc_rig(request, kind, tmp_path, "90s") as (app, procs):
        record = proc_jobs.dbx_batch_record
        await Queue.bulk([record.with_({"k": f"run{i}", "sleep": 1.0}) for i in range(4)])
        await Queue.bulk([record.with_({"k": f"wait{i}"}) for i in range(6)])
        p = procs.start("--concurrency", "4")
        await procs.wait_ready(p)
        await until(lambda: sum(procs.count("start").values()) == 4, within=60)
        p.send_signal(signal.SIGTERM)
        assert await procs.wait_exit(p) == 0, procs.log(p)
        ended = procs.count("end")
        assert sorted(ended) == [f"run{i}" for i in range(4)], procs.events()
        # the four finished jobs' acks were sent before the process exited
        assert await _keys_left(app, procs.table) == [f"wait{i}" for i in range(6)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", PROC_BACKENDS)
async def test_a_sigkill_before_the_flush_runs_only_the_unflushed_jobs_again(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    concurrency = 4
    async with proc_rig(request, kind, tmp_path, "2s") as (app, procs):
        record, kill = proc_jobs.dbx_batch_record, proc_jobs.dbx_batch_kill
        await Queue.bulk([record.with_({"k": f"a{i}"}) for i in range(40)])
        await kill.dispatch({"k": "kill"})
        await Queue.bulk([record.with_({"k": f"b{i}"}) for i in range(20)])
        every = {f"a{i}" for i in range(40)} | {"kill"} | {f"b{i}" for i in range(20)}
        first = procs.start("--concurrency", str(concurrency))
        # The kill job's after-event SIGKILLs the worker: the job is done, its ack is
        # still in the worker's buffer.
        assert await procs.wait_exit(first) == -signal.SIGKILL, procs.log(first)
        left = set(await _keys_left(app, procs.table))
        assert "kill" in left, "the finished job's ack was sent before the kill"
        started_first = set(procs.count("start"))
        assert "kill" in set(procs.count("end"))
        second = procs.start("--concurrency", str(concurrency))
        await procs.wait_ready(second)
        # The first worker's claims come back after retry_after: wait for the table.
        deadline = asyncio.get_running_loop().time() + 60
        while await _keys_left(app, procs.table):
            assert asyncio.get_running_loop().time() < deadline, procs.log(second)
            await asyncio.sleep(0.1)
        second.send_signal(signal.SIGTERM)
        assert await procs.wait_exit(second) == 0, procs.log(second)
        assert await _keys_left(app, procs.table) == []
        starts = procs.count("start")
        twice = {k for k, n in starts.items() if n > 1}
        # Nothing lost; what ran twice is exactly what the first worker had started
        # (finished or running) without its ack reaching the table.
        assert set(starts) == every
        assert all(n <= 2 for n in starts.values()), starts
        assert twice == left & started_first, (twice, left, started_first)
        assert "kill" in twice
        # acks pending at the kill: at most two claims' worth (one buffered, one in flight)
        assert len(twice) <= 2 * concurrency, twice
