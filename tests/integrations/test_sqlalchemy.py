"""``haze.integrations.sqlalchemy`` against real databases through SQLAlchemy.

Every scenario runs on a SQLite file (``tmp_path``) and on PostgreSQL (127.0.0.1:5432,
user ``postgres``; a fresh uniquely named database per test session, dropped at the
end). Without a server the PostgreSQL cases are skipped locally and fail when
``CI=true``. Jobs run on the ``memory`` driver; a job reads the row its transaction
wrote through a separate connection, so "it ran after COMMIT" is checked directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import haze
import pytest
from haze import App, DispatchResult, Queue, define_job, define_queue_config
from haze._base.hints import install_hint
from haze.integrations.sqlalchemy import TransactionScope, transaction_scope
from haze.transactions import current_transaction
from services import server_missing
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, scoped_session, sessionmaker

IN_CI = os.environ.get("CI") == "true"
PG_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=3"
PG_URL = "postgresql+{driver}://postgres@127.0.0.1:5432/{db}"

DDL = [
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT)",
    "CREATE TABLE parents (id INTEGER PRIMARY KEY)",
    "CREATE TABLE children (id INTEGER PRIMARY KEY, parent_id INTEGER "
    "REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)",
]
INSERT = text("INSERT INTO orders (id, note) VALUES (:id, 'x')")


def _need(module: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"{module} is required in CI: {exc}")
        pytest.skip(f"{module} is not installed")


# ==================================================================== jobs

RAN: list[dict[str, Any]] = []
PROBE: list[Callable[[int], bool]] = []


def _record(name: str, payload: Any, job: Any) -> None:
    seen = None
    if PROBE and isinstance(payload, dict) and "order_id" in payload:
        seen = PROBE[0](payload["order_id"])
    RAN.append({"job": name, "payload": payload, "id": job.id, "seen": seen})


@define_job(name="sa_receipt", after_commit=True)
async def sa_receipt(payload: dict[str, Any], job: Any) -> None:
    _record("sa_receipt", payload, job)


@define_job(name="sa_notify")
async def sa_notify(payload: dict[str, Any], job: Any) -> None:
    _record("sa_notify", payload, job)


@define_job(name="sa_unique", unique=True, after_commit=True)
async def sa_unique(payload: dict[str, Any], job: Any) -> None:
    _record("sa_unique", payload, job)


@define_job(name="sa_bad_key", unique={"key": lambda p: p["missing"]}, after_commit=True)
async def sa_bad_key(payload: dict[str, Any], job: Any) -> None:
    _record("sa_bad_key", payload, job)


def ran(name: str | None = None) -> list[dict[str, Any]]:
    return [r for r in RAN if name is None or r["job"] == name]


def payloads(name: str | None = None) -> list[Any]:
    return [r["payload"] for r in ran(name)]


# ==================================================================== databases


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    try:
        import psycopg

        admin = psycopg.connect(PG_ADMIN_DSN, autocommit=True)
    except Exception as exc:
        server_missing("PostgreSQL", "127.0.0.1:5432", str(exc))
    name = f"haze_sa_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _sqlite_recipe(engine: Engine) -> None:
    """SQLAlchemy's documented recipe for working SAVEPOINTs on (aio)sqlite."""

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")


@dataclass
class Db:
    backend: str
    engine: Engine
    async_url: str
    _async_engine: Any = None

    @property
    def async_engine(self) -> Any:
        if self._async_engine is None:
            _need("greenlet")
            from sqlalchemy.ext.asyncio import create_async_engine

            self._async_engine = create_async_engine(self.async_url)
            if self.backend == "sqlite":
                _sqlite_recipe(self._async_engine.sync_engine)
        return self._async_engine

    def probe(self, order_id: int) -> bool:
        with self.engine.connect() as conn:
            n = conn.execute(text("SELECT count(*) FROM orders WHERE id = :id"), {"id": order_id})
            return bool(n.scalar())


