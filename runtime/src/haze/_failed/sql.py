"""Failed jobs in a SQL ``failed_jobs`` table, on the queue tables' ``.sql`` blocks.

One layout for every SQL backend (SQLite, libSQL, D1, PostgreSQL, MySQL/MariaDB): the
database driver's own table, and the table a ``failed_store`` database connection
keeps (sqs, cloudflare). A row holds the envelope ``body`` (column ``payload``); the job
name, payload, ``chain_id`` and ``batch_id`` are read back from it with
``FailedJob.from_body``.
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from haze._base.message import FailedJob, retry_claim_of, with_retry_claim
from haze._base.sqlfiles import queue_schema, queue_sql

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from haze.connectors import Connector

__all__ = ["SqlFailedJobs", "failed_row"]

log = logging.getLogger("haze.failed")

_R = TypeVar("_R")
#: The jobs table's name when only the failed table's schema is wanted (never created).
_NO_JOBS = "haze_no_jobs_table"


def failed_row(row: Sequence[Any]) -> FailedJob:
    """A ``failed_jobs`` row (uuid, connection, queue, payload, exception, failed_at)."""
    uuid, connection, queue, body, exception, failed_at = row
    if isinstance(body, (bytes, bytearray)):
        body = bytes(body).decode("utf-8", "replace")
    return FailedJob.from_body(
        body,
        id=str(uuid),
        connection=connection,
        queue=queue,
        exception=exception,
        failed_at=float(failed_at),
    )


class SqlFailedJobs:
    """The ``failed_jobs`` table ``table`` of the database ``db()`` returns.

    ``connection`` limits every call to that queue connection's rows (a ``failed_store``
    table may be shared); None reads the whole table (the database driver's own).
    ``create`` makes the table on first use when it is missing (a ``failed_store``);
    otherwise ``error`` may turn a backend error into a clearer one (the database
    driver's "run haze make:queue-tables"), None keeping it as it is.
    """

    def __init__(
        self,
        db: Callable[[], Connector],
        *,
        table: str = "failed_jobs",
        connection: str | None = None,
        create: bool = False,
        error: Callable[[BaseException], BaseException | None] | None = None,
    ) -> None:
        self._db = db
        self.table = table
        self.connection = connection
        self._create = create
        self._error = error
        self._sql: dict[str, str] | None = None
        self._dialect: str | None = None
        self._ready = not create

    async def _call(self, fn: Callable[[Connector, dict[str, str]], Awaitable[_R]]) -> _R:
        db = self._db()
        if self._sql is None or self._dialect != db.dialect:
            self._sql, self._dialect = queue_sql(db.dialect, _NO_JOBS, self.table), db.dialect
        if not self._ready:
            await self._make_table(db)
        try:
            return await fn(db, self._sql)
        except Exception as e:
            better = self._error(e) if self._error is not None else None
            if better is None:
                raise
            raise better from None

    async def _make_table(self, db: Connector) -> None:
        for stmt in queue_schema(db.dialect, _NO_JOBS, self.table):
            if _NO_JOBS in stmt:
                continue
            try:
                await db.execute(stmt)
            except Exception as e:  # an index that already exists (MySQL)
                if stmt.lstrip().upper().startswith("CREATE TABLE"):
                    raise
                log.debug("haze failed jobs: %s: %s", stmt.split("(")[0], e)
        self._ready = True

    def _of(self, name: str, *params: Any) -> tuple[str, tuple[Any, ...]]:
        """Statement ``name`` and its parameters, limited to ``connection`` when set."""
        if self.connection is None:
            return name, params
        return f"{name}_of", (self.connection, *params)

    async def record(self, job: FailedJob) -> None:
        async def run(db: Connector, sql: dict[str, str]) -> None:
            async with db.transaction() as tx:
                # uuid is unique: a job failed again (after Queue.retry) replaces its row
                await tx.execute(sql["failed_forget"], (job.id,))
                await tx.execute(
                    sql["failed_insert"],
                    (job.id, job.connection, job.queue, job.body, job.exception, job.failed_at),
                )

        await self._call(run)

    def _where(self, name: str, *params: Any) -> tuple[str, tuple[Any, ...]]:
        """Statement ``name`` whose connection condition comes last (``_of`` puts it first)."""
        if self.connection is None:
            return name, params
        return f"{name}_of", (*params, self.connection)

    async def claim_retry(self, id: str, token: str, lease: float) -> FailedJob | None:
        found = await self.find(id)
        if found is None:
            return None
        held = retry_claim_of(found.body)
        now = time.time()
        if held is not None and now < held[1]:
            return None
        body = with_retry_claim(found.body, {"token": token, "until": now + lease})
        if body is None:
            return None  # not an envelope: never retried as a job
        name, params = self._where("failed_claim", body, id, found.body)

        async def run(db: Connector, sql: dict[str, str]) -> int:
            return int(await db.execute(sql[name], params))

        if await self._call(run) == 0:
            return None  # another caller's claim (or a new record) came first
        found.body = body
        return found

    async def retried(self, id: str, token: str) -> bool:
        found = await self.find(id)
        held = retry_claim_of(found.body) if found is not None else None
        if found is None or held is None or held[0] != token:
            return False
        name, params = self._where("failed_forget_body", id, found.body)

        async def run(db: Connector, sql: dict[str, str]) -> int:
            return int(await db.execute(sql[name], params))

        return await self._call(run) > 0

    async def list(self, queue: str | None = None) -> builtins.list[FailedJob]:
        name, params = (
            self._of("failed_list") if queue is None else self._of("failed_list_queue", queue)
        )

        async def run(db: Connector, sql: dict[str, str]) -> builtins.list[FailedJob]:
            return [failed_row(r) for r in await db.fetchall(sql[name], params)]

        return await self._call(run)

    async def find(self, id: str) -> FailedJob | None:
        name, params = self._of("failed_find", id)

        async def run(db: Connector, sql: dict[str, str]) -> FailedJob | None:
            row = await db.fetchone(sql[name], params)
            return None if row is None else failed_row(row)

        return await self._call(run)

    async def forget(self, id: str) -> bool:
        name, params = self._of("failed_forget", id)

        async def run(db: Connector, sql: dict[str, str]) -> bool:
            return await db.execute(sql[name], params) > 0

        return await self._call(run)

    async def flush(self, older_than: float | None = None) -> int:
        if older_than is None:
            name, params = self._of("failed_flush")
        else:
            name, params = self._of("failed_flush_older", time.time() - older_than)

        async def run(db: Connector, sql: dict[str, str]) -> int:
            return int(await db.execute(sql[name], params))

        return await self._call(run)

    # -- pages (FailedPages): the dashboard's reads, counted and cut at the database ----

    def _filter(
        self, queue: str | None, since: float | None, until: float | None
    ) -> tuple[str, tuple[Any, ...]]:
        conditions: builtins.list[str] = []
        params: builtins.list[Any] = []
        for condition, value in (
            ("connection = ?", self.connection),
            ("queue = ?", queue),
            ("failed_at >= ?", since),
            ("failed_at <= ?", until),
        ):
            if value is not None:
                conditions.append(condition)
                params.append(value)
        return (" WHERE " + " AND ".join(conditions)) if conditions else "", tuple(params)

    async def count(
        self, queue: str | None = None, since: float | None = None, until: float | None = None
    ) -> int:
        where, params = self._filter(queue, since, until)

        async def run(db: Connector, sql: dict[str, str]) -> int:
            row = await db.fetchone(f"SELECT COUNT(*) FROM {self.table}{where}", params)
            return 0 if row is None else int(row[0])

        return await self._call(run)

    async def counts(self) -> dict[str, int]:
        where, params = self._filter(None, None, None)
        stmt = f"SELECT queue, COUNT(*) FROM {self.table}{where} GROUP BY queue"

        async def run(db: Connector, sql: dict[str, str]) -> dict[str, int]:
            return {str(q): int(n) for q, n in await db.fetchall(stmt, params)}

        return await self._call(run)

    async def page(
        self,
        queue: str | None = None,
        since: float | None = None,
        until: float | None = None,
        *,
        offset: int = 0,
        limit: int = 50,
        text: int | None = None,
    ) -> builtins.list[FailedJob]:
        where, params = self._filter(queue, since, until)
        # The numbers are ints of ours, written into the SQL: every dialect takes them
        # there, where a bound parameter's type would differ (LIMIT, SUBSTR on PostgreSQL).
        exception = "exception" if text is None else f"SUBSTR(exception, 1, {int(text)})"
        stmt = (
            f"SELECT uuid, connection, queue, payload, {exception}, failed_at FROM "
            f"{self.table}{where} ORDER BY failed_at DESC, id DESC "
            f"LIMIT {max(0, int(limit))} OFFSET {max(0, int(offset))}"
        )

        async def run(db: Connector, sql: dict[str, str]) -> builtins.list[FailedJob]:
            return [failed_row(r) for r in await db.fetchall(stmt, params)]

        return await self._call(run)
