"""A dispatch whose INSERT lost its connection: it returns with its job queued once, or
raises with nothing queued, on every SQL backend.

The lost reply is a fault injected into the app's connector (its ``execute``): whether
a statement committed before its connection died cannot be produced on cue by a real
server (``tests/attack`` storms it with killed connections on PostgreSQL and MariaDB).
The statement itself runs on the real database.

The PostgreSQL test below has no fault injected: the server really closes the pool's
idle connections (``pg_terminate_backend``), and the next dispatches, a bulk, a delayed
dispatch and ``Queue.size`` all succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from harness import BACKENDS, PG_ADMIN_URL, backend_url, mysql_database, pg_database
from haze import (
    App,
    DatabaseConnectionError,
    DispatchIncompleteError,
    DispatchOutcomeUnknownError,
    Queue,
    define_database_config,
    define_job,
    define_queue_config,
)
from haze._workers.worker import Worker
from haze.connectors.migrations import ensure_queue_tables
from haze.drivers.sql import landed

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    yield from pg_database("dbx_lost")


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    yield from mysql_database("dbx_lost")


@define_job(name="dbx_lost_reply")
async def noted(payload: Any) -> None:
    return None


@define_job(name="dbx_lost_reply_tracked", track=True)
async def tracked(payload: Any) -> None:
    return None


@contextlib.asynccontextmanager
async def _app(url: str, table: str) -> AsyncIterator[App]:
    conn = {
        "driver": "database",
        "connection": "main",
        "table": table,
        "failed_table": f"{table}_f",
    }
    app = App(
        queue=define_queue_config(default="db", connections={"db": conn}),
        database=define_database_config(default="main", connections={"main": {"url": url}}),
    )
    async with app:
        await ensure_queue_tables(app)
        await app.driver("db").purge("default")
        yield app


def _lose_replies(app: App, monkeypatch: pytest.MonkeyPatch, table: str, plan: list[str]) -> None:
    """Each INSERT into ``table`` takes the next step of ``plan``: "after" runs it and
    then loses the reply; "before" loses the connection before it ran; "ok" runs it;
    "unsent" finds no connection to send it on; "late" loses the connection while the
    server still runs it, and the row lands 0.3 s later (MariaDB's KILL of a busy
    thread, or a backend the connector stopped waiting for); "lost" loses it likewise
    and the statement never commits; "held" likewise, and the row lands when the test
    runs the statement kept in ``_held``."""
    db: Any = app.database("main")
    real = db.execute
    injected = _injected[table] = []

    async def execute(sql: str, params: Any = ()) -> int:
        if f"INSERT INTO {table} " not in sql or not plan:
            return int(await real(sql, params))
        step = plan.pop(0)
        injected.append(step)
        if step == "before":
            raise DatabaseConnectionError("the connection died before the INSERT (injected)")
        if step == "unsent":
            raise DatabaseConnectionError("no connection for the INSERT (injected)", write="unsent")
        if step in ("late", "lost", "held"):
            if step == "held":
                _held.append(lambda: real(sql, params))
            if step == "late":
                landing = asyncio.get_running_loop().call_later(
                    0.3, lambda: asyncio.ensure_future(real(sql, params))
                )
                _late.append(landing)
            raise DatabaseConnectionError(
                "the server still runs the INSERT (injected)", write="unsettled"
            )
        n = int(await real(sql, params))
        if step == "after":
            raise DatabaseConnectionError("the connection died after the INSERT (injected)")
        return n

    monkeypatch.setattr(db, "execute", execute)


#: the late INSERTs scheduled by "late" steps
_late: list[asyncio.TimerHandle] = []


#: the INSERTs of "held" steps, each landed when the test calls it
_held: list[Any] = []

#: table -> the steps of its plan that were taken (each test checks its plan ran)
_injected: dict[str, list[str]] = {}

CASES = {
    # committed, reply lost: found by its id, the dispatch returns
    "committed": (["after"], "returns"),
    # never ran: sent once more
    "not sent once": (["before", "ok"], "returns"),
    # never ran, and the second send committed with its reply lost too
    "not sent, then committed": (["before", "after"], "returns"),
    # never ran, twice: nothing queued, the error stands
    "not sent twice": (["before", "before"], "raises"),
    # no connection at all: nothing was written, the error stands at once (not sent again)
    "no connection": (["unsent"], "raises"),
    # still running when the connection died, and committed later: found, not sent again
    "committed late": (["late"], "returns"),
    # still running when the connection died, and never committed: not sent again (it
    # could still commit), the dispatch says the outcome is unknown
    "never settled": (["lost"], "unknown"),
    # never ran, then the second send was still running when its connection died
    "not sent, then committed late": (["before", "late"], "returns"),
}


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, request.param, tmp_path)


@pytest.mark.parametrize("case", list(CASES))
async def test_a_dispatch_that_lost_its_reply_queues_once_or_nothing(
    url: str, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = f"dbx_lost_{abs(hash(case)) % 10_000}"
    plan, outcome = CASES[case]
    async with _app(url, table) as app:
        _lose_replies(app, monkeypatch, table, list(plan))
        if outcome == "returns":
            await noted.dispatch({"case": case})
        elif outcome == "unknown":
            monkeypatch.setattr(landed, "RESOLVE_SECONDS", 0.5)
            with pytest.raises(DispatchOutcomeUnknownError) as e:
                await noted.dispatch({"case": case})
            assert "may be queued" in str(e.value) and len(e.value.job_ids) == 1
        else:
            with pytest.raises(DatabaseConnectionError) as raised:
                await noted.dispatch({"case": case})
            assert not isinstance(raised.value, DispatchOutcomeUnknownError)
        await asyncio.sleep(0.4 if "late" in plan else 0)  # a late INSERT lands meanwhile
        assert await Queue.size() == (1 if outcome == "returns" else 0)
        assert _injected[table] == plan


async def test_a_bulk_chunk_that_lost_its_reply_is_queued_once(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _app(url, "dbx_lost_bulk") as app:
        _lose_replies(app, monkeypatch, "dbx_lost_bulk", ["after"])
        ids = await Queue.bulk([noted.with_({"n": n}) for n in range(5)])
        assert len(set(ids)) == 5
        assert await Queue.size() == 5
        assert _injected["dbx_lost_bulk"] == ["after"]


@pytest.mark.parametrize("n", [3, 501])
async def test_a_bulk_whose_outcome_is_unknown_keeps_its_status_records(
    url: str, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk whose INSERT may still commit: the bulk raises DispatchOutcomeUnknownError
    naming the chunk's jobs, whose status records stay (they may be queued); the jobs of
    the chunks after it were not sent, and the error says so (501: two chunks)."""
    table = f"dbx_lost_bulk_unknown_{n}"
    async with _app(url, table) as app:
        _lose_replies(app, monkeypatch, table, ["late"])
        monkeypatch.setattr(landed, "RESOLVE_SECONDS", 0.1)
        pending = [tracked.with_({"n": i}) for i in range(n)]
        with pytest.raises(DispatchOutcomeUnknownError) as e:
            await Queue.bulk(pending)
        maybe = e.value.job_ids
        assert len(maybe) == min(n, 500)
        assert ("1 messages after them were not sent" in str(e.value)) == (n > 500)
        await asyncio.sleep(0.4)  # the late INSERT lands
        assert await Queue.size() == len(maybe)
        for job_id in maybe:
            assert await Queue.status(job_id) is not None


