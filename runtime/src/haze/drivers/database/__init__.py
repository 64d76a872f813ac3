"""The ``database`` driver: jobs in a SQL table (SQLite, libSQL/Turso, D1, PostgreSQL,
MySQL 8 / MariaDB), as the seed's 数据库驱动 section describes.

- Claim: PostgreSQL and MySQL ``SELECT … FOR UPDATE SKIP LOCKED`` then mark the rows
  (``reserved_at``, ``attempts + 1``); SQLite/libSQL/D1 one atomic
  ``UPDATE … WHERE id IN (SELECT … LIMIT n) RETURNING``. Rows are taken in due order
  (``available_at``, then ``id``): the ready rows from an index that starts at them,
  merged with the rows whose lease ran out, so rows not due yet are never scanned. An
  idle worker's wait ends when the first of them comes due.
- Delays and retries go through ``available_at``; ``job.release()`` re-inserts the
  row without using a try.
- A row reserved (or heartbeated) longer ago than ``retry_after`` is reclaimed; a
  worker only deletes or releases a row that still carries its own ``reserved_at``.
- Final failures move to ``failed_jobs`` in the same transaction as the delete.
- While a job runs the worker refreshes ``heartbeat_at`` (lease heartbeats), so a long
  job is not reclaimed while its worker lives.

SQL lives beside this module: ``common.sql`` plus one file per dialect.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, ParamSpec, TypeVar

from haze._failed import SqlFailedJobs
from haze._kernel.errors import (
    ConfigError,
    DatabaseConnectionError,
    HazeError,
    QueueTablesMissingError,
)
from haze._kernel.message import MAX_MESSAGE_SIZE, Message, decode, retry_claim_of
from haze._kernel.sqlfiles import queue_sql
from haze.contracts.driver import (
    AcksInClaim,
    Advises,
    Concurrent,
    FailedJob,
    IdlePolling,
    JobRecord,
    Leased,
    QueueCounts,
    Reserved,
    RunningJob,
)
from haze.database import Notifying, Session, dialect_of, missing_column
from haze.database.migrations import MIGRATIONS_DIR

if TYPE_CHECKING:
    from haze.database import Connector

__all__ = ["D1_MAX_MESSAGE_SIZE", "D1_ROW_LIMIT", "DatabaseDriver"]


#: D1's largest string, BLOB or table row, in bytes (SQLITE_TOOBIG past it)
D1_ROW_LIMIT = 2_000_000
#: The default max_message_size on D1: its row limit less room for the row's other
#: columns, and for the exception text beside the body when the job fails
D1_MAX_MESSAGE_SIZE = D1_ROW_LIMIT - 64 * 1024
#: A message id the job lookup searches for (haze's are 32 hex characters).
_JOB_ID = re.compile(r"^[A-Za-z0-9-]{1,128}$")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _missing_table(e: BaseException) -> bool:
    """The backend's "no such table": PostgreSQL's SQLSTATE 42P01, MySQL/MariaDB's error
    1146, and the text SQLite, libSQL and D1 answer with."""
    if getattr(e, "sqlstate", None) == "42P01":
        return True
    args = getattr(e, "args", ())
    if args and args[0] == 1146:
        return True
    return "no such table" in str(e)


#: MySQL/MariaDB: deadlock found (1213), lock wait timeout (1205). The whole transaction
#: was rolled back, so running it again is safe.
_MYSQL_RETRY = (1213, 1205)
#: How many acked claims a driver remembers (to tell an ack sent again from a lost lease).
_ACKS_KEPT = 8192


async def _mysql_retry(fn: Callable[[], Awaitable[_R]], tries: int = 5) -> _R:
    """Run the transaction ``fn`` again when InnoDB picked it as a deadlock victim: a
    batch claim and a batch ack of the same worker can lock rows of one index in
    opposite orders."""
    for attempt in range(tries):
        try:
            return await fn()
        except Exception as e:
            args = getattr(e, "args", ())
            if attempt == tries - 1 or not args or args[0] not in _MYSQL_RETRY:
                raise
            await asyncio.sleep(0.002 * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


def _needs_tables(fn: Callable[_P, Awaitable[_R]]) -> Callable[_P, Coroutine[Any, Any, _R]]:
    """Turn the backend's "no such table" into one line telling the user what to run."""

    @functools.wraps(fn)
    async def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await fn(*args, **kwargs)
        except Exception as e:
            driver: Any = args[0]
            better = driver._tables_missing_for(e)
            if better is None:
                raise
            raise better from None

    return call


