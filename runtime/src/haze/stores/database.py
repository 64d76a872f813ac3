"""The ``database`` store: unique locks, middleware state and batches in a SQL table.

Every operation is one atomic statement (or one transaction on MySQL):
``add`` is an upsert that only takes over an expired row, ``increment`` an upsert
with arithmetic, ``delete(key, owner)`` a ``DELETE … WHERE value = owner`` and
``touch(key, owner, ttl)`` an ``UPDATE … WHERE value = owner`` of a live row.
``settle_batch_job`` is those statements in one transaction. On D1, which has no
interactive transactions, its statements run one by one (a crash between two of them
can leave a batch's counters short of the job).
The table (``haze_cache`` unless ``table`` is set) is created on first use.

On MySQL/MariaDB the key column is ``VARCHAR(191)`` with a binary collation: a key
longer than 128 characters is stored as its first 64 characters, ``~`` and its SHA-256
(129 characters, a length no stored key of its own has), so no key is ever cut and two
long keys that share a prefix stay apart. Every insert is a plain ``INSERT``: an error
(a duplicate key aside) is raised, never turned into a warning.

PostgreSQL text cannot hold NUL (``\x00``), which a key made of a payload can: there a
key holding NUL or ``\u2400`` (the symbol for NUL) is stored with each ``\u2400``
doubled and each NUL written as ``\u2400`` and ``0``. Every other key is stored as it
is, and no two keys share a stored form (a stored ``\u2400`` is always escaped).

On PostgreSQL the store is also a ``StatusNotifier``: ``notify`` is a ``pg_notify`` on
one channel per table (``<table>_notify``, the payload naming the store's channel), and
``subscribe`` listens on the connector's LISTEN connection.

>>> # config/cache.py
>>> # config = define_cache_config(default="database",
>>> #     stores={"database": {"driver": "database", "connection": "main"}})
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from haze._base.errors import ConfigError
from haze._base.sqlfiles import sql_blocks
from haze.connectors import statement_chunks
from haze.connectors.mysql import is_duplicate_key
from haze.contracts.store import BatchSettled, Subscription
from haze.stores.workflow_state import KeyValueWorkflowState

if TYPE_CHECKING:
    from haze.connectors import Connector, Session

__all__ = ["DatabaseStore", "PostgresDatabaseStore", "database_store"]

_SQL_DIR = Path(__file__).parent / "sql"
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class DatabaseStore:
    #: the config options it takes besides ``driver`` (``DeclaresOptions``)
    options: ClassVar[Mapping[str, str]] = {"connection": "str", "table": "ident"}
    _workflow_state: KeyValueWorkflowState | None = None
    atomic = True
    shared = True

    def __init__(self, name: str, options: dict[str, Any], app: Any):
        self.name = name
        self.app = app
        self.table = options.get("table") or "haze_cache"
        # Also here, not only in config: the name goes into SQL text.
        if not _IDENT.match(self.table):
            raise ConfigError(
                f"{self.table!r} is not a valid SQL identifier", key=f"stores.{name}.table"
            )
        self._db_name: str = options.get("connection") or app.database_config.default
        app.check_database_name(self._db_name, app.cache_config.source, f"stores.{name}.connection")
        self._db: Connector | None = None
        self._sql: dict[str, str] | None = None
        self._ready: set[asyncio.AbstractEventLoop] = set()
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._hash_long_keys = False
        self._escape_nul = False

    @property
    def db(self) -> Connector:
        if self._db is None:
            self._db = self.app.database(self._db_name)
        return self._db

    async def _statements(self) -> dict[str, str]:
        if self._sql is None:
            dialect = self.db.dialect
            file = {"postgres": "postgres", "mysql": "mysql"}.get(dialect, "sqlite")
            k = "`key`" if dialect == "mysql" else "key"
            real = {"postgres": "DOUBLE PRECISION", "mysql": "DOUBLE"}.get(dialect, "REAL")
            t = self.table
            sql = {n: s.format(table=t) for n, s in sql_blocks(_SQL_DIR / f"{file}.sql").items()}
            live = "(expires_at IS NULL OR expires_at > ?)"
            sql.update(
                get=f"SELECT value FROM {t} WHERE {k} = ? AND {live}",
                get_many=f"SELECT {k}, value FROM {t} WHERE {k} IN ({{marks}}) AND {live}",
                ttl=f"SELECT expires_at FROM {t} WHERE {k} = ? AND {live}",
                delete=f"DELETE FROM {t} WHERE {k} = ?",
                delete_owner=f"DELETE FROM {t} WHERE {k} = ? AND value = ?",
                # CAST: D1's binding passes every JS number as REAL; keep the column's type
                # explicit on every backend.
                touch=f"UPDATE {t} SET expires_at = CAST(? AS {real}) "
                f"WHERE {k} = ? AND value = ? AND {live}",
                prune=f"DELETE FROM {t} WHERE expires_at IS NOT NULL AND expires_at <= ?",
            )
            # Concurrent first uses would each run CREATE TABLE IF NOT EXISTS, which
            # PostgreSQL does not make race-free (duplicate pg_type row): one per process
            # under a lock, and a loser of a cross-process race tries once more.
            loop = asyncio.get_running_loop()
            if self._lock is None or self._lock[0] is not loop:
                self._lock = (loop, asyncio.Lock())
            async with self._lock[1]:
                if self._sql is None:
                    try:
                        await self.db.execute(sql["schema"])
                    except Exception:
                        await asyncio.sleep(0.05)
                        await self.db.execute(sql["schema"])
                    self._hash_long_keys = dialect == "mysql"
                    self._escape_nul = dialect == "postgres"
                    self._sql = sql
        assert self._sql is not None
        return self._sql

    def _k(self, key: str) -> str:
        """The key as stored (see the module docstring); call after ``_statements()``."""
        if self._hash_long_keys:
            return _fit_key(key)
        if self._escape_nul and ("\x00" in key or _ESC in key):
            return _escaped(key)
        return key

    @staticmethod
    def _exp(ttl: float | None, now: float) -> float | None:
        return None if ttl is None else now + ttl

    def workflow_state(self) -> KeyValueWorkflowState:
        """Workflow runs kept in this store (``HasWorkflowState``)."""
        if self._workflow_state is None:
            self._workflow_state = KeyValueWorkflowState(self)
        return self._workflow_state

    async def get(self, key: str) -> Any | None:
        sql = await self._statements()
        row = await self.db.fetchone(sql["get"], (self._k(key), time.time()))
        return None if row is None else json.loads(row[0])

    async def get_many(self, keys: Sequence[str]) -> list[Any | None]:
        if not keys:
            return []
        sql = await self._statements()
        stored = [self._k(k) for k in keys]
        found: dict[str, Any] = {}
        now = time.time()
        # D1 binds at most 100 values a statement (the keys and the time)
        for part in statement_chunks(stored, self.db.dialect, d1=90, other=500):
            stmt = sql["get_many"].replace("{marks}", ", ".join("?" * len(part)))
            rows = await self.db.fetchall(stmt, (*part, now))
            found.update((r[0], json.loads(r[1])) for r in rows)
        return [found.get(k) for k in stored]

    async def put(self, key: str, value: Any, ttl: float | None = None) -> None:
        sql = await self._statements()
        await self.db.execute(
            sql["put"], (self._k(key), _dumps(value), self._exp(ttl, time.time()))
        )

    async def add(self, key: str, value: Any, ttl: float | None = None) -> bool:
        sql = await self._statements()
        now = time.time()
        return await _add(self.db, sql, self._k(key), _dumps(value), self._exp(ttl, now), now)

    async def increment(self, key: str, by: int = 1, ttl: float | None = None) -> int:
        sql = await self._statements()
        now, key = time.time(), self._k(key)
        if "increment_read" in sql:
            async with self.db.transaction() as tx:
                return await _increment(tx, sql, key, by, self._exp(ttl, now), now)
        return await _increment(self.db, sql, key, by, self._exp(ttl, now), now)

    async def add_listed(self, key: str, value: Any, counter: str, listed: Any) -> bool:
        """``AddsListed`` in one transaction (statement by statement on D1, which has
        no interactive transactions)."""
        sql = await self._statements()
        now = time.time()
        async with self.db.transaction() as tx:
            if not await _add(tx, sql, self._k(key), _dumps(value), None, now):
                return False
            n = await _increment(tx, sql, self._k(counter), 1, None, now)
            await tx.execute(sql["put"], (self._k(f"{counter}:{n}"), _dumps(listed), None))
        return True

    async def settle_batch_job(
        self,
        batch: str,
        job: str,
        outcome: str,
        *,
        count: int = 1,
        cancel: bool = False,
        now: float = 0.0,
        ttl: float | None = None,
        keep: int = 0,
    ) -> BatchSettled:
        sql = await self._statements()
        for attempt in range(_DEADLOCK_RETRIES):
            try:
                # immediate: SQLite takes the write lock at BEGIN, so two settles never
                # both read and then fail to upgrade their lock.
                async with self.db.transaction(immediate=True) as tx:
                    return await self._settle(
                        tx, sql, batch, job, outcome, (count, keep), cancel, now, ttl
                    )
            except Exception as e:
                # A rolled-back transaction changed nothing: run it again.
                if attempt + 1 >= _DEADLOCK_RETRIES or "deadlock" not in str(e).lower():
                    raise
                await asyncio.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _settle(
        self,
        tx: Session,
        sql: dict[str, str],
        batch: str,
        job: str,
        outcome: str,
        counts: tuple[int, int],
        cancel: bool,
        now: float,
        ttl: float | None,
    ) -> BatchSettled:
        count, keep = counts
        clock = time.time()
        exp = self._exp(ttl, clock)
        k = self._k
        marker = k(f"{batch}:done:{job}")
        if await _add(tx, sql, marker, _dumps(outcome), exp, clock):
            if outcome == "failed":
                n = await _increment(tx, sql, k(f"{batch}:failed"), count, exp, clock)
                await tx.execute(sql["put"], (k(f"{batch}:failed:{n}"), _dumps(job), exp))
                if cancel:
                    await _add(tx, sql, k(f"{batch}:cancelled"), _dumps(now), exp, clock)
            else:
                await _increment(tx, sql, k(f"{batch}:processed"), count, exp, clock)
            if keep > 0:
                n = await _increment(tx, sql, k(f"{batch}:jobs"), 1, exp, clock)
                if n <= keep:
                    await tx.execute(sql["put"], (k(f"{batch}:jobs:{n}"), _dumps(job), exp))
            pending = await _increment(tx, sql, k(f"{batch}:pending"), -count, exp, clock)
            return BatchSettled(True, pending, outcome)
        row = await tx.fetchone(sql["get"], (marker, clock))
        first = outcome if row is None else str(json.loads(row[0]))
        if (
            outcome == "done"
            and first == "failed"
            and await _add(tx, sql, k(f"{batch}:recovered:{job}"), "1", exp, clock)
        ):
            await _increment(tx, sql, k(f"{batch}:recovered"), 1, exp, clock)
            await _increment(tx, sql, k(f"{batch}:processed"), 1, exp, clock)
        row = await tx.fetchone(sql["get"], (k(f"{batch}:pending"), clock))
        return BatchSettled(False, 0 if row is None else int(json.loads(row[0])), first)

    async def delete(self, key: str, owner: Any | None = None) -> bool:
        sql = await self._statements()
        key = self._k(key)
        if owner is None:
            return await self.db.execute(sql["delete"], (key,)) > 0
        return await self.db.execute(sql["delete_owner"], (key, _dumps(owner))) > 0

    async def touch(self, key: str, owner: Any, ttl: float) -> bool:
        sql = await self._statements()
        now = time.time()
        params = (now + ttl, self._k(key), _dumps(owner), now)
        return await self.db.execute(sql["touch"], params) > 0

    async def ttl(self, key: str) -> float | None:
        sql = await self._statements()
        now = time.time()
        row = await self.db.fetchone(sql["ttl"], (self._k(key), now))
        if row is None or row[0] is None:
            return None
        return max(0.0, float(row[0]) - now)

    async def prune(self) -> int:
        """Delete expired rows (they are ignored anyway; this reclaims space)."""
        sql = await self._statements()
        return await self.db.execute(sql["prune"], (time.time(),))

    async def close(self) -> None:
        return None  # the connector belongs to the app


class PostgresDatabaseStore(DatabaseStore):
    """The ``database`` store on PostgreSQL: a ``StatusNotifier`` through LISTEN/NOTIFY."""

    @property
    def _channel(self) -> str:
        # PostgreSQL channel names are identifiers: at most 63 bytes.
        return f"{self.table[:56]}_notify"

    async def notify(self, channel: str, message: str) -> None:
        payload = _dumps([channel, message])
        await self.db.fetchone("SELECT pg_notify(?, ?)", (self._channel, payload))

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        sub = _PgSubscription(channel)
        db: Any = self.db
        pg_channel = self._channel
        if not await db.watch(pg_channel, sub.deliver):
            db.unwatch(pg_channel, sub.deliver)
            # No LISTEN connection now: the caller polls at its usual pace instead.
            raise RuntimeError(f"no LISTEN connection to database {self._db_name!r}")
        try:
            yield sub
        finally:
            db.unwatch(pg_channel, sub.deliver)


class _PgSubscription:
    __slots__ = ("_channel", "_messages")

    def __init__(self, channel: str) -> None:
        self._channel = channel
        self._messages: asyncio.Queue[str] = asyncio.Queue()

    def deliver(self, payload: str) -> None:
        if not payload:  # the LISTEN connection dropped: something may have been lost
            self._messages.put_nowait("")
            return
        try:
            channel, message = json.loads(payload)
        except (ValueError, TypeError):
            return  # not one of ours
        if channel == self._channel:
            self._messages.put_nowait(str(message))

    async def receive(self, timeout: float) -> str | None:
        try:
            async with asyncio.timeout(timeout):
                return await self._messages.get()
        except TimeoutError:
            return None


class _DatabaseStoreFactory:
    """Builds the ``database`` store: with notifications on PostgreSQL. The store class
    picked depends on the connection, so the registry names this, which takes the
    store's options."""

    options: ClassVar[Mapping[str, str]] = DatabaseStore.options

    def __call__(self, name: str, options: dict[str, Any], app: Any) -> DatabaseStore:
        store = DatabaseStore(name, options, app)
        try:
            dialect = store.db.dialect
        except Exception:
            return store  # a bad connection config is reported at first use, as before
        if dialect == "postgres":
            return PostgresDatabaseStore(name, options, app)
        return store


