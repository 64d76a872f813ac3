"""The driver contract suite: every test here runs once per queue driver.

Fixtures and helpers (keep these stable; other contract files depend on them)
============================================================================

``driver``          (fixture, parametrised over ``DRIVERS``) -> ``DriverSpec``
                    ``driver.id`` ("memory", "sync", ...), ``driver.inline``,
                    ``driver.remote``, ``driver.local_callbacks``,
                    ``driver.supports_delay``, ``driver.supports_retries``,
                    ``driver.supports_release``, ``driver.stores_failed``,
                    ``driver.has("retries")`` ... (see ``CAPABILITIES``).
``app``             (fixture) an entered ``App`` whose default connection ``"main"`` uses
                    the driver under test. A second connection ``"other"`` (always a
                    ``memory`` connection) exists for on_connection tests.
``make_app``        (fixture) ``async with make_app(**kw) as app:`` -- build and enter an
                    app with options, e.g. ``make_app(concurrency=16)``,
                    ``make_app(batches={"ttl": "1h"})``, ``make_app(store="locks",
                    cache=define_cache_config(...))``, ``make_app(middleware=[...])``,
                    ``make_app(options={...})`` (merged into the "main" connection),
                    ``make_app(connections={...})`` (extra connections),
                    ``make_app(spec=REMOTE_SIM)`` (another DriverSpec), ``key="..."``.
``done``            (fixture) ``await done()`` waits until every job (and every job those
                    jobs dispatched) on the current contract app has finished: memory ->
                    ``Queue.idle()``; sync -> already done (inline); remote drivers -> polls
                    the driver until nothing is queued/delayed/running. ``await done(app)``
                    for an explicit app.
``wait_done(app)``  the same as a plain coroutine function (import from conftest).
``quietly(aw)``     await ``aw``; return the exception instead of raising it (a failing
                    job raises out of ``dispatch()`` on the inline ``sync`` driver only).
``@pytest.mark.requires("retries", "delay", ...)``
                    skip the test on drivers without those capabilities (the seed forbids
                    delays, release and retries on ``sync``).
``skip_unless(driver, *caps)``  the same, inside a test body.
``REMOTE_SIM``      a test-only DriverSpec: a MemoryDriver subclass with ``remote = True``
                    and ``local_callbacks = False``, consumed by a worker this fixture
                    starts (simulates redis/database/sqs).  Use
                    ``make_app(spec=REMOTE_SIM)``; the driver is registered only while the
                    app is open (``haze.drivers.register_driver``; its class declares its options).
Prefer the fixtures ``quietly``, ``remote_sim`` (= REMOTE_SIM) and ``contract`` (a
namespace: contract.quietly, contract.skip_unless, contract.wait_done, contract.REMOTE_SIM,
contract.QUEUES, contract.DRIVERS) over ``from conftest import ...``: another
``conftest`` module (runtime/tests) shares the module name in a full run.
``QUEUES``          the queue names tests should use ("default", "high", "low", "q1",
                    "q2"): remote drivers poll these to decide they are idle.

Adding a driver = one entry in ``DRIVERS``::

    DriverSpec("redis", connection=lambda tmp: {"driver": "redis", "url": REDIS_URL},
               capabilities=FULL | {"remote"}, marks=(needs_redis,))

``connection(tmp_path)`` returns the options of the "main" connection;
``app_kwargs(tmp_path)`` (optional) returns extra ``App(...)`` kwargs (e.g.
``database=define_database_config(...)``); remote drivers get an in-process ``Worker``
on "main" started by the fixture.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from haze import App, Queue, define_queue_config
from haze.drivers.memory import MemoryDriver
from services import CI, needs_server

# This module under a name no other conftest shares (pytest imports every conftest.py
# as "conftest"): the test driver registry and the hook below use it.
_ALIAS = "haze_contract_conftest"
sys.modules[_ALIAS] = sys.modules[__name__]

# --------------------------------------------------------------------------- capabilities

#: Every capability a driver can have.
CAPABILITIES = frozenset(
    {
        "queued",  # jobs go through a queue (not run inside dispatch())
        "delay",  # delayed dispatch / backoff delays are honoured
        "retries",  # a failed attempt is retried (tries > 1)
        "release",  # job.release() puts the job back
        "failed_store",  # final failures are kept (Queue.failed / Queue.retry)
        "concurrency",  # several consumers run jobs at once
        "local_callbacks",  # plain functions are accepted as callbacks
        "remote",  # consumed by other processes (workers)
    }
)
#: What a real queue driver offers (memory, database, redis, sqs ...).
FULL = frozenset(CAPABILITIES - {"remote", "local_callbacks"})

QUEUES = ("default", "high", "low", "q1", "q2")


@dataclass(frozen=True)
class DriverSpec:
    id: str
    connection: Callable[[Path], dict[str, Any]]
    capabilities: frozenset[str]
    app_kwargs: Callable[[Path], dict[str, Any]] | None = None
    marks: tuple[Any, ...] = ()
    #: called with the App before it is entered (e.g. to register a test driver)
    setup: Callable[[], Callable[[], None]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def has(self, *caps: str) -> bool:
        unknown = set(caps) - CAPABILITIES
        assert not unknown, f"unknown capabilities {unknown}"
        return all(c in self.capabilities for c in caps)

    @property
    def inline(self) -> bool:
        return "queued" not in self.capabilities

    @property
    def remote(self) -> bool:
        return "remote" in self.capabilities

    @property
    def local_callbacks(self) -> bool:
        return "local_callbacks" in self.capabilities

    @property
    def supports_delay(self) -> bool:
        return "delay" in self.capabilities

    @property
    def supports_retries(self) -> bool:
        return "retries" in self.capabilities

    @property
    def supports_release(self) -> bool:
        return "release" in self.capabilities

    @property
    def stores_failed(self) -> bool:
        return "failed_store" in self.capabilities

    def __str__(self) -> str:
        return self.id


# --------------------------------------------------------------------------- test-only remote driver


class RemoteMemoryDriver(MemoryDriver):
    """A memory queue that pretends to be consumed elsewhere (like redis/database/sqs)."""

    remote = True
    local_callbacks = False


def _register_remote_sim() -> Callable[[], None]:
    from haze._base import plugins
    from haze.drivers import register_driver

    had = plugins.find(plugins.DRIVERS, "test_remote") is not None
    register_driver("test_remote", f"{_ALIAS}:RemoteMemoryDriver")

    def undo() -> None:
        if not had:
            plugins.unregister(plugins.DRIVERS, "test_remote")

    return undo


# --------------------------------------------------------------------------- database backends
#
# The ``database`` driver on each SQL backend. Every test gets empty queue tables:
# SQLite a fresh file under tmp_path; PostgreSQL and MariaDB one database per test
# session (dropped at exit) whose tables are emptied before each test; libSQL one
# ``sqld`` per session (started on first use). Tables are created with the runtime's
# own ``ensure_queue_tables`` (run on a helper thread: the spec hooks are synchronous).

PG_ADMIN_URL = os.environ.get(
    "HAZE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
MYSQL_ADMIN_URL = os.environ.get("HAZE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/")
_DB_SESSION = f"haze_contract_{os.getpid()}"
_db_state: dict[str, Any] = {}


def _reachable(url: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), 0.5):
            return True
    except OSError:
        return False


def _in_thread(fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``fn()`` on a fresh event loop in a helper thread (we are inside the test's loop)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = asyncio.run(fn())
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=target, name="contract-db-setup")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")


_ensured: set[str] = set()


def _prepare_tables(url: str, cleanup: Iterable[str] = ()) -> None:
    """``ensure_queue_tables`` through a throwaway app (once per database URL in the
    session), then the ``cleanup`` statements."""
    from haze import define_database_config
    from haze.connectors.migrations import ensure_queue_tables

    async def go() -> None:
        setup_app = App(
            queue=define_queue_config(default="q", connections={"q": {"driver": "database"}}),
            database=define_database_config(default="main", connections={"main": {"url": url}}),
        )
        try:
            if url not in _ensured:
                await ensure_queue_tables(setup_app)
                _ensured.add(url)
            db = setup_app.database()
            for stmt in cleanup:
                await db.execute(stmt)
        finally:
            for c in setup_app._connectors.values():
                await c.close()

    _in_thread(go)


def _stale_session_databases(names: list[str]) -> list[str]:
    """Session databases left by test processes that were killed before their atexit
    (the pid in the name is gone on this machine)."""
    stale = []
    for name in names:
        pid = name.rsplit("_", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            stale.append(name)
        except PermissionError:
            pass
    return stale


def _server_database(kind: str) -> str:
    """The session's database on the PostgreSQL/MariaDB server (created once, dropped at exit)."""
    if kind in _db_state:
        return str(_db_state[kind])
    if kind == "postgres":
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as c:
            rows = c.execute("SELECT datname FROM pg_database WHERE datname LIKE 'haze_contract_%'")
            for name in _stale_session_databases([r[0] for r in rows.fetchall()]):
                c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            c.execute(f"DROP DATABASE IF EXISTS {_DB_SESSION}")
            c.execute(f"CREATE DATABASE {_DB_SESSION}")
            # A throwaway database: no fsync per commit (the contract is about semantics;
            # tests/database/test_faults.py runs PostgreSQL with its normal settings).
            c.execute(f"ALTER DATABASE {_DB_SESSION} SET synchronous_commit = off")
        url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{_DB_SESSION}"

        def drop() -> None:
            with (
                contextlib.suppress(Exception),
                psycopg.connect(PG_ADMIN_URL, autocommit=True) as c,
            ):
                c.execute(f"DROP DATABASE IF EXISTS {_DB_SESSION} WITH (FORCE)")
    else:
        from urllib.parse import urlsplit

        import pymysql

        parts = urlsplit(MYSQL_ADMIN_URL)
        admin = {
            "host": parts.hostname,
            "port": parts.port or 3306,
            "user": parts.username or "root",
            "password": parts.password or "",
        }
        with contextlib.closing(pymysql.connect(**admin)) as c, c.cursor() as cur:
            cur.execute("SHOW DATABASES LIKE 'haze\\_contract\\_%'")
            for name in _stale_session_databases([r[0] for r in cur.fetchall()]):
                cur.execute(f"DROP DATABASE IF EXISTS {name}")
            cur.execute(f"DROP DATABASE IF EXISTS {_DB_SESSION}")
            cur.execute(f"CREATE DATABASE {_DB_SESSION}")
        url = MYSQL_ADMIN_URL.rstrip("/") + f"/{_DB_SESSION}"

        def drop() -> None:
            with (
                contextlib.suppress(Exception),
                contextlib.closing(pymysql.connect(**admin)) as c,
                c.cursor() as cur,
            ):
                cur.execute(f"DROP DATABASE IF EXISTS {_DB_SESSION}")

    atexit.register(drop)
    _db_state[kind] = url
    return url