@pytest.fixture(params=["sqlite", "postgresql"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Db]:
    if request.param == "sqlite":
        path = tmp_path / "haze.sqlite"
        engine = create_engine(f"sqlite:///{path}")
        _sqlite_recipe(engine)
        database = Db("sqlite", engine, f"sqlite+aiosqlite:///{path}")
    else:
        name = request.getfixturevalue("pg_database")
        engine = create_engine(PG_URL.format(driver="psycopg", db=name))
        database = Db("postgresql", engine, PG_URL.format(driver="asyncpg", db=name))
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS children, parents, orders")
    with engine.begin() as conn:
        for ddl in DDL:
            conn.exec_driver_sql(ddl)
    PROBE[:] = [database.probe]
    try:
        yield database
    finally:
        PROBE.clear()
        if database._async_engine is not None:
            await database._async_engine.dispose()
        engine.dispose()


@pytest.fixture
async def app() -> AsyncIterator[App]:
    RAN.clear()
    application = App(
        queue=define_queue_config(default="memory", connections={"memory": {"driver": "memory"}})
    )
    try:
        async with application:
            yield application
    finally:
        Queue.restore()
        RAN.clear()


# ==================================================================== flavours
# One adapter per kind of target, so each scenario runs on Session, AsyncSession,
# Connection and AsyncConnection alike.


class Flavor:
    def __init__(self, db: Db) -> None:
        self.db = db

    def scope(self) -> contextlib.AbstractAsyncContextManager[Flavor]:
        raise NotImplementedError

    def begin(self) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    def nested(self) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    async def insert(self, order_id: int) -> None:
        raise NotImplementedError


class SyncFlavor(Flavor):
    target: Any

    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[Any]:
        with self.target.begin() as tx:
            yield tx

    @contextlib.asynccontextmanager
    async def nested(self) -> AsyncIterator[Any]:
        with self.target.begin_nested() as tx:
            yield tx

    async def insert(self, order_id: int) -> None:
        self.target.execute(INSERT, {"id": order_id})


class AsyncFlavor(Flavor):
    target: Any

    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[Any]:
        async with self.target.begin() as tx:
            yield tx

    @contextlib.asynccontextmanager
    async def nested(self) -> AsyncIterator[Any]:
        async with self.target.begin_nested() as tx:
            yield tx

    async def insert(self, order_id: int) -> None:
        await self.target.execute(INSERT, {"id": order_id})


class SessionFlavor(SyncFlavor):
    @contextlib.asynccontextmanager
    async def scope(self) -> AsyncIterator[Flavor]:
        with Session(self.db.engine) as self.target, transaction_scope(self.target):
            yield self


class AsyncSessionFlavor(AsyncFlavor):
    @contextlib.asynccontextmanager
    async def scope(self) -> AsyncIterator[Flavor]:
        from sqlalchemy.ext.asyncio import AsyncSession

        async with (
            AsyncSession(self.db.async_engine) as self.target,
            transaction_scope(self.target),
        ):
            yield self


class ConnectionFlavor(SyncFlavor):
    @contextlib.asynccontextmanager
    async def scope(self) -> AsyncIterator[Flavor]:
        with self.db.engine.connect() as self.target, transaction_scope(self.target):
            yield self


class AsyncConnectionFlavor(AsyncFlavor):
    @contextlib.asynccontextmanager
    async def scope(self) -> AsyncIterator[Flavor]:
        async with self.db.async_engine.connect() as self.target, transaction_scope(self.target):
            yield self


FLAVORS = {
    "Session": SessionFlavor,
    "AsyncSession": AsyncSessionFlavor,
    "Connection": ConnectionFlavor,
    "AsyncConnection": AsyncConnectionFlavor,
}


@pytest.fixture(params=list(FLAVORS))
def flavor(request: pytest.FixtureRequest, db: Db) -> Flavor:
    flavor: Flavor = FLAVORS[request.param](db)
    return flavor


class Boom(Exception):
    pass


@contextlib.asynccontextmanager
async def rolled_back(cm: Any) -> AsyncIterator[Any]:
    """Enter ``cm`` (a sync or async transaction), run the block, then raise inside it."""
    try:
        if hasattr(cm, "__aenter__"):
            async with cm as value:
                yield value
                raise Boom
        else:
            with cm as value:
                yield value
                raise Boom
    except Boom:
        pass


# ==================================================================== commit / rollback


async def test_commit_fires_after_the_outermost_commit(app: App, flavor: Flavor) -> None:
    async with flavor.scope():
        async with flavor.begin():
            await flavor.insert(1)
            job_id = await sa_receipt.dispatch({"order_id": 1})
            await Queue.idle()
            assert ran() == []  # not queued before COMMIT
        await Queue.idle()
    assert ran() == [{"job": "sa_receipt", "payload": {"order_id": 1}, "id": job_id, "seen": True}]


async def test_rollback_drops(app: App, flavor: Flavor) -> None:
    async with flavor.scope():
        async with rolled_back(flavor.begin()):
            await flavor.insert(1)
            await sa_receipt.dispatch({"order_id": 1})
            haze.after_commit(lambda: RAN.append({"job": "callback"}))
        await Queue.idle()
        # the next transaction on the same target starts clean
        async with flavor.begin():
            await flavor.insert(2)
            await sa_receipt.dispatch({"order_id": 2})
        await Queue.idle()
    assert [(r["payload"], r["seen"]) for r in ran()] == [({"order_id": 2}, True)]


async def test_savepoints(app: App, flavor: Flavor) -> None:
    async with flavor.scope():
        async with flavor.begin():
            await flavor.insert(1)
            await sa_receipt.dispatch({"order_id": 1, "at": "outer"})
            async with rolled_back(flavor.nested()):
                await sa_receipt.dispatch({"order_id": 1, "at": "rolled back"})
            async with flavor.nested():
                await sa_receipt.dispatch({"order_id": 1, "at": "released"})
                async with rolled_back(flavor.nested()):
                    await sa_receipt.dispatch({"order_id": 1, "at": "inner rolled back"})
                async with flavor.nested():
                    await sa_receipt.dispatch({"order_id": 1, "at": "inner released"})
            await Queue.idle()
            assert ran() == []  # released savepoints wait for the outer commit
            await sa_receipt.dispatch({"order_id": 1, "at": "outer again"})
        await Queue.idle()
    assert [p["at"] for p in payloads()] == ["outer", "released", "inner released", "outer again"]
    assert all(r["seen"] for r in ran())


async def test_released_savepoint_then_outer_rollback_drops_all(app: App, flavor: Flavor) -> None:
    async with flavor.scope():
        async with rolled_back(flavor.begin()):
            await sa_receipt.dispatch({"at": "outer"})
            async with flavor.nested():
                await sa_receipt.dispatch({"at": "released"})
        await Queue.idle()
    assert ran() == []


async def test_outside_a_transaction_dispatches_at_once(app: App, flavor: Flavor) -> None:
    res = await sa_receipt.with_({"at": "no scope"}).dispatch()
    assert res.deferred is False
    async with flavor.scope():
        assert current_transaction() is None  # nothing begun yet
        res = await sa_receipt.with_({"at": "scope, no transaction"}).dispatch()
        assert res.deferred is False
        await Queue.idle()
        assert [p["at"] for p in payloads()] == ["no scope", "scope, no transaction"]


# ==================================================================== dispatch options


async def test_dispatch_options(app: App, db: Db) -> None:
    with Session(db.engine) as session, transaction_scope(session):
        with session.begin():
            session.execute(INSERT, {"id": 7})
            await sa_receipt.dispatch({"order_id": 7, "how": "job option"})
            await sa_notify.dispatch({"order_id": 7, "how": "dispatch kwarg"}, after_commit=True)
            await Queue.dispatch(
                sa_notify, {"order_id": 7, "how": "Queue.dispatch"}, after_commit=True
            )
            res = await sa_notify.with_({"order_id": 7, "how": "pending"}).after_commit().dispatch()
            assert isinstance(res, DispatchResult)
            assert (res.deferred, res.skipped) == (True, False)
            # opting out: at once, inside the open transaction (the row is not visible yet)
            now = (
                await sa_receipt.with_({"order_id": 7, "how": "opt out"})
                .after_commit(False)
                .dispatch()
            )
            assert now.deferred is False
            await sa_receipt.dispatch({"order_id": 7, "how": "opt out kwarg"}, after_commit=False)
            await sa_notify.dispatch({"order_id": 7, "how": "plain"})
            await Queue.idle()
            assert [(p["how"], r["seen"]) for p, r in zip(payloads(), ran(), strict=True)] == [
                ("opt out", False),
                ("opt out kwarg", False),
                ("plain", False),
            ]
            RAN.clear()
        await Queue.idle()
    assert sorted(p["how"] for p in payloads()) == [
        "Queue.dispatch",
        "dispatch kwarg",
        "job option",
        "pending",
    ]
    assert all(r["seen"] for r in ran())
    # the deferred result's id is the id the job really got
    assert [r["id"] for r in ran() if r["payload"]["how"] == "pending"] == [res.id]


async def test_deferred_result_id_is_the_queued_id(app: App, db: Db) -> None:
    with Session(db.engine) as session, transaction_scope(session), session.begin():
        res = await sa_receipt.with_({"n": 1}).dispatch()
        assert res.deferred is True
        assert RAN == []
    await Queue.idle()
    assert [r["id"] for r in ran()] == [res.id]


# ==================================================================== unique / errors / fake


async def test_unique_lock_taken_only_at_the_real_enqueue(app: App, db: Db) -> None:
    with Session(db.engine) as session, transaction_scope(session):
        async with rolled_back(session.begin()):
            deferred = await sa_unique.with_({"k": 1}).dispatch()
            assert deferred.deferred is True
        # the rolled-back deferred dispatch never took the lock
        res = await sa_unique.with_({"k": 1}).dispatch()
        assert (res.deferred, res.skipped) == (False, False)
        await Queue.idle()
    assert [r["id"] for r in ran("sa_unique")] == [res.id]


async def test_unique_lock_checked_at_commit(app: App, db: Db) -> None:
    fake = Queue.fake()  # keeps the lock held: nothing is processed
    with Session(db.engine) as session, transaction_scope(session):
        with session.begin():
            deferred = await sa_unique.with_({"k": 2}).dispatch()
            now = await sa_unique.with_({"k": 2}).after_commit(False).dispatch()
            assert deferred.deferred is True
            assert (now.deferred, now.skipped) == (False, False)  # the lock was still free
        await Queue.idle()
    assert [r.message.id for r in fake.dispatched] == [now.id]
    fake.assert_skipped(sa_unique)  # the deferred one met the lock at the real enqueue
    assert [r.message.id for r in fake.skipped] == [deferred.id]


async def test_error_in_deferred_dispatch_is_logged_not_raised(
    app: App, flavor: Flavor, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="haze")
    async with flavor.scope():
        async with flavor.begin():
            await flavor.insert(3)
            res = await sa_bad_key.with_({"order_id": 3}).dispatch()  # key fn raises KeyError
            assert res.deferred is True
            await sa_receipt.dispatch({"order_id": 3})
        await Queue.idle()  # the commit went through; nothing raised
    assert payloads() == [{"order_id": 3}]
    assert flavor.db.probe(3)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("sa_bad_key" in r.getMessage() and res.id in r.getMessage() for r in errors)


async def test_fake_records_only_after_commit(app: App, flavor: Flavor) -> None:
    fake = Queue.fake()
    async with flavor.scope():
        async with flavor.begin():
            await sa_receipt.dispatch({"order_id": 1})
            async with flavor.nested():
                await sa_notify.with_({"n": 1}).after_commit().dispatch()
            async with rolled_back(flavor.nested()):
                await sa_notify.with_({"n": 2}).after_commit().dispatch()
            await Queue.idle()
            fake.assert_count(0)
            fake.assert_not_dispatched(sa_receipt)
        if isinstance(flavor, AsyncFlavor):
            # under SQLAlchemy's greenlet the deferred enqueue is awaited inside commit
            fake.assert_count(2)
        await Queue.idle()
    fake.assert_dispatched(sa_receipt, lambda p: p["order_id"] == 1)
    fake.assert_dispatched(sa_notify, lambda p: p["n"] == 1)
    fake.assert_not_dispatched(sa_notify, lambda p: p["n"] == 2)
    fake.assert_count(2)


# ==================================================================== haze.after_commit


async def test_after_commit_sync_and_async_callbacks(app: App, flavor: Flavor) -> None:
    events: list[str] = []

    async def async_cb() -> None:
        events.append("async")

    async with flavor.scope():
        async with flavor.begin():
            haze.after_commit(lambda: events.append("sync"))
            haze.after_commit(async_cb)
            async with rolled_back(flavor.nested()):
                haze.after_commit(lambda: events.append("rolled back"))
            events.append("before commit")
        events.append("after commit")
        await Queue.idle()
        haze.after_commit(lambda: events.append("no transaction"))
    if isinstance(flavor, AsyncFlavor):
        assert events == ["before commit", "sync", "async", "after commit", "no transaction"]
    else:  # a sync session in a running loop schedules async callbacks on it
        assert events == ["before commit", "sync", "after commit", "async", "no transaction"]


async def test_after_commit_callback_error_is_logged(
    app: App, db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="haze")
    events: list[str] = []

    def bad() -> None:
        raise RuntimeError("callback broke")

    with Session(db.engine) as session, transaction_scope(session), session.begin():
        session.execute(INSERT, {"id": 5})
        haze.after_commit(bad)
        haze.after_commit(lambda: events.append("next"))
    assert events == ["next"]
    assert db.probe(5)
    assert "callback broke" in caplog.text


def test_sync_session_without_event_loop(tmp_path: Path) -> None:
    """Plain sync code (Flask, a script): async callbacks complete before commit returns."""
    engine = create_engine(f"sqlite:///{tmp_path / 'sync.sqlite'}")
    _sqlite_recipe(engine)
    events: list[str] = []

    async def async_cb() -> None:
        await asyncio.sleep(0)
        events.append("async")

    try:
        with Session(engine) as session, transaction_scope(session):
            with session.begin():
                session.execute(text("CREATE TABLE t (x INTEGER)"))
                haze.after_commit(async_cb)
                haze.after_commit(lambda: events.append("sync"))
                assert events == []
            assert events == ["async", "sync"]
            try:
                with session.begin():
                    haze.after_commit(lambda: events.append("dropped"))
                    raise Boom
            except Boom:
                pass
        assert events == ["async", "sync"]
    finally:
        engine.dispose()


# ==================================================================== failed COMMIT


async def test_failed_commit_drops(app: App, flavor: Flavor) -> None:
    async def orphan_child() -> None:  # the deferred foreign key fails at COMMIT
        async with flavor.begin():
            stmt = text("INSERT INTO children (id, parent_id) VALUES (1, 99)")
            if isinstance(flavor, AsyncFlavor):
                await flavor.target.execute(stmt)
            else:
                flavor.target.execute(stmt)
            await sa_receipt.dispatch({"at": "doomed"})
            haze.after_commit(lambda: RAN.append({"job": "callback"}))

    async with flavor.scope():
        with pytest.raises(IntegrityError):
            await orphan_child()
        await Queue.idle()
    assert ran() == []


# ==================================================================== shapes of use


async def test_session_commit_with_open_savepoint(app: App, db: Db) -> None:
    with Session(db.engine) as session, transaction_scope(session):
        session.execute(INSERT, {"id": 11})  # autobegin
        await sa_receipt.dispatch({"order_id": 11, "at": "root"})
        session.begin_nested()
        await sa_receipt.dispatch({"order_id": 11, "at": "savepoint"})
        session.commit()  # releases the savepoint, then commits the root
        await Queue.idle()
    assert [(p["at"], r["seen"]) for p, r in zip(payloads(), ran(), strict=True)] == [
        ("root", True),
        ("savepoint", True),
    ]


async def test_connection_commit_as_you_go(app: App, db: Db) -> None:
    with db.engine.connect() as conn, transaction_scope(conn):
        conn.execute(INSERT, {"id": 21})
        await sa_receipt.dispatch({"order_id": 21})
        conn.rollback()
        conn.execute(INSERT, {"id": 22})
        await sa_receipt.dispatch({"order_id": 22})
        await Queue.idle()
        assert ran() == []
        conn.commit()
        await Queue.idle()
    assert [(p["order_id"], r["seen"]) for p, r in zip(payloads(), ran(), strict=True)] == [
        (22, True),
    ]


async def test_scope_entered_inside_an_open_transaction(app: App, db: Db) -> None:
    with db.engine.begin() as conn, transaction_scope(conn):
        conn.execute(INSERT, {"id": 31})
        await sa_receipt.dispatch({"order_id": 31})
        await Queue.idle()
        assert ran() == []
    await Queue.idle()
    assert [(p["order_id"], r["seen"]) for p, r in zip(payloads(), ran(), strict=True)] == [
        (31, True),
    ]
    with Session(db.engine) as session, session.begin():
        session.execute(INSERT, {"id": 32})
        with transaction_scope(session):
            await sa_receipt.dispatch({"order_id": 32})
    await Queue.idle()
    assert [(p["order_id"], r["seen"]) for p, r in zip(payloads(), ran(), strict=True)] == [
        (31, True),
        (32, True),
    ]


async def test_pending_callbacks_survive_leaving_the_scope(app: App, db: Db) -> None:
    with Session(db.engine) as session, session.begin():
        with transaction_scope(session):
            await sa_receipt.dispatch({"at": "inside"})
        await Queue.idle()
        assert ran() == []
    await Queue.idle()
    assert payloads() == [{"at": "inside"}]


async def test_nested_scopes_pick_the_innermost_in_a_transaction(app: App, db: Db) -> None:
    with (
        Session(db.engine) as outer,
        transaction_scope(outer),
        outer.begin(),
        Session(db.engine) as inner,
        transaction_scope(inner),
    ):
        # inner is not in a transaction: the outer one counts
        await sa_receipt.dispatch({"at": "outer"})
        with inner.begin():
            await sa_receipt.dispatch({"at": "inner"})
        await Queue.idle()
        assert payloads() == [{"at": "inner"}]
    await Queue.idle()
    assert payloads() == [{"at": "inner"}, {"at": "outer"}]


async def test_scoped_session_and_sessionmaker(app: App, db: Db) -> None:
    registry = scoped_session(sessionmaker(db.engine))
    try:
        with transaction_scope(registry) as scoped:
            assert scoped is registry
            with registry.begin():
                registry.execute(INSERT, {"id": 41})
                await sa_receipt.dispatch({"order_id": 41})
                await Queue.idle()
                assert ran() == []
        await Queue.idle()
        assert [r["seen"] for r in ran()] == [True]
    finally:
        registry.remove()


async def test_concurrent_tasks_have_their_own_scope(app: App, db: Db) -> None:
    gate = asyncio.Event()

    async def in_transaction() -> None:
        with Session(db.engine) as session, transaction_scope(session), session.begin():
            await sa_receipt.dispatch({"at": "task in transaction"})
            await gate.wait()

    async def outside() -> None:
        res = await sa_receipt.with_({"at": "task outside"}).dispatch()
        assert res.deferred is False
        gate.set()

    await asyncio.gather(in_transaction(), outside())
    await Queue.idle()
    assert sorted(p["at"] for p in payloads()) == ["task in transaction", "task outside"]


async def test_async_scope_starts_an_unstarted_connection(app: App, db: Db) -> None:
    conn = db.async_engine.connect()
    with pytest.raises(RuntimeError, match="not started"), transaction_scope(conn):
        pass
    async with transaction_scope(conn) as started:
        assert started is conn
        async with conn.begin():
            await conn.execute(INSERT, {"id": 51})
            await sa_receipt.dispatch({"order_id": 51})
        await conn.close()
    await Queue.idle()
    assert [r["seen"] for r in ran()] == [True]


def test_wrong_target_type() -> None:
    with pytest.raises(TypeError, match="transaction_scope"):
        transaction_scope(object())
    assert isinstance(transaction_scope(Session()), TransactionScope)


def test_missing_sqlalchemy_raises_missing_dependency_error() -> None:
    code = (
        "import sys; sys.modules['sqlalchemy'] = None\n"
        "from haze.errors import MissingDependencyError\n"
        "try:\n"
        "    import haze.integrations.sqlalchemy\n"
        "except MissingDependencyError as e:\n"
        "    print('ok', e.extra, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("ok sqlalchemy "), out.stdout + out.stderr
    assert install_hint("sqlalchemy") in out.stdout


def test_scope_left_in_another_context() -> None:
    from haze.integrations.sqlalchemy import _scopes

    scope = transaction_scope(Session())
    entered = contextvars.copy_context()
    entered.run(scope.__enter__)
    assert len(entered.run(_scopes.get)) == 1
    elsewhere = entered.copy()
    elsewhere.run(scope.__exit__, None, None, None)  # the token belongs to `entered`
    assert elsewhere.run(_scopes.get) == ()