@pytest.mark.parametrize("step", ["late", "lost"])
async def test_a_later_chunk_whose_outcome_is_unknown_is_not_reported_as_not_queued(
    url: str, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bulk of three chunks whose second chunk's INSERT may still commit: the bulk
    raises DispatchIncompleteError with that chunk's jobs in ``unknown`` (they may be
    queued: "late" lands them, "lost" never does), not in ``failed``, which names only
    the third chunk's jobs (never sent); their status records stay."""
    table = f"dbx_lost_later_{step}"
    async with _app(url, table) as app:
        chunk = 500
        _lose_replies(app, monkeypatch, table, ["ok", step])
        monkeypatch.setattr(landed, "RESOLVE_SECONDS", 0.1)
        pending = [tracked.with_({"n": i}) for i in range(2 * chunk + 3)]
        with pytest.raises(DispatchIncompleteError) as e:
            await Queue.bulk(pending)
        failed = e.value.failed
        assert len(failed) == 3, f"{len(failed)} reported as not queued"
        maybe = e.value.unknown
        assert len(maybe) == chunk and not set(maybe) & set(failed)
        assert e.value.unsent == 3
        assert f"{chunk} may be queued" in str(e.value) and "Queue.status" in str(e.value)
        await asyncio.sleep(0.4)  # a late INSERT lands
        assert await Queue.size() == chunk + (chunk if step == "late" else 0)
        for job_id in maybe:
            assert await Queue.status(job_id) is not None
        for job_id in failed:
            assert await Queue.status(job_id) is None