def _sqld_url() -> str:
    """One real sqld (libSQL server) for the session, from tests/database/sqld.py."""
    if "libsql" not in _db_state:
        import importlib.util
        import tempfile

        path = Path(__file__).resolve().parents[1] / "database" / "sqld.py"
        spec = importlib.util.spec_from_file_location("haze_contract_sqld", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        reason = module.sqld_available()
        if reason:
            if CI:  # CI installs the dev group: a missing sqld is a failure
                pytest.fail(reason, pytrace=False)
            pytest.skip(reason)
        server = module.SqldServer(Path(tempfile.mkdtemp(prefix="haze-contract-sqld-")))
        server.start()
        atexit.register(server.stop)
        # atexit does not run when pytest is killed (a CI timeout): a watchdog stops the
        # server (its own process group) once this process is gone.
        import subprocess

        subprocess.Popen(
            [sys.executable, "-c", _SQLD_WATCHDOG, str(os.getpid()), str(server.process.pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _db_state["libsql"] = server.url
    return str(_db_state["libsql"])


_SQLD_WATCHDOG = """
import os, signal, sys, time
parent, group = int(sys.argv[1]), int(sys.argv[2])
while os.getppid() == parent:  # reparented once the test process is gone
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        sys.exit()  # the server was stopped normally
    time.sleep(1)
for sig in (signal.SIGTERM, signal.SIGKILL):
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        break
    time.sleep(3)
"""


#: What the in-process worker (queues=None) polls, in this order: QUEUES plus the
#: queues two contract tests set with define_job(queue=...).
_DATABASE_QUEUES = [*QUEUES, "bt_jobq", "ch_jobq"]


def _database_connection(tmp: Path) -> dict[str, Any]:
    return {"driver": "database", "connection": "main", "queues": list(_DATABASE_QUEUES)}


#: Empty queue tables before each test (the contract's stores are memory stores).
_CLEANUP = {
    "postgres": ("TRUNCATE jobs, failed_jobs RESTART IDENTITY",),
    "mysql": ("TRUNCATE TABLE jobs", "TRUNCATE TABLE failed_jobs"),
    "libsql": ("DELETE FROM jobs", "DELETE FROM failed_jobs"),
}


def _database_app_kwargs(kind: str) -> Callable[[Path], dict[str, Any]]:
    from haze import define_database_config

    def kwargs(tmp: Path) -> dict[str, Any]:
        if kind == "sqlite":
            url = f"sqlite:///{tmp}/contract-queue.db"  # tmp is absolute: sqlite:////...
            _prepare_tables(url)
        else:
            url = _sqld_url() if kind == "libsql" else _server_database(kind)
            _prepare_tables(url, _CLEANUP[kind])
        # The queue store stays the default memory store: the contract's worker runs in
        # this process, and the contract tests read the memory store's keys. The
        # DatabaseStore has its own suite (test_store_contract.py), processes included.
        return {
            "database": define_database_config(default="main", connections={"main": {"url": url}})
        }

    return kwargs


needs_postgres = needs_server("PostgreSQL", PG_ADMIN_URL)
needs_mysql = needs_server("MySQL/MariaDB", MYSQL_ADMIN_URL.rstrip("/") + "/x")

# --------------------------------------------------------------------------- the drivers

DRIVERS: list[DriverSpec] = [
    DriverSpec(
        "memory",
        connection=lambda tmp: {"driver": "memory"},
        capabilities=FULL | {"local_callbacks"},
    ),
    DriverSpec(
        "sync",
        connection=lambda tmp: {"driver": "sync"},
        capabilities=frozenset({"local_callbacks"}),
    ),
    DriverSpec(
        "database-sqlite",
        connection=_database_connection,
        capabilities=FULL | {"remote"},
        app_kwargs=_database_app_kwargs("sqlite"),
    ),
    DriverSpec(
        "database-postgres",
        connection=_database_connection,
        capabilities=FULL | {"remote"},
        app_kwargs=_database_app_kwargs("postgres"),
        marks=(needs_postgres,),
        # the batch dispatches its jobs one INSERT at a time: 300 keep the test short
        extra={"big_batch": 300},
    ),
    DriverSpec(
        "database-mariadb",
        connection=_database_connection,
        capabilities=FULL | {"remote"},
        app_kwargs=_database_app_kwargs("mysql"),
        marks=(needs_mysql,),
        extra={"big_batch": 300},  # one INSERT (and commit) per batch member, as above
    ),
    DriverSpec(
        "database-libsql",
        connection=_database_connection,
        capabilities=FULL | {"remote"},
        app_kwargs=_database_app_kwargs("libsql"),
        extra={"big_batch": 100},  # every statement is an HTTP request to sqld
    ),
    __import__("runpy").run_path(f"{Path(__file__).parent.parent}/drivers/redis_spec.py")["SPEC"],
    # sqs: moto in server mode, a fresh set of queues per test (tests/drivers/sqs_spec.py)
    __import__("runpy").run_path(f"{Path(__file__).parent.parent}/drivers/sqs_spec.py")["SPEC"],
    # vercel: the SDK's own local queue service, new topics per test (tests/drivers/vercel_spec.py)
    __import__("runpy").run_path(f"{Path(__file__).parent.parent}/drivers/vercel_spec.py")["SPEC"],
]
if sys.platform == "emscripten":
    # Inside Pyodide the suite runs on the cloudflare driver only, consumed by
    # QueueWorker.queue() (adapters/cloudflare/tests/test_cf_contract_pyodide.py).
    DRIVERS = [
        __import__("runpy").run_path(
            f"{Path(__file__).parents[2]}/adapters/cloudflare/tests/cf_contract_spec.py"
        )["SPEC"]
    ]

#: Not in DRIVERS (the real remote drivers cover that); use make_app(spec=REMOTE_SIM).
REMOTE_SIM = DriverSpec(
    "remote-sim",
    connection=lambda tmp: {"driver": "test_remote"},
    capabilities=FULL | {"remote"},
    setup=_register_remote_sim,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "requires(*caps): skip the contract test on drivers without these capabilities"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """``from conftest import quietly`` in a contract test module must get THIS conftest,
    even when another directory's conftest (runtime/tests) was imported last under the
    same module name: point ``sys.modules["conftest"]`` here while the module imports."""
    if not isinstance(collector, pytest.Module):
        yield
        return
    previous = sys.modules.get("conftest")
    sys.modules["conftest"] = sys.modules[_ALIAS]
    try:
        yield
    finally:
        if previous is not None:
            sys.modules["conftest"] = previous
        else:
            sys.modules.pop("conftest", None)


@pytest.fixture(params=[pytest.param(d, id=d.id, marks=d.marks) for d in DRIVERS])
def driver(request: pytest.FixtureRequest) -> DriverSpec:
    spec: DriverSpec = request.param
    return spec


def skip_unless(driver: DriverSpec, *caps: str) -> None:
    if not driver.has(*caps):
        missing = [c for c in caps if c not in driver.capabilities]
        pytest.skip(f"the {driver.id} driver does not support: {', '.join(missing)}")


@pytest.fixture(autouse=True)
def _contract_requires(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("requires")
    if marker is None or "driver" not in request.fixturenames:
        return
    skip_unless(request.getfixturevalue("driver"), *marker.args)


# --------------------------------------------------------------------------- waiting


_SPEC_ATTR = "_contract_spec"
_WORKERS_ATTR = "_contract_workers"


async def wait_done(app: App | None = None, timeout: float = 20.0) -> None:
    """Wait until the app's jobs (local and remote-simulated) have all finished."""
    if app is None:
        app = _current_app
    assert app is not None, "no contract app is open"
    workers = getattr(app, _WORKERS_ATTR, [])
    deadline = time.monotonic() + timeout

    async def remote_busy() -> bool:
        for w in workers:
            if w.running:
                return True
            d = w.driver
            pending = getattr(d, "pending", None)
            if pending is not None:
                if pending():
                    return True
                continue
            # the connection's own queues (its settings; a driver class's ``options`` only
            # declares which options it takes): the database connection polls two more
            settings = getattr(d, "settings", None)
            queues = settings.get("queues") if isinstance(settings, dict) else None
            for q in queues or QUEUES:
                if await d.size(q):
                    return True
        return False

    stable = 0
    while True:
        await asyncio.wait_for(Queue.idle(), max(0.1, deadline - time.monotonic()))
        if workers and await remote_busy():
            stable = 0
        else:
            stable += 1
            if stable >= 2:
                return
        if time.monotonic() > deadline:
            raise TimeoutError("contract app did not become idle")
        await asyncio.sleep(0.005 if workers else 0)


async def quietly(aw: Awaitable[Any]) -> Any:
    """Await; return the raised exception instead of propagating it."""
    try:
        return await aw
    except Exception as e:
        return e


# --------------------------------------------------------------------------- apps

_current_app: App | None = None


@pytest.fixture
def make_app(
    driver: DriverSpec, tmp_path: Path
) -> Callable[..., contextlib.AbstractAsyncContextManager[App]]:
    @contextlib.asynccontextmanager
    async def factory(
        *,
        spec: DriverSpec | None = None,
        options: dict[str, Any] | None = None,
        concurrency: int | None = None,
        connections: dict[str, dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[App]:
        global _current_app
        s = spec or driver
        undo = s.setup() if s.setup else None
        try:
            main = dict(s.connection(tmp_path))
            if options:
                main.update(options)
            if concurrency is not None and main["driver"] != "sync":
                main["concurrency"] = concurrency
            conns = {"main": main, "other": {"driver": "memory"}}
            conns.update(connections or {})
            queue_kw = {k: kwargs.pop(k) for k in ("store", "batches", "middleware") if k in kwargs}
            app_kw = dict(s.app_kwargs(tmp_path)) if s.app_kwargs else {}
            app_kw.update(kwargs)
            if "store" not in queue_kw and "cache" not in app_kw:
                # The contract's worker runs in this process and the tests read the memory
                # store's keys: name it, or the store would follow the driver's backend.
                queue_kw["store"] = "memory"
            app = App(
                queue=define_queue_config(default="main", connections=conns, **queue_kw),
                **app_kw,
            )
            setattr(app, _SPEC_ATTR, s)
            previous = _current_app
            async with app:
                _current_app = app
                workers = []
                if s.remote:
                    from haze._workers.worker import Worker

                    # extra["consumer"](app, concurrency): a spec's own consumer, shaped
                    # like Worker (cloudflare: the platform delivering batches to queue())
                    consumer = s.extra.get("consumer")
                    w = (
                        consumer(app, concurrency)
                        if consumer is not None
                        else Worker(app, "main", None, concurrency or 1, sleep=0.01, max_sleep=0.02)
                    )
                    w.start()
                    workers.append(w)
                setattr(app, _WORKERS_ATTR, workers)
                try:
                    yield app
                finally:
                    for w in workers:
                        await w.stop()
                    _current_app = previous
        finally:
            if undo is not None:
                undo()

    return factory


@pytest.fixture
async def app(make_app: Callable[..., Any]) -> AsyncIterator[App]:
    async with make_app() as a:
        yield a


@pytest.fixture
def done() -> Callable[..., Awaitable[None]]:
    return wait_done


def iter_specs() -> Iterable[DriverSpec]:
    return iter(DRIVERS)


@pytest.fixture(name="quietly")
def _quietly_fixture() -> Callable[[Awaitable[Any]], Awaitable[Any]]:
    return quietly


@pytest.fixture
def remote_sim() -> DriverSpec:
    return REMOTE_SIM


@pytest.fixture
def contract() -> SimpleNamespace:
    return SimpleNamespace(
        quietly=quietly,
        skip_unless=skip_unless,
        wait_done=wait_done,
        REMOTE_SIM=REMOTE_SIM,
        QUEUES=QUEUES,
        DRIVERS=DRIVERS,
        DriverSpec=DriverSpec,
        FULL=FULL,
        RemoteMemoryDriver=RemoteMemoryDriver,
    )
