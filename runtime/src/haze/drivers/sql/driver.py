"""``DatabaseDriver``: the database driver's parts put together, with dispatch,
inspection and advice."""

from __future__ import annotations

import asyncio
import builtins
import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import haze.drivers.sql.landed as landed
from haze._base.errors import BackendUnavailableError
from haze._base.message import Message, decode
from haze.contracts.driver import (
    AcksInClaim,
    Advises,
    Concurrent,
    GroupBacklog,
    HeldLeases,
    IdlePolling,
    JobRecord,
    KnowsQueued,
    LeaseBudget,
    Leased,
    QueueCounts,
    RunningJob,
)
from haze.drivers._leases import lease_warning
from haze.drivers._parts import Item, in_parts
from haze.drivers.sql.base import _JOB_ID, _needs_tables
from haze.drivers.sql.landed import insert_resolved
from haze.drivers.sql.settle import _Settling
from haze.drivers.sql.turns import group_of

#: About how many leases one heartbeat round renews a second on each dialect, on a
#: local server under load, the low end of what was measured on two shared cores
#: (PostgreSQL 45,000-70,000 alone, 15,000-50,000 in a worker running 40,000 jobs;
#: MariaDB 6,000-13,000; SQLite 65,000-115,000); libSQL and D1 answer over HTTP, in
#: chunks of 400 and 45 rows. A lease runs out only when a round takes about twice the
#: interval (it is renewed every third of retry_after): the warning at one interval
#: leaves that margin.
_RENEWALS_PER_SECOND = {"postgres": 25_000, "mysql": 6_000, "sqlite": 40_000, "libsql": 10_000}
_DIALECT_NAMES = {"postgres": "PostgreSQL", "mysql": "MySQL/MariaDB", "sqlite": "SQLite"}