class _QueueFailedJobs(SqlFailedJobs):
    """The driver's own ``failed_jobs`` table, beside its jobs table in one database: a
    retry inserts the job and deletes the record in one transaction
    (``RetriesAtomically``). D1 has no transactions: there the two statements run one
    after the other (the job first, so a crash between them never loses it)."""

    def __init__(self, driver: DatabaseDriver) -> None:
        super().__init__(
            lambda: driver.db, table=driver.failed_table, error=driver._tables_missing_for
        )
        self._driver = driver

    async def requeue_claimed(self, id: str, token: str, body: str, message: Message) -> bool:
        found = await self.find(id)
        held = retry_claim_of(found.body) if found is not None else None
        if found is None or held is None or held[0] != token:
            return False
        d = self._driver
        sql = d.sql
        now = time.time()
        job = (message.queue, body, message.attempts, now, now)

        async def step(tx: Session) -> bool:
            if d.dialect == "d1":
                await tx.execute(sql["enqueue"], job)
                await tx.execute(sql["failed_forget_body"], (id, found.body))
                return True
            # The record only goes while it still holds this claim; the job only with it.
            if await tx.execute(sql["failed_forget_body"], (id, found.body)) == 0:
                return False
            await tx.execute(sql["enqueue"], job)
            return True

        async def run(db: Connector, _: dict[str, str]) -> bool:
            if d.dialect == "mysql":
                return await d._mysql_tx(step)
            async with db.transaction(immediate=True) as tx:
                return await step(tx)

        done = await self._call(run)
        if done:
            d._notify(message.queue)
        return done