#: The ``database`` store for ``options``: with notifications on PostgreSQL.
database_store = _DatabaseStoreFactory()


_DEADLOCK_RETRIES = 5

#: Keys up to this many characters are stored as they are (see the module docstring).
_KEPT_WHOLE = 128


#: PostgreSQL text cannot hold NUL: in a key it is written as this character and "0", and
#: the character itself doubled (see the module docstring)
_ESC = "\u2400"


def _escaped(key: str) -> str:
    return key.replace(_ESC, _ESC + _ESC).replace("\x00", _ESC + "0")


def _fit_key(key: str) -> str:
    if len(key) <= _KEPT_WHOLE:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{key[:64]}~{digest}"


async def _add(
    db: Session, sql: dict[str, str], key: str, body: str, exp: float | None, now: float
) -> bool:
    if "add_insert" in sql:  # MySQL: INSERT, or take over an expired row
        try:
            await db.execute(sql["add_insert"], (key, body, exp))
            return True
        except Exception as e:
            # InnoDB undoes the failed statement alone: an enclosing transaction goes on.
            if not is_duplicate_key(e):
                raise
        return await db.execute(sql["add_takeover"], (body, exp, key, now)) > 0
    return await db.execute(sql["add"], (key, body, exp, now)) > 0


async def _increment(
    db: Session, sql: dict[str, str], key: str, by: int, exp: float | None, now: float
) -> int:
    """On MySQL, ``db`` must be a transaction (the upsert locks the row until the read)."""
    params = (key, str(by), exp, now, by, now)
    if "increment_read" in sql:
        await db.execute(sql["increment"], params)
        row = await db.fetchone(sql["increment_read"], (key,))
    else:
        row = await db.fetchone(sql["increment"], params)
    assert row is not None
    return int(row[0])