#: the ``n`` of each job of ``counted`` that ran
RAN: list[int] = []
#: the ``n`` of the job of ``counted`` that lands the held INSERT while it runs
LAND_IN: list[int] = []


@define_job(name="dbx_lost_reply_counted")
async def counted(payload: Any) -> None:
    RAN.append(payload["n"])
    if payload["n"] in LAND_IN:
        await _held.pop()()


async def _until(predicate: Any, within: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await predicate():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("split", ["batch chunk", "driver chunk"])
@pytest.mark.parametrize("step", ["late", "held", "lost", "held after", "lookup down"])
async def test_a_batch_member_whose_outcome_is_unknown_is_pending_not_failed(
    url: str, step: str, split: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """A batch of 6 whose jobs 3 and 4 went out in an INSERT that lost its reply and
    could not be looked up: the dispatch raises DispatchIncompleteError naming them in
    ``unknown`` (none failed), and the batch keeps them pending. One worker runs the
    batch one job at a time.

    Queued after all, they run and count as done, even when they are taken only after
    every other job of the batch ended: "late" lands them before the worker starts
    (behind the others when jobs 5 and 6 were not sent), "held" while the batch's last
    other job runs; the batch looks them up on their connection before giving up on
    them. Never queued ("lost"; "lookup down": and the first lookups fail, as with the
    database down), they count as failed once the batch's other jobs have ended, and
    the batch ends (a lookup without an answer is asked again in the background). Queued only after the batch ended ("held after"), they are
    skipped: the batch never runs a job it counted as failed.

    ``split``: the INSERT is the first of its bulk (the batch sends 2 jobs a bulk:
    DispatchOutcomeUnknownError, and jobs 5 and 6 go out in the next bulk) or the
    second (the driver sends 2 rows an INSERT: DispatchIncompleteError, and jobs 5 and
    6 are not sent: failed). The lookup's failures are injected into the real
    connector's ``fetchall`` for its lookup statement."""
    table = f"dbx_lost_batch_{step.replace(' ', '_')}_{split[0]}"
    async with _app(url, table) as app:
        from haze._orchestration import batch_dispatch, batch_settle

        if split == "batch chunk":
            monkeypatch.setattr(batch_dispatch, "DISPATCH_CHUNK", 2)
        else:
            driver: Any = app.driver("db")
            two = lambda items, **_: (items[i : i + 2] for i in range(0, len(items), 2))  # noqa: E731
            monkeypatch.setattr(driver, "_chunks", two)
        sent = {"lookup down": "lost", "held after": "held"}.get(step, step)
        _lose_replies(app, monkeypatch, table, ["ok", sent])
        monkeypatch.setattr(landed, "RESOLVE_SECONDS", 0.1)
        monkeypatch.setattr(batch_settle, "LOOKUP_RETRY_SECONDS", 0.2)
        RAN.clear()
        _held.clear()
        LAND_IN.clear()
        jobs = [counted.with_({"n": n}) for n in range(6)]
        with pytest.raises(DispatchIncompleteError) as e:
            await Queue.batch(jobs).allow_failures().dispatch()
        unsent = 2 if split == "driver chunk" else 0
        assert len(e.value.failed) == e.value.unsent == unsent, e.value
        maybe, batch_id = e.value.unknown, e.value.batch_id
        assert len(maybe) == 2 and batch_id is not None
        assert "2 more may be queued" in str(e.value)
        batch = await Queue.find_batch(batch_id)
        assert batch is not None and batch.unknown == 2
        assert (batch.pending, batch.failed) == (6 - unsent, unsent)
        await asyncio.sleep(0.4)  # a late INSERT lands
        queued = [0, 1] if unsent else [0, 1, 4, 5]
        if step == "held":
            LAND_IN.append(queued[-1])
        if step == "lookup down":
            _fail_lookups(app, monkeypatch, 0.3)
        worker = Worker(app, "db", ["default"], 1, sleep=0.05)
        worker.start()
        try:

            async def finished() -> bool:
                b = await Queue.find_batch(batch_id)
                return b is not None and b.finished

            await _until(finished)
            if step == "held after":
                await _held[0]()  # the INSERT lands after the batch ended
            await _until(lambda: _empty())
        finally:
            await worker.stop()
        batch = await Queue.find_batch(batch_id)
        assert batch is not None and batch.pending == 0
        if step in ("late", "held"):
            assert sorted(RAN) == sorted([*queued, 2, 3]) and batch.failed == unsent
            assert not set(maybe) & set(batch.failed_job_ids)
        else:
            assert sorted(RAN) == queued and batch.failed == unsent + 2
            assert set(maybe) <= set(batch.failed_job_ids)
        # a lookup without an answer is asked again later: no job of the batch is left
        # to settle and ask
        assert ("asking again" in caplog.text) == (step == "lookup down"), caplog.text


async def test_an_app_that_stops_while_asking_again_ends_the_lookup_and_says_so(
    url: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """The batch's jobs 3 and 4 lost their INSERT's reply and were never queued, and
    every lookup fails (the database stays down for it): the batch asks again in the
    background. The app stops meanwhile: that task ends with it (no task outlives the
    app's loop and store), and a warning names the batch, which stays pending."""
    table = "dbx_lost_batch_stop"
    async with _app(url, table) as app:
        from haze._orchestration import batch_dispatch, batch_settle

        monkeypatch.setattr(batch_dispatch, "DISPATCH_CHUNK", 2)
        _lose_replies(app, monkeypatch, table, ["ok", "lost"])
        monkeypatch.setattr(landed, "RESOLVE_SECONDS", 0.1)
        monkeypatch.setattr(batch_settle, "LOOKUP_RETRY_SECONDS", 0.2)
        RAN.clear()
        _fail_lookups(app, monkeypatch, 600)
        with pytest.raises(DispatchIncompleteError) as e:
            await Queue.batch([counted.with_({"n": n}) for n in range(6)]).dispatch()
        batch_id = e.value.batch_id
        worker = Worker(app, "db", ["default"], 1, sleep=0.05)
        worker.start()

        async def asking() -> bool:
            return "asking again" in caplog.text

        try:
            await _until(asking)
        finally:
            await worker.stop()
        [(_, task)] = [v for k, v in batch_settle._asking.items() if k == batch_id]
    assert task.cancelled() or task.done()
    assert batch_id not in batch_settle._asking
    assert f'batch "{batch_id}": the app stopped before it could tell' in caplog.text


def _fail_lookups(app: App, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The queue connection's job lookups fail for ``seconds`` from the first one on
    (longer than a lookup keeps asking: ``landed.RESOLVE_SECONDS``), as with its
    database down (the real connector's ``fetchall`` wrapped)."""
    db: Any = app.database("main")
    real = db.fetchall
    driver: Any = app.driver("db")
    lookup = driver.sql["find_job"]
    since: list[float] = []

    async def fetchall(sql: str, params: Any = ()) -> Any:
        if sql == lookup:
            now = asyncio.get_running_loop().time()
            since[:] = since or [now]
            if now < since[0] + seconds:
                raise DatabaseConnectionError("the database is down (injected)")
        return await real(sql, params)

    monkeypatch.setattr(db, "fetchall", fetchall)


async def _empty() -> bool:
    return await Queue.size() == 0


def terminate(url: str) -> int:
    """Terminate every server process of ``url``'s database (of no other): what a server
    restart, a failover or an idle-session timeout does to a client's pool."""
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as c:
        rows = c.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)


@pytest.fixture
def own_pg() -> Iterator[str]:
    """A database of its own: the test terminates every connection to it."""
    yield from pg_database("dbx_idle")


async def test_postgres_idle_connections_the_server_closed_cost_no_dispatch(
    own_pg: str,
) -> None:
    async with _app(own_pg, "dbx_idle") as app:
        del app
        await asyncio.gather(*(noted.dispatch({"warm": i}) for i in range(20)))
        for step in ("dispatch", "bulk", "delayed", "size"):
            assert terminate(own_pg) > 0
            await asyncio.sleep(0.2)  # the server's goodbye reaches the pooled sockets
            if step == "dispatch":
                await noted.dispatch({"after": 1})
            elif step == "bulk":
                await Queue.bulk([noted.with_({"bulk": n}) for n in range(3)])
            elif step == "delayed":
                await noted.with_({"later": 1}).delay(60).dispatch()
            else:
                assert await Queue.size() == 25
        assert await Queue.size() == 25


@contextlib.asynccontextmanager
async def _failover_app(url: str, table: str, tmp_path: Path) -> AsyncIterator[App]:
    """An app whose default connection fails over from ``url`` to a SQLite file."""
    conns = {
        "db": {
            "driver": "database",
            "connection": "main",
            "table": table,
            "failed_table": f"{table}_f",
        },
        "spare": {"driver": "database", "connection": "spare"},
        "both": {"driver": "failover", "connections": ["db", "spare"]},
    }
    app = App(
        queue=define_queue_config(default="both", connections=conns),
        database=define_database_config(
            default="main",
            connections={"main": {"url": url}, "spare": {"url": f"sqlite:///{tmp_path}/spare.db"}},
        ),
    )
    async with app:
        await ensure_queue_tables(app, "db")
        await ensure_queue_tables(app, "spare")
        await app.driver("db").purge("default")
        yield app


@pytest.mark.parametrize("bulk", [False, True], ids=["dispatch", "bulk"])
async def test_a_failover_connection_does_not_send_a_job_that_may_be_queued_elsewhere(
    url: str, bulk: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failover connection moves on only when nothing was queued: a first connection
    whose INSERT may still commit (its dispatch raises DispatchOutcomeUnknownError) is
    not followed by the next one. Before the fix the job went to the second connection
    too, and ran twice once the first INSERT committed."""
    table = "dbx_lost_failover"
    async with _failover_app(url, table, tmp_path) as app:
        _lose_replies(app, monkeypatch, table, ["held"])
        monkeypatch.setattr(landed, "RESOLVE_SECONDS", 0.2)
        send = (
            Queue.bulk([noted.with_({"n": n}) for n in range(3)])
            if bulk
            else noted.dispatch({"n": 0})
        )
        with pytest.raises(DispatchOutcomeUnknownError):
            await send
        await _held.pop()()  # the first connection's INSERT commits after all
        queued = await app.driver("db").size("default"), await app.driver("spare").size("default")
    assert queued == ((3 if bulk else 1), 0)


async def test_a_failover_bulk_sends_what_its_first_connection_did_not_queue_to_the_next(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bulk of 501 (two INSERTs of 500 and 1) whose second INSERT finds the first
    connection down (twice: it is sent once more) goes on to the next connection with
    only the job not queued: the bulk returns, every job queued once. Before, the bulk
    raised DispatchIncompleteError naming that job."""
    table = "dbx_lost_failover_part"
    async with _failover_app(url, table, tmp_path) as app:
        _lose_replies(app, monkeypatch, table, ["ok", "before", "before"])
        ids = await Queue.bulk([noted.with_({"n": n}) for n in range(501)])
        assert len(set(ids)) == 501
        queued = await app.driver("db").size("default"), await app.driver("spare").size("default")
    assert queued == (500, 1)
    assert _injected[table] == ["ok", "before", "before"]


async def test_a_failover_bulk_keeps_the_jobs_that_may_be_queued_on_its_first_connection(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second INSERT of a bulk of 1,001 may still commit (its outcome is unknown)
    and the third was not sent: only the third's job goes to the next connection; the
    bulk raises DispatchIncompleteError naming the 500 that may be queued, none failed."""
    table = "dbx_lost_failover_unknown"
    async with _failover_app(url, table, tmp_path) as app:
        _lose_replies(app, monkeypatch, table, ["ok", "held"])
        monkeypatch.setattr(landed, "RESOLVE_SECONDS", 0.2)
        with pytest.raises(DispatchIncompleteError) as e:
            await Queue.bulk([noted.with_({"n": n}) for n in range(1001)])
        assert (len(e.value.unknown), e.value.failed) == (500, {})
        assert "may be queued" in str(e.value)
        await _held.pop()()
        queued = await app.driver("db").size("default"), await app.driver("spare").size("default")
    assert queued == (1000, 1)
