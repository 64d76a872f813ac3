"""What every part of the database driver shares: its settings, its connector and SQL,
the one-line errors for missing tables, and the wake-up of an idle worker."""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from haze._base.errors import (
    ConfigError,
    DatabaseConnectionError,
    HazeError,
    QueueTablesMissingError,
)
from haze._base.message import MAX_MESSAGE_SIZE
from haze._base.sqlfiles import queue_sql
from haze._failed import SqlFailedJobs
from haze.connectors import (
    Notifying,
    Session,
    dialect_of,
    missing_column,
    missing_table,
    mysql_error_code,
    statement_chunks,
)
from haze.connectors.migrations import MIGRATIONS_DIR
from haze.drivers.sql.failed import _QueueFailedJobs
from haze.drivers.sql.turns import next_turn

if TYPE_CHECKING:
    from pathlib import Path

    from haze.connectors import Connector
    from haze.contracts.driver import Reserved
    from haze.drivers.context import DriverContext

#: D1's largest string, BLOB or table row, in bytes (SQLITE_TOOBIG past it)
D1_ROW_LIMIT = 2_000_000
#: The default max_message_size on D1: its row limit less room for the row's other
#: columns, and for the exception text beside the body when the job fails
D1_MAX_MESSAGE_SIZE = D1_ROW_LIMIT - 64 * 1024
#: A message id the job lookup searches for (haze's are 32 hex characters).
_JOB_ID = re.compile(r"^[A-Za-z0-9-]{1,128}$")
_P = ParamSpec("_P")
_R = TypeVar("_R")
_T = TypeVar("_T")


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
            if attempt == tries - 1 or mysql_error_code(e) not in _MYSQL_RETRY:
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
            better = await driver._explain(e)
            if better is None:
                raise
            raise better from None

    return call


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: The columns tenant groups added to the jobs table.
_GROUP_COLUMNS = re.compile(r"\b(turn|grp)\b")