class DatabaseDriver(
    _Settling,
    AcksInClaim,
    Advises,
    HeldLeases,
    LeaseBudget,
    Leased,
    IdlePolling,
    Concurrent,
    GroupBacklog,
    KnowsQueued,
):
    """Queue connection on a SQL table; see the package docstring for the rules."""

    #: the config options it takes besides the common ones (``DeclaresOptions``)
    options: ClassVar[Mapping[str, str]] = {
        "connection": "str",
        "table": "ident",
        "failed_table": "ident",
        "retry_after": "duration",
        "sleep": "duration",
        "max_sleep": "duration",
        "groups": "groups",
        "vacuum": "bool",
    }

    remote = True
    local_callbacks = False
    inline = False

    @_needs_tables
    async def enqueue(self, body: str, message: Message, delay: float) -> None:
        await insert_resolved(
            functools.partial(self._enqueue_one, body, message, delay),
            functools.partial(self._has_job, message.id),
            self.name,
            (message.id,),
        )

    async def _enqueue_one(self, body: str, message: Message, delay: float) -> None:
        now = time.time()
        due = now + delay
        group = group_of(message)
        db = self._db
        # A job without a group takes its due time as its turn: no read, no coroutine.
        turn = due if group is None else await self._turn(db, message.queue, group, due)
        params = (message.queue, body, message.attempts, due, now, group, turn)
        if db.dialect == "postgres":
            # The NOTIFY rides in the INSERT's statement: a separate pg_notify round trip
            # per dispatch was half of a single dispatch's cost.
            await db.execute(self.sql["enqueue_notify"], (*params, f"haze_{self.table}"))
            self._wake_local()
            return
        await db.execute(self.sql["enqueue"], params)
        self._notify(message.queue)

    @_needs_tables
    async def enqueue_many(self, items: Sequence[tuple[str, Message, float]]) -> None:
        if not items:
            return
        now = time.time()
        rows: list[tuple[Any, ...]] = []
        #: each (queue, group)'s next turn in this batch: one lookup per group, not per row
        turns: dict[tuple[str, str], float] = {}
        for body, m, delay in items:
            group = group_of(m)
            due = now + delay
            if group is None:
                turn = due
            else:
                key = (m.queue, group)
                known = turns.get(key)
                turn = known if known is not None else await self._turn(self.db, *key, due)
                turns[key] = turn + 1.0
            rows.append((m.queue, body, m.attempts, due, now, group, turn))
        try:
            await self._insert_many(rows, items)
        finally:
            for q in {m.queue for _, m, _ in items}:
                self._notify(q)

    async def _insert_many(self, rows: list[tuple[Any, ...]], items: Sequence[Item]) -> None:
        # One multi-row INSERT per chunk: a single round trip and transaction, so one row
        # of a chunk found after a lost reply means the whole chunk landed (a later chunk
        # that fails leaves the earlier ones queued: in_parts says which).
        base = self.sql["enqueue"].split("VALUES", 1)[0]
        row_of = {m.id: row for (_, m, _), row in zip(items, rows, strict=True)}

        async def insert(part: Sequence[Item]) -> None:
            values = ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(part))
            params = [p for _, m, _ in part for p in row_of[m.id]]
            await insert_resolved(
                functools.partial(self.db.execute, f"{base}VALUES {values}", params),
                functools.partial(self._has_job, part[0][1].id),
                self.name,
                [m.id for _, m, _ in part],
            )

        parts = list(self._chunks(items, d1=14, other=500))  # D1: 7 values a row
        await in_parts(parts, insert, self.name)

    async def _has_job(self, job_id: str) -> bool | None:
        """Whether a row carries the message ``job_id`` (None: not an id to search for)."""
        if not _JOB_ID.match(job_id):
            return None
        rows = await self.db.fetchall(self.sql["find_job"], (f'%"id":"{job_id}"%',))
        for row in rows:
            body = row[1]
            if isinstance(body, (bytes, bytearray)):
                body = body.decode("utf-8", "replace")
            try:
                if decode(body).id == job_id:
                    return True
            except Exception:
                continue
        return False

    @_needs_tables
    async def holds_job(self, job_id: str) -> bool | None:
        """The lookup of a dispatch that lost its reply, asked again while the database
        cannot be reached, up to ``landed.RESOLVE_SECONDS``: a job's row stays until its
        run has ended (queued, delayed or running)."""
        if not _JOB_ID.match(job_id):
            return None
        found = await landed.look(functools.partial(self._has_job, job_id), settled=True)
        if found is None:
            raise BackendUnavailableError(
                f'queue connection "{self.name}" could not be asked whether job {job_id} is '
                f"queued (no answer within {landed.RESOLVE_SECONDS:g}s); check that its "
                "database is running and reachable"
            )
        return found

    @_needs_tables
    async def group_backlog(self, queue: str, limit: int = 20) -> builtins.list[tuple[str, int]]:
        rows = await self.db.fetchall(self.sql["group_backlog"], (queue, limit))
        return [(str(r[0]), int(r[1])) for r in rows]

    def lease_warning(self, concurrency: int) -> str | None:
        dialect = self.dialect
        return lease_warning(
            self.name,
            _DIALECT_NAMES.get(dialect, dialect),
            concurrency,
            rate=_RENEWALS_PER_SECOND.get(dialect, 1_000),  # D1: 45 rows a request
            interval=self.heartbeat_interval,
            retry_after=self.retry_after,
        )

    async def advice(self) -> builtins.list[str]:
        """PostgreSQL with autovacuum off for the jobs table: it would grow for ever;
        MySQL whose max_allowed_packet is below max_message_size."""
        if self.dialect == "mysql":
            return await self._packet_advice()
        if self.dialect != "postgres":
            return []
        try:
            row = await self.db.fetchone(self.sql["autovacuum_off"], (self.table,))
        except Exception:  # unreachable or no tables yet: the worker reports those itself
            return []
        if row is None:
            return []
        where = "on this server" if row[0] == "off" else f'for the "{self.table}" table'
        if self._vacuum_on:
            return [
                f"autovacuum is off {where}: every job leaves dead rows in {self.table!r}, "
                "so this worker runs VACUUM on it itself when they pile up; turn "
                "autovacuum on to leave that to the server"
            ]
        return [
            f"autovacuum is off {where}: every job leaves dead rows in {self.table!r} and "
            "it grows until VACUUM runs; turn autovacuum on, or run VACUUM on the table "
            "every few minutes"
        ]

    async def _packet_advice(self) -> builtins.list[str]:
        try:
            row = await self.db.fetchone("SELECT @@max_allowed_packet")
        except Exception:  # unreachable: the worker reports that itself
            return []
        packet = int(row[0]) if row and row[0] else None
        limit = self.max_message_size
        if packet is None or limit is None or limit < packet:
            return []
        return [
            f"max_message_size ({limit} bytes) is not below the server's max_allowed_packet "
            f"({packet} bytes): a message near the limit is refused at dispatch "
            "(PayloadTooLargeError); raise max_allowed_packet on the server, or lower "
            f'max_message_size of connection "{self.name}"'
        ]

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
        # The connector belongs to the app, which closes it; a VACUUM under way ends
        # with its own connection (and its lock with it).
        task, self._vacuum_task = self._vacuum_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