class DatabaseDriver(AcksInClaim, Advises, Leased, IdlePolling, Concurrent):
    """Queue connection on a SQL table; see the module docstring for the rules."""

    #: the config options it takes besides the common ones (``DeclaresOptions``)
    options: ClassVar[Mapping[str, str]] = {
        "connection": "str",
        "table": "ident",
        "failed_table": "ident",
        "retry_after": "duration",
        "sleep": "duration",
        "max_sleep": "duration",
    }

    remote = True
    local_callbacks = False
    inline = False
    #: connectors raise this for an unreachable server (or a SQLite file locked past
    #: busy_timeout): the worker logs it once per outage, dispatch shows it as one line
    outage_errors: tuple[type[BaseException], ...] = (DatabaseConnectionError,)

    def __init__(self, name: str, options: dict[str, Any], app: Any):
        self.name = name
        self.app = app
        self.settings = options
        self.concurrency: int = options.get("concurrency") or 1
        self.retry_after: float = options.get("retry_after") or 90.0
        self.sleep: float = options.get("sleep") or 1.0
        self.max_sleep: float = options.get("max_sleep") or self.sleep * 5
        self.heartbeat_interval: float = max(0.05, self.retry_after / 3)
        self.table = options.get("table") or "jobs"
        self.failed_table = options.get("failed_table") or "failed_jobs"
        self._db_name: str = options.get("connection") or app.database_config.default
        app.check_database_name(
            self._db_name, app.queue_config.source, f"connections.{name}.connection"
        )
        self.max_message_size: int | None = self._size_limit(options.get("max_message_size"))
        self._db: Connector | None = None
        self._wakes: tuple[Notifying, ...] | None = None
        self._sql: dict[str, str] | None = None
        self.failed: SqlFailedJobs = _QueueFailedJobs(self)
        self._wakeup: asyncio.Event | None = None
        self._wake_loop: asyncio.AbstractEventLoop | None = None
        self._last_ts = 0.0
        # The claims (row id, reserved_at) this driver acked, or sent an ack for that
        # raised, newest last: a later ack of one that finds its row gone is a repeat
        # (done), where a first ack that finds it gone means another worker took the job
        # over and finished it (a lost lease: the job ran twice).
        self._acks_sent: dict[tuple[int, Any], None] = {}

    def _size_limit(self, configured: int | None) -> int:
        """``max_message_size``: as configured, else 4 MiB; on D1 at most what its row
        limit leaves for the body (a larger one fails there with SQLITE_TOOBIG)."""
        connection = self.app.database_config.connections.get(self._db_name) or {}
        if dialect_of(str(connection.get("url") or "")) != "d1":
            return configured or MAX_MESSAGE_SIZE
        if configured is not None and configured > D1_MAX_MESSAGE_SIZE:
            raise ConfigError(
                f"{configured} bytes is more than a D1 row can hold with the job's other "
                f"columns ({D1_ROW_LIMIT:,} bytes a row); use at most {D1_MAX_MESSAGE_SIZE}",
                key=f"connections.{self.name}.max_message_size",
            )
        return configured or D1_MAX_MESSAGE_SIZE

    # -- connection ---------------------------------------------------------------

    @property
    def db(self) -> Connector:
        if self._db is None:
            self._db = self.app.database(self._db_name)
        return self._db

    @property
    def _notifying(self) -> Notifying | None:
        """The connector's cross-process wake-ups, when its database has them (checked
        once: the dispatch path asks on every job)."""
        if self._wakes is None:
            db = self.db
            self._wakes = (db,) if isinstance(db, Notifying) else ()
        return self._wakes[0] if self._wakes else None

    @property
    def dialect(self) -> str:
        return self.db.dialect

    @property
    def sql(self) -> dict[str, str]:
        if self._sql is None:
            self._sql = queue_sql(self.dialect, self.table, self.failed_table)
        return self._sql

    def _tables_missing_for(self, error: BaseException) -> HazeError | None:
        """``tables_missing()`` when ``error`` is the backend's "no such table", and
        ``tables_not_ours()`` when it is "no such column"."""
        if _missing_table(error):
            return self.tables_missing()
        return self.tables_not_ours() if missing_column(error) else None

    def tables_not_ours(self) -> ConfigError:
        """A table of the queue's name exists without the queue's columns: it is the
        app's own (``CREATE TABLE IF NOT EXISTS`` kept it), so no wait or migration
        helps; the queue tables need other names."""
        root = self.app.root
        written = (
            sorted((root / MIGRATIONS_DIR).glob(f"*_create_{self.table}_and_*_tables.*"))
            if root is not None
            else []
        )
        # The migration of the old names would fail again on the same table: it goes.
        remove = f"delete {written[0].relative_to(root)}, " if written and root else ""
        return ConfigError(
            f'the table "{self.table}" on database "{self._db_name}" is not a haze queue '
            "table (it lacks the queue's columns): when the app has a table of that name "
            f'of its own, set "table" and "failed_table" on connection "{self.name}" to '
            f"free names, {remove}then run haze make:queue-tables and haze db:migrate",
            source=self.app.queue_config.source,
        )

    def tables_missing(self) -> QueueTablesMissingError:
        """The error for this connection's missing tables, naming the command to run."""
        root = self.app.root
        written = root is not None and any(
            path.suffix in (".sql", ".py")
            for path in (root / MIGRATIONS_DIR).glob(
                f"*_create_{self.table}_and_{self.failed_table}_tables.*"
            )
        )
        migrate = "haze db:migrate"
        if self._db_name != self.app.database_config.default:
            migrate += f" --database {self._db_name}"
        if not written:
            connection = (
                "" if self.name == self.app.queue_config.default else f" --connection {self.name}"
            )
            migrate = f"haze make:queue-tables{connection}, then {migrate}"
        return QueueTablesMissingError(self._db_name, migrate)

    def _token(self) -> float:
        """A reserved_at value unique to this process's claims (the ownership token)."""
        now = time.time()
        if now <= self._last_ts:
            now = self._last_ts + 1e-6
        self._last_ts = now
        return now

    def _wake(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._wakeup is None or self._wake_loop is not loop:
            self._wakeup = asyncio.Event()
            self._wake_loop = loop
        return self._wakeup

    # -- producer -----------------------------------------------------------------

    @_needs_tables
    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        now = time.time()
        params = (message.queue, body, message.attempts, now + delay, now)
        if self.dialect == "postgres":
            # The NOTIFY rides in the INSERT's statement: a separate pg_notify round trip
            # per dispatch was half of a single dispatch's cost.
            await self.db.execute(self.sql["enqueue_notify"], (*params, f"haze_{self.table}"))
            self._wake_local()
            return
        await self.db.execute(self.sql["enqueue"], params)
        self._notify(message.queue)

    @_needs_tables
    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        if not items:
            return
        now = time.time()
        rows = [(m.queue, body, m.attempts, now + delay, now) for body, m, delay in items]
        await self._insert_many(rows)
        for q in {m.queue for _, m, _ in items}:
            self._notify(q)

    async def _insert_many(self, rows: list[tuple[Any, ...]]) -> None:
        # One multi-row INSERT per chunk: a single round trip and transaction.
        base = self.sql["enqueue"].split("VALUES", 1)[0]
        per = 20 if self.dialect == "d1" else 500  # D1: at most 100 bound values a statement
        for i in range(0, len(rows), per):
            chunk = rows[i : i + per]
            values = ", ".join(["(?, ?, ?, ?, ?)"] * len(chunk))
            params = [p for row in chunk for p in row]
            await self.db.execute(f"{base}VALUES {values}", params)

    def _wake_local(self) -> bool:
        """Wake an idle worker of this process; True when it runs on the caller's loop."""
        if self._wakeup is not None and self._wake_loop is not None:
            try:
                if asyncio.get_running_loop() is self._wake_loop:
                    self._wakeup.set()
                    return True
            except RuntimeError:
                pass
            self._wake_loop.call_soon_threadsafe(self._wakeup.set)
        return False

    def _notify(self, queue: str) -> None:
        """Same-process dispatch wakes an idle worker at once."""
        if self._wake_local():
            return
        if self._notifying is not None:
            self._notifying.notify(f"haze_{self.table}", queue)

    # -- consumer -----------------------------------------------------------------

    async def _claim(self, queue: str) -> Reserved | None:
        jobs = await self._claim_many(queue, 1)
        return jobs[0] if jobs else None

    async def _claim_many(self, queue: str, limit: int) -> builtins.list[Reserved]:
        """Up to ``limit`` rows of ``queue`` in one claim statement, in due order."""
        now = time.time()
        token = self._token()
        abandoned = now - self.retry_after
        sql = self.sql
        rows: builtins.list[tuple[Any, ...]]
        if self.dialect == "mysql":
            rows = await self._mysql_tx(
                lambda tx: self._mysql_claim(tx, queue, limit, now, abandoned, token)
            )
        else:
            branches = (queue, now, limit, queue, abandoned, limit, limit)
            # PostgreSQL's statement sets the token after its branches, SQLite's before
            params = (
                (*branches, token, token)
                if self.dialect == "postgres"
                else (token, token, *branches)
            )
            rows = await self.db.fetchall(sql["claim_many"], params)
        return await self._claimed(rows, queue, token)

    async def _mysql_tx(self, fn: Callable[[Session], Awaitable[_R]]) -> _R:
        """``fn`` in one transaction, run again when InnoDB picked it as a deadlock victim."""

        async def once() -> _R:
            async with self.db.transaction() as tx:
                return await fn(tx)

        return await _mysql_retry(once)

    async def _mysql_claim(
        self, tx: Session, queue: str, limit: int, now: float, abandoned: float, token: float
    ) -> builtins.list[tuple[Any, ...]]:
        """The claim on MySQL/MariaDB (no UPDATE … RETURNING): lock, then mark."""
        sql = self.sql
        params = (queue, now, limit, queue, abandoned, limit, limit)
        found = await tx.fetchall(sql["claim_many_select"], params)
        if found:
            ids = [r[0] for r in found]
            marks = ", ".join(["?"] * len(ids))
            await tx.execute(sql["claim_many_mark"].replace("{ids}", marks), (token, token, *ids))
        return [(r[0], r[1], int(r[2]) + 1, token, r[3]) for r in found]

    async def _mysql_ack(self, tx: Session, pairs: builtins.list[tuple[int, Any]]) -> set[int]:
        """The batched ack on MySQL/MariaDB (no DELETE … RETURNING): lock the rows still
        owned, then delete them. Grouped by token (a claim's rows share one), compared by
        the server as the single ack does: a DOUBLE read back as text need not equal the
        float sent."""
        by_token: dict[Any, builtins.list[int]] = {}
        for row_id, token in pairs:
            by_token.setdefault(token, []).append(row_id)
        where = " OR ".join(
            f"(reserved_at = ? AND id IN ({', '.join(['?'] * len(ids))}))"
            for ids in by_token.values()
        )
        params = [v for token, ids in by_token.items() for v in (token, *ids)]
        select = self.sql["ack_many_select"].replace("{where}", where)
        found = {int(r[0]) for r in await tx.fetchall(select, params)}
        if found:
            marks = ", ".join(["?"] * len(found))
            await tx.execute(self.sql["ack_many_delete"].replace("{ids}", marks), list(found))
        return found

    async def _claimed(
        self, rows: builtins.list[tuple[Any, ...]], queue: str, token: float
    ) -> builtins.list[Reserved]:
        """``rows`` (id, payload, attempts, reserved_at, available_at) in due order."""
        if not rows:
            return []
        rows.sort(key=lambda r: (float(r[4]), int(r[0])))  # RETURNING's order is not the claim's
        return [self._reserved(r, queue) for r in await self._fresh(rows, token)]

    async def _fresh(
        self, rows: builtins.list[tuple[Any, ...]], token: float
    ) -> builtins.list[tuple[Any, ...]]:
        """The claimed rows that are still this claim's.

        A slow claim (pool start-up, a loaded server) wrote a reserved_at/heartbeat_at
        that was already old, so its rows may look abandoned to other workers before the
        first heartbeat: refresh them now, and drop any another worker has taken over
        meanwhile (not ours to run)."""
        if time.time() - token <= self.retry_after / 4:
            return rows
        kept = []
        for row in rows:
            if await self.db.execute(self.sql["heartbeat"], (time.time(), row[0], row[3])):
                kept.append(row)
        return kept

    def _reserved(self, row: Sequence[Any], queue: str) -> Reserved:
        row_id, body, attempts, reserved_at = row[:4]
        if isinstance(body, (bytes, bytearray)):
            body = body.decode("utf-8", "replace")
        try:
            message: Message | None = decode(body)
            error: BaseException | None = None
        except Exception as e:
            message, error = None, e
        return Reserved(message, int(attempts), body, queue, (row_id, reserved_at), error)

    @_needs_tables
    async def reserve(self, queues: Sequence[str], wait: float) -> Reserved | None:
        # No queues given (Worker(queues=None)): the connection's ``queues``, as queue:work does.
        queues = queues or self.settings.get("queues") or ["default"]
        event = self._wake() if wait > 0 else None
        if event is not None:
            # Cleared before the claims, not after: a dispatch or a stop (interrupt) that
            # happens while they run must still cut the wait short.
            event.clear()
        for q in queues:
            job = await self._claim(q)
            if job is not None:
                return job
        if event is None:
            return None
        await self._idle_wait(event, await self._until_due(queues, wait))
        for q in queues:
            job = await self._claim(q)
            if job is not None:
                return job
        return None

    @_needs_tables
    async def reserve_many(
        self, queues: Sequence[str], limit: int, wait: float, *, first_claimed: bool = False
    ) -> builtins.list[Reserved]:
        """Up to ``limit`` jobs in one claim statement: from the first queue (in priority
        order) that has any; waits like ``reserve`` when none has. ``first_claimed``:
        ``ack_and_claim`` just found the first queue empty, after arming the wake-up."""
        queues = queues or self.settings.get("queues") or ["default"]
        event = self._wake() if wait > 0 else None
        if event is not None and not first_claimed:
            event.clear()  # before the claims: see reserve()
        for q in queues[1:] if first_claimed else queues:
            jobs = await self._claim_many(q, limit)
            if jobs:
                return jobs
        if event is None:
            return []
        await self._idle_wait(event, await self._until_due(queues, wait))
        for q in queues:
            jobs = await self._claim_many(q, limit)
            if jobs:
                return jobs
        return []

    async def _until_due(self, queues: Sequence[str], wait: float) -> float:
        """``wait``, cut to when the first delayed row of ``queues`` comes due: nothing
        wakes a worker then (a NOTIFY comes at dispatch), so it would find the job only
        at its next poll."""
        now = time.time()
        for q in queues:
            row = await self.db.fetchone(self.sql["next_due"], (q,))
            if row is not None and row[0] is not None:
                # not below 10 ms: a due row another claim holds is that claim's
                wait = min(wait, max(float(row[0]) - now, 0.01))
        return wait

    async def _idle_wait(self, event: asyncio.Event, wait: float) -> None:
        """Until a dispatch of this process, a NOTIFY, interrupt() or ``wait`` seconds."""
        waiter = asyncio.ensure_future(event.wait())
        waiters: set[asyncio.Future[Any]] = {waiter}
        if self._notifying is not None:
            listen = self._notifying.listen(f"haze_{self.table}", wait)
            waiters.add(asyncio.ensure_future(listen))
        try:
            await asyncio.wait(waiters, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    @_needs_tables
    async def ack_many(self, jobs: Sequence[Reserved]) -> builtins.list[bool]:
        """Delete the rows of several finished jobs in one statement and one commit.

        One bool per job, as ``ack`` returns: False where another worker had taken the
        row over (the row is there with a reserved_at that is no longer this claim's),
        and nothing was deleted."""
        if not jobs:
            return []
        pairs = [(int(job.token[0]), job.token[1]) for job in jobs]
        with self._sending_acks(pairs):
            owned = await self._ack_pairs(pairs)
        return await self._acked(pairs, owned)

    async def _ack_pairs(self, pairs: builtins.list[tuple[int, Any]]) -> set[int]:
        """The ids of ``pairs`` (row id, reserved_at) whose rows this call deleted."""
        owned: set[int] = set()
        sql = self.sql
        if self.dialect == "postgres":
            ids = [p[0] for p in pairs]
            rows = await self.db.fetchall(sql["ack_many"], (ids, [p[1] for p in pairs]))
            owned = {int(r[0]) for r in rows}
        elif self.dialect == "mysql":
            owned = await self._mysql_tx(lambda tx: self._mysql_ack(tx, pairs))
        else:
            per = 45 if self.dialect == "d1" else 400  # D1: at most 100 bound values a statement
            for i in range(0, len(pairs), per):
                chunk = pairs[i : i + per]
                stmt = sql["ack_many"].replace("{pairs}", ", ".join(["(?, ?)"] * len(chunk)))
                rows = await self.db.fetchall(stmt, [v for p in chunk for v in p])
                owned.update(int(r[0]) for r in rows)
        return owned

    @contextlib.contextmanager
    def _sending_acks(self, pairs: builtins.list[tuple[int, Any]]) -> Iterator[None]:
        """Remember ``pairs`` as sent when the ack raises: it may have committed before
        its answer was lost, so the ack sent again may find the rows gone."""
        try:
            yield
        except BaseException:
            self._remember_acks(pairs)
            raise

    def _remember_acks(self, pairs: builtins.list[tuple[int, Any]]) -> None:
        sent = self._acks_sent
        for pair in pairs:
            sent.pop(pair, None)
            sent[pair] = None
        while len(sent) > _ACKS_KEPT:
            del sent[next(iter(sent))]

    async def _acked(
        self, pairs: builtins.list[tuple[int, Any]], deleted: set[int]
    ) -> builtins.list[bool]:
        """One bool per claim, as ``ack`` returns: False for a lost lease. A row this call
        did not delete is one, unless this driver had acked that claim before (the row
        is gone: done): then only a row still there, under another claim, is one."""
        repeats = [i for i, t in pairs if i not in deleted and (i, t) in self._acks_sent]
        there: set[int] = set()
        per = 90 if self.dialect == "d1" else 500  # D1: at most 100 bound values a statement
        for n in range(0, len(repeats), per):
            chunk = repeats[n : n + per]
            stmt = self.sql["still_there"].replace("{ids}", ", ".join(["?"] * len(chunk)))
            there.update(int(r[0]) for r in await self.db.fetchall(stmt, chunk))
        self._remember_acks([p for p in pairs if p[0] in deleted])
        gone = set(repeats) - there
        return [i in deleted or i in gone for i, _ in pairs]

    @_needs_tables
    async def ack_and_claim(
        self, jobs: Sequence[Reserved], queue: str, limit: int
    ) -> tuple[builtins.list[bool], builtins.list[Reserved]]:
        """``ack_many(jobs)``, then claim up to ``limit`` ready jobs of ``queue`` without
        waiting. On PostgreSQL both are one statement and one commit; on MySQL/MariaDB one
        transaction (one commit); elsewhere they run one after the other.

        The wake-up is armed before either: a dispatch of this process or ``interrupt()``
        during them ends the wait of ``reserve_many(..., first_claimed=True)`` (and
        PostgreSQL's listener keeps a NOTIFY that arrives meanwhile)."""
        self._wake().clear()
        if self.dialect not in ("postgres", "mysql") or not jobs:
            owned = await self.ack_many(jobs)
            return owned, await self._claim_many(queue, limit)
        pairs = [(int(job.token[0]), job.token[1]) for job in jobs]
        with self._sending_acks(pairs):
            return await self._ack_and_claim(pairs, queue, limit)

    async def _ack_and_claim(
        self, pairs: builtins.list[tuple[int, Any]], queue: str, limit: int
    ) -> tuple[builtins.list[bool], builtins.list[Reserved]]:
        now = time.time()
        token = self._token()
        ids = [p[0] for p in pairs]
        if self.dialect == "mysql":

            async def both(tx: Session) -> tuple[set[int], builtins.list[tuple[Any, ...]]]:
                acked = await self._mysql_ack(tx, pairs)
                # the acked rows are deleted in this transaction: the claim cannot see them
                rows = await self._mysql_claim(tx, queue, limit, now, now - self.retry_after, token)
                return acked, rows

            acked, rows = await self._mysql_tx(both)
            return await self._acked(pairs, acked), await self._claimed(rows, queue, token)
        params = (
            ids,
            [p[1] for p in pairs],
            queue,
            now,
            limit,
            queue,
            now - self.retry_after,
            ids,
            limit,
            limit,
            token,
            token,
        )
        rows = await self.db.fetchall(self.sql["ack_claim_many"], params)
        acked = {int(r[0]) for r in rows if r[1] is None}
        claimed = [r for r in rows if r[1] is not None]
        return await self._acked(pairs, acked), await self._claimed(claimed, queue, token)

    async def advice(self) -> builtins.list[str]:
        """PostgreSQL with autovacuum off for the jobs table: it would grow for ever."""
        if self.dialect != "postgres":
            return []
        try:
            row = await self.db.fetchone(self.sql["autovacuum_off"], (self.table,))
        except Exception:  # unreachable or no tables yet: the worker reports those itself
            return []
        if row is None:
            return []
        where = "on this server" if row[0] == "off" else f'for the "{self.table}" table'
        return [
            f"autovacuum is off {where}: every job leaves dead rows in {self.table!r} and "
            "it grows until VACUUM runs; turn autovacuum on, or run VACUUM on the table "
            "every few minutes"
        ]

    def interrupt(self) -> None:
        """End an idle wait now (the worker is stopping)."""
        if self._wakeup is not None:
            self._wakeup.set()

    @_needs_tables
    async def ack(self, job: Reserved) -> bool:
        # ack, release and fail match the row by its id and this claim's reserved_at: 0
        # rows means another worker reclaimed it after retry_after (False, nothing
        # changed), unless the row is gone: an earlier try deleted it (True)
        row_id, reserved_at = job.token
        pair = (int(row_id), reserved_at)
        with self._sending_acks([pair]):
            deleted = await self.db.execute(self.sql["ack"], (row_id, reserved_at)) > 0
        [acked] = await self._acked([pair], {pair[0]} if deleted else set())
        return acked

    @_needs_tables
    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        row_id, reserved_at = job.token
        if consume_attempt:
            params = (time.time() + delay, row_id, reserved_at)
            return await self.db.execute(self.sql["retry"], params) > 0
        # release(): a new row with the attempt handed back, only if we still own the old one.
        now = time.time()
        async with self.db.transaction(immediate=True) as tx:
            if await tx.execute(self.sql["ack"], (row_id, reserved_at)) == 0:
                return False
            await tx.execute(
                self.sql["enqueue"],
                (job.queue, job.body, max(0, job.attempt - 1), now + delay, now),
            )
        self._notify(job.queue)
        return True

    @_needs_tables
    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        row_id, reserved_at = job.token
        async with self.db.transaction(immediate=True) as tx:
            if await tx.execute(self.sql["ack"], (row_id, reserved_at)) == 0:
                return False  # another worker reclaimed the row; it owns the outcome now
            # A repeated message id (a redelivery, a copied row, a retried job failing
            # again) replaces its earlier record: uuid is unique.
            await tx.execute(self.sql["failed_forget"], (failed.id,))
            await tx.execute(
                self.sql["failed_insert"],
                (
                    failed.id,
                    failed.connection,
                    failed.queue,
                    failed.body,
                    failed.exception,
                    failed.failed_at,
                ),
            )
        return True

    async def heartbeat(self, jobs: Sequence[Reserved]) -> None:
        """Refresh ``heartbeat_at`` of running jobs so they are not reclaimed."""
        now = time.time()
        for job in jobs:
            row_id, reserved_at = job.token
            await self.db.execute(self.sql["heartbeat"], (now, row_id, reserved_at))

    # -- inspection ---------------------------------------------------------------

    @_needs_tables
    async def size(self, queue: str) -> int:
        row = await self.db.fetchone(self.sql["size"], (queue,))
        return int(row[0]) if row else 0

    @_needs_tables
    async def counts(self, queue: str) -> QueueCounts:
        now = time.time()
        abandoned = now - self.retry_after
        row = await self.db.fetchone(
            self.sql["counts"],
            (now, abandoned, now, abandoned, now, abandoned, float(self.retry_after), now, queue),
        )
        if not row:
            return QueueCounts(0, 0, 0)
        ready, delayed, running = (int(v or 0) for v in row[:3])
        oldest = None if row[3] is None else float(row[3])
        due = None if row[4] is None else float(row[4])
        return QueueCounts(ready, delayed, running, oldest, due)

    @_needs_tables
    async def running(self, queue: str, limit: int = 50) -> builtins.list[RunningJob] | None:
        abandoned = time.time() - self.retry_after
        rows = await self.db.fetchall(self.sql["running"], (queue, abandoned, limit))
        jobs = []
        for body, attempts, reserved_at in rows:
            if isinstance(body, (bytes, bytearray)):
                body = body.decode("utf-8", "replace")
            try:
                message = decode(body)
                job_id, name = message.id, message.job
            except Exception:
                job_id, name = "?", "<undecodable>"
            jobs.append(RunningJob(job_id, name, queue, int(attempts), float(reserved_at)))
        return jobs

    @_needs_tables
    async def find_job(self, job_id: str, queues: Sequence[str]) -> JobRecord | None:
        """The row whose envelope carries ``job_id`` (a scan: the row has no id column).
        A job that ended is gone (acked rows are deleted, failed ones moved)."""
        if not _JOB_ID.match(job_id):
            return None  # not an id haze makes: no LIKE metacharacters reach the pattern
        now = time.time()
        rows = await self.db.fetchall(self.sql["find_job"], (f'%"id":"{job_id}"%',))
        for queue, body, attempts, reserved_at, heartbeat_at, available_at in rows:
            if isinstance(body, (bytes, bytearray)):
                body = body.decode("utf-8", "replace")
            try:
                message = decode(body)
            except Exception:
                continue
            if message.id != job_id or (queues and queue not in queues):
                continue
            due = float(available_at)
            if reserved_at is not None:
                # A claim whose lease ran out is ready again (the next claim takes it).
                beat = float(heartbeat_at or reserved_at)
                state = "running" if beat > now - self.retry_after else "ready"
            else:
                state = "delayed" if due > now else "ready"
            at = due if state == "delayed" else None
            return JobRecord(message.id, message.job, queue, state, int(attempts), body, at)
        return None

    @_needs_tables
    async def purge(self, queue: str) -> int:
        return await self.db.execute(self.sql["purge"], (queue,))

    async def close(self) -> None:
        return None  # the connector belongs to the app, which closes it