class _DatabaseBase:
    """The state every part of ``DatabaseDriver`` reads; see the package docstring."""

    #: connectors raise this for an unreachable server (or a SQLite file locked past
    #: busy_timeout): the worker logs it once per outage, dispatch shows it as one line
    outage_errors: tuple[type[BaseException], ...] = (DatabaseConnectionError,)

    def __init__(self, name: str, options: dict[str, Any], context: DriverContext):
        self.name = name
        self.settings = options
        self.concurrency: int = options.get("concurrency") or 1
        self.retry_after: float = options.get("retry_after") or 90.0
        self.sleep: float = options.get("sleep") or 1.0
        self.max_sleep: float = options.get("max_sleep") or self.sleep * 5
        self.heartbeat_interval: float = max(0.05, self.retry_after / 3)
        self.table = options.get("table") or "jobs"
        self.failed_table = options.get("failed_table") or "failed_jobs"
        # Also here, not only in config: the names go into SQL text, and a driver can be
        # built from options that skipped the config's checks.
        for key, value in (("table", self.table), ("failed_table", self.failed_table)):
            if not _IDENT.match(value):
                raise ConfigError(
                    f"{value!r} is not a valid SQL identifier", key=f"connections.{name}.{key}"
                )
        databases = context.database_config
        self._db_name: str = options.get("connection") or databases.default
        #: the app's shared connector, resolved once here (built; it connects on first use)
        self._db: Connector = context.database(self._db_name, key="connection")
        # The plain facts the missing-table hints name: no App is kept to ask later.
        self._root: Path | None = context.root
        self._source = context.source
        self._default_connection = context.default_connection
        self._default_database = databases.default
        url = str((databases.connections.get(self._db_name) or {}).get("url") or "")
        self.max_message_size: int | None = self._size_limit(
            options.get("max_message_size"), d1=dialect_of(url) == "d1"
        )
        self._wakes: tuple[Notifying, ...] | None = None
        self._sql: dict[str, str] | None = None
        self.failed: SqlFailedJobs = _QueueFailedJobs(self)
        self._wakeup: asyncio.Event | None = None
        self._wake_loop: asyncio.AbstractEventLoop | None = None
        self._last_ts = 0.0
        #: queue -> when a claim of this driver last looked for lapsed leases
        self._lapsed_looks: dict[str, float] = {}
        #: the worker's own VACUUM of the jobs table (vacuum.py)
        self._vacuum_on: bool = options.get("vacuum", True) is not False
        self._vacuum_checked = float("-inf")
        self._vacuum_task: asyncio.Task[None] | None = None
        self._vacuum_said = False
        # The claims (row id, reserved_at) this driver acked, or sent an ack for that
        # raised, newest last: a later ack of one that finds its row gone is a repeat
        # (done), where a first ack that finds it gone means another worker took the job
        # over and finished it (a lost lease: the job ran twice).
        self._acks_sent: dict[tuple[int, Any], None] = {}
        self._init_own_leases()

    def _init_own_leases(self) -> None:
        """What tells this process's own leases from other workers' (``HeldLeases``)."""
        #: The renewal sets of the consumers running this driver's jobs (``HeldLeases``):
        #: a claim that takes back a lapsed row one of them holds leaves it to that run.
        self._holders: list[Callable[[], Iterable[Reserved]]] = []
        #: The claims (row id, reserved_at) released for a retry, newest last: their run
        #: is over, so a claim of their row is the next attempt even while the ended run
        #: is still in its consumer's renewal set. True once a claim of this driver took
        #: the row as that next attempt.
        self._released: dict[tuple[int, Any], bool] = {}
        #: This driver's recent claim tokens: a row under one of them is this process's.
        self._tokens: dict[float, None] = {}
        #: The claims in flight, with the task of each: done once their jobs are handed
        #: out (a claim taking over lapsed leases waits for the others)...
        self._claims: dict[asyncio.Future[None], asyncio.Task[Any] | None] = {}
        #: ... and once any held row's new lease is passed to its run (``_adopted``): a
        #: settle that lost its row waits for the others' (never for their whole claim:
        #: two claims each settling acks inside would wait for each other for ever).
        self._adopting: dict[asyncio.Future[None], asyncio.Task[Any] | None] = {}
        #: The claim in flight that takes over lapsed leases: it runs alone (_claiming).
        self._lapsed_claim: asyncio.Future[None] | None = None

    def _size_limit(self, configured: int | None, *, d1: bool) -> int:
        """``max_message_size``: as configured, else 4 MiB; on D1 at most what its row
        limit leaves for the body (a larger one fails there with SQLITE_TOOBIG)."""
        if not d1:
            return configured or MAX_MESSAGE_SIZE
        if configured is not None and configured > D1_MAX_MESSAGE_SIZE:
            raise ConfigError(
                f"{configured} bytes is more than a D1 row can hold with the job's other "
                f"columns ({D1_ROW_LIMIT:,} bytes a row); use at most {D1_MAX_MESSAGE_SIZE}",
                key=f"connections.{self.name}.max_message_size",
            )
        return configured or D1_MAX_MESSAGE_SIZE

    @property
    def db(self) -> Connector:
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

    def _chunks(
        self,
        items: Sequence[_T],
        *,
        d1: int,
        other: int,
        postgres: int | None = None,
        mysql: int | None = None,
    ) -> Iterator[Sequence[_T]]:
        """``items`` in slices one statement of this dialect can bind
        (``statement_chunks``)."""
        return statement_chunks(
            items, self.dialect, d1=d1, other=other, postgres=postgres, mysql=mysql
        )

    @property
    def sql(self) -> dict[str, str]:
        if self._sql is None:
            self._sql = queue_sql(self.dialect, self.table, self.failed_table)
        return self._sql

    def _tables_missing_for(self, error: BaseException) -> HazeError | None:
        """``tables_missing()`` when ``error`` is the backend's "no such table", and
        ``tables_not_ours()`` when it is "no such column"."""
        if missing_table(error, self.dialect):
            return self.tables_missing()
        return self.tables_not_ours() if missing_column(error, self.dialect) else None

    async def _explain(self, error: BaseException) -> HazeError | None:
        """``_tables_missing_for``, and a table an earlier haze made (it has the queue's
        columns, not the group ones): ``tables_outdated()``."""
        if missing_column(error, self.dialect) and _GROUP_COLUMNS.search(str(error)):
            try:
                await self.db.fetchall(self.sql["queue_columns"])
            except Exception:
                return self.tables_not_ours()
            return self.tables_outdated()
        return self._tables_missing_for(error)

    def tables_outdated(self) -> QueueTablesMissingError:
        """The queue table predates tenant groups (no ``grp``/``turn`` columns)."""
        migrate = "haze db:migrate"
        if self._db_name != self._default_database:
            migrate += f" --database {self._db_name}"
        return QueueTablesMissingError(
            self._db_name,
            migrate,
            message=f'the queue table "{self.table}" was created by an earlier haze (it has no '
            f"group columns): run {migrate} to upgrade it",
        )

    async def _turn(self, db: Session, queue: str, group: str | None, due: float) -> float:
        """A new row's turn: its due time without a group (due order, as ever)."""
        if group is None:
            return due
        row = await db.fetchone(self.sql["group_turn"], (queue, group, queue))
        last, head = (row[0], row[1]) if row is not None else (None, None)
        return next_turn(last, head, due)

    def tables_not_ours(self) -> ConfigError:
        """A table of the queue's name exists without the queue's columns: it is the
        app's own (``CREATE TABLE IF NOT EXISTS`` kept it), so no wait or migration
        helps; the queue tables need other names."""
        root = self._root
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
            source=self._source,
        )

    def tables_missing(self) -> QueueTablesMissingError:
        """The error for this connection's missing tables, naming the command to run."""
        root = self._root
        written = root is not None and any(
            path.suffix in (".sql", ".py")
            for path in (root / MIGRATIONS_DIR).glob(
                f"*_create_{self.table}_and_{self.failed_table}_tables.*"
            )
        )
        migrate = "haze db:migrate"
        if self._db_name != self._default_database:
            migrate += f" --database {self._db_name}"
        if not written:
            connection = (
                "" if self.name == self._default_connection else f" --connection {self.name}"
            )
            migrate = f"haze make:queue-tables{connection}, then {migrate}"
        return QueueTablesMissingError(self._db_name, migrate)

    def _token(self) -> float:
        """A reserved_at value unique to this process's claims (the ownership token)."""
        now = time.time()
        if now <= self._last_ts:
            now = self._last_ts + 1e-6
        self._last_ts = now
        self._tokens[now] = None
        while len(self._tokens) > _ACKS_KEPT:
            del self._tokens[next(iter(self._tokens))]
        return now

    def _wake(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._wakeup is None or self._wake_loop is not loop:
            self._wakeup = asyncio.Event()
            self._wake_loop = loop
        return self._wakeup

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

    async def _mysql_tx(self, fn: Callable[[Session], Awaitable[_R]]) -> _R:
        """``fn`` in one transaction, run again when InnoDB picked it as a deadlock victim."""

        async def once() -> _R:
            async with self.db.transaction() as tx:
                return await fn(tx)

        return await _mysql_retry(once)
